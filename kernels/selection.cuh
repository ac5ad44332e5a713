// CUDA selection kernels: exact top-k by magnitude, k-th magnitude, threshold
// selection and bucketed top-k. Same results, bit for bit, as the CPU kernels
// (kernels/topk_select.h, kernels/threshold_select.h): output in ascending index
// order, ties at the k-th magnitude go to the lower index, NaN ranks above +inf.
//
// Exact top-k is a radix select on the magnitude key with 11-bit digits
// (AIR top-k style): float32 keys (31 bits) take passes of 11, 11 and 9 bits,
// 16-bit keys (15 bits) passes of 11 and 4. Each pass
//   1. histograms the current digit of the candidates - the keys whose higher
//      digits equal the digits found so far - in shared memory with atomics;
//   2. a one-block kernel scans the histogram from the top digit down and
//      writes the digit holding the k-th key into a RadixState in device
//      memory, which the next pass reads: no host round trip, no stream sync.
// After the last pass the state holds the exact k-th key T and how many entries
// with key == T to take. An ordered compaction (per-tile counts of key > T and
// key == T, a CUB exclusive scan over tiles, a write pass with a block scan)
// then emits the selection in index order, the first `ties` entries equal to T
// being the tied ones kept.
//
// Threshold selection is a single pass (CUB DeviceSelect::If, stable) with a
// writer that stores only the first `capacity` selected entries.
//
// Launchers take one scratch block (size from *_scratch_bytes) and a stream,
// enqueue everything on that stream and return the first launch error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include "kernels/cuda_common.cuh"
#include "kernels/float_bits.cuh"
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

