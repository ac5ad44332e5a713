// CUDA selection kernels: exact top-k by magnitude, k-th magnitude, threshold
// selection and bucketed top-k. Same results, bit for bit, as the CPU kernels
// (kernels/topk_select.h, kernels/threshold_select.h): output in ascending index
// order, ties at the k-th magnitude go to the lower index, NaN ranks above +inf.
//
// Exact top-k is a radix select on the magnitude key with 11-bit digits
// (AIR top-k style): float32 keys (31 bits) take passes of 11, 11 and 9 bits,
// 16-bit keys (15 bits) passes of 11 and 4. After each pass's histogram a
// one-block kernel scans it from the top digit down and writes the digit
// holding the k-th key into a RadixState in device memory, which the next pass
// reads: no host round trip, no stream sync. x is read twice in full:
//   1. histogram of the first digit (16-byte vector loads, tile by tile);
//   2. the filter pass: entries whose first digit is above the k-th key's are
//      selected (a bit in the `greater` mask); entries sharing it are the
//      candidates: their second digit is histogrammed and they are appended,
//      (key, index), to a candidate buffer;
//   3. the remaining digits come from the candidate buffer only, then its
//      entries above the k-th key join the greater mask and those equal to it
//      form the tie mask (a full read of x again only if the buffer overflowed:
//      heavy ties or flat data, never a wrong result);
//   4. the masks are compacted in index order (kernels/mask_compaction.cuh),
//      the first `ties` tied entries being kept.
//
// Threshold selection is one read of x: the mask of |x| >= t, then the same
// mask compaction, writing only the first `capacity` entries.
//
// The k-th magnitude (stride 1) reads x twice the same way: steps 1-3 without the
// masks (KthReads::kThree, the radix select's one read per digit, stays for
// comparison; a strided sample always takes it). The compaction's blocks take
// several tiles each (CompactGrid::kResident; kTilePerBlock, one block per tile,
// stays for comparison). A top-k zeroes its histograms, flag, tie mask and tile
// counts by one memset (they follow one another in the scratch): at 16M the
// launches, not the passes over x, are most of its time.
//
// Launchers take one scratch block (size from *_scratch_bytes) and a stream,
// enqueue everything on that stream and return the first launch error.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/cuda_common.cuh"
#include "kernels/float_bits.cuh"
#include "kernels/mask_compaction.cuh"
#include "kernels/scratch_layout.cuh"

