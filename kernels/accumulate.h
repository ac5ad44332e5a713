// The error-feedback accumulator in one pass: acc = decay * residual + grad,
// with the gradient read from its leaves' own buffers (no concatenated copy).
//
// The flat layout (jax_sparse_sync/transforms/flat.py) puts leaf j at entries
// [offsets[j], offsets[j + 1]) of the residual. XLA:CPU writes the same sum as
// a concatenation of per-leaf slice-and-adds several times slower than a
// memory pass (its concatenate fusion picks the operand per element); this
// loop is one read of the residual and the gradient and one write, on up to
// num_threads_for(n) threads over fixed chunks. Each entry is computed alone
// (one rounding for the product, one for the sum; built with -ffp-contract=off
// so no fused multiply-add joins them), so the result is the same bit for bit
// for any thread count and machine, equal to XLA's without a decay (with one,
// XLA may use a fused multiply-add: 1 ulp apart).
//
// accumulate_topk adds the exact top-k of |acc| without its two passes over
// acc when a hint holds: while each block of acc is still in cache, the
// entries whose magnitude is >= the hint (the last step's k-th magnitude,
// lowered a little) are listed, in index order. If at least k and at most
// `cap` entries are listed, every entry of the top k is among them (the k-th
// magnitude is >= the hint), so the radix select runs on the list alone;
// otherwise on the whole of acc, as jss.topk does. Either way the result is
// jss.topk(acc, k) bit for bit (ties to the lower index, NaN first).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/leaf_spans.h"
#include "kernels/parallel.h"
#include "kernels/topk_select.h"

namespace jss {

struct AccumulateBuffers : GradientLeaves {
  const float* residual = nullptr;   // (n,)
  float* acc = nullptr;              // (n,), may be the residual's own buffer
};

// out[j] = decay * r[j] + add[j] for j < len (r[j] + add[j] without a decay), the
// product and the sum each rounded alone: the accumulator's entries, here and in
// the fused Adam pass (kernels/adam_accumulate.h). `out` may be `r`.
inline void decayed_sum(const float* r, const float* add, int64_t len, bool has_decay,
                        float decay, float* out) {
  if (has_decay) {
    for (int64_t j = 0; j < len; ++j) {
      const float kept = r[j] * decay;
      out[j] = kept + add[j];
    }
  } else {
    for (int64_t j = 0; j < len; ++j) out[j] = r[j] + add[j];
  }
}

inline void accumulate_range(const AccumulateBuffers& b, bool has_decay, float decay,
                             int64_t lo, int64_t hi) {
  for_each_leaf_span(b, lo, hi, [&](const float* g, int64_t i, int64_t end) {
    decayed_sum(b.residual + i, g, end - i, has_decay, decay, b.acc + i);
  });
}

// Entries of one chunk whose key is >= the hint: indices and values (the
// first `cap`, in index order) and how many there were in all. The value is
// kept as it is listed, while its block is in cache: reading acc[i] back after
// the pass cost a cache miss per listed entry (about 20 ns each, ~8 ms a step
// for the 4 k entries an Adam-direction accumulator lists at 1 % of 10.9M).
struct ChunkCandidates {
  std::vector<int32_t> index;
  std::vector<float> value;
  int64_t count = 0;
};

//: entries computed before they are scanned for the hint, while in cache
constexpr int64_t kAccumulateBlock = 4096;

// compute_range(lo, hi) writes acc[lo, hi) (any kernel that produces the
// accumulator: accumulate_range here, the fused Adam pass of
// kernels/adam_accumulate.h); block by block, the entries of [lo, hi) whose key
// is >= the hint are listed while they are in cache.
template <typename ComputeRange>
inline void compute_collect_range(ComputeRange&& compute_range, const float* acc,
                                  uint32_t hint_key, int64_t cap, int64_t lo, int64_t hi,
                                  ChunkCandidates* out) {
  for (int64_t i = lo; i < hi; i += kAccumulateBlock) {
    const int64_t end = std::min(hi, i + kAccumulateBlock);
    compute_range(i, end);
    for_each_key_at_least(acc, i, end, hint_key, [&](int64_t j) {
      if (out->count++ < cap) {
        out->index.push_back(static_cast<int32_t>(j));
        out->value.push_back(acc[j]);
      }
    });
  }
}

inline void accumulate(const AccumulateBuffers& b, bool has_decay, float decay) {
  const int64_t n = b.offsets.back();
  parallel_chunks(n, num_threads_for(n), [&](int, int64_t lo, int64_t hi) {
    accumulate_range(b, has_decay, decay, lo, hi);
  });
}

// acc[0, n) computed by compute_range(lo, hi) on all cores, and its exact top-k
// by magnitude: values and int32 indices in ascending index order, equal to
// topk_by_magnitude(acc, n, k). hint_key = 0 (no hint) skips the list. Returns
// whether the list was used. Requires 1 <= k <= n < 2^31.
template <typename ComputeRange>
inline bool compute_topk(int64_t n, ComputeRange&& compute_range, const float* acc,
                         uint32_t hint_key, int64_t k, int64_t cap, float* values,
                         int32_t* indices) {
  const int threads = num_threads_for(n);
  if (hint_key == 0 || cap < k) {
    parallel_chunks(n, threads, [&](int, int64_t lo, int64_t hi) { compute_range(lo, hi); });
    topk_by_magnitude(acc, n, k, values, indices, threads);
    return false;
  }
  std::vector<ChunkCandidates> chunks(static_cast<size_t>(threads));
  parallel_chunks(n, threads, [&](int t, int64_t lo, int64_t hi) {
    ChunkCandidates& c = chunks[static_cast<size_t>(t)];
    const auto room = static_cast<size_t>(std::min(cap, hi - lo));
    c.index.reserve(room);
    c.value.reserve(room);
    compute_collect_range(compute_range, acc, hint_key, cap, lo, hi, &c);
  });
  int64_t total = 0;
  for (const auto& c : chunks) total += c.count;
  if (total < k || total > cap) {  // the hint missed: select from the whole of acc
    topk_by_magnitude(acc, n, k, values, indices, threads);
    return false;
  }
  // One chunk (one thread): its list is the list. Else the chunks' lists end
  // to end, in chunk (= index) order.
  ChunkCandidates joined;
  const ChunkCandidates* list = &chunks[0];
  if (chunks.size() > 1) {
    joined.index.reserve(static_cast<size_t>(total));
    joined.value.reserve(static_cast<size_t>(total));
    for (const auto& c : chunks) {
      joined.index.insert(joined.index.end(), c.index.begin(), c.index.end());
      joined.value.insert(joined.value.end(), c.value.begin(), c.value.end());
    }
    list = &joined;
  }
  // Positions in the list are in index order, so ties at the k-th magnitude still
  // go to the lower index and the output stays ascending.
  topk_by_magnitude(list->value.data(), total, k, values, indices, num_threads_for(total));
  for (int64_t j = 0; j < k; ++j) indices[j] = list->index[static_cast<size_t>(indices[j])];
  return true;
}

// acc (as accumulate) and its exact top-k by magnitude (compute_topk).
inline bool accumulate_topk(const AccumulateBuffers& b, bool has_decay, float decay,
                            uint32_t hint_key, int64_t k, int64_t cap, float* values,
                            int32_t* indices) {
  return compute_topk(
      b.offsets.back(),
      [&](int64_t lo, int64_t hi) { accumulate_range(b, has_decay, decay, lo, hi); }, b.acc,
      hint_key, k, cap, values, indices);
}

}  // namespace jss
