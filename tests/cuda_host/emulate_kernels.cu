// Host emulation of the CUDA kernels, checked bit for bit against the CPU
// kernels (kernels/*.h), which tests/test_topk.py etc. check against the NumPy
// reference. Runs on a machine without a GPU: it never launches a kernel.
// Built with -DJSS_DEVICE_RUN and run with --device on a GPU machine, the same
// checks run the real CUDA launchers instead of the emulation (no JAX, no XLA:
// the first thing to run when a GPU test fails).
//
// The emulation runs the kernels' own __host__ __device__ pieces (digit plan,
// candidate test, k-th-bin search, the tile's vector arrangement, mask-word
// compaction, slot formula, threshold key, float conversions, QSGD code/decode) in the same
// thread/tile/block arrangement as the kernels in kernels/selection.cuh and
// kernels/compression.cuh, so a logic error there shows up here. What it cannot
// check: races, shared-memory use, CUB block/device primitives and launch
// configuration - those need a GPU (tests/test_cuda_kernels.py).
//
// On a GPU: nvcc -std=c++17 -O1 -arch=native -diag-suppress 1675 -DJSS_DEVICE_RUN -I.
//   tests/cuda_host/emulate_kernels.cu -o /tmp/emu_gpu && /tmp/emu_gpu --device
//   (/tmp/emu_gpu --device fused: the fused accumulator passes only;
//   /tmp/emu_gpu --bench [N]: kernel-only timings at N = 16M and 64M, or N alone;
//   per kernel under Nsight Compute: ncu --metrics gpu__time_duration.sum
//   --print-summary per-kernel /tmp/emu_gpu --bench 67108864)
// Build and run (tests/cuda_host/test_cuda_host_emulation.py does this):
//   nvcc -std=c++17 -O1 -diag-suppress 1675 -I. tests/cuda_host/emulate_kernels.cu -o /tmp/emu
//   /tmp/emu
// Under AddressSanitizer / UBSan (found the bucket_topk k = 0 overflow):
//   nvcc -std=c++17 -O1 -g -diag-suppress 1675 -Xcompiler=-fsanitize=address
//     -Xcompiler=-fsanitize=undefined -I. -c tests/cuda_host/emulate_kernels.cu -o /tmp/emu.o
//   g++ -fsanitize=address,undefined /tmp/emu.o -L/usr/local/cuda/lib64 -lcudart_static
//     -ldl -lpthread -lrt -o /tmp/emu_asan && /tmp/emu_asan
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "kernels/compression.cuh"
#include "kernels/selection.cuh"
// The CPU kernels: the contract.
#include "kernels/block_scan.h"
#include "kernels/float_bits.h"
#include "kernels/qsgd.h"
#include "kernels/sparse_update.h"
#include "kernels/threshold_select.h"
#include "kernels/topk_select.h"

namespace c = jss::cuda;
using ull = unsigned long long;

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    ++g_checks;                                           \
    if (!(cond)) {                                        \
      if (++g_failures <= 30) {                           \
        std::printf("FAIL %s:%d: ", __FILE__, __LINE__);  \
        std::printf(__VA_ARGS__);                         \
        std::printf("\n");                                \
      }                                                   \
    }                                                     \
  } while (0)

// CPU element type for each CUDA storage trait.
template <typename F> struct CpuType;
template <> struct CpuType<c::F32> { using T = float; static constexpr const char* name = "f32"; };
template <> struct CpuType<c::BF16> { using T = jss::bfloat16_t; static constexpr const char* name = "bf16"; };
template <> struct CpuType<c::F16> { using T = jss::float16_t; static constexpr const char* name = "f16"; };

template <typename F>
const typename CpuType<F>::T* as_cpu(const typename F::Bits* p) {
  return reinterpret_cast<const typename CpuType<F>::T*>(p);
}
template <typename F>
typename CpuType<F>::T* as_cpu(typename F::Bits* p) {
  return reinterpret_cast<typename CpuType<F>::T*>(p);
}

// --- emulation of kernels/selection.cuh ---------------------------------------

// radix_select_launch: histogram kernel + choose kernel per pass.
template <typename F>
c::RadixState emulate_radix_select(const typename F::Bits* x, long long m, long long stride,
                                   long long k) {
  c::RadixState st{0, 0, static_cast<ull>(k)};
  constexpr int kPer = c::kMaxBins / c::kChooseThreads;
  for (int pass = 0; pass < c::radix_passes(F::kKeyBits); ++pass) {
    const int shift = c::radix_shift(F::kKeyBits, pass);
    const int width = c::radix_width(F::kKeyBits, pass);
    const int nbins = 1 << width;
    std::vector<ull> hist(c::kMaxBins, 0);
    for (long long i = 0; i < m; ++i) {
      const uint32_t key = F::key(x[i * stride]);
      if (c::key_is_candidate(st, key)) hist[c::key_digit(key, shift, width)]++;
    }
    const ull ties = st.ties;  // every thread reads it before the one write
    ull above = 0;             // exclusive scan over threads
    int found = 0;
    for (int t = 0; t < c::kChooseThreads; ++t) {
      ull count[kPer];
      ull sum = 0;
      for (int j = 0; j < kPer; ++j) {
        const int r = t * kPer + j;
        count[j] = r < nbins ? hist[nbins - 1 - r] : 0;
        sum += count[j];
      }
      uint32_t digit;
      ull above_digit;
      if (c::find_kth_bin(count, t * kPer, nbins, above, ties, &digit, &above_digit)) {
        c::radix_state_take_digit(&st, digit, shift, width, above_digit);
        ++found;
      }
      above += sum;
    }
    CHECK(found == 1, "radix pass %d: %d threads found the k-th bin", pass, found);
  }
  return st;
}

