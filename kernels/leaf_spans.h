// The gradient as its leaves' own buffers, laid out flat: leaf j is entries
// [offsets[j], offsets[j + 1]) of the flat layout (jax_sparse_sync/transforms/
// flat.py). Kernels that read the gradient this way (the Adam-direction pass,
// the error-feedback accumulator) walk a range of the flat layout leaf by leaf.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace jss {

struct GradientLeaves {
  std::vector<const float*> leaves;  // the gradient, leaf by leaf (tree order)
  std::vector<int64_t> offsets;      // leaf j is entries [offsets[j], offsets[j + 1])
};

// fn(g, i, end) for each leaf's part [i, end) of [lo, hi), in order; g points at
// the leaf's entry for flat index i.
template <typename Fn>
inline void for_each_leaf_span(const GradientLeaves& g, int64_t lo, int64_t hi, Fn&& fn) {
  if (lo >= hi) return;
  size_t leaf = static_cast<size_t>(
      std::upper_bound(g.offsets.begin(), g.offsets.end(), lo) - g.offsets.begin() - 1);
  for (int64_t i = lo; i < hi; ++leaf) {
    const int64_t end = std::min(hi, g.offsets[leaf + 1]);
    fn(g.leaves[leaf] + (i - g.offsets[leaf]), i, end);
    i = end;
  }
}

}  // namespace jss
