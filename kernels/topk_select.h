// Exact top-k by magnitude: radix select on the magnitude key with 11-bit
// digits (the AIR top-k scheme), multi-threaded, no sort of the input.
//
// The key (float_bits.h) is |x|'s bit pattern: 31 bits for float32, 15 for
// the 16-bit floats. Its digits, from the top: 11, 11, 9 bits (float32) or
// 11, 4 bits (bfloat16 / float16).
//
//   pass 1 (whole input): histogram of the top digit -> the digit d of the
//           k-th key; entries with a larger top digit are certainly selected;
//           those with top digit d are the candidates.
//   pass 2 (whole input): writes the certainly-selected entries straight to
//           the output and the candidates (key, index) to a candidate buffer,
//           both in index order, and histograms the candidates' next digit.
//           If the k-th bucket of pass 1 is exactly filled (all its entries
//           are needed) this pass is the final filter and the work ends here.
//   later passes (candidate buffer only): the next digits, each narrowing the
//           k-th key, stopping early when a bucket is exactly filled; the last
//           one is fused with the final filter, which picks from the
//           candidates every key above the k-th and, of the keys equal to it,
//           the lowest indices.
//   merge:  the certain run and the candidate run are each in index order;
//           one backward merge, in place in the output, makes the whole
//           output ascending in index (O(k)).
//
// Passes 1 and 2 run on up to num_threads_for(n) threads over fixed chunks
// with per-chunk histograms; the prefix sums of those histograms place every
// chunk's output, so the result is the same bit for bit for any thread count.
// Ties at the k-th magnitude go to the lower index; NaN ranks above +inf.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/float_bits.h"
#include "kernels/parallel.h"

#if defined(__SSE2__) && !defined(JSS_NO_SIMD)
#include <emmintrin.h>
#endif

namespace jss {

constexpr int kRadixBits = 11;
constexpr uint32_t kRadixBuckets = 1u << kRadixBits;  // 2048

// Shift of the top digit of a key of `key_bits` bits, and of the digits below.
constexpr int top_digit_shift(int key_bits) { return key_bits - kRadixBits; }
constexpr int next_digit_shift(int shift) { return shift > kRadixBits ? shift - kRadixBits : 0; }

// Magnitude key of x[i], loaded as bits (this form vectorizes for every T).
template <typename T>
inline uint32_t raw_key(const T* x, int64_t i) {
  typename FloatTraits<T>::Bits b;
  std::memcpy(&b, x + i, sizeof(b));
  return static_cast<uint32_t>(b) & ((1u << FloatTraits<T>::kKeyBits) - 1);
}

// The passes that select rare entries test 16 keys at a time with a few SIMD
// compares (block_hits_at_least / block_hits_in give a 16-bit hit mask) and
// visit only the set bits.
constexpr int64_t kScanBlock = 16;

// Bit j set <=> key of block[j] >= t, for the 16 entries of block[0..16)
// (0 <= t <= 2^kKeyBits; t = 0 sets all 16). SSE2 (every x86-64): mask the
// sign, one signed compare per 4 (float32) or 8 (16-bit) keys against t - 1
// (keys are below 2^31 / 2^15, so signed is exact), movemask. Elsewhere a
// plain loop.
template <typename T>
inline uint32_t block_hits_at_least(const T* block, uint32_t t) {
  static_assert(kScanBlock == 16, "one 16-bit mask per block");
#if defined(__SSE2__) && !defined(JSS_NO_SIMD)
  const __m128i* p = reinterpret_cast<const __m128i*>(block);
  if constexpr (sizeof(T) == 4) {
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    const __m128i below = _mm_set1_epi32(static_cast<int32_t>(t - 1));
    uint32_t m = 0;
    for (int q = 0; q < 4; ++q) {
      const __m128i key = _mm_and_si128(_mm_loadu_si128(p + q), magnitude);
      m |= static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(key, below))))
           << (4 * q);
    }
    return m;
  } else {
    const __m128i magnitude = _mm_set1_epi16(0x7fff);
    const __m128i below = _mm_set1_epi16(static_cast<int16_t>(t - 1));
    const __m128i a = _mm_cmpgt_epi16(_mm_and_si128(_mm_loadu_si128(p), magnitude), below);
    const __m128i b = _mm_cmpgt_epi16(_mm_and_si128(_mm_loadu_si128(p + 1), magnitude), below);
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(a, b)));
  }
