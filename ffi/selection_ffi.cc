// Selection FFI handlers (CPU): exact top-k by magnitude, bucketed top-k,
// threshold selection and the k-th magnitude (threshold estimation).
#include <cmath>
#include <cstdint>
#include <string>

#include "ffi/argument_checks.h"
#include "ffi/signatures.h"
#include "ffi/sparse_allreduce.h"
#include "kernels/float_bits.h"
#include "kernels/threshold_select.h"
#include "kernels/parallel.h"
#include "kernels/topk_select.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr auto kPlatform = checks::Platform::kCpu;

template <typename T>
void run_topk(const ffi::AnyBuffer& x, int64_t k, ffi::Result<ffi::AnyBuffer>& values,
              ffi::Result<ffi::Buffer<ffi::S32>>& indices) {
  topk_by_magnitude(reinterpret_cast<const T*>(x.untyped_data()),
                    static_cast<int64_t>(x.element_count()), k,
                    reinterpret_cast<T*>(values->untyped_data()), indices->typed_data(),
                    num_threads_for(static_cast<int64_t>(x.element_count())));
}

ffi::Error TopkImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                    ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t k) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_topk_args(kPlatform, n, k,
                                       static_cast<int64_t>(values->element_count()),
                                       static_cast<int64_t>(indices->element_count()),
                                       values->element_type(), x.element_type());
      e.failure()) {
    return e;
  }
  switch (x.element_type()) {
    case ffi::F32: run_topk<float>(x, k, values, indices); break;
    case ffi::BF16: run_topk<bfloat16_t>(x, k, values, indices); break;
    case ffi::F16: run_topk<float16_t>(x, k, values, indices); break;
    default: return checks::float_dtype_error("topk", "x");
  }
  return ffi::Error::Success();
}

template <typename T>
void run_bucket_topk(const ffi::AnyBuffer& x, int64_t bucket, int64_t k,
                     ffi::Result<ffi::AnyBuffer>& values,
                     ffi::Result<ffi::Buffer<ffi::S32>>& indices) {
  bucket_topk_by_magnitude(reinterpret_cast<const T*>(x.untyped_data()),
                           static_cast<int64_t>(x.element_count()), bucket, k,
                           reinterpret_cast<T*>(values->untyped_data()), indices->typed_data(),
                           num_threads_for(static_cast<int64_t>(x.element_count())));
}

ffi::Error BucketTopkImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                          ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t bucket, int64_t k) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_bucket_topk_args(kPlatform, n, bucket, k,
                                              static_cast<int64_t>(values->element_count()),
                                              static_cast<int64_t>(indices->element_count()),
                                              values->element_type(), x.element_type());
      e.failure()) {
    return e;
  }
  switch (x.element_type()) {
    case ffi::F32: run_bucket_topk<float>(x, bucket, k, values, indices); break;
    case ffi::BF16: run_bucket_topk<bfloat16_t>(x, bucket, k, values, indices); break;
    case ffi::F16: run_bucket_topk<float16_t>(x, bucket, k, values, indices); break;
    default: return checks::float_dtype_error("bucket_topk", "x");
  }
  return ffi::Error::Success();
}

template <typename T>
int64_t run_threshold_select(const ffi::AnyBuffer& x, float threshold, int64_t capacity,
                             ffi::Result<ffi::AnyBuffer>& values,
                             ffi::Result<ffi::Buffer<ffi::S32>>& indices) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  return threshold_select(reinterpret_cast<const T*>(x.untyped_data()), n, threshold, capacity,
                          reinterpret_cast<T*>(values->untyped_data()), indices->typed_data(),
                          num_threads_for(n));
}

ffi::Error ThresholdSelectImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::F32> threshold,
                               ffi::Result<ffi::AnyBuffer> values,
                               ffi::Result<ffi::Buffer<ffi::S32>> indices,
                               ffi::ResultBuffer<ffi::S32> count, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_threshold_select_args(
          kPlatform, n, capacity, static_cast<int64_t>(values->element_count()),
          static_cast<int64_t>(indices->element_count()), values->element_type(),
          x.element_type(), static_cast<int64_t>(threshold.element_count()),
          static_cast<int64_t>(count->element_count()));
      e.failure()) {
    return e;
  }
  const float t = threshold.typed_data()[0];
  int64_t c = 0;
  switch (x.element_type()) {
    case ffi::F32: c = run_threshold_select<float>(x, t, capacity, values, indices); break;
    case ffi::BF16: c = run_threshold_select<bfloat16_t>(x, t, capacity, values, indices); break;
    case ffi::F16: c = run_threshold_select<float16_t>(x, t, capacity, values, indices); break;
    default: return checks::float_dtype_error("threshold_select", "x");
  }
  count->typed_data()[0] = static_cast<int32_t>(c);  // n < 2^31
  return ffi::Error::Success();
}

template <typename T>
float run_kth_magnitude(const ffi::AnyBuffer& x, int64_t k, int64_t stride) {
  using Tr = FloatTraits<T>;
  const int64_t n = static_cast<int64_t>(x.element_count());
  const int64_t m = (n + stride - 1) / stride;
  const uint32_t key = kth_magnitude_key_strided(reinterpret_cast<const T*>(x.untyped_data()), n,
                                                 stride, k, num_threads_for(m));
  return Tr::from_key(key);
}

ffi::Error KthMagnitudeImpl(ffi::AnyBuffer x, ffi::ResultBuffer<ffi::F32> out, int64_t k,
                            int64_t stride) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_kth_magnitude_args(kPlatform, n, k, stride,
                                                static_cast<int64_t>(out->element_count()));
      e.failure()) {
    return e;
  }
  float kth = 0.0f;
  if (k == 0) {
    kth = INFINITY;  // nothing is selected: a threshold above every number
  } else {
    switch (x.element_type()) {
      case ffi::F32: kth = run_kth_magnitude<float>(x, k, stride); break;
      case ffi::BF16: kth = run_kth_magnitude<bfloat16_t>(x, k, stride); break;
      case ffi::F16: kth = run_kth_magnitude<float16_t>(x, k, stride); break;
      default: return checks::float_dtype_error("kth_magnitude", "x");
    }
  }
  out->typed_data()[0] = kth;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssTopk, jss::TopkImpl,
                              jss::sig::bind_topk(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssBucketTopk, jss::BucketTopkImpl,
                              jss::sig::bind_bucket_topk(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssThresholdSelect, jss::ThresholdSelectImpl,
                              jss::sig::bind_threshold_select(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssKthMagnitude, jss::KthMagnitudeImpl,
                              jss::sig::bind_kth_magnitude(ffi::Ffi::Bind()));