// Sets bit i of a mask; the bit's word and position as the tile kernels'
// vector arrangement gives them (tile_item_offset, store_tile_mask).
template <typename F, typename Decide>
void emulate_tile_masks(long long n, std::vector<uint32_t>* greater, std::vector<uint32_t>* equal,
                        Decide&& decide) {
  const long long tiles = c::num_tiles(n);
  greater->assign(static_cast<size_t>(tiles * c::kTileWords), 0u);
  if (equal != nullptr) equal->assign(greater->size(), 0u);
  std::vector<char> seen(static_cast<size_t>(tiles * c::kTile), 0);
  for (long long b = 0; b < tiles; ++b) {
    for (int t = 0; t < c::kTileThreads; ++t) {
      for (int q = 0; q < c::kTileItems; ++q) {
        const long long i = b * c::kTile + c::tile_item_offset<F>(t, q);
        CHECK(seen[i] == 0, "tile_item_offset: entry %lld seen twice", i);
        seen[i] = 1;
        if (i >= n) continue;
        const int d = decide(i);  // 1: greater, 2: equal
        if (d == 1) (*greater)[i >> 5] |= 1u << (i & 31);
        if (d == 2 && equal != nullptr) (*equal)[i >> 5] |= 1u << (i & 31);
      }
    }
  }
}

// mask_compact_launch: tile counts, exclusive scans, compact_word per word.
// Returns the totals of the greater and equal masks.
template <typename Bits>
std::pair<ull, ull> emulate_mask_compact(const Bits* x, long long n,
                                         const std::vector<uint32_t>& greater,
                                         const std::vector<uint32_t>* equal, ull ties,
                                         long long limit, Bits* values, int32_t* indices) {
  const long long tiles = c::num_tiles(n);
  ull greater_sum = 0, equal_sum = 0;
  for (long long b = 0; b < tiles; ++b) {
    ull g_before = 0, e_before = 0;  // block exclusive scan over the tile's words
    for (int w = 0; w < c::kTileWords; ++w) {
      const long long word = b * c::kTileWords + w;
      const uint32_t g = greater[word], e = equal != nullptr ? (*equal)[word] : 0u;
      if (limit > 0) {
        c::compact_word<Bits>(g, e, word * 32, greater_sum + g_before, equal_sum + e_before, ties,
                              limit, x, values, indices);
      }
      g_before += c::popcount32(g);
      e_before += c::popcount32(e);
    }
    greater_sum += g_before;
    equal_sum += e_before;
  }
  return {greater_sum, equal_sum};
}

// topk_launch: radix select (the candidate buffer changes how the digits are
// found, not which), the filter pass's greater bits and the marks, compaction.
template <typename F>
void emulate_topk(const typename F::Bits* x, long long n, long long k, typename F::Bits* values,
                  int32_t* indices) {
  if (k <= 0) return;
  if (k >= n) {
    for (long long i = 0; i < n; ++i) {
      values[i] = x[i];
      indices[i] = static_cast<int32_t>(i);
    }
    return;
  }
  const c::RadixState st = emulate_radix_select<F>(x, n, 1, k);
  const int shift0 = c::radix_shift(F::kKeyBits, 0), width0 = c::radix_width(F::kKeyBits, 0);
  const uint32_t first = c::key_digit(st.prefix, shift0, width0);
  std::vector<uint32_t> greater, equal;
  emulate_tile_masks<F>(n, &greater, &equal, [&](long long i) {
    const uint32_t key = F::key(x[i]);
    const uint32_t digit = c::key_digit(key, shift0, width0);
    if (digit > first) return 1;                 // topk_filter_kernel
    if (digit < first) return 0;
    return key > st.prefix ? 1 : (key == st.prefix ? 2 : 0);  // candidate_mark_kernel
  });
  const auto totals = emulate_mask_compact<typename F::Bits>(x, n, greater, &equal, st.ties, k,
                                                             values, indices);
  CHECK(totals.first < static_cast<ull>(k) && totals.first + st.ties == static_cast<ull>(k) &&
            totals.second >= st.ties,
        "topk n=%lld k=%lld: %llu above the k-th key, %llu ties of %llu", n, k, totals.first,
        st.ties, totals.second);
}

template <typename F>
float emulate_kth(const typename F::Bits* x, long long n, long long stride, long long k) {
  if (k <= 0) return INFINITY;
  const c::RadixState st = emulate_radix_select<F>(x, (n + stride - 1) / stride, stride, k);
  return c::key_to_float<F>(st.prefix);
}

// threshold_select_launch: threshold_mask_kernel, mask compaction, pad kernel.
template <typename F>
long long emulate_threshold(const typename F::Bits* x, long long n, float threshold,
                            long long capacity, typename F::Bits* values, int32_t* indices) {
  const uint32_t t = c::threshold_key(threshold);
  std::vector<uint32_t> mask;
  emulate_tile_masks<F>(n, &mask, nullptr,
                        [&](long long i) { return c::passes_threshold<F>(x[i], t) ? 1 : 0; });
  const long long selected = static_cast<long long>(
      emulate_mask_compact<typename F::Bits>(x, n, mask, nullptr, 0, capacity, values, indices)
          .first);
  for (long long j = 0; j < capacity; ++j) {
    if (j >= selected) {
      values[j] = typename F::Bits(0);
      indices[j] = -1;
    }
  }
  return selected;
}

