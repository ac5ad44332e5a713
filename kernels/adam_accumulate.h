// The Adam-direction pass fused with the error-feedback accumulator, for
// adam_direction_sync in front of a sync with a flat residual (topk_sync,
// oktopk_sync, grouped_topk_sync: there one call a group, on the group's range
// of the whole buffers, ffi/handlers/adam_accumulate_ffi.cc's offset): one pass reads the gradient (its leaves' own buffers), mu, nu,
// age and the sync's residual, and writes mu, nu, age and the accumulator
//   acc = decay * residual + direction
// into the residual's own buffer. The direction never reaches memory: each
// block of it (kernels/adam_direction.h, kAdamBlock entries) lives in an L1
// scratch buffer and is added into the accumulator while it is in cache.
//
// Unfused, the same step is the Adam pass (the direction written, N floats),
// XLA cutting the direction into the gradient's leaves (a copy), and the
// accumulator reading the residual a second time and those leaves: about 4 N
// floats more memory traffic and one more kernel launch. The arithmetic is the
// same, entry by entry (the Adam block is shared; the sum rounds as
// kernels/accumulate.h's: the product and the sum apart, -ffp-contract=off),
// so the accumulator and the moments are the unfused ones bit for bit.
//
// adam_accumulate_topk adds the exact top-k of the accumulator, listing the
// entries above the hint while each block is in cache (compute_topk,
// kernels/accumulate.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/accumulate.h"
#include "kernels/adam_direction.h"
#include "kernels/leaf_spans.h"

namespace jss {

struct AdamAccumulateBuffers : AdamDirectionBuffers {
  // acc may be the residual's own buffer (b.residual, aliased): each block's
  // residual entries are read (the masking, the sum) before they are written.
  const float* accumulate_from = nullptr;  // the residual the accumulator adds to
  float* acc = nullptr;
};

JSS_MULTIVERSION inline void adam_accumulate_range(const AdamDirectionConfig& c,
                                                   const AdamAccumulateBuffers& b,
                                                   bool has_decay, float decay, int64_t lo,
                                                   int64_t hi) {
  float direction[kAdamBlock];
  for_each_leaf_span(b, lo, hi, [&](const float* g, int64_t i, int64_t end) {
    for (; i < end; i += kAdamBlock, g += kAdamBlock) {
      const int64_t len = std::min(kAdamBlock, end - i);
      adam_direction_block(c, b, g, i, len, direction);
      decayed_sum(b.accumulate_from + i, direction, len, has_decay, decay, b.acc + i);
    }
  });
}

inline void adam_accumulate(const AdamDirectionConfig& c, const AdamAccumulateBuffers& b,
                            bool has_decay, float decay) {
  const int64_t n = b.offsets.back();
  parallel_chunks(n, num_threads_for(n), [&](int, int64_t lo, int64_t hi) {
    adam_accumulate_range(c, b, has_decay, decay, lo, hi);
  });
}

// adam_accumulate and the exact top-k of acc (see compute_topk). Requires
// 1 <= k <= n < 2^31.
inline bool adam_accumulate_topk(const AdamDirectionConfig& c, const AdamAccumulateBuffers& b,
                                 bool has_decay, float decay, uint32_t hint_key, int64_t k,
                                 int64_t cap, float* values, int32_t* indices) {
  return compute_topk(
      b.offsets.back(),
      [&](int64_t lo, int64_t hi) { adam_accumulate_range(c, b, has_decay, decay, lo, hi); },
      b.acc, hint_key, k, cap, values, indices);
}

}  // namespace jss