#else
  uint32_t m = 0;
  for (int64_t j = 0; j < kScanBlock; ++j) m |= (raw_key(block, j) >= t ? 1u : 0u) << j;
  return m;
#endif
}

// Bit j set <=> key of block[j] lies in [base, base + span] (key - base <= span
// unsigned, compared signed with the sign bits flipped). Same SSE2 scheme.
template <typename T>
inline uint32_t block_hits_in(const T* block, uint32_t base, uint32_t span) {
#if defined(__SSE2__) && !defined(JSS_NO_SIMD)
  const __m128i* p = reinterpret_cast<const __m128i*>(block);
  if constexpr (sizeof(T) == 4) {
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    const __m128i flip = _mm_set1_epi32(static_cast<int32_t>(0x80000000u));
    const __m128i from = _mm_set1_epi32(static_cast<int32_t>(base));
    const __m128i limit = _mm_set1_epi32(static_cast<int32_t>(span ^ 0x80000000u));
    uint32_t outside = 0;
    for (int q = 0; q < 4; ++q) {
      const __m128i key = _mm_and_si128(_mm_loadu_si128(p + q), magnitude);
      const __m128i diff = _mm_xor_si128(_mm_sub_epi32(key, from), flip);
      const __m128i above = _mm_cmpgt_epi32(diff, limit);
      outside |= static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(above))) << (4 * q);
    }
    return ~outside & 0xffffu;
  } else {
    const __m128i magnitude = _mm_set1_epi16(0x7fff);
    const __m128i flip = _mm_set1_epi16(static_cast<int16_t>(0x8000));
    const __m128i from = _mm_set1_epi16(static_cast<int16_t>(base));
    const __m128i limit = _mm_set1_epi16(static_cast<int16_t>((span & 0xffffu) ^ 0x8000u));
    const auto outside = [&](const __m128i v) {
      const __m128i key = _mm_and_si128(v, magnitude);
      return _mm_cmpgt_epi16(_mm_xor_si128(_mm_sub_epi16(key, from), flip), limit);
    };
    const __m128i both =
        _mm_packs_epi16(outside(_mm_loadu_si128(p)), outside(_mm_loadu_si128(p + 1)));
    return ~static_cast<uint32_t>(_mm_movemask_epi8(both)) & 0xffffu;
  }
#else
  uint32_t m = 0;
  for (int64_t j = 0; j < kScanBlock; ++j) m |= (raw_key(block, j) - base <= span ? 1u : 0u) << j;
  return m;
#endif
}

// Calls fn(i) in index order for every i in [lo, hi) whose key is >= t
// (0 <= t <= 2^kKeyBits): a hit mask per block of 16, then only its set bits.
template <typename T, typename Fn>
void for_each_key_at_least(const T* x, int64_t lo, int64_t hi, uint32_t t, Fn&& fn) {
  int64_t i = lo;
  for (; i + kScanBlock <= hi; i += kScanBlock) {
    for (uint32_t m = block_hits_at_least(x + i, t); m != 0; m &= m - 1) fn(i + __builtin_ctz(m));
  }
  for (; i < hi; ++i) {
    if (raw_key(x, i) >= t) fn(i);
  }
}

// Walks a histogram from the top digit down until `need` entries are covered.
// Returns the digit holding the need-th largest entry and sets *above to the
// number of entries in larger digits (so 0 <= *above < need <= *above + hist[d]).
template <typename Count>
uint32_t digit_of_rank(const Count* hist, uint32_t buckets, int64_t need, int64_t* above) {
  int64_t acc = 0;
  uint32_t d = buckets - 1;
  for (;; --d) {
    if (acc + static_cast<int64_t>(hist[d]) >= need || d == 0) break;
    acc += static_cast<int64_t>(hist[d]);
  }
  *above = acc;
  return d;
}

// Histogram of the top digit of keys x[lo..hi), two interleaved sub-histograms
// so that runs of equal digits do not serialize on one counter.
template <typename T>
void top_digit_histogram(const T* x, int64_t lo, int64_t hi, uint32_t* out /* 2048 */) {
  using Tr = FloatTraits<T>;
  constexpr int shift = top_digit_shift(Tr::kKeyBits);
  std::vector<uint32_t> h(2 * kRadixBuckets, 0);
  uint32_t* h0 = h.data();
  uint32_t* h1 = h.data() + kRadixBuckets;
  int64_t i = lo;
  for (; i + 1 < hi; i += 2) {
    h0[Tr::key(x[i]) >> shift]++;
    h1[Tr::key(x[i + 1]) >> shift]++;
  }
  if (i < hi) h0[Tr::key(x[i]) >> shift]++;
  for (uint32_t d = 0; d < kRadixBuckets; ++d) out[d] = h0[d] + h1[d];
}