// Output slot of a selected entry: everything strictly above the k-th key
// before it, plus the tied entries before it that are kept (the first `ties`).
JSS_HD unsigned long long topk_slot(unsigned long long greater_before,
                                    unsigned long long equal_before, unsigned long long ties) {
  return greater_before + (equal_before < ties ? equal_before : ties);
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

// --- per-thread compaction steps (shared by the kernels and tests/cuda_host) -

constexpr int kTileThreads = 256;
constexpr int kTileItems = 16;
constexpr int kTile = kTileThreads * kTileItems;  // 4096 entries per compaction tile
// Per-thread and per-tile counts are packed as (greater << 16) | equal.
static_assert(kTile < (1 << 16), "a tile's counts must fit in 16 bits");

// (greater << 16) | equal over a thread's first `count` items.
template <typename F>
JSS_HD uint32_t topk_thread_counts(const typename F::Bits (&items)[kTileItems], int count,
                                   uint32_t kth) {
  uint32_t packed = 0;
JSS_UNROLL
  for (int j = 0; j < kTileItems; ++j) {
    if (j < count) {
      const uint32_t key = F::key(items[j]);
      packed += key > kth ? (1u << 16) : (key == kth ? 1u : 0u);
    }
  }
  return packed;
}

// Writes a thread's selected items (entries first_index + j) given how many
// entries above / equal to the k-th key precede its first item.
template <typename F>
JSS_HD void topk_thread_write(const typename F::Bits (&items)[kTileItems], int count,
                              long long first_index, uint32_t kth, unsigned long long ties,
                              unsigned long long greater, unsigned long long equal, long long k,
                              typename F::Bits* values, int32_t* indices) {
JSS_UNROLL
  for (int j = 0; j < kTileItems; ++j) {
    if (j < count) {
      const uint32_t key = F::key(items[j]);
      const bool above = key > kth;
      const bool kept_tie = key == kth && equal < ties;
      if (above || kept_tie) {
        const unsigned long long slot = topk_slot(greater, equal, ties);
        if (slot < static_cast<unsigned long long>(k)) {
          values[slot] = items[j];
          indices[slot] = static_cast<int32_t>(first_index + j);
        }
      }
      greater += above ? 1 : 0;
      equal += key == kth ? 1 : 0;
    }
  }
}

template <typename F>
JSS_HD bool passes_threshold(typename F::Bits b, uint32_t t) {
  const uint32_t key = F::widen(b) & 0x7fffffffu;
  return key >= t && key != 0;
}

// Items of thread `thread` in a tile of `valid` entries (blocked arrangement).
JSS_HD int tile_thread_items(int valid, int thread) {
  const int left = valid - thread * kTileItems;
  return left < 0 ? 0 : (left > kTileItems ? kTileItems : left);
}

// --- kernels -----------------------------------------------------------------

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

__global__ void radix_init_kernel(RadixState* state, unsigned long long k) {
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
                           unsigned long long* __restrict__ hist) {
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
__global__ void __launch_bounds__(kChooseThreads)
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

__global__ void store_float_kernel(float* out, float value) { out[0] = value; }

template <typename F>
__global__ void kth_to_float_kernel(const RadixState* __restrict__ state, float* out) {
  out[0] = key_to_float<F>(state->prefix);
}

// Per tile of kTile entries: how many keys are above the k-th key and equal to it.
template <typename F>
__global__ void __launch_bounds__(kTileThreads)
    topk_count_kernel(const typename F::Bits* __restrict__ x, long long n,
                      const RadixState* __restrict__ state,
                      unsigned long long* __restrict__ greater_count,
                      unsigned long long* __restrict__ equal_count) {
  using Reduce = cub::BlockReduce<uint32_t, kTileThreads>;
  __shared__ typename Reduce::TempStorage reduce_storage;
  const uint32_t kth = state->prefix;
  const long long base = static_cast<long long>(blockIdx.x) * kTile;
  uint32_t packed = 0;
  for (int j = 0; j < kTileItems; ++j) {
    const long long i = base + j * kTileThreads + threadIdx.x;
    if (i < n) {
      const uint32_t key = F::key(x[i]);
      packed += key > kth ? (1u << 16) : (key == kth ? 1u : 0u);
    }
  }
  const uint32_t total = Reduce(reduce_storage).Sum(packed);
  if (threadIdx.x == 0) {
    greater_count[blockIdx.x] = total >> 16;
    equal_count[blockIdx.x] = total & 0xffffu;
  }
}

// Writes the selected entries of one tile to their slots (index order).
template <typename F>
__global__ void __launch_bounds__(kTileThreads)
    topk_write_kernel(const typename F::Bits* __restrict__ x, long long n, long long k,
                      const RadixState* __restrict__ state,
                      const unsigned long long* __restrict__ greater_offset,
                      const unsigned long long* __restrict__ equal_offset,
                      typename F::Bits* __restrict__ values, int32_t* __restrict__ indices) {
  using Bits = typename F::Bits;
  using Load = cub::BlockLoad<Bits, kTileThreads, kTileItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Scan = cub::BlockScan<uint32_t, kTileThreads>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Scan::TempStorage scan;
  } storage;
  const long long base = static_cast<long long>(blockIdx.x) * kTile;
  const int valid = static_cast<int>(n - base < kTile ? n - base : kTile);
  Bits items[kTileItems];  // blocked: thread t holds entries base + t * kTileItems + j
  Load(storage.load).Load(x + base, items, valid, Bits(0));
  __syncthreads();  // the scan reuses the load's shared memory
  const uint32_t kth = state->prefix;
  const unsigned long long ties = state->ties;
  const int count = tile_thread_items(valid, threadIdx.x);
  uint32_t before;
  Scan(storage.scan).ExclusiveSum(topk_thread_counts<F>(items, count, kth), before);
  topk_thread_write<F>(items, count, base + threadIdx.x * kTileItems, kth, ties,
                       greater_offset[blockIdx.x] + (before >> 16),
                       equal_offset[blockIdx.x] + (before & 0xffffu), k, values, indices);
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

// Threshold selection is one pass: CUB's DeviceSelect::If (single-pass
// decoupled look-back, stable: selected entries keep their index order) over
// the indices 0..n-1 with this predicate, writing through the bounded writer
// below, so only the first `capacity` selected entries are stored while the
// count covers all of them. x is read once in full, then only at the selected
// entries.
template <typename F>
struct ThresholdPredicate {
  const typename F::Bits* x;
  const float* threshold;  // device scalar
  __host__ __device__ bool operator()(int32_t i) const {
    return passes_threshold<F>(x[i], threshold_key(*threshold));
  }
};

template <typename F>
struct BoundedSelectionWriter {
  const typename F::Bits* x;
  typename F::Bits* values;
  int32_t* indices;
  long long capacity;
  // slot: the entry's rank among the selected ones (index order).
  __host__ __device__ void operator()(std::ptrdiff_t slot, int32_t i) const {
    if (slot < capacity) {
      values[slot] = x[i];
      indices[slot] = i;
    }
  }
};

// count_out = the number selected (<= n < 2^31).
__global__ void threshold_count_out_kernel(const long long* __restrict__ selected,
                                           int32_t* __restrict__ count_out) {
  *count_out = static_cast<int32_t>(*selected);
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

inline long long num_tiles(long long n) { return (n + kTile - 1) / kTile; }

// Top-k scratch layout (only used when 0 < k < n).
struct TopkScratch {
  RadixScratch radix;
  size_t greater_count = 0, equal_count = 0, greater_offset = 0, equal_offset = 0;
  size_t scan_temp = 0, scan_temp_bytes = 0;
  size_t total = 0;
  TopkScratch(long long n, int key_bits) {
    ScratchLayout layout;
    radix.reserve(&layout, key_bits);
    const size_t tile_bytes = sizeof(unsigned long long) * static_cast<size_t>(num_tiles(n));
    greater_count = layout.add(tile_bytes);
    equal_count = layout.add(tile_bytes);
    greater_offset = layout.add(tile_bytes);
    equal_offset = layout.add(tile_bytes);
    scan_temp_bytes = jss::cuda::scan_temp_bytes(num_tiles(n));
    scan_temp = layout.add(scan_temp_bytes);
    total = layout.total();
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
                        cudaStream_t stream) {
  if (k <= 0) return cudaSuccess;
  if (k >= n) {
    copy_all_kernel<F><<<grid_for(n, kFillThreads, kFillMaxBlocks), kFillThreads, 0, stream>>>(
        x, n, values, indices);
    return last_launch_error();
  }
  const TopkScratch s(n, F::kKeyBits);
  RadixState* state = ScratchLayout::at<RadixState>(scratch, s.radix.state);
  JSS_CUDA_RETURN_IF_ERROR(radix_select_launch<F>(
      x, n, 1, k, state, ScratchLayout::at<unsigned long long>(scratch, s.radix.hist), stream));
  const long long tiles = num_tiles(n);
  auto* greater_count = ScratchLayout::at<unsigned long long>(scratch, s.greater_count);
  auto* equal_count = ScratchLayout::at<unsigned long long>(scratch, s.equal_count);
  auto* greater_offset = ScratchLayout::at<unsigned long long>(scratch, s.greater_offset);
  auto* equal_offset = ScratchLayout::at<unsigned long long>(scratch, s.equal_offset);
  void* temp = ScratchLayout::at<void>(scratch, s.scan_temp);
  topk_count_kernel<F><<<static_cast<unsigned int>(tiles), kTileThreads, 0, stream>>>(
      x, n, state, greater_count, equal_count);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  size_t temp_bytes = s.scan_temp_bytes;
  JSS_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
      temp, temp_bytes, greater_count, greater_offset, static_cast<int>(tiles), stream));
  temp_bytes = s.scan_temp_bytes;
  JSS_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
      temp, temp_bytes, equal_count, equal_offset, static_cast<int>(tiles), stream));
  topk_write_kernel<F><<<static_cast<unsigned int>(tiles), kTileThreads, 0, stream>>>(
      x, n, k, state, greater_offset, equal_offset, values, indices);
  return last_launch_error();
}

