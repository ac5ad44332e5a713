// FFI handler (CPU) of the fused Adam-direction pass (kernels/adam_direction.h).
#include <algorithm>
#include <cstdint>
#include <string>

#include "ffi/gradient_leaves.h"
#include "ffi/signatures.h"
#include "ffi/sparse_allreduce.h"
#include "kernels/adam_direction.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using F32 = ffi::Buffer<ffi::F32>;

using F32Out = ffi::ResultBuffer<ffi::F32>;

// scalars: (1 - b2**t, 1 - b1**t, scale, noise_norm, update_noise, keep, floor); the
// last four are read with has_noise (second_moment="mean", kernels/adam_direction.h).
ffi::Error AdamDirectionImpl(F32 mu, F32 nu, F32 age, F32 diff_sq, F32 last, F32 before_last,
                             F32 residual, F32 bias1_table, F32 scalars,
                             ffi::RemainingArgs leaves, F32Out mu_out, F32Out nu_out,
                             F32Out age_out, F32Out diff_sq_out, F32Out last_out,
                             F32Out before_last_out, F32Out direction, float b1,
                             float one_minus_b1, float b2, float one_minus_b2, float eps,
                             int64_t masking, int64_t has_residual, int64_t has_noise) {
  const char* op = "jax_sparse_sync.adam_direction_sync";
  const int64_t n = static_cast<int64_t>(mu.element_count());
  if (nu.element_count() != mu.element_count() || age.element_count() != mu.element_count() ||
      (has_residual && residual.element_count() != mu.element_count()) ||
      direction->element_count() != mu.element_count()) {
    return ffi::Error::InvalidArgument(std::string(op) + ": mu, nu, age, residual and the "
                                       "direction must have the same length");
  }
  const int64_t noise_n = has_noise ? n : 1;
  if (diff_sq.element_count() != static_cast<size_t>(noise_n) ||
      last.element_count() != static_cast<size_t>(noise_n) ||
      before_last.element_count() != static_cast<size_t>(noise_n)) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the noise buffers must have "
                                       "the state's length (second_moment='mean')");
  }
  if (scalars.element_count() != 7 || masking < 0 || masking > 2) {
    return ffi::Error::InvalidArgument(std::string(op) + ": bad scalars or masking");
  }
  // Aliased outputs: the kernel reads and writes the same buffers.
  auto alias = [](F32& in, F32Out& out, int64_t len) {
    if (out->typed_data() != in.typed_data()) std::copy_n(in.typed_data(), len, out->typed_data());
  };
  alias(mu, mu_out, n);
  alias(nu, nu_out, n);
  alias(age, age_out, n);
  alias(diff_sq, diff_sq_out, noise_n);
  alias(last, last_out, noise_n);
  alias(before_last, before_last_out, noise_n);
  AdamDirectionBuffers b;
  if (auto e = gather_gradient_leaves(op, leaves, n, "the state", b); e.failure()) return e;
  b.mu = mu_out->typed_data();
  b.nu = nu_out->typed_data();
  b.age = age_out->typed_data();
  b.residual = has_residual ? residual.typed_data() : nullptr;
  b.direction = direction->typed_data();
  const float* sc = scalars.typed_data();
  AdamDirectionConfig c{b1, one_minus_b1, b2, one_minus_b2, eps,
                        static_cast<MomentumMasking>(masking), sc[0], sc[1], sc[2],
                        bias1_table.typed_data(),
                        static_cast<int64_t>(bias1_table.element_count())};
  if (has_noise) {
    b.diff_sq = diff_sq_out->typed_data();
    b.last = last_out->typed_data();
    b.before_last = before_last_out->typed_data();
    c.noise_norm = sc[3];
    c.update_noise = sc[4];
    c.keep = sc[5];
    c.floor = sc[6];
  }
  adam_direction(c, b);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

// Outputs 0-5 are inputs 0-5 (input_output_aliases={0: 0, ..., 5: 5}).
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAdamDirection, jss::AdamDirectionImpl,
                              jss::sig::bind_adam_direction(ffi::Ffi::Bind()));