namespace jss {
namespace cuda {

// --- digit plan and radix state (host + device, checked by tests/cuda_host) --

constexpr int kDigitBits = 11;
constexpr int kMaxBins = 1 << kDigitBits;

JSS_HD constexpr int radix_passes(int key_bits) { return (key_bits + kDigitBits - 1) / kDigitBits; }
// Lowest key bit of the digit of `pass` (pass 0 is the most significant digit).
JSS_HD constexpr int radix_shift(int key_bits, int pass) {
  return key_bits - kDigitBits * (pass + 1) < 0 ? 0 : key_bits - kDigitBits * (pass + 1);
}
JSS_HD constexpr int radix_width(int key_bits, int pass) {
  return key_bits - kDigitBits * pass - radix_shift(key_bits, pass);
}
JSS_HD uint32_t key_digit(uint32_t key, int shift, int width) {
  return (key >> shift) & ((1u << width) - 1u);
}

struct RadixState {
  uint32_t prefix;           // the digits of the k-th key found so far
  uint32_t mask;             // the key bits those digits cover
  unsigned long long ties;   // how many entries matching `prefix` are still to take (>= 1)
};

JSS_HD bool key_is_candidate(const RadixState& s, uint32_t key) { return (key & s.mask) == s.prefix; }

// Bins are walked from the top digit down; `above` candidates have a larger
// digit than this bin, which holds `count`. The bin holds the k-th key when the
// ties still to take fall inside it.
JSS_HD bool bin_holds_kth(unsigned long long above, unsigned long long count,
                          unsigned long long ties) {
  return above < ties && ties <= above + count;
}

JSS_HD void radix_state_take_digit(RadixState* s, uint32_t digit, int shift, int width,
                                   unsigned long long above) {
  s->prefix |= digit << shift;
  s->mask |= ((1u << width) - 1u) << shift;
  s->ties -= above;
}

// A thread of the choose step holds kPer consecutive bins counted from the top
// (r = r0 .. r0 + kPer - 1 is digit nbins - 1 - r) and `above`, the candidates
// in the bins before them. Returns true in the one thread whose bins hold the
// k-th key, with its digit and the candidates above that digit.
template <typename Count, int kPer>
JSS_HD bool find_kth_bin(const Count (&count)[kPer], int r0, int nbins, Count above, Count ties,
                         uint32_t* digit, Count* above_digit) {
  bool found = false;
  for (int j = 0; j < kPer; ++j) {
    const int r = r0 + j;
    if (r < nbins && bin_holds_kth(above, count[j], ties)) {
      *digit = static_cast<uint32_t>(nbins - 1 - r);
      *above_digit = above;
      found = true;
    }
    above += count[j];
  }
  return found;
}

JSS_HD long long num_tiles(long long n) { return (n + kTile - 1) / kTile; }

template <typename F>
JSS_HD bool passes_threshold(typename F::Bits b, uint32_t t) {
  const uint32_t key = F::widen(b) & 0x7fffffffu;
  return key >= t && key != 0;
}

// --- kernels -----------------------------------------------------------------
// (The ones that are not templates are static: each .cu file that includes this
// header, selection_cuda.cu and accumulate_cuda.cu, gets its own copy.)

constexpr int kHistThreads = 512;
constexpr int kHistMaxBlocks = 1024;
constexpr int kChooseThreads = 1024;
constexpr int kBucketThreads = 256;
constexpr int kBucketMaxBlocks = 65536;
constexpr int kFillThreads = 256;
constexpr int kFillMaxBlocks = 65536;

static_assert(kMaxBins % kChooseThreads == 0, "choose kernel covers the bins evenly");
static_assert(kMaxBins % kBucketThreads == 0, "bucket kernel covers the bins evenly");
static_assert(kBucketThreads < (1 << 16), "a bucket chunk's counts must fit in 16 bits");

static __global__ void radix_init_kernel(RadixState* state, unsigned long long k) {
  state->prefix = 0;
  state->mask = 0;
  state->ties = k;
}

// Histogram of the digit at `shift` of the candidates among x[i * stride],
// i < m, added into hist[0 .. 2^width).
template <typename F>
__global__ void __launch_bounds__(kHistThreads)
    radix_histogram_kernel(const typename F::Bits* __restrict__ x, long long m, long long stride,
                           const RadixState* __restrict__ state, int shift, int width,
                           unsigned long long* __restrict__ hist,
                           const unsigned int* __restrict__ only_if_set = nullptr) {
  // top-k's fallback for an overflowed candidate buffer: run only then
  if (only_if_set != nullptr && *only_if_set == 0) return;
  __shared__ unsigned int bins[kMaxBins];  // a block sees fewer than 2^32 entries
  const int nbins = 1 << width;
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const RadixState s = *state;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < m;
       i += step) {
    const uint32_t key = F::key(x[i * stride]);
    if (key_is_candidate(s, key)) atomicAdd(&bins[key_digit(key, shift, width)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) {
    if (bins[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(bins[b]));
  }
}

// One block: finds the bin holding the k-th key and narrows the state to it.
static __global__ void __launch_bounds__(kChooseThreads)
    radix_choose_kernel(const unsigned long long* __restrict__ hist, int shift, int width,
                        RadixState* state) {
  using Scan = cub::BlockScan<unsigned long long, kChooseThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  constexpr int kPerThread = kMaxBins / kChooseThreads;
  const int nbins = 1 << width;
  const unsigned long long ties = state->ties;  // read by all before the one write below
  unsigned long long count[kPerThread];
  unsigned long long sum = 0;
  for (int j = 0; j < kPerThread; ++j) {
    const int r = threadIdx.x * kPerThread + j;  // r-th bin from the top
    count[j] = r < nbins ? hist[nbins - 1 - r] : 0;
    sum += count[j];
  }
  unsigned long long above;
  Scan(scan_storage).ExclusiveSum(sum, above);
  __syncthreads();
  uint32_t digit;
  unsigned long long above_digit;
  if (find_kth_bin(count, threadIdx.x * kPerThread, nbins, above, ties, &digit, &above_digit)) {
    radix_state_take_digit(state, digit, shift, width, above_digit);
  }
}

static __global__ void store_float_kernel(float* out, float value) { out[0] = value; }

template <typename F>
__global__ void kth_to_float_kernel(const RadixState* __restrict__ state, float* out) {
  out[0] = key_to_float<F>(state->prefix);
}

// --- the passes over x (tile by tile, 16-byte loads) ----------------------

// Candidates of the top-k filter pass: the entries whose first digit equals
// the k-th key's, as (key, index). Each warp of the filter pass appends to its
// own region of `region` slots (no atomics, no block barriers in the pass):
// slot i is filled when i % region < warp_count[i / region]. A warp that finds
// more sets `overflow`; then the later steps read x again instead
// (radix_histogram_kernel and overflow_mark_kernel run only then), so the
// result never depends on the buffer size.
struct CandidateBuffer {
  uint32_t* keys;
  int32_t* index;
  unsigned int* warp_count;  // candidates each warp found (may exceed region)
  unsigned int* overflow;    // device flag, zeroed before the filter pass
  long long region;          // slots per warp
  long long slots;           // warps * region
  // nullptr, or a device flag: the buffer is read only where it is nonzero (the
  // fused accumulate-and-select, kernels/fused_accumulate.cuh, fills either this
  // buffer or its hint list, and says which on the device)
  const unsigned int* only_if_set = nullptr;
};

// Whether a candidate kernel reads the buffer: it did not overflow and its gate is open.
__device__ __forceinline__ bool candidates_usable(const CandidateBuffer& cand) {
  return *cand.overflow == 0 && (cand.only_if_set == nullptr || *cand.only_if_set != 0);
}

// A launch gate: kernels given a device flag run only where it is nonzero (every
// block returns at once otherwise), so the device picks between enqueued paths.
__device__ __forceinline__ bool gate_closed(const unsigned int* only_if_set) {
  return only_if_set != nullptr && *only_if_set == 0;
}

JSS_HD bool candidate_slot_filled(const unsigned int* warp_count, long long region, long long i) {
  const unsigned long long have = warp_count[i / region];
  return static_cast<unsigned long long>(i % region) < have;
}

// Normal data at 1% keeps ~0.7% of N as candidates; n / 16 leaves room.
inline long long candidate_capacity(long long n) {
  const long long at_least = 1 << 16;
  const long long c = n / 16 > at_least ? n / 16 : at_least;
  return c < n ? c : n;
}

constexpr int kTileWarps = kTileThreads / 32;

__device__ __forceinline__ void flush_bins(const unsigned int* bins, int nbins,
                                           unsigned long long* __restrict__ hist) {
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) {
    if (bins[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(bins[b]));
  }
}

// Adds a warp's count of greater / equal bits to the tile's packed count.
__device__ __forceinline__ void add_tile_count(unsigned long long* __restrict__ tile_count,
                                               long long tile, uint32_t greater, uint32_t equal) {
  const uint32_t g = warp_sum(greater), e = warp_sum(equal);
  if ((threadIdx.x & 31) == 0 && (g | e) != 0) atomicAdd(&tile_count[tile], pack_counts(g, e));
}

// Top-k pass 0: histogram of the first digit of every entry.
template <typename F>
__global__ void __launch_bounds__(kTileThreads)
    tile_histogram_kernel(const typename F::Bits* __restrict__ x, long long n, int shift,
                          int width, unsigned long long* __restrict__ hist,
                          const unsigned int* __restrict__ only_if_set = nullptr) {
  using Bits = typename F::Bits;
  if (gate_closed(only_if_set)) return;  // the whole block
  __shared__ unsigned int bins[kMaxBins];
  const int nbins = 1 << width;
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const long long tiles = num_tiles(n);
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    Bits items[kTileItems];
    const uint32_t valid = load_tile_items<F>(x, n, tile * kTile, items);
JSS_UNROLL
    for (int q = 0; q < kTileItems; ++q) {
      if ((valid >> q) & 1u) atomicAdd(&bins[key_digit(F::key(items[q]), shift, width)], 1u);
    }
  }
  __syncthreads();
  flush_bins(bins, nbins, hist);
}

// Top-k pass 1, once the first digit d of the k-th key is in `state`: entries
// with a larger first digit get their bit in greater_mask and are counted in
// tile_count (when given: the k-th magnitude alone needs neither); entries
// with first digit d are the candidates: their second digit goes to `hist`
// and each warp appends them to its region of `cand`.
template <typename F>
__global__ void __launch_bounds__(kTileThreads, 5)  // 5 blocks per SM: registers <= 51
    topk_filter_kernel(const typename F::Bits* __restrict__ x, long long n,
                       const RadixState* __restrict__ state, int shift0, int width0, int shift1,
                       int width1, unsigned long long* __restrict__ hist,
                       uint32_t* __restrict__ greater_mask,
                       unsigned long long* __restrict__ tile_count, CandidateBuffer cand,
                       const unsigned int* __restrict__ only_if_set = nullptr) {
  using Bits = typename F::Bits;
  if (gate_closed(only_if_set)) return;  // the whole block
  __shared__ unsigned int bins[kMaxBins];
  const int nbins = 1 << width1;
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const uint32_t first = key_digit(state->prefix, shift0, width0);
  const long long tiles = num_tiles(n);
  const int lane = threadIdx.x & 31;
  const long long warp = static_cast<long long>(blockIdx.x) * kTileWarps + (threadIdx.x >> 5);
  const long long region_start = warp * cand.region;
  unsigned int found = 0;  // this warp's candidates so far (the same in every lane)
  // the loop bounds are the same for the whole block: every lane reaches the shuffles
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    Bits items[kTileItems];
    const uint32_t valid = load_tile_items<F>(x, n, tile * kTile, items);
    uint32_t greater_bits = 0, cand_bits = 0;
JSS_UNROLL
    for (int q = 0; q < kTileItems; ++q) {
      const uint32_t key = F::key(items[q]);
      const uint32_t digit = key_digit(key, shift0, width0);
      const bool in = ((valid >> q) & 1u) != 0;
      greater_bits |= (in && digit > first ? 1u : 0u) << q;
      if (in && digit == first) {
        cand_bits |= 1u << q;
        atomicAdd(&bins[key_digit(key, shift1, width1)], 1u);
      }
    }
    if (greater_mask != nullptr) {
      store_tile_mask<F>(greater_bits, greater_mask + tile * kTileWords);
      add_tile_count(tile_count, tile, static_cast<uint32_t>(popcount32(greater_bits)), 0u);
    }
    // the warp's append: an inclusive scan of the lanes' counts
    const uint32_t mine = static_cast<uint32_t>(popcount32(cand_bits));
    uint32_t upto = mine;
JSS_UNROLL
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, upto, o);
      if (lane >= o) upto += v;
    }
    const uint32_t warp_total = __shfl_sync(0xffffffffu, upto, 31);
    unsigned long long slot = static_cast<unsigned long long>(found) + (upto - mine);
JSS_UNROLL
    for (int q = 0; q < kTileItems; ++q) {  // constant q: items stay in registers
      if ((cand_bits >> q) & 1u) {
        if (slot < static_cast<unsigned long long>(cand.region)) {
          cand.keys[region_start + slot] = F::key(items[q]);
          cand.index[region_start + slot] =
              static_cast<int32_t>(tile * kTile + tile_item_offset<F>(threadIdx.x, q));
        }
        ++slot;
      }
    }
    found += warp_total;
  }
  if (lane == 0) {
    cand.warp_count[warp] = found;
    if (found > static_cast<unsigned long long>(cand.region)) atomicOr(cand.overflow, 1u);
  }
  __syncthreads();
  flush_bins(bins, nbins, hist);
}