// k-th magnitude of the strided sample, as float32 (0 <= k <= ceil(n / stride));
// k = 0 gives +inf (a threshold above every number: nothing is selected).
template <typename F>
size_t kth_magnitude_scratch_bytes(long long k) {
  if (k <= 0) return 0;
  ScratchLayout layout;
  RadixScratch radix;
  radix.reserve(&layout, F::kKeyBits);
  return layout.total();
}

template <typename F>
cudaError_t kth_magnitude_launch(const typename F::Bits* x, long long n, long long stride,
                                 long long k, float* out, void* scratch, cudaStream_t stream) {
  if (k <= 0) {
    store_float_kernel<<<1, 1, 0, stream>>>(out, float_from_bits(0x7f800000u));
    return last_launch_error();
  }
  ScratchLayout layout;
  RadixScratch radix;
  radix.reserve(&layout, F::kKeyBits);
  RadixState* state = ScratchLayout::at<RadixState>(scratch, radix.state);
  const long long m = (n + stride - 1) / stride;
  JSS_CUDA_RETURN_IF_ERROR(radix_select_launch<F>(
      x, m, stride, k, state, ScratchLayout::at<unsigned long long>(scratch, radix.hist), stream));
  kth_to_float_kernel<F><<<1, 1, 0, stream>>>(state, out);
  return last_launch_error();
}

using ThresholdInput = thrust::counting_iterator<int32_t>;
template <typename F>
using ThresholdOutput = thrust::tabulate_output_iterator<BoundedSelectionWriter<F>>;

template <typename F>
struct ThresholdScratch {
  size_t selected = 0, select_temp = 0, select_temp_bytes = 0;
  size_t total = 0;
  explicit ThresholdScratch(long long n) {
    ScratchLayout layout;
    selected = layout.add(sizeof(long long));
    cub::DeviceSelect::If(nullptr, select_temp_bytes, ThresholdInput(0),
                          ThresholdOutput<F>(BoundedSelectionWriter<F>{}),
                          static_cast<long long*>(nullptr), static_cast<int64_t>(n),
                          ThresholdPredicate<F>{});
    select_temp = layout.add(select_temp_bytes);
    total = layout.total();
  }
};

template <typename F>
size_t threshold_select_scratch_bytes(long long n) {
  return ThresholdScratch<F>(n).total;
}

// Writes the first `capacity` entries with |x| >= threshold (and x != 0) in
// index order, pads the rest with 0 / -1, and the true count to count_out.
// `threshold` and `count_out` are device scalars.
template <typename F>
cudaError_t threshold_select_launch(const typename F::Bits* x, long long n,
                                    const float* threshold, long long capacity,
                                    typename F::Bits* values, int32_t* indices,
                                    int32_t* count_out, void* scratch, cudaStream_t stream) {
  const ThresholdScratch<F> s(n);
  auto* selected = ScratchLayout::at<long long>(scratch, s.selected);
  if (n > 0) {
    size_t temp_bytes = s.select_temp_bytes;
    JSS_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(
        ScratchLayout::at<void>(scratch, s.select_temp), temp_bytes, ThresholdInput(0),
        ThresholdOutput<F>(BoundedSelectionWriter<F>{x, values, indices, capacity}), selected,
        static_cast<int64_t>(n), ThresholdPredicate<F>{x, threshold}, stream));
  } else {
    JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(selected, 0, sizeof(long long), stream));
  }
  threshold_count_out_kernel<<<1, 1, 0, stream>>>(selected, count_out);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
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