// bucket_topk_kernel, one bucket at a time, threads emulated in order.
template <typename F>
void emulate_bucket_topk(const typename F::Bits* x, long long n, long long bucket, long long k,
                         typename F::Bits* values, int32_t* indices) {
  using Bits = typename F::Bits;
  constexpr int kPer = c::kMaxBins / c::kBucketThreads;
  const long long num_buckets = (n + bucket - 1) / bucket;
  if (k == 0) return;
  for (long long b = 0; b < num_buckets; ++b) {
    const long long lo = b * bucket;
    const long long len = std::min(bucket, n - lo);
    const long long take = std::min(k, len);
    const Bits* xb = x + lo;
    Bits* vb = values + b * k;
    int32_t* ib = indices + b * k;
    const bool take_all = take == len;
    uint32_t kth = 0, mask = 0;
    uint32_t ties = static_cast<uint32_t>(take);
    if (!take_all) {
      for (int pass = 0; pass < c::radix_passes(F::kKeyBits); ++pass) {
        const int shift = c::radix_shift(F::kKeyBits, pass);
        const int width = c::radix_width(F::kKeyBits, pass);
        const int nbins = 1 << width;
        std::vector<uint32_t> bins(c::kMaxBins, 0);
        for (long long i = 0; i < len; ++i) {
          const uint32_t key = F::key(xb[i]);
          if ((key & mask) == kth) bins[c::key_digit(key, shift, width)]++;
        }
        uint32_t above = 0, found_digit = 0, found_above = 0;
        int found = 0;
        for (int t = 0; t < c::kBucketThreads; ++t) {
          uint32_t count[kPer];
          uint32_t sum = 0;
          for (int j = 0; j < kPer; ++j) {
            const int r = t * kPer + j;
            count[j] = r < nbins ? bins[nbins - 1 - r] : 0;
            sum += count[j];
          }
          uint32_t digit, above_digit;
          if (c::find_kth_bin(count, t * kPer, nbins, above, ties, &digit, &above_digit)) {
            found_digit = digit;
            found_above = above_digit;
            ++found;
          }
          above += sum;
        }
        CHECK(found == 1, "bucket pass %d: %d threads found the k-th bin", pass, found);
        kth |= found_digit << shift;
        mask |= static_cast<uint32_t>(nbins - 1) << shift;
        ties -= found_above;
      }
    }
    ull greater_total = 0, equal_total = 0;
    for (long long start = 0; start < len; start += c::kBucketThreads) {
      uint32_t before = 0, chunk_total = 0;
      for (int t = 0; t < c::kBucketThreads; ++t) {  // chunk totals first (block aggregate)
        const long long i = start + t;
        if (i < len) {
          const uint32_t key = F::key(xb[i]);
          const bool above = take_all || key > kth, equal = !take_all && key == kth;
          chunk_total += above ? (1u << 16) : (equal ? 1u : 0u);
        }
      }
      for (int t = 0; t < c::kBucketThreads; ++t) {
        const long long i = start + t;
        Bits v = Bits(0);
        bool above = false, equal = false;
        if (i < len) {
          v = xb[i];
          const uint32_t key = F::key(v);
          above = take_all || key > kth;
          equal = !take_all && key == kth;
        }
        const ull greater = greater_total + (before >> 16);
        const ull equal_before = equal_total + (before & 0xffffu);
        if (above || (equal && equal_before < ties)) {
          const ull slot = c::topk_slot(greater, equal_before, ties);
          if (slot < static_cast<ull>(take)) {
            vb[slot] = v;
            ib[slot] = static_cast<int32_t>(lo + i);
          }
        }
        before += above ? (1u << 16) : (equal ? 1u : 0u);
      }
      greater_total += chunk_total >> 16;
      equal_total += chunk_total & 0xffffu;
      if (c::topk_slot(greater_total, equal_total, ties) >= static_cast<ull>(take)) break;
    }
    for (long long j = take; j < k; ++j) {
      vb[j] = Bits(0);
      ib[j] = -1;
    }
  }
}

// --- emulation of kernels/compression.cuh -------------------------------------

template <typename F>
void emulate_qsgd_quantize(const typename F::Bits* x, const c::QsgdShape& shape, int32_t seed_in,
                           uint8_t* packed, float* scales) {
  for (long long b = 0; b < shape.num_buckets(); ++b) {  // qsgd_scale_kernel
    float largest = 0.0f;
    int non_finite = 0;
    for (long long i = b * shape.bucket; i < std::min(shape.n, (b + 1) * shape.bucket); ++i) {
      const uint32_t a = F::widen(x[i]) & 0x7fffffffu;
      non_finite |= a >= 0x7f800000u ? 1 : 0;
      largest = std::fmax(largest, c::float_from_bits(a));
    }
    scales[b] = non_finite ? c::float_from_bits(0x7fc00000u) : largest;
  }
  const uint64_t seed = c::qsgd_splitmix64(static_cast<uint32_t>(seed_in));  // qsgd_pack_kernel
  const int per_byte = 8 / shape.bits;
  for (long long byte = 0; byte < shape.packed_bytes(); ++byte) {
    uint32_t out = 0;
    for (int j = 0; j < per_byte; ++j) {
      const long long i = byte * per_byte + j;
      if (i >= shape.n) break;
      out |= c::qsgd_code(F::widen(x[i]), scales[i / shape.bucket], shape.bits, seed,
                          static_cast<uint64_t>(i))
             << (j * shape.bits);
    }
    packed[byte] = static_cast<uint8_t>(out);
  }
}

template <typename F>
void emulate_scatter_add(typename F::Bits* dense, long long n, const typename F::Bits* values,
                         const int32_t* indices, long long cap) {
  std::vector<uint64_t> keys(cap);  // scatter_keys_kernel + radix sort
  for (long long j = 0; j < cap; ++j) keys[j] = c::scatter_sort_key(indices[j], static_cast<uint32_t>(j));
  std::sort(keys.begin(), keys.end());
  for (long long p = 0; p < cap; ++p) {  // scatter_add_runs_kernel
    const long long idx = c::scatter_key_index(keys[p]);
    if (idx < 0 || idx >= n) continue;
    if (p > 0 && c::scatter_key_index(keys[p - 1]) == idx) continue;
    float sum = c::float_from_bits(F::widen(dense[idx]));
    for (long long q = p; q < cap && c::scatter_key_index(keys[q]) == idx; ++q) {
      sum = c::add_rn(sum, c::float_from_bits(F::widen(values[c::scatter_key_slot(keys[q])])));
    }
    dense[idx] = F::narrow(sum);
  }
}

