// FFI handler (CPU) of the error-feedback accumulator (kernels/accumulate.h).
#include <algorithm>
#include <cstdint>
#include <string>

#include "ffi/gradient_leaves.h"
#include "ffi/signatures.h"
#include "ffi/sparse_allreduce.h"
#include "kernels/accumulate.h"
#include "kernels/float_bits.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using F32 = ffi::Buffer<ffi::F32>;

ffi::Error AccumulateImpl(F32 residual, F32 decay, ffi::RemainingArgs leaves,
                          ffi::ResultBuffer<ffi::F32> acc, int64_t has_decay) {
  const char* op = "jax_sparse_sync.accumulate";
  const int64_t n = static_cast<int64_t>(residual.element_count());
  if (acc->element_count() != residual.element_count() || decay.element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the accumulator must have the "
                                       "residual's length and the decay one entry");
  }
  AccumulateBuffers b;
  if (auto e = gather_gradient_leaves(op, leaves, n, "the residual", b); e.failure()) return e;
  b.residual = residual.typed_data();
  b.acc = acc->typed_data();  // normally the residual's own buffer (aliased)
  accumulate(b, has_decay != 0, decay.typed_data()[0]);
  return ffi::Error::Success();
}

// offset, count: the entries offset .. offset + count of the (N,) residual and
// accumulator are this call's (a group of grouped_topk_sync: the gradient's
// leaves hold count entries; the rest of the buffer is left as it is, so the
// groups' calls chain through the same buffer in place); the top-k's indices
// are relative to offset. offset 0, count N: the whole residual.
ffi::Error AccumulateTopkImpl(F32 residual, F32 decay, F32 hint, ffi::RemainingArgs leaves,
                              ffi::ResultBuffer<ffi::F32> acc, ffi::ResultBuffer<ffi::F32> values,
                              ffi::ResultBuffer<ffi::S32> indices,
                              ffi::ResultBuffer<ffi::S32> hint_used, int64_t has_decay,
                              int64_t k, int64_t cap, int64_t offset, int64_t count) {
  const char* op = "jax_sparse_sync.accumulate_topk";
  const int64_t total = static_cast<int64_t>(residual.element_count());
  if (acc->element_count() != residual.element_count() || decay.element_count() != 1 ||
      hint.element_count() != 1 || hint_used->element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the accumulator must have the "
                                       "residual's length, the decay and the hint one entry");
  }
  if (offset < 0 || count < 0 || offset > total - count) {
    return ffi::Error::InvalidArgument(std::string(op) + ": need 0 <= offset and offset + "
                                       "count <= N; got offset = " + std::to_string(offset) +
                                       ", count = " + std::to_string(count) + ", N = " +
                                       std::to_string(total));
  }
  const int64_t n = count;
  if (k < 1 || k > n || n >= (int64_t{1} << 31) ||
      values->element_count() != static_cast<size_t>(k) ||
      indices->element_count() != static_cast<size_t>(k)) {
    return ffi::Error::InvalidArgument(std::string(op) + ": need 1 <= k <= count < 2^31 and k "
                                       "values and indices; got k = " + std::to_string(k) +
                                       ", count = " + std::to_string(n));
  }
  AccumulateBuffers b;
  if (auto e = gather_gradient_leaves(op, leaves, n, "the call's count", b); e.failure()) {
    return e;
  }
  if (acc->typed_data() != residual.typed_data() && n < total) {
    // not aliased: the entries outside the range are the residual's
    std::copy_n(residual.typed_data(), total, acc->typed_data());
  }
  b.residual = residual.typed_data() + offset;
  b.acc = acc->typed_data() + offset;  // normally the residual's own buffer (aliased)
  const float h = hint.typed_data()[0];
  // no usable hint (first step, zero, NaN): key 0 skips the list
  const uint32_t hint_key = (h > 0.0f && h <= 3.4e38f) ? FloatTraits<float>::key(h) : 0u;
  const bool used = accumulate_topk(b, has_decay != 0, decay.typed_data()[0], hint_key, k, cap,
                                    values->typed_data(), indices->typed_data());
  hint_used->typed_data()[0] = used ? 1 : 0;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

// Output 0 is input 0 (input_output_aliases={0: 0}) in both.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAccumulate, jss::AccumulateImpl,
                              jss::sig::bind_accumulate(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAccumulateTopk, jss::AccumulateTopkImpl,
                              jss::sig::bind_accumulate_topk(ffi::Ffi::Bind()));
