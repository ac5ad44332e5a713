// Compression and dense-update FFI handlers (CPU): QSGD quantize /
// dequantize, the in-place residual update and the sparse scatter-add.
#include <cstdint>
#include <cstring>
#include <string>

#include "ffi/signatures.h"
#include "ffi/sparse_allreduce.h"
#include "kernels/float_bits.h"
#include "kernels/qsgd.h"
#include "kernels/sparse_update.h"
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

ffi::Error QsgdQuantizeImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> seed,
                            ffi::ResultBuffer<ffi::U8> packed, ffi::ResultBuffer<ffi::F32> scales,
                            int64_t bits, int64_t bucket) {
  const QsgdLayout layout{static_cast<int64_t>(x.element_count()), static_cast<int>(bits), bucket};
  if (auto e = check_layout(layout, "qsgd_quantize"); e.failure()) return e;
  if (static_cast<int64_t>(packed->element_count()) != layout.packed_bytes() ||
      static_cast<int64_t>(scales->element_count()) != layout.num_buckets()) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.qsgd_quantize: output shape mismatch");
  }
  const uint64_t s = static_cast<uint32_t>(seed.typed_data()[0]);
  const uint64_t key = splitmix64(s);
  switch (x.element_type()) {
    case ffi::F32:
      qsgd_quantize(reinterpret_cast<const float*>(x.untyped_data()), layout, key,
                    packed->typed_data(), scales->typed_data());
      break;
    case ffi::BF16:
      qsgd_quantize(reinterpret_cast<const bfloat16_t*>(x.untyped_data()), layout, key,
                    packed->typed_data(), scales->typed_data());
      break;
    case ffi::F16:
      qsgd_quantize(reinterpret_cast<const float16_t*>(x.untyped_data()), layout, key,
                    packed->typed_data(), scales->typed_data());
      break;
    default:
      return ffi::Error::InvalidArgument(
          "jax_sparse_sync.qsgd_quantize: `x` must be float32, bfloat16 or float16");
  }
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

bool is_selection_float(ffi::DataType t) {
  return t == ffi::F32 || t == ffi::BF16 || t == ffi::F16;
}

// The aliased output is normally acc's own buffer; if XLA gave another one,
// start from a copy of acc.
void start_from_input(const ffi::AnyBuffer& in, ffi::Result<ffi::AnyBuffer>& out) {
  if (out->untyped_data() != in.untyped_data()) {
    std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
  }
}

ffi::Error check_dense_update(const ffi::AnyBuffer& dense, const ffi::Buffer<ffi::S32>& indices,
                              ffi::Result<ffi::AnyBuffer>& out, const char* op,
                              const char* dense_name) {
  if (!is_selection_float(dense.element_type()) || out->element_type() != dense.element_type() ||
      out->element_count() != dense.element_count()) {
    return ffi::Error::InvalidArgument(std::string("jax_sparse_sync.") + op + ": `" + dense_name +
                                       "` must be float32, bfloat16 or float16 and match the output");
  }
  const int64_t n = static_cast<int64_t>(dense.element_count());
  const int64_t bad = first_bad_index(indices.typed_data(),
                                      static_cast<int64_t>(indices.element_count()), n);
  if (bad >= 0) {
    return ffi::Error::InvalidArgument(
        std::string("jax_sparse_sync.") + op + ": indices[" + std::to_string(bad) + "] = " +
        std::to_string(indices.typed_data()[bad]) + " is outside [0, " + std::to_string(n) +
        ") (use -1 for padding)");
  }
  return ffi::Error::Success();
}

ffi::Error ResidualUpdateImpl(ffi::AnyBuffer acc, ffi::Buffer<ffi::S32> indices,
                              ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = check_dense_update(acc, indices, out, "residual_update", "acc"); e.failure()) {
    return e;
  }
  start_from_input(acc, out);
  const int64_t cap = static_cast<int64_t>(indices.element_count());
  switch (acc.element_type()) {
    case ffi::F32:
      zero_at_indices(reinterpret_cast<float*>(out->untyped_data()), indices.typed_data(), cap);
      break;
    case ffi::BF16:
      zero_at_indices(reinterpret_cast<bfloat16_t*>(out->untyped_data()), indices.typed_data(), cap);
      break;
    default:
      zero_at_indices(reinterpret_cast<float16_t*>(out->untyped_data()), indices.typed_data(), cap);
      break;
  }
  return ffi::Error::Success();
}

ffi::Error ScatterAddImpl(ffi::AnyBuffer dense, ffi::AnyBuffer values,
                          ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::AnyBuffer> out) {
  if (auto e = check_dense_update(dense, indices, out, "scatter_add", "dense"); e.failure()) {
    return e;
  }
  if (values.element_type() != dense.element_type() ||
      values.element_count() != indices.element_count()) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.scatter_add: `values` must have `dense`'s dtype and `indices`' length");
  }
  start_from_input(dense, out);
  const int64_t cap = static_cast<int64_t>(indices.element_count());
  switch (dense.element_type()) {
    case ffi::F32:
      scatter_add(reinterpret_cast<float*>(out->untyped_data()),
                  reinterpret_cast<const float*>(values.untyped_data()), indices.typed_data(), cap);
      break;
    case ffi::BF16:
      scatter_add(reinterpret_cast<bfloat16_t*>(out->untyped_data()),
                  reinterpret_cast<const bfloat16_t*>(values.untyped_data()), indices.typed_data(),
                  cap);
      break;
    default:
      scatter_add(reinterpret_cast<float16_t*>(out->untyped_data()),
                  reinterpret_cast<const float16_t*>(values.untyped_data()), indices.typed_data(),
                  cap);
      break;
  }
  return ffi::Error::Success();
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