void emulate_qsgd_dequantize(const uint8_t* packed, const float* scales, const c::QsgdShape& shape,
                             float* out) {
  const int per_byte = 8 / shape.bits;
  for (long long i = 0; i < shape.n; ++i) {  // qsgd_dequantize_kernel
    const uint32_t code =
        (packed[i / per_byte] >> ((i % per_byte) * shape.bits)) & ((1u << shape.bits) - 1u);
    out[i] = c::qsgd_decode(code, scales[i / shape.bucket], shape.bits);
  }
}

template <typename F>
void emulate_block_scan(const typename F::Bits* x, long long n, long long block, uint8_t* mask) {
  std::fill(mask, mask + (n + block - 1) / block, 0);  // the memset
  for (long long i = 0; i < n; ++i) {                 // block_scan_kernel
    if ((x[i] & F::kNonzeroMask) != 0) mask[i / block] = 1;
  }
}

template <typename F>
void emulate_residual_update(typename F::Bits* acc, long long n, const int32_t* indices,
                             long long cap) {
  for (long long j = 0; j < cap; ++j) {  // residual_zero_kernel
    if (indices[j] >= 0 && indices[j] < n) acc[indices[j]] = typename F::Bits(0);
  }
}

// --- the real kernels on a GPU (built with -DJSS_DEVICE_RUN, run with --device) -

#ifdef JSS_DEVICE_RUN
static bool g_on_device = false;

