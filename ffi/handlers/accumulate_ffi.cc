// FFI handler (CPU) of the error-feedback accumulator (kernels/accumulate.h).
#include <algorithm>
#include <cstdint>
#include <string>

#include "ffi/handlers/gradient_leaves.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
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

// starts: where each gradient leaf's entries begin in the (N,) residual and
// accumulator. The whole gradient: 0, then each leaf after the one before. One
// group of grouped_topk_sync: the group's leaves' places in the whole buffer;
// only those entries are read and written (in place), the rest of the buffer is
// left as it is, so the groups' calls chain through the same buffer. The top-k
// is over the group's entries in the order of its leaves, its indices relative
// to that order. Leaves that follow one another in the buffer (one range) are
// selected from the buffer itself; otherwise the group's accumulator is also
// written, in that order, to `gathered` ((count,), else (1,) and unused), which
// the selection reads.
ffi::Error AccumulateTopkImpl(F32 residual, F32 decay, F32 hint, ffi::RemainingArgs leaves,
                              ffi::ResultBuffer<ffi::F32> acc, ffi::ResultBuffer<ffi::F32> values,
                              ffi::ResultBuffer<ffi::S32> indices,
                              ffi::ResultBuffer<ffi::S32> hint_used,
                              ffi::ResultBuffer<ffi::F32> gathered, int64_t has_decay, int64_t k,
                              int64_t cap, ffi::Span<const int64_t> starts) {
  const char* op = "jax_sparse_sync.accumulate_topk";
  const int64_t total = static_cast<int64_t>(residual.element_count());
  if (acc->element_count() != residual.element_count() || decay.element_count() != 1 ||
      hint.element_count() != 1 || hint_used->element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the accumulator must have the "
                                       "residual's length, the decay and the hint one entry");
  }
  AccumulateBuffers b;
  bool one_range;
  if (auto e = gather_placed_leaves(op, leaves, starts, total, "the residual's", b, one_range);
      e.failure()) {
    return e;
  }
  const int64_t n = b.offsets.back();
  if (auto e = check_topk_outputs(op, 1, k, n, one_range, values->element_count(),
                                  indices->element_count(), gathered->element_count());
      e.failure()) {
    return e;
  }
  if (acc->typed_data() != residual.typed_data() && n < total) {
    // not aliased: the entries outside the call's are the residual's
    std::copy_n(residual.typed_data(), total, acc->typed_data());
  }
  const float h = hint.typed_data()[0];
  // no usable hint (first step, zero, NaN): key 0 skips the list
  const uint32_t hint_key = (h > 0.0f && h <= 3.4e38f) ? FloatTraits<float>::key(h) : 0u;
  const float factor = decay.typed_data()[0];
  bool used;
  if (one_range) {
    const int64_t at = starts.size() ? starts[0] : 0;
    b.residual = residual.typed_data() + at;
    b.acc = acc->typed_data() + at;  // normally the residual's own buffer (aliased)
    used = accumulate_topk(b, has_decay != 0, factor, hint_key, k, cap, values->typed_data(),
                           indices->typed_data());
  } else {
    // each leaf's entries read from and written to its place in the whole buffer,
    // and to the gathered buffer (the group's order), which the selection reads
    // while each block is in cache
    const float* in = residual.typed_data();
    float* out = acc->typed_data();
    float* g_acc = gathered->typed_data();
    auto compute = [&](int64_t lo, int64_t hi) {
      for_each_leaf_span(b, lo, hi, [&](const float* g, int64_t i, int64_t end) {
        const auto leaf = static_cast<size_t>(
            std::upper_bound(b.offsets.begin(), b.offsets.end(), i) - b.offsets.begin() - 1);
        const int64_t place = starts[leaf] - b.offsets[leaf] + i;
        const float* r = in + place;
        float* o = out + place;
        float* q = g_acc + i;
        const int64_t len = end - i;
        // each entry rounded as accumulate_range rounds it (the product, then the sum)
        if (has_decay) {
          for (int64_t j = 0; j < len; ++j) {
            const float kept = r[j] * factor;
            q[j] = o[j] = kept + g[j];
          }
        } else {
          for (int64_t j = 0; j < len; ++j) q[j] = o[j] = r[j] + g[j];
        }
      });
    };
    used = compute_topk(n, compute, g_acc, hint_key, k, cap, values->typed_data(),
                        indices->typed_data());
  }
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
