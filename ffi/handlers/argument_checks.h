// Argument validation shared by the CPU FFI handlers (ffi/handlers/selection_ffi.cc,
// ffi/handlers/compression_ffi.cc, JssBlockScan in ffi/collectives/block_allreduce.cc) and their
// CUDA twins (ffi/cuda/selection_cuda.cu, ffi/cuda/compression_cuda.cu): one function per
// target, returning ffi::Error::Success() or the InvalidArgument the handler
// reports. The message texts are part of the interface (tests match them).
//
// Where the two handlers of a target check different things today, the
// function takes the Platform and keeps each one's checks, order and message;
// every such difference is noted at the function. Only shapes, dtypes and
// attributes are checked here, nothing that reads buffer contents (the CUDA
// buffers are device memory); the CPU-only index-range check takes the slot
// the caller found on the host.
//
// Every function takes the handler's own buffers, so a handler checks its
// arguments in one call. Host-only, header-only: compiled by g++ and (from
// the .cu files) by nvcc.
// Everything is in jss::checks (like the bindings in jss::sig).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jss {
namespace checks {

namespace ffi = xla::ffi;

enum class Platform { kCpu, kCuda };

// Element count of an argument or (through *result) a result buffer.
inline int64_t count_of(const ffi::AnyBuffer& b) { return static_cast<int64_t>(b.element_count()); }
template <ffi::DataType T>
int64_t count_of(const ffi::Buffer<T>& b) {
  return static_cast<int64_t>(b.element_count());
}

// Largest x.size + 1 the selection targets accept (they return int32 indices).
constexpr int64_t kMaxIndexable = int64_t{1} << 31;

inline bool is_selection_float(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

// The error of a float32 / bfloat16 / float16 argument of another type.
inline ffi::Error float_dtype_error(const char* op, const char* arg) {
  return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op + ": `" + arg +
                                     "` must be float32, bfloat16 or float16");
}

// The dtype dispatch of every handler: fn(F32T{}), fn(BF16T{}) or fn(F16T{})
// for a float32 / bfloat16 / float16 buffer type, returning fn's ffi::Error;
// any other type gives the dtype error naming `arg`. The CPU handlers pass
// their storage types (float, bfloat16_t, float16_t), the CUDA ones the
// kernels' traits (cuda::F32, cuda::BF16, cuda::F16).
template <typename F32T, typename BF16T, typename F16T, typename Fn>
ffi::Error dispatch_float_dtype(ffi::DataType type, const char* op, const char* arg, Fn&& fn) {
  switch (type) {
    case ffi::DataType::F32: return fn(F32T{});
    case ffi::DataType::BF16: return fn(BF16T{});
    case ffi::DataType::F16: return fn(F16T{});
    default: return float_dtype_error(op, arg);
  }
}

// --- selection ---------------------------------------------------------------

// topk. CUDA only: also checks the outputs' lengths (k) and the values' dtype.
inline ffi::Error check_topk_args(Platform platform, const ffi::AnyBuffer& x,
                                  ffi::Result<ffi::AnyBuffer>& values,
                                  ffi::Result<ffi::Buffer<ffi::S32>>& indices, int64_t k) {
  const int64_t n = count_of(x);
  if (k < 0 || k > n) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.topk: `k` must be in [0, x.size]; got k=" +
                                       std::to_string(k) + " for size " + std::to_string(n));
  }
  if (n >= kMaxIndexable) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.topk: x.size must be below 2**31 (int32 indices)");
  }
  if (platform == Platform::kCuda && (count_of(*values) != k || count_of(*indices) != k ||
                                      values->element_type() != x.element_type())) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.topk: output shape or dtype mismatch");
  }
  return ffi::Error::Success();
}

// bucket_topk. The CPU handler checks neither the 2**31 size limit nor the
// indices' length nor the values' dtype (only the values' length); CUDA checks
// all of them.
inline ffi::Error check_bucket_topk_args(Platform platform, const ffi::AnyBuffer& x,
                                         ffi::Result<ffi::AnyBuffer>& values,
                                         ffi::Result<ffi::Buffer<ffi::S32>>& indices,
                                         int64_t bucket, int64_t k) {
  const int64_t n = count_of(x);
  if (bucket < 1 || k < 0 || k > bucket) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.bucket_topk: need bucket >= 1 and 0 <= k_per_bucket <= bucket");
  }
  if (platform == Platform::kCuda && n >= kMaxIndexable) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.bucket_topk: x.size must be below 2**31 (int32 indices)");
  }
  const int64_t slots = (n + bucket - 1) / bucket * k;
  const bool mismatch =
      platform == Platform::kCpu
          ? count_of(*values) != slots
          : count_of(*values) != slots || count_of(*indices) != slots ||
                values->element_type() != x.element_type();
  if (mismatch) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.bucket_topk: output shape mismatch");
  }
  return ffi::Error::Success();
}

