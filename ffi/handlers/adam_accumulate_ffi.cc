// FFI handler (CPU) of the Adam-direction pass fused with the error-feedback
// accumulator and, optionally, the exact top-k (kernels/adam_accumulate.h).
// Its CUDA twin: ffi/cuda/accumulate_cuda.cu (kernels/fused_accumulate.cuh).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ffi/handlers/adam_state_args.h"
#include "ffi/handlers/gradient_leaves.h"
#include "ffi/handlers/signatures.h"
#include "kernels/adam_accumulate.h"
#include "kernels/float_bits.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using F32 = ffi::Buffer<ffi::F32>;
using F32Out = ffi::ResultBuffer<ffi::F32>;

// scalars: as jss_adam_direction's (1 - b2**t, 1 - b1**t, scale, noise_norm,
// update_noise, keep, floor), then the residual's decay (read with has_decay) and
// the top-k hint (a magnitude <= the k-th, or 0; read with k >= 1), then the
// gradient's global norm and the clipping's max_norm (read with has_clip: every
// gradient entry is clipped as optax.clip_by_global_norm(max_norm) clips it
// unless the norm is below max_norm; kernels/adam_direction.h).
// starts: where each gradient leaf's entries begin in the (N,) state, residual and
// accumulator. The whole gradient: 0, then each leaf after the one before. One
// group of grouped_topk_sync: the group's leaves' places; only those entries are
// read and written (in place), the rest of each buffer is left as it is, so the
// groups' calls chain through the same buffers. The top-k is over the group's
// entries in the order of its leaves, its indices relative to that order. Leaves
// that follow one another (one range) are selected from the accumulator itself;
// otherwise the group's accumulator is also written, in that order, to `gathered`
// ((count,), else (1,) and unused), which the selection reads.
ffi::Error AdamAccumulateImpl(F32 mu, F32 nu, AgeBuffer age, F32 diff_sq, F32 last,
                              F32 before_last, F32 residual, F32 bias1_table, F32 scalars,
                              ffi::RemainingArgs leaves, F32Out mu_out, F32Out nu_out,
                              AgeResult age_out, F32Out diff_sq_out, F32Out last_out,
                              F32Out before_last_out, F32Out acc, F32Out values,
                              ffi::ResultBuffer<ffi::S32> indices,
                              ffi::ResultBuffer<ffi::S32> hint_used, F32Out gathered, float b1,
                              float one_minus_b1, float b2, float one_minus_b2, float eps,
                              int64_t masking, int64_t mask_from_residual, int64_t has_noise,
                              int64_t has_decay, int64_t has_clip, int64_t k, int64_t cap,
                              ffi::Span<const int64_t> starts) {
  const char* op = "jax_sparse_sync.adam_direction_sync (fused accumulate)";
  AdamStateArgs state{mu, nu, age, diff_sq, last, before_last, mu_out, nu_out, age_out,
                      diff_sq_out, last_out, before_last_out, has_noise};
  const int64_t total = state.size();
  if (auto e = state.check(op, {residual.element_count(), acc->element_count()},
                           "the residual and the accumulator", 11, scalars, masking,
                           bias1_table);
      e.failure()) {
    return e;
  }
  if (hint_used->element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": bad hint_used output");
  }
  AdamAccumulateBuffers b;
  bool one_range;
  if (auto e = gather_placed_leaves(op, leaves, starts, total, "the state's", b, one_range);
      e.failure()) {
    return e;
  }
  const int64_t n = b.offsets.back();
  if (auto e = check_topk_outputs(op, 0, k, n, one_range, values->element_count(),
                                  indices->element_count(), gathered->element_count());
      e.failure()) {
    return e;
  }
  state.bind_outputs(b);
  if (acc->typed_data() != residual.typed_data() && n < total) {
    // not aliased: the entries outside the call's are the residual's
    std::copy_n(residual.typed_data(), total, acc->typed_data());
  }
  // acc is normally the residual's own buffer (aliased); if not, every read of
  // the residual (the masking, the sum) goes to the input
  b.residual = mask_from_residual ? residual.typed_data() : nullptr;
  b.accumulate_from = residual.typed_data();
  b.acc = acc->typed_data();
  // every per-entry buffer moved by `by` entries (an output XLA did not alias was
  // copied whole above)
  auto shift = [&](AdamAccumulateBuffers& x, int64_t by, bool with_acc) {
    x.mu += by;
    x.nu += by;
    x.age += by;
    if (has_noise) {
      x.diff_sq += by;
      x.last += by;
      x.before_last += by;
    }
    if (x.residual != nullptr) x.residual += by;
    x.accumulate_from += by;
    if (with_acc) x.acc += by;
  };
  if (one_range) shift(b, starts.size() ? starts[0] : 0, true);
  b.direction = nullptr;  // never written: each block's direction stays in cache
  const float* sc = scalars.typed_data();
  AdamDirectionConfig c = state.config(b1, one_minus_b1, b2, one_minus_b2, eps, masking,
                                       bias1_table, sc);
  if (has_clip) {
    // optax's trigger: the gradient is left as it is where norm < max_norm (a NaN
    // norm clips, as there: every entry becomes NaN)
    c.clip = !(sc[9] < sc[10]);
    c.clip_norm = sc[9];
    c.clip_max_norm = sc[10];
  }
  const float decay = sc[7];
  bool used = false;
  if (one_range) {
    if (k == 0) {
      adam_accumulate(c, b, has_decay != 0, decay);
    } else {
      const float h = sc[8];
      // no usable hint (first step, zero, NaN): key 0 skips the list
      const uint32_t hint_key = (h > 0.0f && h <= 3.4e38f) ? FloatTraits<float>::key(h) : 0u;
      used = adam_accumulate_topk(c, b, has_decay != 0, decay, hint_key, k, cap,
                                  values->typed_data(), indices->typed_data());
    }
  } else {
    // each leaf's pass on its place in the whole buffers, its accumulator written in
    // the group's order to `gathered` (the selection's) and then, while in cache,
    // to its place in the accumulator
    std::vector<AdamAccumulateBuffers> per_leaf(starts.size());
    for (size_t j = 0; j < starts.size(); ++j) {
      AdamAccumulateBuffers& x = per_leaf[j];
      static_cast<AdamDirectionBuffers&>(x) = AdamDirectionBuffers{};
      x.leaves = {b.leaves[j]};
      x.offsets = {b.offsets[j], b.offsets[j + 1]};
      x.mu = b.mu;
      x.nu = b.nu;
      x.age = b.age;
      x.residual = b.residual;
      x.direction = nullptr;
      x.diff_sq = b.diff_sq;
      x.last = b.last;
      x.before_last = b.before_last;
      x.accumulate_from = b.accumulate_from;
      x.acc = gathered->typed_data();
      shift(x, starts[j] - b.offsets[j], false);
    }
    float* whole = acc->typed_data();
    const float* g_acc = gathered->typed_data();
    auto compute = [&](int64_t lo, int64_t hi) {
      for_each_leaf_span(b, lo, hi, [&](const float*, int64_t i, int64_t end) {
        const auto j = static_cast<size_t>(
            std::upper_bound(b.offsets.begin(), b.offsets.end(), i) - b.offsets.begin() - 1);
        adam_accumulate_range(c, per_leaf[j], has_decay != 0, decay, i, end);
        std::copy(g_acc + i, g_acc + end, whole + starts[j] - b.offsets[j] + i);
      });
    };
    if (k == 0) {
      parallel_chunks(n, num_threads_for(n), [&](int, int64_t lo, int64_t hi) { compute(lo, hi); });
    } else {
      const float h = sc[8];
      const uint32_t hint_key = (h > 0.0f && h <= 3.4e38f) ? FloatTraits<float>::key(h) : 0u;
      used = compute_topk(n, compute, g_acc, hint_key, k, cap, values->typed_data(),
                          indices->typed_data());
    }
  }
  if (k == 0) {
    values->typed_data()[0] = 0.0f;
    indices->typed_data()[0] = -1;
  }
  hint_used->typed_data()[0] = used ? 1 : 0;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAdamAccumulate, jss::AdamAccumulateImpl,
                              jss::sig::bind_adam_accumulate(ffi::Ffi::Bind()));
