// Compression FFI handlers (CPU): QSGD quantize / dequantize.
#include <cstdint>

#include "ffi/sparse_allreduce.h"
#include "kernels/qsgd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

ffi::Error check_layout(const QsgdLayout& layout, const char* op) {
  if (!qsgd_bits_supported(layout.bits)) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": `bits` must be 2, 4 or 8");
  }
  if (layout.bucket < 1) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op +
                                       ": `bucket` must be >= 1");
  }
  return ffi::Error::Success();
}

ffi::Error QsgdQuantizeImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> seed,
                            ffi::ResultBuffer<ffi::U8> packed, ffi::ResultBuffer<ffi::F32> scales,
                            int64_t bits, int64_t bucket) {
  const QsgdLayout layout{static_cast<int64_t>(x.element_count()), static_cast<int>(bits), bucket};
  if (auto e = check_layout(layout, "qsgd_quantize"); e.failure()) return e;
  if (static_cast<int64_t>(packed->element_count()) != layout.packed_bytes() ||
      static_cast<int64_t>(scales->element_count()) != layout.num_buckets()) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.qsgd_quantize: output shape mismatch");
  }
  const uint64_t s = static_cast<uint32_t>(seed.typed_data()[0]);
  qsgd_quantize(x.typed_data(), layout, splitmix64(s), packed->typed_data(), scales->typed_data());
  return ffi::Error::Success();
}

ffi::Error QsgdDequantizeImpl(ffi::Buffer<ffi::U8> packed, ffi::Buffer<ffi::F32> scales,
                              ffi::ResultBuffer<ffi::F32> out, int64_t bits, int64_t bucket) {
  const QsgdLayout layout{static_cast<int64_t>(out->element_count()), static_cast<int>(bits), bucket};
  if (auto e = check_layout(layout, "qsgd_dequantize"); e.failure()) return e;
  if (static_cast<int64_t>(packed.element_count()) != layout.packed_bytes() ||
      static_cast<int64_t>(scales.element_count()) != layout.num_buckets()) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.qsgd_dequantize: `packed`/`scales` do not match size, bits and bucket");
  }
  qsgd_dequantize(packed.typed_data(), scales.typed_data(), layout, out->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssQsgdQuantize, jss::QsgdQuantizeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("bucket"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssQsgdDequantize, jss::QsgdDequantizeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("bucket"));
