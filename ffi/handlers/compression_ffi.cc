// Compression and dense-update FFI handlers (CPU): QSGD quantize /
// dequantize, the in-place residual update and the sparse scatter-add.
#include <cstdint>
#include <cstring>
#include <string>

#include "ffi/handlers/argument_checks.h"
#include "ffi/handlers/cpu_dispatch.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "kernels/float_bits.h"
#include "kernels/parallel.h"
#include "kernels/qsgd.h"
#include "kernels/sparse_update.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr auto kPlatform = checks::Platform::kCpu;
using cpu_ffi::data_as;
using cpu_ffi::for_float_dtype;

ffi::Error QsgdQuantizeImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> seed,
                            ffi::ResultBuffer<ffi::U8> packed, ffi::ResultBuffer<ffi::F32> scales,
                            int64_t bits, int64_t bucket) {
  const QsgdLayout layout{static_cast<int64_t>(x.element_count()), static_cast<int>(bits), bucket};
  // The CPU handler checks `bits` after its int conversion (layout.bits).
  if (auto e = checks::check_qsgd_quantize_args(kPlatform, layout.bits, layout, seed, packed,
                                                scales);
      e.failure()) {
    return e;
  }
  const uint64_t key = splitmix64(static_cast<uint32_t>(seed.typed_data()[0]));
  return for_float_dtype(x.element_type(), "qsgd_quantize", "x", [&](auto tag) {
    using T = decltype(tag);
    qsgd_quantize(data_as<T>(x), layout, key, packed->typed_data(), scales->typed_data(),
                  num_threads_for(layout.n));
    return ffi::Error::Success();
  });
}

ffi::Error QsgdDequantizeImpl(ffi::Buffer<ffi::U8> packed, ffi::Buffer<ffi::F32> scales,
                              ffi::ResultBuffer<ffi::F32> out, int64_t bits, int64_t bucket) {
  const QsgdLayout layout{static_cast<int64_t>(out->element_count()), static_cast<int>(bits), bucket};
  if (auto e = checks::check_qsgd_dequantize_args(layout.bits, layout, packed, scales);
      e.failure()) {
    return e;
  }
  qsgd_dequantize(packed.typed_data(), scales.typed_data(), layout, out->typed_data(),
                  num_threads_for(layout.n));
  return ffi::Error::Success();
}

// The aliased output is normally acc's own buffer; if XLA gave another one,
// start from a copy of acc.
void start_from_input(const ffi::AnyBuffer& in, ffi::Result<ffi::AnyBuffer>& out) {
  if (out->untyped_data() != in.untyped_data()) {
    std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
  }
}

// The shared dtype / shape checks, then the indices' range (host memory here).
ffi::Error check_dense_update(const ffi::AnyBuffer& dense, const ffi::Buffer<ffi::S32>& indices,
                              ffi::Result<ffi::AnyBuffer>& out, const char* op,
                              const char* dense_name) {
  if (auto e = checks::check_dense_update(kPlatform, dense, indices, out, op, dense_name);
      e.failure()) {
    return e;
  }
  const int64_t n = static_cast<int64_t>(dense.element_count());
  const int64_t bad = first_bad_index(indices.typed_data(),
                                      static_cast<int64_t>(indices.element_count()), n);
  return checks::check_update_index_range(op, bad, bad >= 0 ? indices.typed_data()[bad] : 0, n);
}

ffi::Error ResidualUpdateImpl(ffi::AnyBuffer acc, ffi::Buffer<ffi::S32> indices,
                              ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = check_dense_update(acc, indices, out, "residual_update", "acc"); e.failure()) {
    return e;
  }
  start_from_input(acc, out);
  return for_float_dtype(acc.element_type(), "residual_update", "acc", [&](auto tag) {
    using T = decltype(tag);
    zero_at_indices(data_as<T>(out), indices.typed_data(),
                    static_cast<int64_t>(indices.element_count()));
    return ffi::Error::Success();
  });
}

ffi::Error ScatterAddImpl(ffi::AnyBuffer dense, ffi::AnyBuffer values,
                          ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = check_dense_update(dense, indices, out, "scatter_add", "dense"); e.failure()) {
    return e;
  }
  if (auto e = checks::check_scatter_add_values(values, dense, indices); e.failure()) {
    return e;
  }
  start_from_input(dense, out);
  return for_float_dtype(dense.element_type(), "scatter_add", "dense", [&](auto tag) {
    using T = decltype(tag);
    scatter_add(data_as<T>(out), data_as<T>(values), indices.typed_data(),
                static_cast<int64_t>(indices.element_count()));
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssQsgdQuantize, jss::QsgdQuantizeImpl,
                              jss::sig::bind_qsgd_quantize(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssQsgdDequantize, jss::QsgdDequantizeImpl,
                              jss::sig::bind_qsgd_dequantize(ffi::Ffi::Bind()));

// Both aliased: output 0 is input 0 (input_output_aliases={0: 0}).
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssResidualUpdate, jss::ResidualUpdateImpl,
                              jss::sig::bind_residual_update(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssScatterAdd, jss::ScatterAddImpl,
                              jss::sig::bind_scatter_add(ffi::Ffi::Bind()));