// Later top-k passes: histogram of the digit at `shift` of the buffered
// candidates that match the state (nothing if the buffer overflowed).
static __global__ void __launch_bounds__(kHistThreads)
    candidate_histogram_kernel(CandidateBuffer cand, const RadixState* __restrict__ state,
                               int shift, int width, unsigned long long* __restrict__ hist) {
  if (!candidates_usable(cand)) return;  // the whole block
  __shared__ unsigned int bins[kMaxBins];
  const int nbins = 1 << width;
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const RadixState s = *state;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < cand.slots; i += step) {
    if (!candidate_slot_filled(cand.warp_count, cand.region, i)) continue;
    const uint32_t key = cand.keys[i];
    if (key_is_candidate(s, key)) atomicAdd(&bins[key_digit(key, shift, width)], 1u);
  }
  __syncthreads();
  flush_bins(bins, nbins, hist);
}

// Sets entry i's bit in the greater or equal mask and counts it in its tile.
__device__ __forceinline__ void mark_entry(uint32_t key, uint32_t kth, long long i,
                                           uint32_t* __restrict__ greater_mask,
                                           uint32_t* __restrict__ equal_mask,
                                           unsigned long long* __restrict__ tile_count) {
  const uint32_t bit = 1u << (i & 31);
  if (key > kth) {
    atomicOr(&greater_mask[i >> 5], bit);
    atomicAdd(&tile_count[i / kTile], pack_counts(1, 0));
  } else if (key == kth) {
    atomicOr(&equal_mask[i >> 5], bit);
    atomicAdd(&tile_count[i / kTile], pack_counts(0, 1));
  }
}

