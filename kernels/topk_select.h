// Exact top-k by magnitude: radix select on the magnitude key, then one
// compaction pass. No sort of the whole input.
//
//   pass 1: histogram of the high digit of every key (16 bits for float32,
//           the whole 15-bit key for 16-bit floats) -> the digit of the k-th key;
//   pass 2 (float32 only): histogram of the low 15 bits of the keys whose high
//           digit equals it -> the exact k-th key T;
//   pass 3: emit every entry with key > T, and the first (k - #above) entries
//           with key == T in index order.
//
// The output is in ascending index order and ties are broken towards the lower
// index, so the selection is deterministic: the same input gives the same
// (values, indices) on every rank and every run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/float_bits.h"

namespace jss {

struct KthKey {
  uint32_t key;      // magnitude key of the k-th largest entry
  int64_t n_above;   // entries with a strictly larger key (< k)
};

// Finds the k-th largest magnitude key of x[0..n). Requires 1 <= k <= n.
template <typename T>
KthKey kth_magnitude_key(const T* x, int64_t n, int64_t k) {
  using Tr = FloatTraits<T>;
  constexpr int kLowBits = Tr::kKeyBits > 16 ? Tr::kKeyBits - 16 : 0;  // 15 for f32
  constexpr uint32_t kHighBuckets = 1u << (Tr::kKeyBits - kLowBits);   // 65536 / 32768
  std::vector<int64_t> hist(kHighBuckets, 0);
  for (int64_t i = 0; i < n; ++i) hist[Tr::key(x[i]) >> kLowBits]++;

  // Walk from the top bucket down until k entries are covered.
  int64_t above = 0;
  uint32_t digit = kHighBuckets - 1;
  for (;; --digit) {
    if (above + hist[digit] >= k) break;
    above += hist[digit];
  }
  if constexpr (kLowBits == 0) {
    return KthKey{digit, above};
  } else {
    constexpr uint32_t kLowBuckets = 1u << kLowBits;
    constexpr uint32_t kLowMask = kLowBuckets - 1;
    std::vector<int64_t> low(kLowBuckets, 0);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = Tr::key(x[i]);
      if ((key >> kLowBits) == digit) low[key & kLowMask]++;
    }
    uint32_t lo = kLowMask;
    for (;; --lo) {
      if (above + low[lo] >= k) break;
      above += low[lo];
    }
    return KthKey{(digit << kLowBits) | lo, above};
  }
}

// Writes the k entries of largest magnitude: values (in x's type) and int32
// indices, in ascending index order. Requires 0 <= k <= n, n < 2^31.
template <typename T>
void topk_by_magnitude(const T* x, int64_t n, int64_t k, T* values, int32_t* indices) {
  using Tr = FloatTraits<T>;
  if (k <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) { values[i] = x[i]; indices[i] = static_cast<int32_t>(i); }
    return;
  }
  const KthKey t = kth_magnitude_key(x, n, k);
  int64_t ties_left = k - t.n_above;
  int64_t out = 0;
  for (int64_t i = 0; i < n && out < k; ++i) {
    const uint32_t key = Tr::key(x[i]);
    if (key > t.key || (key == t.key && ties_left > 0)) {
      if (key == t.key) --ties_left;
      values[out] = x[i];
      indices[out] = static_cast<int32_t>(i);
      ++out;
    }
  }
}

}  // namespace jss

namespace jss {

// Bucketed top-k: the k largest magnitudes of every bucket of `bucket`
// consecutive entries (SparCML trains with k = 2..16 per 512). Output slot
// b * k + j belongs to bucket b; a last bucket shorter than k is padded with
// value 0 and index -1. Within a bucket, ties go to the lower index and the
// entries come in ascending index order, as in topk_by_magnitude.
template <typename T>
void bucket_topk_by_magnitude(const T* x, int64_t n, int64_t bucket, int64_t k, T* values,
                              int32_t* indices) {
  using Tr = FloatTraits<T>;
  const int64_t num_buckets = (n + bucket - 1) / bucket;
  std::vector<std::pair<uint32_t, int32_t>> keyed(static_cast<size_t>(bucket));
  for (int64_t b = 0; b < num_buckets; ++b) {
    const int64_t lo = b * bucket;
    const int64_t len = std::min(bucket, n - lo);
    const int64_t take = std::min(k, len);
    for (int64_t i = 0; i < len; ++i) {
      keyed[i] = {Tr::key(x[lo + i]), static_cast<int32_t>(lo + i)};
    }
    auto larger = [](const std::pair<uint32_t, int32_t>& a, const std::pair<uint32_t, int32_t>& c) {
      return a.first != c.first ? a.first > c.first : a.second < c.second;
    };
    if (take < len) std::nth_element(keyed.begin(), keyed.begin() + take, keyed.begin() + len, larger);
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
}

}  // namespace jss