// Where a radix select stands: the k-th key's bits above hi_shift are
// `prefix`, and `quota` of the keys sharing them are still to be taken.
struct RadixState {
  uint32_t prefix;
  int hi_shift;
  int64_t quota;
};

// The radix select continued on candidate keys alone (every key whose bits
// above s.hi_shift equal s.prefix is among keys[0..count)): one digit per
// round, from a histogram of the candidates that still share the prefix (the
// first round's may be given). Runs to the last digit, or with
// stop_when_filled until a digit's keys fill the quota exactly (all of them
// are then taken: the caller's filter needs only the state).
inline RadixState radix_select_among(const uint32_t* keys, int64_t count, RadixState s,
                                     bool stop_when_filled,
                                     const std::vector<int64_t>* first_hist = nullptr) {
  std::vector<int64_t> h = first_hist ? *first_hist : std::vector<int64_t>(kRadixBuckets);
  for (bool given = first_hist != nullptr; s.hi_shift > 0; given = false) {
    const int shift = next_digit_shift(s.hi_shift);
    const uint32_t width = static_cast<uint32_t>(s.hi_shift - shift);
    const uint32_t mask = (1u << width) - 1;
    if (!given) {
      std::fill(h.begin(), h.end(), 0);
      for (int64_t c = 0; c < count; ++c) {
        if ((keys[c] >> s.hi_shift) == s.prefix) h[(keys[c] >> shift) & mask]++;
      }
    }
    int64_t above = 0;
    const uint32_t d = digit_of_rank(h.data(), mask + 1, s.quota, &above);
    s.quota -= above;
    s.prefix = (s.prefix << width) | d;
    s.hi_shift = shift;
    if (stop_when_filled && s.quota == h[d]) break;
  }
  return s;
}

template <typename T>
uint32_t kth_magnitude_key(const T* x, int64_t n, int64_t k, int threads);

// The k entries whose keys are above `kth` (the k-th largest key) and, of the
// keys equal to it, those of lowest index: a counting pass (per chunk: above,
// equal), then one filtering pass that writes every chunk's entries at its
// prefix-sum offset, so the output is in index order for any thread count.
template <typename T>
void topk_at_or_above_key(const T* x, int64_t n, int64_t k, uint32_t kth, T* values,
                          int32_t* indices, int threads) {
  using Tr = FloatTraits<T>;
  std::vector<int64_t> above(static_cast<size_t>(threads), 0), equal(above);
  parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
    int64_t a = 0, e = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t key = Tr::key(x[i]);
      a += key > kth;
      e += key == kth;
    }
    above[static_cast<size_t>(t)] = a;
    equal[static_cast<size_t>(t)] = e;
  });
  int64_t ties_left = k;
  for (int64_t a : above) ties_left -= a;
  std::vector<int64_t> out_at(static_cast<size_t>(threads) + 1, 0), ties(above.size(), 0);
  for (size_t t = 0; t < above.size(); ++t) {
    ties[t] = std::min(equal[t], std::max<int64_t>(ties_left, 0));
    ties_left -= ties[t];
    out_at[t + 1] = out_at[t] + above[t] + ties[t];
  }
  parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
    int64_t w = out_at[static_cast<size_t>(t)];
    int64_t quota = ties[static_cast<size_t>(t)];
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t key = Tr::key(x[i]);
      if (key > kth || (key == kth && quota > 0)) {
        quota -= key == kth;
        values[w] = x[i];
        indices[w] = static_cast<int32_t>(i);
        ++w;
      }
    }
  });
}