// threshold_select. The two handlers differ:
//  CPU:  capacity in [0, x.size] and the outputs' lengths (message "`capacity`
//        must be in [0, x.size] and match the outputs"), then the size limit.
//  CUDA: the size limit first, then capacity >= 0 (no upper bound), the
//        outputs' lengths, the values' dtype and the threshold / count being
//        scalars, under another message ("output shapes must be ...").
inline ffi::Error check_threshold_select_args(Platform platform, const ffi::AnyBuffer& x,
                                              const ffi::Buffer<ffi::F32>& threshold,
                                              ffi::Result<ffi::AnyBuffer>& values,
                                              ffi::Result<ffi::Buffer<ffi::S32>>& indices,
                                              ffi::Result<ffi::Buffer<ffi::S32>>& count,
                                              int64_t capacity) {
  const int64_t n = count_of(x);
  const int64_t values_count = count_of(*values), indices_count = count_of(*indices);
  const auto size_error = [] {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.threshold_select: x.size must be below 2**31 (int32 indices)");
  };
  if (platform == Platform::kCpu) {
    if (capacity < 0 || capacity > n || values_count != capacity || indices_count != capacity) {
      return ffi::Error::InvalidArgument(
          "jax_sparse_sync.threshold_select: `capacity` must be in [0, x.size] and match the "
          "outputs");
    }
    if (n >= kMaxIndexable) return size_error();
    return ffi::Error::Success();
  }
  if (n >= kMaxIndexable) return size_error();
  if (capacity < 0 || values_count != capacity || indices_count != capacity ||
      values->element_type() != x.element_type() || count_of(threshold) != 1 ||
      count_of(*count) != 1) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.threshold_select: output shapes must be (capacity,), (capacity,), () "
        "and the threshold a scalar");
  }
  return ffi::Error::Success();
}

// kth_magnitude. CUDA only: also checks that the output is a scalar.
inline ffi::Error check_kth_magnitude_args(Platform platform, const ffi::AnyBuffer& x,
                                           ffi::Result<ffi::Buffer<ffi::F32>>& out, int64_t k,
                                           int64_t stride) {
  const int64_t n = count_of(x);
  if (stride < 1) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.kth_magnitude: `stride` must be >= 1");
  }
  const int64_t m = (n + stride - 1) / stride;
  if (k < 0 || k > m) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.kth_magnitude: `k` must be in [0, ceil(x.size / stride)]; got k=" +
        std::to_string(k) + " for a sample of " + std::to_string(m));
  }
  if (platform == Platform::kCuda && count_of(*out) != 1) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.kth_magnitude: output must be a scalar");
  }
  return ffi::Error::Success();
}

// --- compression -------------------------------------------------------------

// `bits` and `bucket` of qsgd_quantize / qsgd_dequantize. Layout is QsgdLayout
// (CPU, kernels/qsgd.h) or cuda::QsgdShape (CUDA, kernels/compression.cuh); its
// packed_bytes() / num_buckets() are only evaluated once bucket >= 1.
// `bits` is the value each handler checks today: the CPU one its int
// conversion (QsgdLayout::bits), the CUDA one the int64 attribute itself.
template <typename Layout>
ffi::Error check_qsgd_layout(const char* op, int64_t bits, const Layout& layout) {
  if (bits != 2 && bits != 4 && bits != 8) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": `bits` must be 2, 4 or 8");
  }
  if (layout.bucket < 1) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": `bucket` must be >= 1");
  }
  return ffi::Error::Success();
}

// qsgd_quantize. CUDA only: also checks that the seed is a single number.
template <typename Layout>
ffi::Error check_qsgd_quantize_args(Platform platform, int64_t bits, const Layout& layout,
                                    const ffi::Buffer<ffi::S32>& seed,
                                    ffi::Result<ffi::Buffer<ffi::U8>>& packed,
                                    ffi::Result<ffi::Buffer<ffi::F32>>& scales) {
  if (auto e = check_qsgd_layout("qsgd_quantize", bits, layout); e.failure()) return e;
  if (count_of(*packed) != static_cast<int64_t>(layout.packed_bytes()) ||
      count_of(*scales) != static_cast<int64_t>(layout.num_buckets()) ||
      (platform == Platform::kCuda && count_of(seed) != 1)) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.qsgd_quantize: output shape mismatch");
  }
  return ffi::Error::Success();
}

