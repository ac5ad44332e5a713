// One pass of Adam over a rank's own gradient, for adam_direction_sync: reads
// the gradient (in its leaves' separate buffers), mu, nu, age and the sync's
// residual, writes mu, nu, age in place and the bias-corrected direction.
//
// XLA:CPU computes the same in ~11 passes over the N floats (the gradient
// concatenated, mu, nu, the direction and the masking in separate fusions);
// here it is one pass, on all cores.
//
// Momentum masking is applied lazily, at the next step: a coordinate whose
// residual held something before its sync (stored as a negative age) and is
// zero now (this step's residual is the last sync's result) was sent after
// being held back, so its first moment (and, for "restart", its bias
// correction's age) starts again before this step's gradient is added. That
// is the same arithmetic as masking right after the sync, without a second
// pass over mu, age and the residual (and without a copy of the residual XLA
// makes to compare it before and after the sync).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/leaf_spans.h"
#include "kernels/parallel.h"

namespace jss {

enum class MomentumMasking : int64_t { kRestart = 0, kZero = 1, kOff = 2 };

// Ages are int16 (half the traffic of a float32 age: 43.6 MB a step less on the
// LM's 10.9M entries) and saturate at kMaxAge: exact for the bias correction
// where 1 - b1**kMaxAge rounds to 1.0f (b1 < 0.99945; the Python side refuses
// "restart" with a larger b1), and the sign (a pending mask) is all "zero" and
// "off" read.
constexpr int32_t kMaxAge = 32767;

struct AdamDirectionConfig {
  float b1, one_minus_b1, b2, one_minus_b2, eps;
  MomentumMasking masking;
  float bias2;          // 1 - b2**t
  float bias1_t;        // 1 - b1**t ("zero" / "off": the global bias correction)
  float scale;          // the direction's factor (a learning rate before the sync; else 1)
  const float* bias1;   // "restart": bias1[a - 1] = 1 - b1**a for a in [1, table_size]
  int64_t table_size;   // 1 - b1**a is 1.0f at table_size, or table_size == kMaxAge
  // second_moment="mean" (buffers diff_sq, last, before_last set): divide by
  // max(nu_hat - keep * sigma2, nu_hat * floor), sigma2 = diff_sq * noise_norm
  float noise_norm = 0.0f;    // 1 / (6 (1 - b2**(t - 2))) from step 3 on; else 0
  float update_noise = 0.0f;  // 1 from step 3 on: the second difference is defined
  float keep = 0.0f;          // 1 - 1/P (times the warm-up's fraction)
  float floor = 1.0f;         // 1 - keep: 1/P after the warm-up
  // optax.clip_by_global_norm folded in (jss_adam_accumulate's max_grad_norm): with
  // clip, each gradient entry is read as (g / clip_norm) * clip_max_norm, the
  // rounding of optax's clip_fn (a division, then a product), so the step equals
  // chain(clip_by_global_norm(clip_max_norm), ...) bit for bit without the clipped
  // gradient's N-float write and read. clip_norm is the gradient's global norm
  // (computed before the pass); clip is false where it is below clip_max_norm.
  bool clip = false;
  float clip_norm = 1.0f;
  float clip_max_norm = 1.0f;
};

struct AdamDirectionBuffers : GradientLeaves {
  float* mu;
  float* nu;
  int16_t* age;                      // >= 1, negative where the residual held something
  const float* residual;             // nullptr: no masking (none to read, or "off")
  float* direction;
  // second_moment="mean" (else nullptr): the EMA of the gradient's squared second
  // difference g_t - 2 g_{t-1} + g_{t-2}, the last gradient and the one before
  float* diff_sq = nullptr;
  float* last = nullptr;
  float* before_last = nullptr;
};

// The pass compiled for several instruction sets, picked when the library loads
// (GCC / Clang function multi-versioning): the build targets baseline x86-64
// (SSE2), where the divisions and square roots of the LM's 10.9M entries took
// 31.6 ms a pass against 13.8 ms with AVX-512 (docs/topics/time_to_accuracy.md).
// Every clone computes the same bits: each operation rounds alone (the callers'
// files are built with -ffp-contract=off: no fused multiply-add), and division
// and sqrt are correctly rounded at any vector width.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(JSS_NO_MULTIVERSION)
#define JSS_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define JSS_MULTIVERSION
#endif

// One entry's moments: mu and nu take the EMAs of the gradient entry gi and of its
// square (each product and sum rounded alone); returns the new values.
struct AdamMoments {
  float m, v;
};
inline AdamMoments update_moments(float b1, float omb1, float b2, float omb2, float gi,
                                  float& mu, float& nu) {
  const float m = b1 * mu + omb1 * gi;
  const float v = b2 * nu + omb2 * gi * gi;
  mu = m;
  nu = v;
  return {m, v};
}

// Entries per block: the mask / age step, then the bias-correction lookups, then
// the moments and the direction, each a loop over the block (in L1), so the first
// and last vectorize (branch-free selects; the lookup is the scalar part).
constexpr int64_t kAdamBlock = 512;

// `direction` is this block's own (entries s .. s + len of b.direction, or a
// block-sized scratch buffer: kernels/adam_accumulate.h adds it into the
// accumulator while it is in cache).
JSS_MULTIVERSION inline void adam_direction_block(const AdamDirectionConfig& c,
                                                  const AdamDirectionBuffers& b,
                                                  const float* __restrict g_in, int64_t s,
                                                  int64_t len, float* __restrict direction) {
  // the gradient as the pass reads it: clipped by the global norm (in L1) or as given
  float g_clipped[kAdamBlock];
  if (c.clip) {
    const float norm = c.clip_norm, max_norm = c.clip_max_norm;
    for (int64_t j = 0; j < len; ++j) g_clipped[j] = (g_in[j] / norm) * max_norm;
  }
  const float* __restrict g = c.clip ? g_clipped : g_in;
  float* __restrict mu = b.mu + s;
  float* __restrict nu = b.nu + s;
  int16_t* __restrict age = b.age + s;
  int32_t a_new[kAdamBlock];
  float bias1[kAdamBlock];
  if (b.residual != nullptr) {
    const float* __restrict r = b.residual + s;
    for (int64_t j = 0; j < len; ++j) {
      // sent at the last step after being held back: restart its moment
      const int32_t old = age[j];
      const bool sent = (old < 0) & (r[j] == 0.0f);
      mu[j] = sent ? 0.0f : mu[j];
      const int32_t a = std::min(sent ? 0 : (old < 0 ? -old : old), kMaxAge - 1) + 1;
      a_new[j] = a;
      age[j] = static_cast<int16_t>(r[j] != 0.0f ? -a : a);  // held now: a mask may follow
    }
  } else {
    for (int64_t j = 0; j < len; ++j) {
      const int32_t old = age[j];
      const int32_t a = std::min(old < 0 ? -old : old, kMaxAge - 1) + 1;
      a_new[j] = a;
      age[j] = static_cast<int16_t>(a);
    }
  }
  if (c.masking == MomentumMasking::kRestart) {
    // every age past the table reads its last entry (1.0f, or the table covers
    // every age up to kMaxAge; checked by the handler): a clamped index,
    // branch-free (a branch per entry measured about 40 ms a step on the LM)
    const int32_t last = static_cast<int32_t>(c.table_size);
    for (int64_t j = 0; j < len; ++j) bias1[j] = c.bias1[std::min(a_new[j], last) - 1];
  } else {
    for (int64_t j = 0; j < len; ++j) bias1[j] = c.bias1_t;
  }
  const float b1 = c.b1, omb1 = c.one_minus_b1, b2 = c.b2, omb2 = c.one_minus_b2;
  const float bias2 = c.bias2, eps = c.eps, scale = c.scale;
  if (b.diff_sq != nullptr) {  // the mean gradient's second moment, estimated
    float* __restrict dsq = b.diff_sq + s;
    float* __restrict last = b.last + s;
    float* __restrict before = b.before_last + s;
    const float norm = c.noise_norm, keep = c.keep, floor = c.floor;
    const bool update = c.update_noise != 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      const float gi = g[j];
      const auto [m, v] = update_moments(b1, omb1, b2, omb2, gi, mu[j], nu[j]);
      const float d = (gi - 2.0f * last[j]) + before[j];
      const float ds = update ? b2 * dsq[j] + omb2 * d * d : dsq[j];
      dsq[j] = ds;
      before[j] = last[j];
      last[j] = gi;
      const float v_hat = v / bias2;
      const float v_mean = std::max(v_hat - keep * (ds * norm), v_hat * floor);
      direction[j] = scale * ((m / bias1[j]) / (std::sqrt(v_mean) + eps));
    }
    return;
  }
  for (int64_t j = 0; j < len; ++j) {
    const auto [m, v] = update_moments(b1, omb1, b2, omb2, g[j], mu[j], nu[j]);
    direction[j] = scale * ((m / bias1[j]) / (std::sqrt(v / bias2) + eps));
  }
}

JSS_MULTIVERSION inline void adam_direction_range(const AdamDirectionConfig& c,
                                                  const AdamDirectionBuffers& b, int64_t lo,
                                                  int64_t hi) {
  for_each_leaf_span(b, lo, hi, [&](const float* g, int64_t i, int64_t end) {
    for (; i < end; i += kAdamBlock, g += kAdamBlock) {
      adam_direction_block(c, b, g, i, std::min(kAdamBlock, end - i), b.direction + i);
    }
  });
}

inline void adam_direction(const AdamDirectionConfig& c, const AdamDirectionBuffers& b) {
  const int64_t n = b.offsets.back();
  parallel_chunks(n, num_threads_for(n), [&](int, int64_t lo, int64_t hi) {
    adam_direction_range(c, b, lo, hi);
  });
}

}  // namespace jss