// The k entries of largest magnitude of x[0..n): values (x's type) and int32
// indices, in ascending index order. Requires 0 <= k <= n < 2^31.
template <typename T>
void topk_by_magnitude(const T* x, int64_t n, int64_t k, T* values, int32_t* indices,
                       int threads) {
  using Tr = FloatTraits<T>;
  constexpr int shift0 = top_digit_shift(Tr::kKeyBits);
  if (k <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) { values[i] = x[i]; indices[i] = static_cast<int32_t>(i); }
    return;
  }
  threads = std::max(1, threads);

  // pass 1: per-chunk histograms of the top digit
  std::vector<uint32_t> chunk_hist(static_cast<size_t>(threads) * kRadixBuckets);
  parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
    top_digit_histogram(x, lo, hi, chunk_hist.data() + static_cast<size_t>(t) * kRadixBuckets);
  });
  std::vector<int64_t> hist(kRadixBuckets, 0);
  for (int t = 0; t < threads; ++t)
    for (uint32_t d = 0; d < kRadixBuckets; ++d) hist[d] += chunk_hist[t * kRadixBuckets + d];
  int64_t n_above = 0;  // entries with a larger top digit: all selected
  const uint32_t d0 = digit_of_rank(hist.data(), kRadixBuckets, k, &n_above);
  const int64_t need = k - n_above;  // taken from the top-digit-d0 entries, 1..hist[d0]
  const bool exact_fill = need == hist[d0];
  // Most entries share the k-th's top digit (concentrated magnitudes: Adam's
  // directions are all near 1, and exactly +-1 at its first step): gathering
  // them as candidates would copy most of the input and select among the copy
  // digit by digit, up to 9x slower than on spread-out data. The k-th key from
  // histogram passes over x, then one filter, costs a few reads instead.
  if (!exact_fill && hist[d0] > std::max<int64_t>(int64_t{1} << 16, n / 4)) {
    topk_at_or_above_key(x, n, k, kth_magnitude_key(x, n, k, threads), values, indices, threads);
    return;
  }

  // Output offsets of every chunk: entries above d0 (and, on exact fill, equal).
  std::vector<int64_t> out_at(threads + 1, 0), cand_at(threads + 1, 0);
  for (int t = 0; t < threads; ++t) {
    const uint32_t* h = chunk_hist.data() + static_cast<size_t>(t) * kRadixBuckets;
    int64_t above = 0;
    for (uint32_t d = d0 + 1; d < kRadixBuckets; ++d) above += h[d];
    const int64_t equal = h[d0];
    out_at[t + 1] = out_at[t] + above + (exact_fill ? equal : 0);
    cand_at[t + 1] = cand_at[t] + (exact_fill ? 0 : equal);
  }

  if (exact_fill) {  // pass 2 is the final filter: every entry with digit >= d0
    parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
      const uint32_t digit = d0;
      int64_t w = out_at[t];
      for (int64_t i = lo; i < hi; ++i) {
        if ((Tr::key(x[i]) >> shift0) >= digit) {
          values[w] = x[i];
          indices[w] = static_cast<int32_t>(i);
          ++w;
        }
      }
    });
    return;
  }

  // pass 2: certain entries to the output, candidates to the buffer (+ next histogram)
  constexpr int shift1 = next_digit_shift(shift0);
  constexpr uint32_t width1 = static_cast<uint32_t>(shift0 - shift1);
  const int64_t num_cand = cand_at[threads];
  std::vector<uint32_t> cand_key(static_cast<size_t>(num_cand));
  std::vector<int32_t> cand_idx(static_cast<size_t>(num_cand));
  std::vector<uint32_t> next_hist(static_cast<size_t>(threads) * kRadixBuckets, 0);
  parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
    // locals, not captures: the counters are uint32 and could alias them
    const uint32_t digit = d0;
    const uint32_t lowest = d0 << shift0;  // smallest key with top digit d0
    uint32_t* keys = cand_key.data();
    int32_t* where = cand_idx.data();
    int64_t w = out_at[t], c = cand_at[t];
    uint32_t* h = next_hist.data() + static_cast<size_t>(t) * kRadixBuckets;
    const auto visit = [&](int64_t i) {
      const uint32_t key = Tr::key(x[i]);
      const uint32_t d = key >> shift0;
      if (d > digit) {
        values[w] = x[i];
        indices[w] = static_cast<int32_t>(i);
        ++w;
      } else {  // d == digit: a candidate
        keys[c] = key;
        where[c] = static_cast<int32_t>(i);
        ++c;
        h[(key >> shift1) & ((1u << width1) - 1)]++;
      }
    };
    // most entries fall below the k-th digit: only those at or above it are visited
    for_each_key_at_least(x, lo, hi, lowest, visit);
  });

  // later digits, on the candidates only
  std::vector<int64_t> h(kRadixBuckets, 0);
  for (int t = 0; t < threads; ++t)
    for (uint32_t d = 0; d < kRadixBuckets; ++d) h[d] += next_hist[t * kRadixBuckets + d];
  const RadixState kth = radix_select_among(cand_key.data(), num_cand, {d0, shift0, need},
                                            /*stop_when_filled=*/true, &h);
  const uint32_t prefix = kth.prefix;
  const int shift = kth.hi_shift;
  int64_t quota = kth.quota;

  // final filter over the candidates: prefix above the k-th's, or equal within quota
  std::vector<int32_t> picked;
  picked.reserve(static_cast<size_t>(need));
  for (int64_t c = 0; c < num_cand && static_cast<int64_t>(picked.size()) < need; ++c) {
    const uint32_t p = cand_key[c] >> shift;
    if (p > prefix || (p == prefix && quota-- > 0)) picked.push_back(cand_idx[c]);
  }

  // backward in-place merge of the certain run [0, n_above) and the picked run
  int64_t i = n_above - 1, j = static_cast<int64_t>(picked.size()) - 1, w = k - 1;
  while (j >= 0) {
    if (i >= 0 && indices[i] > picked[j]) {
      values[w] = values[i];
      indices[w] = indices[i];
      --i;
    } else {
      values[w] = x[picked[j]];
      indices[w] = picked[j];
      --j;
    }
    --w;
  }
}

