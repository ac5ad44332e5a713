// The Adam-direction state as the two fused CPU handlers receive it
// (jss_adam_direction in adam_direction_ffi.cc, jss_adam_accumulate in
// adam_accumulate_ffi.cc): the argument checks, the aliased in-place outputs and
// the kernel's configuration, written once for both.
#ifndef JSS_FFI_ADAM_STATE_ARGS_H_
#define JSS_FFI_ADAM_STATE_ARGS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/adam_direction.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// The ages' buffers: int16, saturating at kMaxAge (kernels/adam_direction.h).
using AgeBuffer = xla::ffi::Buffer<xla::ffi::S16>;
using AgeResult = xla::ffi::ResultBuffer<xla::ffi::S16>;

// mu, nu, age (N,; age int16) and the second_moment="mean" buffers diff_sq, last,
// before_last ((N,) with has_noise, else (1,)), inputs and their aliased outputs.
struct AdamStateArgs {
  xla::ffi::Buffer<xla::ffi::F32> mu, nu;
  AgeBuffer age;
  xla::ffi::Buffer<xla::ffi::F32> diff_sq, last, before_last;
  xla::ffi::ResultBuffer<xla::ffi::F32> mu_out, nu_out;
  AgeResult age_out;
  xla::ffi::ResultBuffer<xla::ffi::F32> diff_sq_out, last_out, before_last_out;
  int64_t has_noise;

  int64_t size() const { return static_cast<int64_t>(mu.element_count()); }
  int64_t noise_size() const { return has_noise ? size() : 1; }

  // The lengths agree (`others` are further (N,) buffers of the handler, named in
  // `others_named` for the message), masking is one of the three modes, the
  // scalars have `scalar_count` entries and, for "restart", the 1 - b1**a table is
  // one the kernel's clamped lookup reads right. `table_on_host`: false where the
  // table is device memory (the CUDA twin): then only its length is checked (its
  // last entry is adam_pass.bias1_table's to get right).
  xla::ffi::Error check(const char* op, std::initializer_list<size_t> others,
                        const char* others_named, size_t scalar_count,
                        const xla::ffi::Buffer<xla::ffi::F32>& scalars, int64_t masking,
                        const xla::ffi::Buffer<xla::ffi::F32>& bias1_table,
                        bool table_on_host = true) const {
    const size_t n = mu.element_count();
    bool same = nu.element_count() == n && age.element_count() == n;
    for (size_t len : others) same = same && len == n;
    if (!same) {
      return xla::ffi::Error::InvalidArgument(std::string(op) + ": mu, nu, age, " +
                                              others_named + " must have the same length");
    }
    const size_t noise_n = static_cast<size_t>(noise_size());
    if (diff_sq.element_count() != noise_n || last.element_count() != noise_n ||
        before_last.element_count() != noise_n) {
      return xla::ffi::Error::InvalidArgument(std::string(op) + ": the noise buffers must have "
                                              "the state's length (second_moment='mean')");
    }
    if (scalars.element_count() != scalar_count || masking < 0 || masking > 2) {
      return xla::ffi::Error::InvalidArgument(std::string(op) + ": bad scalars or masking");
    }
    if (masking == static_cast<int64_t>(MomentumMasking::kRestart)) {
      return check_table(op, bias1_table, table_on_host);
    }
    return xla::ffi::Error::Success();
  }

  // The 1 - b1**a table the "restart" masking reads with a clamped index: it
  // reaches 1.0f, or it covers every age up to kMaxAge (kernels/adam_direction.h).
  static xla::ffi::Error check_table(const char* op,
                                     const xla::ffi::Buffer<xla::ffi::F32>& table,
                                     bool on_host = true) {
    const int64_t size = static_cast<int64_t>(table.element_count());
    if (size < 1 || size > kMaxAge ||
        (on_host && size < kMaxAge && table.typed_data()[size - 1] != 1.0f)) {
      return xla::ffi::Error::InvalidArgument(
          std::string(op) + ": the 1 - b1**a table must end at 1.0 or have " +
          std::to_string(kMaxAge) + " entries (adam_pass.bias1_table)");
    }
    return xla::ffi::Error::Success();
  }

  // The kernel reads and writes the outputs in place: copy each input that XLA
  // did not alias to its output, then point the buffers at the outputs.
  void bind_outputs(AdamDirectionBuffers& b) {
    auto alias = [](auto& in, auto& out, int64_t len) {
      if (out->typed_data() != in.typed_data()) {
        std::copy_n(in.typed_data(), len, out->typed_data());
      }
      return out->typed_data();
    };
    b.mu = alias(mu, mu_out, size());
    b.nu = alias(nu, nu_out, size());
    b.age = alias(age, age_out, size());
    float* d = alias(diff_sq, diff_sq_out, noise_size());
    float* l = alias(last, last_out, noise_size());
    float* bl = alias(before_last, before_last_out, noise_size());
    if (has_noise) {
      b.diff_sq = d;
      b.last = l;
      b.before_last = bl;
    }
  }

  // scalars: (1 - b2**t, 1 - b1**t, scale, noise_norm, update_noise, keep, floor, ...);
  // the noise terms are read with has_noise.
  AdamDirectionConfig config(float b1, float one_minus_b1, float b2, float one_minus_b2,
                             float eps, int64_t masking,
                             const xla::ffi::Buffer<xla::ffi::F32>& bias1_table,
                             const float* sc) const {
    AdamDirectionConfig c{b1, one_minus_b1, b2, one_minus_b2, eps,
                          static_cast<MomentumMasking>(masking), sc[0], sc[1], sc[2],
                          bias1_table.typed_data(),
                          static_cast<int64_t>(bias1_table.element_count())};
    if (has_noise) {
      c.noise_norm = sc[3];
      c.update_noise = sc[4];
      c.keep = sc[5];
      c.floor = sc[6];
    }
    return c;
  }
};

}  // namespace jss

#endif  // JSS_FFI_ADAM_STATE_ARGS_H_
