// CUDA compression and dense-update kernels: QSGD quantize / dequantize, block
// scan, residual update (zero selected entries) and deterministic scatter-add.
// Same results, bit for bit, as the CPU kernels (kernels/qsgd.h,
// kernels/block_scan.h): QSGD uses the same counter-based hash of (seed,
// position), so the same seed gives the same codes on CPU and GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/cuda_common.cuh"
#include "kernels/float_bits.cuh"
#include "kernels/scratch_layout.cuh"

namespace jss {
namespace cuda {

// --- QSGD (host + device, checked by tests/cuda_host) ------------------------

JSS_HD uint64_t qsgd_splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 random bits from (seed, i); exact in float.
JSS_HD float qsgd_uniform01(uint64_t seed, uint64_t i) {
  return static_cast<float>(qsgd_splitmix64(seed ^ qsgd_splitmix64(i)) >> 40) *
         (1.0f / 16777216.0f);
}

// Code of entry i (value bits `xbits`, float32) in a bucket of scale `scale`:
// stochastic rounding of |x| / scale * s to a level, sign in the top bit.
JSS_HD uint32_t qsgd_code(uint32_t xbits, float scale, int bits, uint64_t seed, uint64_t i) {
  if (!(scale > 0.0f)) return 0;  // all-zero bucket, or NaN scale (non-finite bucket)
  const int64_t s = (int64_t{1} << (bits - 1)) - 1;
  // As on the CPU (kernels/qsgd.h): a tiny scale makes s / scale inf, then
  // divide the entry by the scale first.
  const float to_level = div_rn(static_cast<float>(s), scale);
  const float magnitude = float_from_bits(xbits & 0x7fffffffu);
  const float r = (bits_from_float(to_level) & 0x7fffffffu) == 0x7f800000u
                      ? mul_rn(div_rn(magnitude, scale), static_cast<float>(s))
                      : mul_rn(magnitude, to_level);  // in [0, s]
  int64_t level = static_cast<int64_t>(r);
  if (level < s && qsgd_uniform01(seed, i) < sub_rn(r, static_cast<float>(level))) ++level;
  const bool negative = (xbits & 0x80000000u) != 0;
  return static_cast<uint32_t>(level) | (negative && level > 0 ? 1u << (bits - 1) : 0u);
}

JSS_HD float qsgd_decode(uint32_t code, float scale, int bits) {
  const int64_t s = (int64_t{1} << (bits - 1)) - 1;
  const uint32_t sign_bit = 1u << (bits - 1);
  // A NaN scale gives the quiet NaN 0x7fc00000 (sign from the code), as on the
  // CPU: the GPU's own arithmetic would give its canonical 0x7fffffff.
  const float magnitude =
      scale != scale ? float_from_bits(0x7fc00000u)
                     : mul_rn(static_cast<float>(code & ~sign_bit), div_rn(scale, static_cast<float>(s)));
  return (code & sign_bit) ? -magnitude : magnitude;
}

constexpr int kQsgdScaleThreads = 256;
constexpr int kQsgdScaleMaxBlocks = 65536;
constexpr int kElementThreads = 256;
constexpr int kElementMaxBlocks = 65536;

struct FloatMax {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// One block per bucket (grid-stride): scale = max |x|, NaN if the bucket holds
// a NaN or an Inf.
template <typename F>
__global__ void __launch_bounds__(kQsgdScaleThreads)
    qsgd_scale_kernel(const typename F::Bits* __restrict__ x, long long n, long long bucket,
                      long long num_buckets, float* __restrict__ scales) {
  using MaxReduce = cub::BlockReduce<float, kQsgdScaleThreads>;
  using CountReduce = cub::BlockReduce<int, kQsgdScaleThreads>;
  __shared__ typename MaxReduce::TempStorage max_storage;
  __shared__ typename CountReduce::TempStorage count_storage;
  for (long long b = blockIdx.x; b < num_buckets; b += gridDim.x) {
    const long long lo = b * bucket;
    const long long hi = lo + bucket < n ? lo + bucket : n;
    float largest = 0.0f;
    int non_finite = 0;
    for (long long i = lo + threadIdx.x; i < hi; i += kQsgdScaleThreads) {
      const uint32_t a = F::widen(x[i]) & 0x7fffffffu;
      non_finite |= a >= 0x7f800000u ? 1 : 0;
      largest = fmaxf(largest, float_from_bits(a));
    }
    const float scale = MaxReduce(max_storage).Reduce(largest, FloatMax());
    const int bad = CountReduce(count_storage).Sum(non_finite);
    if (threadIdx.x == 0) scales[b] = bad ? __int_as_float(0x7fc00000) : scale;
    __syncthreads();  // the reductions' shared memory is reused by the next bucket
  }
}

// One thread per packed byte: codes never straddle a byte (bits in {2, 4, 8}).
template <typename F>
__global__ void qsgd_pack_kernel(const typename F::Bits* __restrict__ x, long long n,
                                 long long bucket, int bits, const int32_t* __restrict__ seed_in,
                                 const float* __restrict__ scales, long long packed_bytes,
                                 uint8_t* __restrict__ packed) {
  // Same seed derivation as the CPU handler: splitmix64 of the seed's uint32 bits.
  const uint64_t seed = qsgd_splitmix64(static_cast<uint32_t>(seed_in[0]));
  const int per_byte = 8 / bits;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long byte = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       byte < packed_bytes; byte += step) {
    uint32_t out = 0;
    for (int j = 0; j < per_byte; ++j) {
      const long long i = byte * per_byte + j;
      if (i >= n) break;
      const uint32_t code =
          qsgd_code(F::widen(x[i]), scales[i / bucket], bits, seed, static_cast<uint64_t>(i));
      out |= code << (j * bits);
    }
    packed[byte] = static_cast<uint8_t>(out);
  }
}

__global__ void qsgd_dequantize_kernel(const uint8_t* __restrict__ packed,
                                       const float* __restrict__ scales, long long n,
                                       long long bucket, int bits, float* __restrict__ out) {
  const int per_byte = 8 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    const uint32_t code = (packed[i / per_byte] >> ((i % per_byte) * bits)) & mask;
    out[i] = qsgd_decode(code, scales[i / bucket], bits);
  }
}

// --- block scan, residual update, scatter-add --------------------------------

// mask must be zeroed first; every nonzero entry (NaN included) marks its block.
// Concurrent stores of the same byte value are benign.
template <typename F>
__global__ void block_scan_kernel(const typename F::Bits* __restrict__ x, long long n,
                                  long long block, uint8_t* __restrict__ mask) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    if ((x[i] & F::kNonzeroMask) != 0) mask[i / block] = 1;
  }
}

