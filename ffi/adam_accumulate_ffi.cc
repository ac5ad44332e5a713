// FFI handler (CPU) of the Adam-direction pass fused with the error-feedback
// accumulator and, optionally, the exact top-k (kernels/adam_accumulate.h).
// CPU only, like jss_adam_direction and jss_accumulate: on GPU XLA fuses the
// same elementwise arithmetic (jax_sparse_sync/transforms/adam_accumulate.py).
#include <algorithm>
#include <cstdint>
#include <string>

#include "ffi/adam_state_args.h"
#include "ffi/gradient_leaves.h"
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
// offset, count: the entries offset .. offset + count of the (N,) state, residual
// and accumulator are this call's (a group of grouped_topk_sync: the gradient's
// leaves hold count entries; the rest of each buffer is left as it is, so the
// groups' calls chain through the same buffers in place); the top-k's indices
// are relative to offset. offset 0, count N: the whole state.
ffi::Error AdamAccumulateImpl(F32 mu, F32 nu, AgeBuffer age, F32 diff_sq, F32 last,
                              F32 before_last, F32 residual, F32 bias1_table, F32 scalars,
                              ffi::RemainingArgs leaves, F32Out mu_out, F32Out nu_out,
                              AgeResult age_out, F32Out diff_sq_out, F32Out last_out,
                              F32Out before_last_out, F32Out acc, F32Out values,
                              ffi::ResultBuffer<ffi::S32> indices,
                              ffi::ResultBuffer<ffi::S32> hint_used, float b1,
                              float one_minus_b1, float b2, float one_minus_b2, float eps,
                              int64_t masking, int64_t mask_from_residual, int64_t has_noise,
                              int64_t has_decay, int64_t has_clip, int64_t k, int64_t cap,
                              int64_t offset, int64_t count) {
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
  if (offset < 0 || count < 0 || offset > total - count) {
    return ffi::Error::InvalidArgument(std::string(op) + ": need 0 <= offset and offset + "
                                       "count <= N; got offset = " + std::to_string(offset) +
                                       ", count = " + std::to_string(count) + ", N = " +
                                       std::to_string(total));
  }
  const int64_t n = count;
  const size_t out_k = static_cast<size_t>(std::max<int64_t>(k, 1));
  if (k < 0 || k > n || n >= (int64_t{1} << 31) || values->element_count() != out_k ||
      indices->element_count() != out_k) {
    return ffi::Error::InvalidArgument(std::string(op) + ": need 0 <= k <= count < 2^31 and "
                                       "max(k, 1) values and indices; got k = " +
                                       std::to_string(k) + ", count = " + std::to_string(n));
  }
  AdamAccumulateBuffers b;
  if (auto e = gather_gradient_leaves(op, leaves, n, "the call's count", b); e.failure()) {
    return e;
  }
  state.bind_outputs(b);
  // the call's range: every buffer from its offset (the kernel runs over the
  // leaves' n entries); an output XLA did not alias was copied whole above
  b.mu += offset;
  b.nu += offset;
  b.age += offset;
  if (has_noise) {
    b.diff_sq += offset;
    b.last += offset;
    b.before_last += offset;
  }
  if (acc->typed_data() != residual.typed_data() && n < total) {
    // not aliased: the entries outside the range are the residual's
    std::copy_n(residual.typed_data(), total, acc->typed_data());
  }
  // acc is normally the residual's own buffer (aliased); if not, every read of
  // the residual (the masking, the sum) goes to the input
  b.residual = mask_from_residual ? residual.typed_data() + offset : nullptr;
  b.accumulate_from = residual.typed_data() + offset;
  b.acc = acc->typed_data() + offset;
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
  if (k == 0) {
    adam_accumulate(c, b, has_decay != 0, decay);
    values->typed_data()[0] = 0.0f;
    indices->typed_data()[0] = -1;
  } else {
    const float h = sc[8];
    // no usable hint (first step, zero, NaN): key 0 skips the list
    const uint32_t hint_key = (h > 0.0f && h <= 3.4e38f) ? FloatTraits<float>::key(h) : 0u;
    used = adam_accumulate_topk(c, b, has_decay != 0, decay, hint_key, k, cap,
                                values->typed_data(), indices->typed_data());
  }
  hint_used->typed_data()[0] = used ? 1 : 0;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

// Outputs 0-6 are inputs 0-6 (input_output_aliases={0: 0, ..., 6: 6}): the moments,
// age, the noise buffers, and the accumulator in the residual's buffer.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JssAdamAccumulate, jss::AdamAccumulateImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::F32>>()  // mu (N,)
        .Arg<ffi::Buffer<ffi::F32>>()  // nu (N,)
        .Arg<ffi::Buffer<ffi::S16>>()  // age (N,), int16
        .Arg<ffi::Buffer<ffi::F32>>()  // squared second differences' EMA (N,) or (1,)
        .Arg<ffi::Buffer<ffi::F32>>()  // the last gradient (N,) or (1,)
        .Arg<ffi::Buffer<ffi::F32>>()  // the one before (N,) or (1,): has_noise=0
        .Arg<ffi::Buffer<ffi::F32>>()  // the sync's residual (N,)
        .Arg<ffi::Buffer<ffi::F32>>()  // 1 - b1**a for a = 1..T
        .Arg<ffi::Buffer<ffi::F32>>()  // scalars (11,), see above
        .RemainingArgs()               // the gradient's leaves, f32, tree order
        .Ret<ffi::Buffer<ffi::F32>>()  // mu (aliased)
        .Ret<ffi::Buffer<ffi::F32>>()  // nu (aliased)
        .Ret<ffi::Buffer<ffi::S16>>()  // age (aliased)
        .Ret<ffi::Buffer<ffi::F32>>()  // squared second differences' EMA (aliased)
        .Ret<ffi::Buffer<ffi::F32>>()  // the last gradient (aliased)
        .Ret<ffi::Buffer<ffi::F32>>()  // the one before (aliased)
        .Ret<ffi::Buffer<ffi::F32>>()  // acc (N,) (aliased to the residual)
        .Ret<ffi::Buffer<ffi::F32>>()  // values (max(k, 1),), the top-k's
        .Ret<ffi::Buffer<ffi::S32>>()  // indices (max(k, 1),), ascending
        .Ret<ffi::Buffer<ffi::S32>>()  // (1,): 1 if the hint's list was used
        .Attr<float>("b1")
        .Attr<float>("one_minus_b1")
        .Attr<float>("b2")
        .Attr<float>("one_minus_b2")
        .Attr<float>("eps")
        .Attr<int64_t>("masking")
        .Attr<int64_t>("mask_from_residual")
        .Attr<int64_t>("has_noise")
        .Attr<int64_t>("has_decay")
        .Attr<int64_t>("has_clip")  // 1: clip the gradient by its global norm (scalars 9, 10)
        .Attr<int64_t>("k")     // 0: the accumulator only
        .Attr<int64_t>("cap")
        .Attr<int64_t>("offset")  // the call's first entry of the (N,) buffers
        .Attr<int64_t>("count"));  // its entries (the leaves'): offset + count <= N