#define CUDA_OK(expr)                                                                  \
  do {                                                                                 \
    const cudaError_t err_ = (expr);                                                   \
    if (err_ != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (n) CUDA_OK(cudaMalloc(&ptr, n * sizeof(T)));
  }
  DeviceBuffer(const T* host, size_t n) : DeviceBuffer(n) {  // host's contents, incl. sentinels
    if (n) CUDA_OK(cudaMemcpy(ptr, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  void to_host(T* host) const {
    if (count) CUDA_OK(cudaMemcpy(host, ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
  }
};

// Launches on a non-default stream, as XLA does, then waits for it.
struct DeviceRun {
  cudaStream_t stream;
  void* scratch = nullptr;
  explicit DeviceRun(size_t scratch_bytes) {
    CUDA_OK(cudaStreamCreate(&stream));
    if (scratch_bytes) CUDA_OK(cudaMalloc(&scratch, scratch_bytes));
  }
  void finish(cudaError_t launched) {
    CUDA_OK(launched);
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  ~DeviceRun() {
    if (scratch) cudaFree(scratch);
    cudaStreamDestroy(stream);
  }
};

template <typename F>
void device_topk(const typename F::Bits* x, long long n, long long k, typename F::Bits* values,
                 int32_t* indices) {
  DeviceBuffer<typename F::Bits> dx(x, n), dv(values, k);
  DeviceBuffer<int32_t> di(indices, k);
  DeviceRun run(c::topk_scratch_bytes<F>(n, k));
  run.finish(c::topk_launch<F>(dx.ptr, n, k, dv.ptr, di.ptr, run.scratch, run.stream));
  dv.to_host(values);
  di.to_host(indices);
}

template <typename F>
float device_kth(const typename F::Bits* x, long long n, long long stride, long long k) {
  DeviceBuffer<typename F::Bits> dx(x, n);
  DeviceBuffer<float> out(1);
  DeviceRun run(c::kth_magnitude_scratch_bytes<F>(n, stride, k));
  run.finish(c::kth_magnitude_launch<F>(dx.ptr, n, stride, k, out.ptr, run.scratch, run.stream));
  float result;
  out.to_host(&result);
  if (stride == 1 && k >= 1) {  // and the three-read radix select it replaced: the same key
    DeviceRun three(c::kth_magnitude_scratch_bytes<F>(n, stride, k, c::KthReads::kThree));
    three.finish(c::kth_magnitude_launch<F>(dx.ptr, n, stride, k, out.ptr, three.scratch,
                                            three.stream, c::KthReads::kThree));
    float before;
    out.to_host(&before);
    CHECK(c::bits_from_float(before) == c::bits_from_float(result),
          "kth n=%lld k=%lld: two reads %g, three reads %g", n, k, result, before);
  }
  return result;
}

template <typename F>
long long device_threshold(const typename F::Bits* x, long long n, float threshold,
                           long long capacity, typename F::Bits* values, int32_t* indices) {
  DeviceBuffer<typename F::Bits> dx(x, n), dv(values, capacity);
  DeviceBuffer<int32_t> di(indices, capacity), count(1);
  DeviceBuffer<float> t(&threshold, 1);
  DeviceRun run(c::threshold_select_scratch_bytes<F>(n));
  run.finish(c::threshold_select_launch<F>(dx.ptr, n, t.ptr, capacity, dv.ptr, di.ptr, count.ptr,
                                           run.scratch, run.stream));
  dv.to_host(values);
  di.to_host(indices);
  int32_t result;
  count.to_host(&result);
  return result;
}

template <typename F>
void device_bucket_topk(const typename F::Bits* x, long long n, long long bucket, long long k,
                        typename F::Bits* values, int32_t* indices) {
  const long long slots = (n + bucket - 1) / bucket * k;
  DeviceBuffer<typename F::Bits> dx(x, n), dv(values, slots);
  DeviceBuffer<int32_t> di(indices, slots);
  DeviceRun run(0);
  run.finish(c::bucket_topk_launch<F>(dx.ptr, n, bucket, k, dv.ptr, di.ptr, run.stream));
  dv.to_host(values);
  di.to_host(indices);
}

template <typename F>
void device_qsgd_quantize(const typename F::Bits* x, const c::QsgdShape& shape, int32_t seed,
                          uint8_t* packed, float* scales) {
  DeviceBuffer<typename F::Bits> dx(x, shape.n);
  DeviceBuffer<int32_t> dseed(&seed, 1);
  DeviceBuffer<uint8_t> dp(packed, shape.packed_bytes());
  DeviceBuffer<float> ds(scales, shape.num_buckets());
  DeviceRun run(0);
  run.finish(c::qsgd_quantize_launch<F>(dx.ptr, shape, dseed.ptr, dp.ptr, ds.ptr, run.stream));
  dp.to_host(packed);
  ds.to_host(scales);
}

void device_qsgd_dequantize(const uint8_t* packed, const float* scales, const c::QsgdShape& shape,
                            float* out) {
  DeviceBuffer<uint8_t> dp(packed, shape.packed_bytes());
  DeviceBuffer<float> ds(scales, shape.num_buckets()), dout(out, shape.n);
  DeviceRun run(0);
  run.finish(c::qsgd_dequantize_launch(dp.ptr, ds.ptr, shape, dout.ptr, run.stream));
  dout.to_host(out);
}

template <typename F>
void device_block_scan(const typename F::Bits* x, long long n, long long block, uint8_t* mask) {
  DeviceBuffer<typename F::Bits> dx(x, n);
  DeviceBuffer<uint8_t> dm(mask, (n + block - 1) / block);
  DeviceRun run(0);
  run.finish(c::block_scan_launch<F>(dx.ptr, n, block, dm.ptr, run.stream));
  dm.to_host(mask);
}

// In place (aliased) when in_place, else through a separate output buffer.
template <typename F>
void device_residual_update(typename F::Bits* acc, long long n, const int32_t* indices,
                            long long cap, bool in_place = true) {
  DeviceBuffer<typename F::Bits> da(acc, n), dout(n);
  DeviceBuffer<int32_t> di(indices, cap);
  DeviceRun run(0);
  auto* out = in_place ? da.ptr : dout.ptr;
  run.finish(c::residual_update_launch<F>(da.ptr, n, di.ptr, cap, out, run.stream));
  (in_place ? da : dout).to_host(acc);
}

template <typename F>
void device_scatter_add(typename F::Bits* dense, long long n, const typename F::Bits* values,
                        const int32_t* indices, long long cap, bool in_place = true) {
  DeviceBuffer<typename F::Bits> dd(dense, n), dv(values, cap), dout(n);
  DeviceBuffer<int32_t> di(indices, cap);
  DeviceRun run(c::scatter_add_scratch_bytes(cap));
  auto* out = in_place ? dd.ptr : dout.ptr;
  run.finish(c::scatter_add_launch<F>(dd.ptr, n, dv.ptr, di.ptr, cap, out, run.scratch,
                                      run.stream));
  (in_place ? dd : dout).to_host(dense);
}

// --bench: kernel-only timings of the launchers at N = 16M and 64M float32
// (random normal, density 1%), with CUDA events on one stream; input GB/s is
// N * 4 bytes / time, as in benchmarks/selection.py. The floor is a
// device-to-device copy of x (one read + one write).
template <typename Launch>
double time_ms(cudaStream_t stream, Launch&& launch) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) CUDA_OK(launch());
  constexpr int kReps = 20;
  CUDA_OK(cudaEventRecord(start, stream));
  for (int i = 0; i < kReps; ++i) CUDA_OK(launch());
  CUDA_OK(cudaEventRecord(stop, stream));
  CUDA_OK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / kReps;
}

void bench(long long only_n) {  // only_n > 0: that size alone (e.g. under ncu)
  using F = c::F32;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (long long n : {1LL << 24, 1LL << 26}) {
    if (only_n > 0 && n != only_n) continue;
    std::vector<uint32_t> x(n);
    for (auto& v : x) v = c::bits_from_float(normal(rng));
    const long long k = n / 100;
    // the magnitude of the k-th entry, so threshold_select keeps about k
    std::vector<float> mags(n);
    for (long long i = 0; i < n; ++i) mags[i] = std::fabs(c::float_from_bits(x[i]));
    std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
    const float threshold = mags[k - 1];
    DeviceBuffer<uint32_t> dx(x.data(), n), dv(k), copy(n);
    DeviceBuffer<int32_t> di(k), count(1), idx(k);
    DeviceBuffer<float> t(&threshold, 1), kth(1);
    const long long bucket_k = 5, slots = (n + 511) / 512 * bucket_k;
    DeviceBuffer<uint32_t> bv(slots);
    DeviceBuffer<int32_t> bi(slots);
    const size_t scratch = std::max({c::topk_scratch_bytes<F>(n, k),
                                     c::threshold_select_scratch_bytes<F>(n),
                                     c::kth_magnitude_scratch_bytes<F>(n, 1, k),
                                     c::scatter_add_scratch_bytes(k)});
    DeviceRun run(scratch);
    CUDA_OK(c::topk_launch<F>(dx.ptr, n, k, dv.ptr, idx.ptr, run.scratch, run.stream));
    const double bytes = 4.0 * n;
    auto report = [&](const char* name, double ms) {
      std::printf("N=%lld k=%lld %-18s %8.3f ms  %7.1f GB/s input\n", n, k, name, ms,
                  bytes / ms / 1e6);
    };
    report("copy (floor)", time_ms(run.stream, [&] {
      return cudaMemcpyAsync(copy.ptr, dx.ptr, 4 * n, cudaMemcpyDeviceToDevice, run.stream);
    }));
    report("topk", time_ms(run.stream, [&] {
      return c::topk_launch<F>(dx.ptr, n, k, dv.ptr, di.ptr, run.scratch, run.stream);
    }));
    report("threshold_select", time_ms(run.stream, [&] {
      return c::threshold_select_launch<F>(dx.ptr, n, t.ptr, k, dv.ptr, di.ptr, count.ptr,
                                           run.scratch, run.stream);
    }));
    report("kth_magnitude", time_ms(run.stream, [&] {
      return c::kth_magnitude_launch<F>(dx.ptr, n, 1, k, kth.ptr, run.scratch, run.stream);
    }));
    report("kth (3 reads, old)", time_ms(run.stream, [&] {
      return c::kth_magnitude_launch<F>(dx.ptr, n, 1, k, kth.ptr, run.scratch, run.stream,
                                        c::KthReads::kThree);
    }));
    report("topk (tile/block)", time_ms(run.stream, [&] {
      return c::topk_launch<F>(dx.ptr, n, k, dv.ptr, di.ptr, run.scratch, run.stream,
                               c::CompactGrid::kTilePerBlock);
    }));
    report("threshold (t/block)", time_ms(run.stream, [&] {
      return c::threshold_select_launch<F>(dx.ptr, n, t.ptr, k, dv.ptr, di.ptr, count.ptr,
                                           run.scratch, run.stream,
                                           c::CompactGrid::kTilePerBlock);
    }));
    report("kth stride 64", time_ms(run.stream, [&] {
      return c::kth_magnitude_launch<F>(dx.ptr, n, 64, k / 64, kth.ptr, run.scratch, run.stream);
    }));
    report("bucket_topk 5/512", time_ms(run.stream, [&] {
      return c::bucket_topk_launch<F>(dx.ptr, n, 512, bucket_k, bv.ptr, bi.ptr, run.stream);
    }));
    report("block_scan 256", time_ms(run.stream, [&] {
      return c::block_scan_launch<F>(dx.ptr, n, 256, reinterpret_cast<uint8_t*>(copy.ptr),
                                     run.stream);
    }));
    report("residual_update", time_ms(run.stream, [&] {
      return c::residual_update_launch<F>(copy.ptr, n, idx.ptr, k, copy.ptr, run.stream);
    }));
    report("scatter_add", time_ms(run.stream, [&] {
      return c::scatter_add_launch<F>(copy.ptr, n, dv.ptr, idx.ptr, k, copy.ptr, run.scratch,
                                      run.stream);
    }));
    int32_t selected = 0;
    count.to_host(&selected);
    std::printf("  (threshold_select kept %d of target %lld)\n", selected, k);
  }
}

#define JSS_RUN(name, ...) (g_on_device ? device_##name(__VA_ARGS__) : emulate_##name(__VA_ARGS__))
#else
#define JSS_RUN(name, ...) emulate_##name(__VA_ARGS__)
#endif

// --- inputs ------------------------------------------------------------------

// Values from a small set (many ties), zeros of both signs, NaN, +-inf and
// subnormals, as raw bits of the storage type.
template <typename F>
std::vector<typename F::Bits> make_input(long long n, std::mt19937_64& rng, int flavor) {
  using Bits = typename F::Bits;
  std::vector<Bits> x(n);
  std::uniform_int_distribution<int> small(-6, 6);
  std::uniform_int_distribution<int> pick(0, 99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (long long i = 0; i < n; ++i) {
    float v;
    const int p = pick(rng);
    if (flavor == 0) {
      v = static_cast<float>(small(rng)) * 0.25f;  // heavy ties, zeros
    } else if (flavor == 1) {
      v = normal(rng);  // few ties
    } else {
      v = p < 2 ? NAN : (p < 4 ? INFINITY : (p < 6 ? -INFINITY : (p < 10 ? -0.0f : (p < 14 ? 1e-41f : normal(rng)))));
    }
    if (flavor != 2 && p == 0) v = -0.0f;
    x[i] = F::narrow(v);
  }
  return x;
}

// --- checks against the CPU kernels --------------------------------------------

template <typename F>
void check_selection(std::mt19937_64& rng) {
  using Bits = typename F::Bits;
  using T = typename CpuType<F>::T;
  const char* name = CpuType<F>::name;
  const long long sizes[] = {0, 1, 2, 7, 300, 4095, 4096, 4097, 9000, 20011};
  for (long long n : sizes) {
    for (int flavor = 0; flavor < 3; ++flavor) {
      const std::vector<Bits> x = make_input<F>(n, rng, flavor);
      // top-k
      std::vector<long long> ks = {0, 1, n / 3, n / 2, n - 1, n};
      for (long long k : ks) {
        if (k < 0 || k > n) continue;
        std::vector<Bits> gv(k, Bits(0x5a)), cv(k, Bits(0x5a));
        std::vector<int32_t> gi(k, -7), ci(k, -7);
        JSS_RUN(topk<F>, x.data(), n, k, gv.data(), gi.data());
        jss::topk_by_magnitude(as_cpu<F>(x.data()), n, k, as_cpu<F>(cv.data()), ci.data(), 1);
        CHECK(gv == cv && gi == ci, "topk %s n=%lld k=%lld flavor=%d differs from the CPU kernel",
              name, n, k, flavor);
      }
      // k-th magnitude, strided
      for (long long stride : {1LL, 3LL, 64LL}) {
        const long long m = (n + stride - 1) / stride;
        for (long long k : {0LL, 1LL, m / 2, m}) {
          if (k > m) continue;
          const float g = JSS_RUN(kth<F>, x.data(), n, stride, k);
          const float cpu = k == 0 ? INFINITY
                                   : jss::FloatTraits<T>::from_key(jss::kth_magnitude_key_strided(
                                         as_cpu<F>(x.data()), n, stride, k, 1));
          CHECK(c::bits_from_float(g) == c::bits_from_float(cpu),
                "kth %s n=%lld stride=%lld k=%lld: %g vs CPU %g", name, n, stride, k, g, cpu);
        }
      }
      // threshold selection
      for (float threshold : {-1.0f, 0.0f, 0.25f, 0.5f, 1.0f, 1e-41f, INFINITY, NAN}) {
        for (long long cap : {0LL, 1LL, n / 4, n + 3}) {
          std::vector<Bits> gv(cap, Bits(0x5a)), cv(cap, Bits(0x5a));
          std::vector<int32_t> gi(cap, -7), ci(cap, -7);
          const long long gc =
              JSS_RUN(threshold<F>, x.data(), n, threshold, cap, gv.data(), gi.data());
          const long long cc = jss::threshold_select(as_cpu<F>(x.data()), n, threshold, cap,
                                                     as_cpu<F>(cv.data()), ci.data(), 1);
          CHECK(gc == cc && gv == cv && gi == ci,
                "threshold %s n=%lld t=%g cap=%lld flavor=%d: count %lld vs CPU %lld", name, n,
                threshold, cap, flavor, gc, cc);
        }
      }
      // bucketed top-k
      for (long long bucket : {1LL, 5LL, 512LL, 3000LL}) {
        for (long long k : {0LL, 1LL, 2LL, 16LL, bucket}) {
          if (k > bucket) continue;
          const long long slots = (n + bucket - 1) / bucket * k;
          std::vector<Bits> gv(slots, Bits(0x5a)), cv(slots, Bits(0x5a));
          std::vector<int32_t> gi(slots, -7), ci(slots, -7);
          JSS_RUN(bucket_topk<F>, x.data(), n, bucket, k, gv.data(), gi.data());
          jss::bucket_topk_by_magnitude(as_cpu<F>(x.data()), n, bucket, k, as_cpu<F>(cv.data()),
                                        ci.data());
          CHECK(gv == cv && gi == ci, "bucket_topk %s n=%lld bucket=%lld k=%lld flavor=%d differs",
                name, n, bucket, k, flavor);
        }
      }
    }
  }
}

template <typename F>
void check_compression(std::mt19937_64& rng) {
  using Bits = typename F::Bits;
  const char* name = CpuType<F>::name;
  for (long long n : {0LL, 1LL, 3LL, 100LL, 1001LL, 5000LL}) {
    for (int flavor = 0; flavor < 3; ++flavor) {
      const std::vector<Bits> x = make_input<F>(n, rng, flavor);
      for (int bits : {2, 4, 8}) {
        for (long long bucket : {1LL, 3LL, 64LL, 512LL}) {
          const c::QsgdShape shape{n, bits, bucket};
          for (int32_t seed : {0, 7, -3}) {
            std::vector<uint8_t> gp(shape.packed_bytes(), 0xee), cp(shape.packed_bytes(), 0xee);
            std::vector<float> gs(shape.num_buckets()), cs(shape.num_buckets());
            JSS_RUN(qsgd_quantize<F>, x.data(), shape, seed, gp.data(), gs.data());
            const jss::QsgdLayout layout{n, bits, bucket};
            jss::qsgd_quantize(as_cpu<F>(x.data()), layout,
                               jss::splitmix64(static_cast<uint32_t>(seed)), cp.data(), cs.data());
            bool same_scales = true;
            for (size_t b = 0; b < gs.size(); ++b) {
              same_scales &= c::bits_from_float(gs[b]) == c::bits_from_float(cs[b]);
            }
            CHECK(gp == cp && same_scales,
                  "qsgd_quantize %s n=%lld bits=%d bucket=%lld seed=%d flavor=%d differs", name, n,
                  bits, bucket, seed, flavor);
            std::vector<float> gd(n), cd(n);
            JSS_RUN(qsgd_dequantize, cp.data(), cs.data(), shape, gd.data());
            jss::qsgd_dequantize(cp.data(), cs.data(), layout, cd.data());
            CHECK(n == 0 || std::memcmp(gd.data(), cd.data(), sizeof(float) * n) == 0,
                  "qsgd_dequantize n=%lld bits=%d bucket=%lld differs", n, bits, bucket);
          }
        }
      }
      // block scan
      for (long long block : {1LL, 4LL, 33LL, 256LL}) {
        const long long nb = (n + block - 1) / block;
        std::vector<uint8_t> gm(nb, 5), cm(nb, 7);
        JSS_RUN(block_scan<F>, x.data(), n, block, gm.data());
        jss::block_mask(as_cpu<F>(x.data()), n, block, cm.data());
        CHECK(gm == cm, "block_scan %s n=%lld block=%lld differs", name, n, block);
      }
      // scatter-add with duplicate indices and padding
      if (n > 0) {
        std::uniform_int_distribution<int32_t> idx(-1, static_cast<int32_t>(std::min<long long>(n - 1, 40)));
        const long long cap = 3 * n / 2 + 1;
        std::vector<int32_t> indices(cap);
        for (auto& i : indices) i = idx(rng);
        const std::vector<Bits> values = make_input<F>(cap, rng, flavor == 2 ? 1 : flavor);
        std::vector<Bits> g = x, cpu = x;
        JSS_RUN(scatter_add<F>, g.data(), n, values.data(), indices.data(), cap);
        jss::scatter_add(as_cpu<F>(cpu.data()), as_cpu<F>(values.data()), indices.data(), cap);
        bool same = true;
        for (long long i = 0; i < n; ++i) {
          const bool both_nan = std::isnan(c::float_from_bits(F::widen(g[i]))) &&
                                std::isnan(c::float_from_bits(F::widen(cpu[i])));
          same &= g[i] == cpu[i] || both_nan;  // NaN payloads may come from either operand
        }
        CHECK(same, "scatter_add %s n=%lld cap=%lld flavor=%d differs", name, n, cap, flavor);
        std::vector<Bits> r = x, cpu_r = x;
        JSS_RUN(residual_update<F>, r.data(), n, indices.data(), cap);
        jss::zero_at_indices(as_cpu<F>(cpu_r.data()), indices.data(), cap);
        CHECK(r == cpu_r, "residual_update %s n=%lld cap=%lld differs", name, n, cap);
#ifdef JSS_DEVICE_RUN
        if (g_on_device) {  // the not-aliased paths: copy, then update
          std::vector<Bits> g2 = x, r2 = x;
          device_scatter_add<F>(g2.data(), n, values.data(), indices.data(), cap, false);
          device_residual_update<F>(r2.data(), n, indices.data(), cap, false);
          CHECK(g2 == g && r2 == r, "%s: not-aliased output differs from in-place", name);
        }
#endif
      }
    }
  }
}

void check_float_conversions(std::mt19937_64& rng) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float cpu = jss::half_to_float(static_cast<uint16_t>(h));
    CHECK(c::half_bits_to_float_bits(static_cast<uint16_t>(h)) == c::bits_from_float(cpu),
          "half 0x%04x widens differently", h);
  }
  std::vector<uint32_t> patterns = {0u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                    0x7f800001u, 0xffc12345u, 0x477fe000u, 0x477fefffu,
                                    0x477ff000u, 0x38800000u, 0x387fffffu, 0x33000000u,
                                    0x33000001u, 0x32ffffffu, 0x33800000u, 0x00000001u,
                                    0x7f7fffffu, 0x3f800000u, 0x3f801000u, 0x3f803000u};
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<uint32_t> small_exp(0x30000000u, 0x48000000u);
  for (int i = 0; i < 400000; ++i) patterns.push_back(i % 2 ? any_bits(rng) : small_exp(rng));
  for (uint32_t f : patterns) {
    const float v = c::float_from_bits(f);
    CHECK(c::float_bits_to_half_bits(f) == jss::float_to_half_bits(v),
          "float 0x%08x narrows to half 0x%04x, CPU 0x%04x", f, c::float_bits_to_half_bits(f),
          jss::float_to_half_bits(v));
    CHECK(c::float_bits_to_bf16_bits(f) == jss::float_to_bfloat16_bits(v),
          "float 0x%08x narrows to bf16 0x%04x, CPU 0x%04x", f, c::float_bits_to_bf16_bits(f),
          jss::float_to_bfloat16_bits(v));
  }
  for (float t : {-2.0f, -0.0f, 0.0f, 1.5f, INFINITY, NAN}) {
    CHECK(c::threshold_key(t) == jss::key_of_threshold<float>(t), "threshold key of %g", t);
  }
}

void check_scatter_keys() {
  for (int32_t idx : {-1, 0, 1, 12345, 2147483646}) {
    for (uint32_t slot : {0u, 7u, 2147483647u}) {
      const uint64_t key = c::scatter_sort_key(idx, slot);
      CHECK(c::scatter_key_index(key) == idx && c::scatter_key_slot(key) == slot,
            "scatter key (%d, %u) round trip", idx, slot);
    }
  }
  // other invalid indices decode outside [0, 2^31 - 1): skipped like padding
  for (int32_t idx : {-2, -100, 2147483647}) {
    const long long back = c::scatter_key_index(c::scatter_sort_key(idx, 3));
    CHECK(back < 0 || back >= 2147483647LL, "invalid index %d decodes to %lld", idx, back);
  }
  CHECK(c::scatter_sort_key(3, 9) < c::scatter_sort_key(4, 0) &&
            c::scatter_sort_key(3, 1) < c::scatter_sort_key(3, 2) &&
            c::scatter_sort_key(-1, 5) < c::scatter_sort_key(0, 0),
        "scatter keys order by index, then slot");
}

#include "tests/cuda_host/fused_checks.cuh"

void check_digit_plan() {
  CHECK(c::radix_passes(31) == 3 && c::radix_passes(15) == 2, "pass counts");
  CHECK(c::radix_shift(31, 0) == 20 && c::radix_width(31, 0) == 11, "f32 pass 0");
  CHECK(c::radix_shift(31, 1) == 9 && c::radix_width(31, 1) == 11, "f32 pass 1");
  CHECK(c::radix_shift(31, 2) == 0 && c::radix_width(31, 2) == 9, "f32 pass 2");
  CHECK(c::radix_shift(15, 0) == 4 && c::radix_width(15, 0) == 11, "16-bit pass 0");
  CHECK(c::radix_shift(15, 1) == 0 && c::radix_width(15, 1) == 4, "16-bit pass 1");
  // a key of all ones survives every pass's mask
  c::RadixState st{0, 0, 1};
  for (int p = 0; p < 3; ++p) {
    const int s = c::radix_shift(31, p), w = c::radix_width(31, p);
    c::radix_state_take_digit(&st, c::key_digit(0x7fffffffu, s, w), s, w, 0);
  }
  CHECK(st.prefix == 0x7fffffffu && st.mask == 0x7fffffffu && st.ties == 1, "full mask");
}

int main(int argc, char** argv) {
  std::mt19937_64 rng(20261122);
  const bool device = argc > 1 && std::strcmp(argv[1], "--device") == 0;
#ifdef JSS_DEVICE_RUN
  g_on_device = device;
  if (device) std::printf("running the CUDA kernels on the GPU\n");
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    const long long only_n = argc > 2 ? std::atoll(argv[2]) : 0;
    bench(only_n);
    for (long long n : {1LL << 24, 1LL << 26}) {
      if (only_n <= 0 || n == only_n) bench_fused(n);
    }
    return 0;
  }
#else
  if (device) {
    std::printf("built without -DJSS_DEVICE_RUN: cannot run on the GPU\n");
    return 2;
  }
#endif
  // --device fused: the fused accumulator passes alone (the campaign's first check of
  // kernels/fused_accumulate.cuh on a GPU, before any timing)
  const bool fused_only = argc > 2 && std::strcmp(argv[2], "fused") == 0;
  if (fused_only) {
    check_fused_leaf_lookup();
    check_fused_accumulate_topk(rng);
    std::printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
  }
  check_digit_plan();
  check_scatter_keys();
  check_float_conversions(rng);
  check_selection<c::F32>(rng);
  check_selection<c::BF16>(rng);
  check_selection<c::F16>(rng);
  check_compression<c::F32>(rng);
  check_compression<c::BF16>(rng);
  check_compression<c::F16>(rng);
  check_fused_leaf_lookup();
  check_fused_accumulate_topk(rng);
  check_fused_adam_accumulate(rng);
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