// acc[idx] = 0 for every idx in [0, n); padding (-1) and out-of-range ignored.
template <typename F>
__global__ void residual_zero_kernel(typename F::Bits* __restrict__ acc, long long n,
                                     const int32_t* __restrict__ indices, long long cap) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; j < cap;
       j += step) {
    const int32_t idx = indices[j];
    if (idx >= 0 && idx < n) acc[idx] = typename F::Bits(0);
  }
}

// Scatter-add sorts one 64-bit key per slot: (index + 1) in the high word, the
// slot in the low word. Keys are unique, so the sorted order - by index, then
// by slot - does not depend on the sort being stable. Padding (-1) gets index
// word 0; any other out-of-range index decodes to an index outside [0, n).
JSS_HD uint64_t scatter_sort_key(int32_t index, uint32_t slot) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int64_t>(index) + 1)) << 32) |
         slot;
}
JSS_HD long long scatter_key_index(uint64_t key) { return static_cast<long long>(key >> 32) - 1; }
JSS_HD uint32_t scatter_key_slot(uint64_t key) { return static_cast<uint32_t>(key); }

__global__ void scatter_keys_kernel(const int32_t* __restrict__ indices, long long cap,
                                    uint64_t* __restrict__ keys) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; j < cap;
       j += step) {
    keys[j] = scatter_sort_key(indices[j], static_cast<uint32_t>(j));
  }
}

// After sorting the keys, the first slot of each run of equal indices adds the
// run's values in slot order: one thread per index, so duplicates are summed
// in a fixed order (deterministic), in float32, rounded once to the type.
template <typename F>
__global__ void scatter_add_runs_kernel(const uint64_t* __restrict__ sorted_keys, long long cap,
                                        const typename F::Bits* __restrict__ values,
                                        typename F::Bits* __restrict__ dense, long long n) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < cap;
       p += step) {
    const long long idx = scatter_key_index(sorted_keys[p]);
    if (idx < 0 || idx >= n) continue;
    if (p > 0 && scatter_key_index(sorted_keys[p - 1]) == idx) continue;  // not a run's head
    float sum = float_from_bits(F::widen(dense[idx]));
    for (long long q = p; q < cap && scatter_key_index(sorted_keys[q]) == idx; ++q) {
      sum = add_rn(sum, float_from_bits(F::widen(values[scatter_key_slot(sorted_keys[q])])));
    }
    dense[idx] = F::narrow(sum);
  }
}

// --- launchers ---------------------------------------------------------------

struct QsgdShape {
  long long n;
  int bits;
  long long bucket;
  long long num_buckets() const { return (n + bucket - 1) / bucket; }
  long long packed_bytes() const { return (n * bits + 7) / 8; }
};

