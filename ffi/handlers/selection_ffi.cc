// Selection FFI handlers (CPU): exact top-k by magnitude, bucketed top-k,
// threshold selection and the k-th magnitude (threshold estimation).
#include <cmath>
#include <cstdint>
#include <string>

#include "ffi/handlers/argument_checks.h"
#include "ffi/handlers/cpu_dispatch.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "kernels/float_bits.h"
#include "kernels/threshold_select.h"
#include "kernels/parallel.h"
#include "kernels/topk_select.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr auto kPlatform = checks::Platform::kCpu;

using cpu_ffi::data_as;
using cpu_ffi::for_float_dtype;

ffi::Error TopkImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                    ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t k) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_topk_args(kPlatform, x, values, indices, k); e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "topk", "x", [&](auto tag) {
    using T = decltype(tag);
    topk_by_magnitude(data_as<T>(x), n, k, data_as<T>(values), indices->typed_data(),
                      num_threads_for(n));
    return ffi::Error::Success();
  });
}

ffi::Error BucketTopkImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                          ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t bucket, int64_t k) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_bucket_topk_args(kPlatform, x, values, indices, bucket, k);
      e.failure()) {
    return e;
  }
  return for_float_dtype(x.element_type(), "bucket_topk", "x", [&](auto tag) {
    using T = decltype(tag);
    bucket_topk_by_magnitude(data_as<T>(x), n, bucket, k, data_as<T>(values),
                             indices->typed_data(), num_threads_for(n));
    return ffi::Error::Success();
  });
}

ffi::Error ThresholdSelectImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::F32> threshold,
                               ffi::Result<ffi::AnyBuffer> values,
                               ffi::Result<ffi::Buffer<ffi::S32>> indices,
                               ffi::ResultBuffer<ffi::S32> count, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_threshold_select_args(kPlatform, x, threshold, values, indices, count,
                                                   capacity);
      e.failure()) {
    return e;
  }
  const float t = threshold.typed_data()[0];
  return for_float_dtype(x.element_type(), "threshold_select", "x", [&](auto tag) {
    using T = decltype(tag);
    const int64_t c = threshold_select(data_as<T>(x), n, t, capacity, data_as<T>(values),
                                       indices->typed_data(), num_threads_for(n));
    count->typed_data()[0] = static_cast<int32_t>(c);  // n < 2^31
    return ffi::Error::Success();
  });
}

ffi::Error KthMagnitudeImpl(ffi::AnyBuffer x, ffi::ResultBuffer<ffi::F32> out, int64_t k,
                            int64_t stride) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_kth_magnitude_args(kPlatform, x, out, k, stride); e.failure()) {
    return e;
  }
  if (k == 0) {
    out->typed_data()[0] = INFINITY;  // nothing is selected: a threshold above every number
    return ffi::Error::Success();
  }
  return for_float_dtype(x.element_type(), "kth_magnitude", "x", [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = (n + stride - 1) / stride;
    out->typed_data()[0] = FloatTraits<T>::from_key(
        kth_magnitude_key_strided(data_as<T>(x), n, stride, k, num_threads_for(m)));
    return ffi::Error::Success();
  });
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
