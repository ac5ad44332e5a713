// Compression and dense-update FFI handlers (CUDA): QSGD quantize / dequantize,
// block scan, residual update and scatter-add. Same target signatures as the
// CPU handlers (ffi/handlers/compression_ffi.cc, JssBlockScan in ffi/collectives/block_allreduce.cc);
// thin bindings over kernels/compression.cuh, on XLA's stream.
//
// Index policy: the CPU handlers reject an index outside [-1, N) before writing
// anything. Checking that here would need a device-to-host copy and a stream
// synchronize, so the CUDA kernels skip such indices instead (like padding);
// the Python wrappers validate indices where they are concrete.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ffi/handlers/argument_checks.h"
#include "ffi/cuda/cuda_ffi_common.cuh"
#include "ffi/cuda/cuda_handlers.h"
#include "ffi/handlers/signatures.h"
#include "kernels/compression.cuh"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using namespace cuda_ffi;  // the handlers' plumbing and kPlatform (cuda_ffi_common.cuh)

ffi::Error QsgdQuantizeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> seed,
                                ffi::ResultBuffer<ffi::U8> packed,
                                ffi::ResultBuffer<ffi::F32> scales, int64_t bits, int64_t bucket) {
  const cuda::QsgdShape shape{static_cast<long long>(x.element_count()), static_cast<int>(bits),
                              bucket};
  // The CUDA handler checks the int64 `bits` attribute itself.
  if (auto e = checks::check_qsgd_quantize_args(kPlatform, bits, shape, seed, packed, scales);
      e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "qsgd_quantize", "x", [&](auto traits) {
    using F = decltype(traits);
    return cuda_error("qsgd_quantize",
                      cuda::qsgd_quantize_launch<F>(bits_of<F>(x), shape, seed.typed_data(),
                                                    packed->typed_data(), scales->typed_data(),
                                                    stream));
  });
}

ffi::Error QsgdDequantizeCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> packed,
                                  ffi::Buffer<ffi::F32> scales, ffi::ResultBuffer<ffi::F32> out,
                                  int64_t bits, int64_t bucket) {
  const cuda::QsgdShape shape{static_cast<long long>(out->element_count()),
                              static_cast<int>(bits), bucket};
  if (auto e = checks::check_qsgd_dequantize_args(bits, shape, packed, scales); e.failure()) {
    return e;
  }
  return cuda_error("qsgd_dequantize",
                    cuda::qsgd_dequantize_launch(packed.typed_data(), scales.typed_data(), shape,
                                                 out->typed_data(), stream));
}

ffi::Error BlockScanCudaImpl(cudaStream_t stream, ffi::AnyBuffer x,
                             ffi::ResultBuffer<ffi::U8> mask, int64_t block_size) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_block_scan_args(kPlatform, x, mask, block_size); e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "block_scan", "x", [&](auto traits) {
    using F = decltype(traits);
    return cuda_error("block_scan", cuda::block_scan_launch<F>(bits_of<F>(x), n, block_size,
                                                               mask->typed_data(), stream));
  });
}

ffi::Error ResidualUpdateCudaImpl(cudaStream_t stream, ffi::AnyBuffer acc,
                                  ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = checks::check_dense_update(kPlatform, acc, indices, out, "residual_update", "acc");
      e.failure()) {
    return e;
  }
  const long long n = static_cast<long long>(acc.element_count());
  const long long cap = static_cast<long long>(indices.element_count());
  return for_float_dtype(acc.element_type(), "residual_update", "acc", [&](auto traits) {
    using F = decltype(traits);
    return cuda_error("residual_update",
                      cuda::residual_update_launch<F>(bits_of<F>(acc), n, indices.typed_data(), cap,
                                                      bits_of<F>(out), stream));
  });
}

ffi::Error ScatterAddCudaImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                              ffi::AnyBuffer dense, ffi::AnyBuffer values,
                              ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = checks::check_dense_update(kPlatform, dense, indices, out, "scatter_add", "dense");
      e.failure()) {
    return e;
  }
  if (auto e = checks::check_scatter_add_values(values, dense, indices); e.failure()) {
    return e;
  }
  const long long n = static_cast<long long>(dense.element_count());
  const long long cap = static_cast<long long>(indices.element_count());
  return for_float_dtype(dense.element_type(), "scatter_add", "dense", [&](auto traits) {
    using F = decltype(traits);
    return launch_with_scratch(
        scratch, n > 0 ? cuda::scatter_add_scratch_bytes(cap) : 0, "scatter_add", [&](void* w) {
          return cuda::scatter_add_launch<F>(bits_of<F>(dense), n, bits_of<F>(values),
                                             indices.typed_data(), cap, bits_of<F>(out), w,
                                             stream);
        });
  });
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssQsgdQuantizeCuda, jss::QsgdQuantizeCudaImpl,
                              jss::sig::bind_qsgd_quantize(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssQsgdDequantizeCuda, jss::QsgdDequantizeCudaImpl,
                              jss::sig::bind_qsgd_dequantize(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssBlockScanCuda, jss::BlockScanCudaImpl,
                              jss::sig::bind_block_scan(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssResidualUpdateCuda, jss::ResidualUpdateCudaImpl,
                              jss::sig::bind_residual_update(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssScatterAddCuda, jss::ScatterAddCudaImpl,
                              jss::sig::bind_scatter_add(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));