template <typename F>
cudaError_t qsgd_quantize_launch(const typename F::Bits* x, const QsgdShape& shape,
                                 const int32_t* seed, uint8_t* packed, float* scales,
                                 cudaStream_t stream) {
  const long long nb = shape.num_buckets();
  if (nb > 0) {
    qsgd_scale_kernel<F><<<static_cast<unsigned int>(nb < kQsgdScaleMaxBlocks ? nb
                                                                              : kQsgdScaleMaxBlocks),
                           kQsgdScaleThreads, 0, stream>>>(x, shape.n, shape.bucket, nb, scales);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  const long long bytes = shape.packed_bytes();
  if (bytes > 0) {
    qsgd_pack_kernel<F><<<grid_for(bytes, kElementThreads, kElementMaxBlocks), kElementThreads, 0,
                          stream>>>(x, shape.n, shape.bucket, shape.bits, seed, scales, bytes,
                                    packed);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  return cudaSuccess;
}

inline cudaError_t qsgd_dequantize_launch(const uint8_t* packed, const float* scales,
                                          const QsgdShape& shape, float* out,
                                          cudaStream_t stream) {
  if (shape.n == 0) return cudaSuccess;
  qsgd_dequantize_kernel<<<grid_for(shape.n, kElementThreads, kElementMaxBlocks), kElementThreads,
                           0, stream>>>(packed, scales, shape.n, shape.bucket, shape.bits, out);
  return last_launch_error();
}

template <typename F>
cudaError_t block_scan_launch(const typename F::Bits* x, long long n, long long block,
                              uint8_t* mask, cudaStream_t stream) {
  const long long nb = (n + block - 1) / block;
  if (nb == 0) return cudaSuccess;
  JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(mask, 0, static_cast<size_t>(nb), stream));
  block_scan_kernel<F><<<grid_for(n, kElementThreads, kElementMaxBlocks), kElementThreads, 0,
                         stream>>>(x, n, block, mask);
  return last_launch_error();
}

// out may alias acc (the usual case: input-output aliasing); if not, acc is
// copied to out first.
template <typename F>
cudaError_t residual_update_launch(const typename F::Bits* acc, long long n,
                                   const int32_t* indices, long long cap,
                                   typename F::Bits* out, cudaStream_t stream) {
  if (out != acc && n > 0) {
    JSS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, acc, sizeof(typename F::Bits) * n,
                                             cudaMemcpyDeviceToDevice, stream));
  }
  if (cap == 0 || n == 0) return cudaSuccess;
  residual_zero_kernel<F><<<grid_for(cap, kElementThreads, kElementMaxBlocks), kElementThreads, 0,
                            stream>>>(out, n, indices, cap);
  return last_launch_error();
}

struct ScatterAddScratch {
  size_t keys = 0, sorted_keys = 0, sort_temp = 0, sort_temp_bytes = 0;
  size_t total = 0;
  explicit ScatterAddScratch(long long cap) {
    ScratchLayout layout;
    const size_t bytes = sizeof(uint64_t) * static_cast<size_t>(cap);
    keys = layout.add(bytes);
    sorted_keys = layout.add(bytes);
    cub::DeviceRadixSort::SortKeys(nullptr, sort_temp_bytes, static_cast<const uint64_t*>(nullptr),
                                   static_cast<uint64_t*>(nullptr), static_cast<int>(cap));
    sort_temp = layout.add(sort_temp_bytes);
    total = layout.total();
  }
};

inline size_t scatter_add_scratch_bytes(long long cap) {
  return cap > 0 ? ScatterAddScratch(cap).total : 0;
}

// out[idx[j]] += values[j] for j ascending; out may alias dense (else dense is
// copied to out first). Requires cap < 2^31.
template <typename F>
cudaError_t scatter_add_launch(const typename F::Bits* dense, long long n,
                               const typename F::Bits* values, const int32_t* indices,
                               long long cap, typename F::Bits* out, void* scratch,
                               cudaStream_t stream) {
  if (out != dense && n > 0) {
    JSS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, dense, sizeof(typename F::Bits) * n,
                                             cudaMemcpyDeviceToDevice, stream));
  }
  if (cap == 0 || n == 0) return cudaSuccess;
  const ScatterAddScratch s(cap);
  auto* keys = ScratchLayout::at<uint64_t>(scratch, s.keys);
  auto* sorted_keys = ScratchLayout::at<uint64_t>(scratch, s.sorted_keys);
  const unsigned int grid = grid_for(cap, kElementThreads, kElementMaxBlocks);
  scatter_keys_kernel<<<grid, kElementThreads, 0, stream>>>(indices, cap, keys);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  size_t temp_bytes = s.sort_temp_bytes;
  JSS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeys(
      ScratchLayout::at<void>(scratch, s.sort_temp), temp_bytes, keys, sorted_keys,
      static_cast<int>(cap), 0, 64, stream));
  scatter_add_runs_kernel<F><<<grid, kElementThreads, 0, stream>>>(sorted_keys, cap, values, out,
                                                                  n);
  return last_launch_error();
}

}  // namespace cuda
}  // namespace jss