// Calls fn(key) for the keys of x[lo..hi) whose bits above hi_shift (< 32)
// equal prefix. Few keys match: each block of 16 gives a hit mask
// ((key >> hi_shift) == prefix <=> key - base <= span, unsigned) and only its
// set bits are visited.
template <typename T, typename Fn>
void for_each_matching_key(const T* x, int64_t lo, int64_t hi, int hi_shift, uint32_t prefix,
                           Fn&& fn) {
  using Tr = FloatTraits<T>;
  const uint32_t base = prefix << hi_shift;
  const uint32_t span_minus_1 = (1u << hi_shift) - 1;
  int64_t s = lo;
  for (; s + kScanBlock <= hi; s += kScanBlock) {
    for (uint32_t m = block_hits_in(x + s, base, span_minus_1); m != 0; m &= m - 1) {
      fn(Tr::key(x[s + __builtin_ctz(m)]));
    }
  }
  for (; s < hi; ++s) {
    const uint32_t key = Tr::key(x[s]);
    if ((key >> hi_shift) == prefix) fn(key);
  }
}

// Histogram of digit (key >> shift) & mask over the keys of x[lo..hi) whose
// key >> hi_shift equals prefix. Plain value parameters, so nothing is
// reloaded after each counter store (the counters are uint32 like prefix, and
// could otherwise alias it).
template <typename T>
void matching_digit_histogram(const T* x, int64_t lo, int64_t hi, int hi_shift, uint32_t prefix,
                              int shift, uint32_t mask, uint32_t* h, bool most_match = false) {
  using Tr = FloatTraits<T>;
  if (most_match) {
    // most keys match (concentrated magnitudes): a plain branch-free loop, the
    // others counted in a spare bucket, two sub-histograms taken in turn
    std::vector<uint32_t> sub(2 * (static_cast<size_t>(mask) + 2), 0);
    uint32_t* h0 = sub.data();
    uint32_t* h1 = sub.data() + mask + 2;
    const uint32_t spare = mask + 1;
    int64_t i = lo;
    for (; i + 1 < hi; i += 2) {
      const uint32_t a = Tr::key(x[i]), b = Tr::key(x[i + 1]);
      h0[(a >> hi_shift) == prefix ? (a >> shift) & mask : spare]++;
      h1[(b >> hi_shift) == prefix ? (b >> shift) & mask : spare]++;
    }
    if (i < hi) {
      const uint32_t a = Tr::key(x[i]);
      h0[(a >> hi_shift) == prefix ? (a >> shift) & mask : spare]++;
    }
    for (uint32_t d = 0; d <= mask; ++d) h[d] += h0[d] + h1[d];
    return;
  }
  for_each_matching_key(x, lo, hi, hi_shift, prefix,
                        [h, shift, mask](uint32_t key) { h[(key >> shift) & mask]++; });
}