// With the k-th key known: buffered candidates above it join the greater
// mask, those equal to it form the equal (tie) mask.
static __global__ void candidate_mark_kernel(CandidateBuffer cand,
                                             const RadixState* __restrict__ state,
                                             uint32_t* __restrict__ greater_mask,
                                             uint32_t* __restrict__ equal_mask,
                                             unsigned long long* __restrict__ tile_count) {
  if (!candidates_usable(cand)) return;
  const uint32_t kth = state->prefix;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < cand.slots; i += step) {
    if (!candidate_slot_filled(cand.warp_count, cand.region, i)) continue;
    mark_entry(cand.keys[i], kth, cand.index[i], greater_mask, equal_mask, tile_count);
  }
}

// The same from x, only when the candidate buffer overflowed: the entries that
// share the k-th key's first digit (first_mask covers its bits).
template <typename F>
__global__ void overflow_mark_kernel(const typename F::Bits* __restrict__ x, long long n,
                                     const RadixState* __restrict__ state,
                                     const unsigned int* __restrict__ overflow,
                                     uint32_t first_mask, uint32_t* __restrict__ greater_mask,
                                     uint32_t* __restrict__ equal_mask,
                                     unsigned long long* __restrict__ tile_count) {
  if (*overflow == 0) return;
  const uint32_t kth = state->prefix;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    const uint32_t key = F::key(x[i]);
    if ((key & first_mask) == (kth & first_mask)) {
      mark_entry(key, kth, i, greater_mask, equal_mask, tile_count);
    }
  }
}

// Threshold selection's one read of x: the mask of |x| >= threshold, x != 0,
// and each tile's count (tile_count zeroed before).
template <typename F>
__global__ void __launch_bounds__(kTileThreads)
    threshold_mask_kernel(const typename F::Bits* __restrict__ x, long long n,
                          const float* __restrict__ threshold, uint32_t* __restrict__ mask,
                          unsigned long long* __restrict__ tile_count) {
  using Bits = typename F::Bits;
  const uint32_t t = threshold_key(*threshold);
  const long long tiles = num_tiles(n);
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    Bits items[kTileItems];
    const uint32_t valid = load_tile_items<F>(x, n, tile * kTile, items);
    uint32_t bits = 0;
JSS_UNROLL
    for (int q = 0; q < kTileItems; ++q) {
      bits |= (((valid >> q) & 1u) != 0 && passes_threshold<F>(items[q], t) ? 1u : 0u) << q;
    }
    store_tile_mask<F>(bits, mask + tile * kTileWords);
    add_tile_count(tile_count, tile, static_cast<uint32_t>(popcount32(bits)), 0u);
  }
}

// selected = count_out = the number of entries in the greater mask (< 2^31).
static __global__ void threshold_total_kernel(const unsigned long long* __restrict__ offset,
                                              const unsigned long long* __restrict__ count,
                                              long long tiles, long long* __restrict__ selected,
                                              int32_t* __restrict__ count_out) {
  const long long total =
      tiles > 0 ? static_cast<long long>(packed_greater(offset[tiles - 1] + count[tiles - 1])) : 0;
  *selected = total;
  *count_out = static_cast<int32_t>(total);
}

// k >= n: every entry, in index order.
template <typename F>
__global__ void copy_all_kernel(const typename F::Bits* __restrict__ x, long long n,
                                typename F::Bits* __restrict__ values,
                                int32_t* __restrict__ indices) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    values[i] = x[i];
    indices[i] = static_cast<int32_t>(i);
  }
}

// Slots [total, capacity) get value 0 and index -1.
template <typename F>
__global__ void threshold_pad_kernel(const long long* __restrict__ selected, long long capacity,
                                     typename F::Bits* __restrict__ values,
                                     int32_t* __restrict__ indices) {
  const long long first = *selected;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; j < capacity;
       j += step) {
    if (j >= first) {
      values[j] = typename F::Bits(0);
      indices[j] = -1;
    }
  }
}

// One block per bucket (grid-stride over buckets): radix select inside the
// bucket with a shared-memory histogram, then an ordered compaction in chunks
// of one entry per thread. Slots b * k + [take, k) are padded with 0 / -1.
template <typename F>
__global__ void __launch_bounds__(kBucketThreads)
    bucket_topk_kernel(const typename F::Bits* __restrict__ x, long long n, long long bucket,
                       long long k, long long num_buckets, typename F::Bits* __restrict__ values,
                       int32_t* __restrict__ indices) {
  using Bits = typename F::Bits;
  using Scan = cub::BlockScan<uint32_t, kBucketThreads>;
  __shared__ uint32_t bins[kMaxBins];
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ uint32_t found_digit;
  __shared__ uint32_t found_above;
  constexpr int kPerThread = kMaxBins / kBucketThreads;
  // Every loop bound below is the same for all threads of the block, so the
  // __syncthreads inside the loops are reached by all of them.
  for (long long b = blockIdx.x; b < num_buckets; b += gridDim.x) {
    const long long lo = b * bucket;
    const long long len = bucket < n - lo ? bucket : n - lo;
    const long long take = k < len ? k : len;
    const Bits* xb = x + lo;
    Bits* vb = values + b * k;
    int32_t* ib = indices + b * k;
    const bool take_all = take == len;
    uint32_t kth = 0;
    uint32_t ties = static_cast<uint32_t>(take);  // take <= len < 2^31
    if (!take_all) {
      uint32_t mask = 0;
      for (int pass = 0; pass < radix_passes(F::kKeyBits); ++pass) {
        const int shift = radix_shift(F::kKeyBits, pass);
        const int width = radix_width(F::kKeyBits, pass);
        const int nbins = 1 << width;
        for (int r = threadIdx.x; r < nbins; r += kBucketThreads) bins[r] = 0;
        __syncthreads();
        for (long long i = threadIdx.x; i < len; i += kBucketThreads) {
          const uint32_t key = F::key(xb[i]);
          if ((key & mask) == kth) atomicAdd(&bins[key_digit(key, shift, width)], 1u);
        }
        __syncthreads();
        uint32_t count[kPerThread];
        uint32_t sum = 0;
        for (int j = 0; j < kPerThread; ++j) {
          const int r = threadIdx.x * kPerThread + j;
          count[j] = r < nbins ? bins[nbins - 1 - r] : 0;
          sum += count[j];
        }
        uint32_t above;
        Scan(scan_storage).ExclusiveSum(sum, above);
        uint32_t digit, above_digit;
        if (find_kth_bin(count, threadIdx.x * kPerThread, nbins, above, ties, &digit,
                         &above_digit)) {
          found_digit = digit;
          found_above = above_digit;
        }
        __syncthreads();
        kth |= found_digit << shift;
        mask |= static_cast<uint32_t>(nbins - 1) << shift;
        ties -= found_above;
        __syncthreads();  // found_* and bins are rewritten by the next pass
      }
    }
    unsigned long long greater_total = 0, equal_total = 0;
    for (long long start = 0; start < len; start += kBucketThreads) {
      const long long i = start + threadIdx.x;
      Bits v = Bits(0);
      bool above = false, equal = false;
      if (i < len) {
        v = xb[i];
        const uint32_t key = F::key(v);
        above = take_all || key > kth;
        equal = !take_all && key == kth;
      }
      uint32_t before, chunk_total;
      Scan(scan_storage).ExclusiveSum(above ? (1u << 16) : (equal ? 1u : 0u), before, chunk_total);
      const unsigned long long greater = greater_total + (before >> 16);
      const unsigned long long equal_before = equal_total + (before & 0xffffu);
      if (above || (equal && equal_before < ties)) {
        const unsigned long long slot = topk_slot(greater, equal_before, ties);
        if (slot < static_cast<unsigned long long>(take)) {
          vb[slot] = v;
          ib[slot] = static_cast<int32_t>(lo + i);
        }
      }
      greater_total += chunk_total >> 16;
      equal_total += chunk_total & 0xffffu;
      __syncthreads();  // scan_storage is reused by the next chunk
      if (topk_slot(greater_total, equal_total, ties) >= static_cast<unsigned long long>(take)) {
        break;  // the bucket's selection is complete (same decision in every thread)
      }
    }
    for (long long j = take + threadIdx.x; j < k; j += kBucketThreads) {
      vb[j] = Bits(0);
      ib[j] = -1;
    }
    __syncthreads();  // shared memory is reused by the next bucket
  }
}