// qsgd_dequantize (same checks on both).
template <typename Layout>
ffi::Error check_qsgd_dequantize_args(int64_t bits, const Layout& layout,
                                      const ffi::Buffer<ffi::U8>& packed,
                                      const ffi::Buffer<ffi::F32>& scales) {
  if (auto e = check_qsgd_layout("qsgd_dequantize", bits, layout); e.failure()) return e;
  if (count_of(packed) != static_cast<int64_t>(layout.packed_bytes()) ||
      count_of(scales) != static_cast<int64_t>(layout.num_buckets())) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.qsgd_dequantize: `packed`/`scales` do not match size, bits and bucket");
  }
  return ffi::Error::Success();
}

// block_scan. CUDA only: also checks the mask's length.
inline ffi::Error check_block_scan_args(Platform platform, const ffi::AnyBuffer& x,
                                        ffi::Result<ffi::Buffer<ffi::U8>>& mask,
                                        int64_t block_size) {
  const int64_t n = count_of(x);
  if (block_size < 1) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.block_scan: `block_size` must be >= 1");
  }
  if (platform == Platform::kCuda && count_of(*mask) != (n + block_size - 1) / block_size) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.block_scan: mask must hold ceil(x.size / block_size) entries");
  }
  return ffi::Error::Success();
}

// residual_update / scatter_add: the dense input `dense_name` against the
// aliased output. The two handlers differ:
//  CPU:  the dense dtype must be a float one and match the output's, sizes
//        equal (one message); no size limit. The CPU handler then checks the
//        indices' range on the host (check_update_index_range).
//  CUDA: the output's dtype and size must match (another message; a non-float
//        dtype is reported by the dtype dispatch later), then dense and indices
//        sizes below 2**31. Indices are not range-checked (device memory; the
//        kernels skip out-of-range indices).
inline ffi::Error check_dense_update(Platform platform, const ffi::AnyBuffer& dense,
                                     const ffi::Buffer<ffi::S32>& indices,
                                     ffi::Result<ffi::AnyBuffer>& out, const char* op,
                                     const char* dense_name) {
  const ffi::DataType dense_type = dense.element_type(), out_type = out->element_type();
  const size_t dense_count = dense.element_count(), indices_count = indices.element_count();
  const size_t out_count = out->element_count();
  if (platform == Platform::kCpu) {
    if (!is_selection_float(dense_type) || out_type != dense_type || out_count != dense_count) {
      return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op + ": `" +
                                         dense_name +
                                         "` must be float32, bfloat16 or float16 and match the "
                                         "output");
    }
    return ffi::Error::Success();
  }
  if (out_type != dense_type || out_count != dense_count) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op + ": `" + dense_name +
                                       "` must match the output's dtype and shape");
  }
  if (dense_count >= (size_t{1} << 31) || indices_count >= (size_t{1} << 31)) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": sizes must be below 2**31 (int32 indices)");
  }
  return ffi::Error::Success();
}

// CPU only: `bad` is the slot of the first index outside [-1, n) (or -1 when
// every index is valid, see first_bad_index in kernels/sparse_update.h) and
// `bad_value` the index found there.
inline ffi::Error check_update_index_range(const char* op, int64_t bad, int32_t bad_value,
                                           int64_t n) {
  if (bad >= 0) {
    return ffi::Error::InvalidArgument(
        std::string("jax_sparse_sync.") + op + ": indices[" + std::to_string(bad) + "] = " +
        std::to_string(bad_value) + " is outside [0, " + std::to_string(n) +
        ") (use -1 for padding)");
  }
  return ffi::Error::Success();
}

// scatter_add's `values` (same check on both, after check_dense_update).
inline ffi::Error check_scatter_add_values(const ffi::AnyBuffer& values,
                                           const ffi::AnyBuffer& dense,
                                           const ffi::Buffer<ffi::S32>& indices) {
  if (values.element_type() != dense.element_type() ||
      values.element_count() != indices.element_count()) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.scatter_add: `values` must have `dense`'s dtype and `indices`' length");
  }
  return ffi::Error::Success();
}

}  // namespace checks
}  // namespace jss