// The keys of x[lo..hi) whose bits above hi_shift equal prefix, appended to out.
template <typename T>
void matching_keys(const T* x, int64_t lo, int64_t hi, int hi_shift, uint32_t prefix,
                   std::vector<uint32_t>* out) {
  for_each_matching_key(x, lo, hi, hi_shift, prefix, [out](uint32_t key) { out->push_back(key); });
}

// The radix select continued on candidate keys alone: every key whose bits
// above hi_shift equal prefix is among `keys`, and `quota` of them are still
// to pass. Returns the full k-th key.
inline uint32_t kth_key_among(const std::vector<uint32_t>& keys, uint32_t prefix, int hi_shift,
                              int64_t quota) {
  return radix_select_among(keys.data(), static_cast<int64_t>(keys.size()),
                            {prefix, hi_shift, quota}, /*stop_when_filled=*/false)
      .prefix;
}

// The k-th largest magnitude key of x[0..n) by radix select without
// compaction: one histogram pass per digit, each counting only the entries
// whose higher digits match the k-th's. The entries sharing the first digit
// are gathered in the second pass when they are few (up to n / 8; the first
// histogram says how many), and the later digits come from them: two reads
// of x instead of three. Requires 1 <= k <= n.
template <typename T>
uint32_t kth_magnitude_key(const T* x, int64_t n, int64_t k, int threads) {
  using Tr = FloatTraits<T>;
  threads = std::max(1, threads);
  std::vector<uint32_t> chunk_hist(static_cast<size_t>(threads) * kRadixBuckets);
  std::vector<int64_t> hist(kRadixBuckets);
  uint32_t prefix = 0;
  int hi_shift = Tr::kKeyBits;  // bits [shift, hi_shift) form the current digit
  int64_t quota = k;
  int64_t matching = n;  // keys sharing the prefix
  for (bool first = true;; first = false) {
    const int shift = first ? top_digit_shift(Tr::kKeyBits) : next_digit_shift(hi_shift);
    const uint32_t width = static_cast<uint32_t>(hi_shift - shift);
    const uint32_t mask = (1u << width) - 1;
    parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
      uint32_t* h = chunk_hist.data() + static_cast<size_t>(t) * kRadixBuckets;
      if (first) {
        top_digit_histogram(x, lo, hi, h);
      } else {
        std::fill(h, h + kRadixBuckets, 0u);
        matching_digit_histogram(x, lo, hi, hi_shift, prefix, shift, mask, h,
                                 /*most_match=*/matching > n / 8);
      }
    });
    std::fill(hist.begin(), hist.end(), 0);
    for (int t = 0; t < threads; ++t)
      for (uint32_t d = 0; d <= mask; ++d) hist[d] += chunk_hist[t * kRadixBuckets + d];
    int64_t above = 0;
    const uint32_t d = digit_of_rank(hist.data(), mask + 1, quota, &above);
    quota -= above;
    prefix = (prefix << width) | d;
    if (shift == 0) return prefix;
    hi_shift = shift;
    matching = hist[d];
    if (first && hist[d] <= std::max<int64_t>(int64_t{1} << 16, n / 8)) {
      std::vector<std::vector<uint32_t>> parts(static_cast<size_t>(threads));
      parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
        matching_keys(x, lo, hi, hi_shift, prefix, &parts[static_cast<size_t>(t)]);
      });
      std::vector<uint32_t> keys;
      keys.reserve(static_cast<size_t>(hist[d]));
      for (const auto& part : parts) keys.insert(keys.end(), part.begin(), part.end());
      return kth_key_among(keys, prefix, hi_shift, quota);
    }
  }
}

// The k-th largest magnitude key over the strided sample x[0], x[stride], ...
// (m = ceil(n / stride) entries); requires 1 <= k <= m. A strided read touches
// a cache line (or two) per sample whatever the stride, so the sample's keys
// are read once into a contiguous array and selected there, not in one
// strided pass per digit.
template <typename T>
uint32_t kth_magnitude_key_strided(const T* x, int64_t n, int64_t stride, int64_t k, int threads) {
  using Tr = FloatTraits<T>;
  if (stride == 1) return kth_magnitude_key(x, n, k, threads);
  const int64_t m = (n + stride - 1) / stride;
  std::vector<uint32_t> keys(static_cast<size_t>(m));
  parallel_chunks(m, std::max(1, threads), [&](int, int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) keys[static_cast<size_t>(s)] = Tr::key(x[s * stride]);
  });
  return kth_key_among(keys, 0, Tr::kKeyBits, k);
}

}  // namespace jss

