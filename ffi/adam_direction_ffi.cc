// FFI handler (CPU) of the fused Adam-direction pass (kernels/adam_direction.h).
#include <algorithm>
#include <cstdint>
#include <string>

#include "ffi/signatures.h"
#include "ffi/sparse_allreduce.h"
#include "kernels/adam_direction.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using F32 = ffi::Buffer<ffi::F32>;

using F32Out = ffi::ResultBuffer<ffi::F32>;

ffi::Error AdamDirectionImpl(F32 mu, F32 nu, F32 age, F32 residual, F32 bias1_table,
                             F32 scalars, ffi::RemainingArgs leaves, F32Out mu_out,
                             F32Out nu_out, F32Out age_out,
                             F32Out direction, float b1, float one_minus_b1,
                             float b2, float one_minus_b2, float eps, int64_t masking,
                             int64_t has_residual) {
  const char* op = "jax_sparse_sync.adam_direction_sync";
  const int64_t n = static_cast<int64_t>(mu.element_count());
  if (nu.element_count() != mu.element_count() || age.element_count() != mu.element_count() ||
      (has_residual && residual.element_count() != mu.element_count()) ||
      direction->element_count() != mu.element_count()) {
    return ffi::Error::InvalidArgument(std::string(op) + ": mu, nu, age, residual and the "
                                       "direction must have the same length");
  }
  if (scalars.element_count() != 3 || masking < 0 || masking > 2) {
    return ffi::Error::InvalidArgument(std::string(op) + ": bad scalars or masking");
  }
  // Aliased outputs: the kernel reads and writes the same buffers.
  if (mu_out->typed_data() != mu.typed_data() || nu_out->typed_data() != nu.typed_data() ||
      age_out->typed_data() != age.typed_data()) {
    std::copy_n(mu.typed_data(), n, mu_out->typed_data());
    std::copy_n(nu.typed_data(), n, nu_out->typed_data());
    std::copy_n(age.typed_data(), n, age_out->typed_data());
  }
  AdamDirectionBuffers b;
  b.offsets.push_back(0);
  for (size_t j = 0; j < leaves.size(); ++j) {
    auto leaf = leaves.get<F32>(j);
    if (!leaf.has_value()) {
      return ffi::Error::InvalidArgument(std::string(op) + ": gradient leaf " +
                                         std::to_string(j) + " is not float32");
    }
    b.leaves.push_back(leaf->typed_data());
    b.offsets.push_back(b.offsets.back() + static_cast<int64_t>(leaf->element_count()));
  }
  if (b.offsets.back() != n) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the gradient has " +
                                       std::to_string(b.offsets.back()) +
                                       " entries but the state " + std::to_string(n));
  }
  b.mu = mu_out->typed_data();
  b.nu = nu_out->typed_data();
  b.age = age_out->typed_data();
  b.residual = has_residual ? residual.typed_data() : nullptr;
  b.direction = direction->typed_data();
  const AdamDirectionConfig c{b1, one_minus_b1, b2, one_minus_b2, eps,
                              static_cast<MomentumMasking>(masking), scalars.typed_data()[0],
                              scalars.typed_data()[1], scalars.typed_data()[2],
                              bias1_table.typed_data(),
                              static_cast<int64_t>(bias1_table.element_count())};
  adam_direction(c, b);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

// Outputs 0-2 are inputs 0-2 (input_output_aliases={0: 0, 1: 1, 2: 2}).
XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAdamDirection, jss::AdamDirectionImpl,
                              jss::sig::bind_adam_direction(ffi::Ffi::Bind()));