// --- launchers ---------------------------------------------------------------

// Scratch for radix select: the state and one histogram per pass.
struct RadixScratch {
  size_t state = 0, hist = 0;
  void reserve(ScratchLayout* layout, int key_bits) {
    state = layout->add(sizeof(RadixState));
    hist = layout->add(sizeof(unsigned long long) * kMaxBins * radix_passes(key_bits));
  }
};

// Leaves in `state` the k-th largest key of x[i * stride], i < m (1 <= k <= m).
template <typename F>
cudaError_t radix_select_launch(const typename F::Bits* x, long long m, long long stride,
                                long long k, RadixState* state, unsigned long long* hist,
                                cudaStream_t stream) {
  constexpr int kPasses = radix_passes(F::kKeyBits);
  JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      hist, 0, sizeof(unsigned long long) * kMaxBins * kPasses, stream));
  radix_init_kernel<<<1, 1, 0, stream>>>(state, static_cast<unsigned long long>(k));
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  const unsigned int grid = grid_for(m, kHistThreads, kHistMaxBlocks);
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = radix_shift(F::kKeyBits, pass);
    const int width = radix_width(F::kKeyBits, pass);
    unsigned long long* pass_hist = hist + static_cast<size_t>(pass) * kMaxBins;
    radix_histogram_kernel<F><<<grid, kHistThreads, 0, stream>>>(x, m, stride, state, shift, width,
                                                                 pass_hist);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(pass_hist, shift, width, state);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  return cudaSuccess;
}

inline size_t scan_temp_bytes(long long items) {
  size_t bytes = 0;
  cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const unsigned long long*>(nullptr),
                                static_cast<unsigned long long*>(nullptr),
                                static_cast<int>(items));
  return bytes;
}

// Masks, packed per-tile counts, their offsets and the scan's temporary
// storage of a mask compaction over n entries (with or without an equal mask).
// The parts a selection zeroes come first, one after the other: the equal mask and
// the tile counts (then the greater mask, which the fused accumulator pass zeroes
// too): one memset with whatever precedes them (TopkScratch).
struct MaskScratch {
  size_t greater = 0, equal = 0, tile_count = 0, tile_offset = 0, scan_temp = 0,
         scan_temp_bytes = 0, mask_bytes = 0, tile_count_bytes = 0;
  void reserve(ScratchLayout* layout, long long n, bool with_equal) {
    const size_t tiles = static_cast<size_t>(num_tiles(n));
    mask_bytes = sizeof(uint32_t) * kTileWords * tiles;
    tile_count_bytes = sizeof(unsigned long long) * tiles;
    if (with_equal) equal = layout->add(mask_bytes);
    tile_count = layout->add(tile_count_bytes);
    greater = layout->add(mask_bytes);
    tile_offset = layout->add(sizeof(unsigned long long) * tiles);
    scan_temp_bytes = jss::cuda::scan_temp_bytes(static_cast<long long>(tiles));
    scan_temp = layout->add(scan_temp_bytes);
  }
};

// How mask_compact_kernel's blocks take the tiles: several per block, a resident
// grid (the default), or one block per tile (the kernel before; kept for the
// campaign's comparison, tests/cuda_host/emulate_kernels.cu --bench).
enum class CompactGrid { kResident, kTilePerBlock };