namespace jss {

// Bucketed top-k: the k largest magnitudes of every bucket of `bucket`
// consecutive entries (SparCML trains with k = 2..16 per 512). Output slot
// b * k + j belongs to bucket b; a last bucket shorter than k is padded with
// value 0 and index -1. Within a bucket, ties go to the lower index and the
// entries come in ascending index order, as in topk_by_magnitude.
// Up to this many per bucket, insertion into a small sorted list beats nth_element:
// at 10.9M entries in buckets of 4096 (chunked_topk_sync's chunks), one thread, k = 64
// took 0.44-0.48 of nth_element's time and k = 128 0.68-0.84; k = 256, 1.4-1.7x.
constexpr int64_t kSmallBucketK = 128;

template <typename T>
void bucket_topk_by_magnitude(const T* x, int64_t n, int64_t bucket, int64_t k, T* values,
                              int32_t* indices, int threads = 1) {
  using Tr = FloatTraits<T>;
  const int64_t num_buckets = (n + bucket - 1) / bucket;
  // buckets are independent: chunks of whole buckets per thread
  parallel_chunks(num_buckets, std::max(1, threads), [&](int, int64_t b_lo, int64_t b_hi) {
    std::vector<std::pair<uint32_t, int32_t>> keyed(static_cast<size_t>(bucket));
    for (int64_t b = b_lo; b < b_hi; ++b) {
      const int64_t lo = b * bucket;
      const int64_t len = std::min(bucket, n - lo);
      const int64_t take = std::min(k, len);
      if (take > 0 && take <= kSmallBucketK && take < len) {  // take = 0: no top_key[-1]
        // small k: keep the best `take` so far, best first, by insertion. An
        // entry enters only if its key beats the worst kept key; on a tie the
        // earlier (lower) index stays, which is the tie-break.
        uint32_t top_key[kSmallBucketK];
        int32_t top_idx[kSmallBucketK];
        int64_t kept = 0;
        const auto offer = [&](int64_t i) {
          const uint32_t key = Tr::key(x[lo + i]);
          if (kept == take && key <= top_key[take - 1]) return;
          int64_t p = kept < take ? kept++ : take - 1;
          for (; p > 0 && top_key[p - 1] < key; --p) {
            top_key[p] = top_key[p - 1];
            top_idx[p] = top_idx[p - 1];
          }
          top_key[p] = key;
          top_idx[p] = static_cast<int32_t>(lo + i);
        };
        int64_t i = 0;
        for (; i < len && kept < take; ++i) offer(i);
        // once full, a block of 16 is offered only the entries whose key beats
        // the worst kept one (SIMD mask; the bar only rises while offering)
        for (; i + kScanBlock <= len; i += kScanBlock) {
          for (uint32_t m = block_hits_at_least(x + lo + i, top_key[take - 1] + 1); m != 0;
               m &= m - 1) {
            offer(i + __builtin_ctz(m));
          }
        }
        for (; i < len; ++i) offer(i);
        std::sort(top_idx, top_idx + take);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t slot = b * k + j;
          values[slot] = j < take ? x[top_idx[j]] : T{};
          indices[slot] = j < take ? top_idx[j] : -1;
        }
        continue;
      }
      for (int64_t i = 0; i < len; ++i) {
        keyed[i] = {Tr::key(x[lo + i]), static_cast<int32_t>(lo + i)};
      }
      auto larger = [](const std::pair<uint32_t, int32_t>& a,
                       const std::pair<uint32_t, int32_t>& c) {
        return a.first != c.first ? a.first > c.first : a.second < c.second;
      };
      if (take < len) {
        std::nth_element(keyed.begin(), keyed.begin() + take, keyed.begin() + len, larger);
      }
      std::sort(keyed.begin(), keyed.begin() + take,
                [](const auto& a, const auto& c) { return a.second < c.second; });
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = b * k + j;
        if (j < take) {
          values[slot] = x[keyed[j].second];
          indices[slot] = keyed[j].second;
        } else {
          values[slot] = T{};
          indices[slot] = -1;
        }
      }
    }
  });
}

}  // namespace jss
