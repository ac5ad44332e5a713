// FFI handler (CPU) of the fused Adam-direction pass (kernels/adam_direction.h).
#include <algorithm>
#include <cstdint>
#include <string>

#include "ffi/handlers/adam_state_args.h"
#include "ffi/handlers/gradient_leaves.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "kernels/adam_direction.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using F32 = ffi::Buffer<ffi::F32>;

using F32Out = ffi::ResultBuffer<ffi::F32>;

// scalars: (1 - b2**t, 1 - b1**t, scale, noise_norm, update_noise, keep, floor); the
// last four are read with has_noise (second_moment="mean", kernels/adam_direction.h).
ffi::Error AdamDirectionImpl(F32 mu, F32 nu, AgeBuffer age, F32 diff_sq, F32 last,
                             F32 before_last, F32 residual, F32 bias1_table, F32 scalars,
                             ffi::RemainingArgs leaves, F32Out mu_out, F32Out nu_out,
                             AgeResult age_out, F32Out diff_sq_out, F32Out last_out,
                             F32Out before_last_out, F32Out direction, float b1,
                             float one_minus_b1, float b2, float one_minus_b2, float eps,
                             int64_t masking, int64_t has_residual, int64_t has_noise) {
  const char* op = "jax_sparse_sync.adam_direction_sync";
  AdamStateArgs state{mu, nu, age, diff_sq, last, before_last, mu_out, nu_out, age_out,
                      diff_sq_out, last_out, before_last_out, has_noise};
  const size_t n = mu.element_count();
  if (auto e = state.check(op, {has_residual ? residual.element_count() : n,
                                direction->element_count()},
                           "the residual and the direction", 7, scalars, masking,
                           bias1_table);
      e.failure()) {
    return e;
  }
  AdamDirectionBuffers b;
  if (auto e = gather_gradient_leaves(op, leaves, state.size(), "the state", b); e.failure()) {
    return e;
  }
  state.bind_outputs(b);
  b.residual = has_residual ? residual.typed_data() : nullptr;
  b.direction = direction->typed_data();
  const AdamDirectionConfig c = state.config(b1, one_minus_b1, b2, one_minus_b2, eps, masking,
                                             bias1_table, scalars.typed_data());
  adam_direction(c, b);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

// Outputs 0-5 are inputs 0-5 (input_output_aliases={0: 0, ..., 5: 5}).
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAdamDirection, jss::AdamDirectionImpl,
                              jss::sig::bind_adam_direction(ffi::Ffi::Bind()));