// Scans the tile counts (written by the pass that set the bits), then writes
// the selected entries (slots < limit); `selected`/`count_out`, when given,
// get the greater mask's total.
template <typename Bits>
cudaError_t mask_compact_launch(const Bits* x, long long n, const MaskScratch& m, bool with_equal,
                                void* scratch, const unsigned long long* ties, long long limit,
                                Bits* values, int32_t* indices, cudaStream_t stream,
                                long long* selected = nullptr, int32_t* count_out = nullptr,
                                CompactGrid grid = CompactGrid::kResident) {
  const long long tiles = num_tiles(n);
  const uint32_t* greater = ScratchLayout::at<uint32_t>(scratch, m.greater);
  const uint32_t* equal = with_equal ? ScratchLayout::at<uint32_t>(scratch, m.equal) : nullptr;
  auto* tile_count = ScratchLayout::at<unsigned long long>(scratch, m.tile_count);
  auto* tile_offset = ScratchLayout::at<unsigned long long>(scratch, m.tile_offset);
  size_t temp_bytes = m.scan_temp_bytes;
  JSS_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(ScratchLayout::at<void>(scratch, m.scan_temp),
                                                         temp_bytes, tile_count, tile_offset,
                                                         static_cast<int>(tiles), stream));
  if (selected != nullptr) {
    threshold_total_kernel<<<1, 1, 0, stream>>>(tile_offset, tile_count, tiles, selected,
                                                count_out);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  if (limit > 0) {
    const unsigned int blocks = grid == CompactGrid::kTilePerBlock
                                    ? static_cast<unsigned int>(tiles)
                                    : resident_grid(mask_compact_kernel<Bits>, kTileWords, tiles);
    mask_compact_kernel<Bits><<<blocks, kTileWords, 0, stream>>>(
        x, greater, equal, tile_offset, ties, limit, tiles, values, indices);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  return cudaSuccess;
}

// Top-k scratch layout (only used when 0 < k < n).
struct TopkScratch {
  RadixScratch radix;
  size_t flags = 0, warp_count = 0, cand_keys = 0, cand_index = 0;
  long long cand_capacity = 0;
  MaskScratch masks;
  size_t total = 0;
  TopkScratch(long long n, int key_bits) {
    ScratchLayout layout;
    // zeroed before a selection, one after the other (zeroed_bytes): the
    // histograms, the overflow flag, the equal mask and the tile counts
    radix.reserve(&layout, key_bits);
    flags = layout.add(sizeof(unsigned int));
    masks.reserve(&layout, n, true);
    // at least one slot for every warp the filter pass can have
    const long long max_warps = static_cast<long long>(kTileWarps) * num_tiles(n);
    cand_capacity = std::max(candidate_capacity(n), max_warps);
    // one count per warp of the filter pass: at most one block per tile
    warp_count = layout.add(sizeof(unsigned int) * kTileWarps * static_cast<size_t>(num_tiles(n)));
    cand_keys = layout.add(sizeof(uint32_t) * static_cast<size_t>(cand_capacity));
    cand_index = layout.add(sizeof(int32_t) * static_cast<size_t>(cand_capacity));
    total = layout.total();
  }
  // From the histograms to the end of the tile counts (or, with_greater, of the
  // greater mask): what a selection zeroes, by one memset from radix.hist.
  size_t zeroed_bytes(bool with_greater) const {
    return (with_greater ? masks.greater + masks.mask_bytes
                         : masks.tile_count + masks.tile_count_bytes) - radix.hist;
  }
  // The candidate regions of a filter pass run with `blocks` blocks.
  CandidateBuffer candidates(void* scratch, unsigned int blocks) const {
    const long long warps = static_cast<long long>(blocks) * kTileWarps;
    const long long region = cand_capacity / warps;  // >= 1: warps <= kTileWarps * tiles
    return CandidateBuffer{ScratchLayout::at<uint32_t>(scratch, cand_keys),
                           ScratchLayout::at<int32_t>(scratch, cand_index),
                           ScratchLayout::at<unsigned int>(scratch, warp_count),
                           ScratchLayout::at<unsigned int>(scratch, flags), region,
                           region * warps};
  }
};

template <typename F>
size_t topk_scratch_bytes(long long n, long long k) {
  if (k <= 0 || k >= n) return 0;
  return TopkScratch(n, F::kKeyBits).total;
}

// values / indices hold k entries. Requires 0 <= k <= n < 2^31.
template <typename F>
cudaError_t topk_launch(const typename F::Bits* x, long long n, long long k,
                        typename F::Bits* values, int32_t* indices, void* scratch,
                        cudaStream_t stream, CompactGrid grid = CompactGrid::kResident) {
  if (k <= 0) return cudaSuccess;
  if (k >= n) {
    copy_all_kernel<F><<<grid_for(n, kFillThreads, kFillMaxBlocks), kFillThreads, 0, stream>>>(
        x, n, values, indices);
    return last_launch_error();
  }
  constexpr int kPasses = radix_passes(F::kKeyBits);
  static_assert(kPasses >= 2, "the filter pass finds the second digit");
  const TopkScratch s(n, F::kKeyBits);
  const long long tiles = num_tiles(n);
  RadixState* state = ScratchLayout::at<RadixState>(scratch, s.radix.state);
  auto* hist = ScratchLayout::at<unsigned long long>(scratch, s.radix.hist);
  uint32_t* greater = ScratchLayout::at<uint32_t>(scratch, s.masks.greater);
  uint32_t* equal = ScratchLayout::at<uint32_t>(scratch, s.masks.equal);
  auto* tile_count = ScratchLayout::at<unsigned long long>(scratch, s.masks.tile_count);
  const unsigned int filter_grid = resident_grid(topk_filter_kernel<F>, kTileThreads, tiles);
  const CandidateBuffer cand = s.candidates(scratch, filter_grid);

  // the histograms, the overflow flag, the equal mask and the tile counts: one memset
  // (four launches before; the launches dominate at 16M)
  JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(hist, 0, s.zeroed_bytes(false), stream));
  radix_init_kernel<<<1, 1, 0, stream>>>(state, static_cast<unsigned long long>(k));
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  const int shift0 = radix_shift(F::kKeyBits, 0), width0 = radix_width(F::kKeyBits, 0);
  const int shift1 = radix_shift(F::kKeyBits, 1), width1 = radix_width(F::kKeyBits, 1);
  // 1. first digit
  tile_histogram_kernel<F><<<resident_grid(tile_histogram_kernel<F>, kTileThreads, tiles),
                             kTileThreads, 0, stream>>>(x, n, shift0, width0, hist);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(hist, shift0, width0, state);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  // 2. filter: greater mask and its tile counts, candidates, second digit
  topk_filter_kernel<F><<<filter_grid, kTileThreads, 0, stream>>>(
      x, n, state, shift0, width0, shift1, width1, hist + kMaxBins, greater, tile_count, cand);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(hist + kMaxBins, shift1, width1, state);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  // 3. remaining digits from the candidates (from x if they overflowed)
  for (int pass = 2; pass < kPasses; ++pass) {
    const int shift = radix_shift(F::kKeyBits, pass), width = radix_width(F::kKeyBits, pass);
    unsigned long long* pass_hist = hist + static_cast<size_t>(pass) * kMaxBins;
    candidate_histogram_kernel<<<resident_grid(candidate_histogram_kernel, kHistThreads,
                                               grid_for(cand.slots, kHistThreads, kHistMaxBlocks)),
                                 kHistThreads, 0, stream>>>(cand, state, shift, width, pass_hist);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    radix_histogram_kernel<F><<<resident_grid(radix_histogram_kernel<F>, kHistThreads,
                                              grid_for(n, kHistThreads, kHistMaxBlocks)),
                                kHistThreads, 0, stream>>>(x, n, 1, state, shift, width,
                                                           pass_hist, cand.overflow);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(pass_hist, shift, width, state);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  // the candidates above / equal to the k-th key join the masks and counts
  candidate_mark_kernel<<<resident_grid(candidate_mark_kernel, kFillThreads,
                                        grid_for(cand.slots, kFillThreads, kFillMaxBlocks)),
                          kFillThreads, 0, stream>>>(cand, state, greater, equal, tile_count);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  const uint32_t first_mask = ((1u << width0) - 1u) << shift0;
  overflow_mark_kernel<F><<<resident_grid(overflow_mark_kernel<F>, kFillThreads,
                                          grid_for(n, kFillThreads, kFillMaxBlocks)),
                            kFillThreads, 0, stream>>>(x, n, state, cand.overflow, first_mask,
                                                       greater, equal, tile_count);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  // 4. ordered compaction
  return mask_compact_launch<typename F::Bits>(x, n, s.masks, true, scratch, &state->ties, k,
                                               values, indices, stream, nullptr, nullptr, grid);
}

// How kth_magnitude reads x (stride 1): twice (the default), as the top-k finds its
// k-th key (the first digit's histogram, then the filter pass that buffers the
// candidates and histograms their second digit; the last digit from the buffer),
// or once per digit (the radix select over all of x; the strided sample always
// takes it). kThree is kept for the campaign's comparison.
enum class KthReads { kTwo, kThree };

// The two-read k-th magnitude's scratch: the radix state and histograms, the
// candidate buffer's overflow flag (zeroed with the histograms: they follow one
// another), its warp counts and slots.
struct KthScratch {
  RadixScratch radix;
  size_t flags = 0, warp_count = 0, cand_keys = 0, cand_index = 0, total = 0;
  long long cand_capacity = 0;
  KthScratch(long long n, int key_bits) {
    ScratchLayout layout;
    radix.reserve(&layout, key_bits);
    flags = layout.add(sizeof(unsigned int));
    const long long max_warps = static_cast<long long>(kTileWarps) * num_tiles(n);
    cand_capacity = std::max(candidate_capacity(n), max_warps);
    warp_count = layout.add(sizeof(unsigned int) * static_cast<size_t>(max_warps));
    cand_keys = layout.add(sizeof(uint32_t) * static_cast<size_t>(cand_capacity));
    cand_index = layout.add(sizeof(int32_t) * static_cast<size_t>(cand_capacity));
    total = layout.total();
  }
  CandidateBuffer candidates(void* scratch, unsigned int blocks) const {
    const long long warps = static_cast<long long>(blocks) * kTileWarps;
    const long long region = cand_capacity / warps;  // >= 1: warps <= kTileWarps * tiles
    return CandidateBuffer{ScratchLayout::at<uint32_t>(scratch, cand_keys),
                           ScratchLayout::at<int32_t>(scratch, cand_index),
                           ScratchLayout::at<unsigned int>(scratch, warp_count),
                           ScratchLayout::at<unsigned int>(scratch, flags), region,
                           region * warps};
  }
};

JSS_HD bool kth_in_two_reads(long long stride, long long k, KthReads reads) {
  return stride == 1 && k >= 1 && reads == KthReads::kTwo;
}

// k-th magnitude of the strided sample, as float32 (0 <= k <= ceil(n / stride));
// k = 0 gives +inf (a threshold above every number: nothing is selected).
template <typename F>
size_t kth_magnitude_scratch_bytes(long long n, long long stride, long long k,
                                   KthReads reads = KthReads::kTwo) {
  if (k <= 0) return 0;
  if (kth_in_two_reads(stride, k, reads)) return KthScratch(n, F::kKeyBits).total;
  ScratchLayout layout;
  RadixScratch radix;
  radix.reserve(&layout, F::kKeyBits);
  return layout.total();
}

// The k-th key of x (1 <= k <= n) into `state` in two reads of x (KthReads::kTwo).
template <typename F>
cudaError_t kth_two_reads_launch(const typename F::Bits* x, long long n, long long k,
                                 RadixState* state, void* scratch, cudaStream_t stream) {
  constexpr int kPasses = radix_passes(F::kKeyBits);
  static_assert(kPasses >= 2, "the filter pass finds the second digit");
  const KthScratch s(n, F::kKeyBits);
  const long long tiles = num_tiles(n);
  auto* hist = ScratchLayout::at<unsigned long long>(scratch, s.radix.hist);
  const unsigned int filter_grid = resident_grid(topk_filter_kernel<F>, kTileThreads, tiles);
  const CandidateBuffer cand = s.candidates(scratch, filter_grid);
  // the histograms and the overflow flag, one after the other: one memset
  JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(hist, 0, s.flags + sizeof(unsigned int) - s.radix.hist,
                                           stream));
  radix_init_kernel<<<1, 1, 0, stream>>>(state, static_cast<unsigned long long>(k));
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  const int shift0 = radix_shift(F::kKeyBits, 0), width0 = radix_width(F::kKeyBits, 0);
  const int shift1 = radix_shift(F::kKeyBits, 1), width1 = radix_width(F::kKeyBits, 1);
  tile_histogram_kernel<F><<<resident_grid(tile_histogram_kernel<F>, kTileThreads, tiles),
                             kTileThreads, 0, stream>>>(x, n, shift0, width0, hist);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(hist, shift0, width0, state);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  // the filter pass without masks: the candidates and their second digit only
  topk_filter_kernel<F><<<filter_grid, kTileThreads, 0, stream>>>(
      x, n, state, shift0, width0, shift1, width1, hist + kMaxBins, nullptr, nullptr, cand);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(hist + kMaxBins, shift1, width1, state);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  for (int pass = 2; pass < kPasses; ++pass) {  // from the candidates (x where they overflowed)
    const int shift = radix_shift(F::kKeyBits, pass), width = radix_width(F::kKeyBits, pass);
    unsigned long long* pass_hist = hist + static_cast<size_t>(pass) * kMaxBins;
    candidate_histogram_kernel<<<resident_grid(candidate_histogram_kernel, kHistThreads,
                                               grid_for(cand.slots, kHistThreads, kHistMaxBlocks)),
                                 kHistThreads, 0, stream>>>(cand, state, shift, width, pass_hist);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    radix_histogram_kernel<F><<<resident_grid(radix_histogram_kernel<F>, kHistThreads,
                                              grid_for(n, kHistThreads, kHistMaxBlocks)),
                                kHistThreads, 0, stream>>>(x, n, 1, state, shift, width,
                                                           pass_hist, cand.overflow);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(pass_hist, shift, width, state);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  return cudaSuccess;
}

template <typename F>
cudaError_t kth_magnitude_launch(const typename F::Bits* x, long long n, long long stride,
                                 long long k, float* out, void* scratch, cudaStream_t stream,
                                 KthReads reads = KthReads::kTwo) {
  if (k <= 0) {
    store_float_kernel<<<1, 1, 0, stream>>>(out, float_from_bits(0x7f800000u));
    return last_launch_error();
  }
  ScratchLayout layout;
  RadixScratch radix;
  radix.reserve(&layout, F::kKeyBits);  // the state at the same offset in both layouts
  RadixState* state = ScratchLayout::at<RadixState>(scratch, radix.state);
  if (kth_in_two_reads(stride, k, reads)) {
    JSS_CUDA_RETURN_IF_ERROR(kth_two_reads_launch<F>(x, n, k, state, scratch, stream));
  } else {
    const long long m = (n + stride - 1) / stride;
    JSS_CUDA_RETURN_IF_ERROR(radix_select_launch<F>(
        x, m, stride, k, state, ScratchLayout::at<unsigned long long>(scratch, radix.hist),
        stream));
  }
  kth_to_float_kernel<F><<<1, 1, 0, stream>>>(state, out);
  return last_launch_error();
}

// Threshold scratch: the selected count, the mask and its compaction.
struct ThresholdScratch {
  size_t selected = 0;
  MaskScratch masks;
  size_t total = 0;
  explicit ThresholdScratch(long long n) {
    ScratchLayout layout;
    selected = layout.add(sizeof(long long));
    masks.reserve(&layout, n, false);
    total = layout.total();
  }
};

template <typename F>
size_t threshold_select_scratch_bytes(long long n) {
  return ThresholdScratch(n).total;
}

// Writes the first `capacity` entries with |x| >= threshold (and x != 0) in
// index order, pads the rest with 0 / -1, and the true count to count_out.
// `threshold` and `count_out` are device scalars.
template <typename F>
cudaError_t threshold_select_launch(const typename F::Bits* x, long long n,
                                    const float* threshold, long long capacity,
                                    typename F::Bits* values, int32_t* indices,
                                    int32_t* count_out, void* scratch, cudaStream_t stream,
                                    CompactGrid grid = CompactGrid::kResident) {
  const ThresholdScratch s(n);
  auto* selected = ScratchLayout::at<long long>(scratch, s.selected);
  if (n > 0) {
    const long long tiles = num_tiles(n);
    auto* tile_count = ScratchLayout::at<unsigned long long>(scratch, s.masks.tile_count);
    JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        tile_count, 0, sizeof(unsigned long long) * static_cast<size_t>(tiles), stream));
    threshold_mask_kernel<F><<<resident_grid(threshold_mask_kernel<F>, kTileThreads, tiles),
                               kTileThreads, 0, stream>>>(
        x, n, threshold, ScratchLayout::at<uint32_t>(scratch, s.masks.greater), tile_count);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    JSS_CUDA_RETURN_IF_ERROR(mask_compact_launch<typename F::Bits>(
        x, n, s.masks, false, scratch, nullptr, capacity, values, indices, stream, selected,
        count_out, grid));
  } else {
    threshold_total_kernel<<<1, 1, 0, stream>>>(nullptr, nullptr, 0, selected, count_out);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  if (capacity > 0) {
    threshold_pad_kernel<F><<<grid_for(capacity, kFillThreads, kFillMaxBlocks), kFillThreads, 0,
                              stream>>>(selected, capacity, values, indices);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  return cudaSuccess;
}

// values / indices hold ceil(n / bucket) * k slots. Requires bucket >= 1,
// 0 <= k <= bucket, n < 2^31.
template <typename F>
cudaError_t bucket_topk_launch(const typename F::Bits* x, long long n, long long bucket,
                               long long k, typename F::Bits* values, int32_t* indices,
                               cudaStream_t stream) {
  const long long num_buckets = (n + bucket - 1) / bucket;
  if (num_buckets == 0 || k == 0) return cudaSuccess;
  const unsigned int grid = static_cast<unsigned int>(
      num_buckets < kBucketMaxBlocks ? num_buckets : kBucketMaxBlocks);
  bucket_topk_kernel<F><<<grid, kBucketThreads, 0, stream>>>(x, n, bucket, k, num_buckets, values,
                                                            indices);
  return last_launch_error();
}

}  // namespace cuda
}  // namespace jss
