// Selection FFI handlers (CUDA): exact top-k, bucketed top-k, threshold
// selection and k-th magnitude. Same target signatures as the CPU handlers in
// ffi/handlers/selection_ffi.cc; thin bindings over kernels/selection.cuh. Everything
// runs on XLA's stream with scratch from XLA's allocator; nothing here
// synchronizes the stream or reads device data on the host.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ffi/handlers/argument_checks.h"
#include "ffi/cuda/cuda_ffi_common.cuh"
#include "ffi/cuda/cuda_handlers.h"
#include "ffi/handlers/signatures.h"
#include "kernels/selection.cuh"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using namespace cuda_ffi;  // the handlers' plumbing and kPlatform (cuda_ffi_common.cuh)

ffi::Error TopkCudaImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                        ffi::Result<ffi::AnyBuffer> values,
                        ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t k) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_topk_args(kPlatform, x, values, indices, k); e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "topk", "x", [&](auto traits) {
    using F = decltype(traits);
    return launch_with_scratch(scratch, cuda::topk_scratch_bytes<F>(n, k), "topk", [&](void* w) {
      return cuda::topk_launch<F>(bits_of<F>(x), n, k, bits_of<F>(values), indices->typed_data(),
                                  w, stream);
    });
  });
}

ffi::Error BucketTopkCudaImpl(cudaStream_t stream, ffi::AnyBuffer x,
                              ffi::Result<ffi::AnyBuffer> values,
                              ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t bucket,
                              int64_t k) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_bucket_topk_args(kPlatform, x, values, indices, bucket, k);
      e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "bucket_topk", "x", [&](auto traits) {
    using F = decltype(traits);
    return cuda_error("bucket_topk",
                      cuda::bucket_topk_launch<F>(bits_of<F>(x), n, bucket, k, bits_of<F>(values),
                                                  indices->typed_data(), stream));
  });
}

ffi::Error ThresholdSelectCudaImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                                   ffi::AnyBuffer x, ffi::Buffer<ffi::F32> threshold,
                                   ffi::Result<ffi::AnyBuffer> values,
                                   ffi::Result<ffi::Buffer<ffi::S32>> indices,
                                   ffi::ResultBuffer<ffi::S32> count, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_threshold_select_args(kPlatform, x, threshold, values, indices, count,
                                                   capacity);
      e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "threshold_select", "x", [&](auto traits) {
    using F = decltype(traits);
    return launch_with_scratch(
        scratch, cuda::threshold_select_scratch_bytes<F>(n), "threshold_select", [&](void* w) {
          return cuda::threshold_select_launch<F>(bits_of<F>(x), n, threshold.typed_data(),
                                                  capacity, bits_of<F>(values),
                                                  indices->typed_data(), count->typed_data(), w,
                                                  stream);
        });
  });
}

ffi::Error KthMagnitudeCudaImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                                ffi::AnyBuffer x, ffi::ResultBuffer<ffi::F32> out, int64_t k,
                                int64_t stride) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_kth_magnitude_args(kPlatform, x, out, k, stride); e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "kth_magnitude", "x", [&](auto traits) {
    using F = decltype(traits);
    return launch_with_scratch(
        scratch, cuda::kth_magnitude_scratch_bytes<F>(n, stride, k), "kth_magnitude",
        [&](void* w) {
          return cuda::kth_magnitude_launch<F>(bits_of<F>(x), n, stride, k, out->typed_data(), w,
                                               stream);
        });
  });
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssTopkCuda, jss::TopkCudaImpl,
                              jss::sig::bind_topk(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssBucketTopkCuda, jss::BucketTopkCudaImpl,
                              jss::sig::bind_bucket_topk(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssThresholdSelectCuda, jss::ThresholdSelectCudaImpl,
                              jss::sig::bind_threshold_select(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssKthMagnitudeCuda, jss::KthMagnitudeCudaImpl,
                              jss::sig::bind_kth_magnitude(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));
