// Block scan: which blocks of `block` consecutive entries hold a nonzero, in
// one pass (OmniReduce's sparsity unit). A NaN counts as nonzero; so does a
// subnormal. For float32 "nonzero" is (bits & 0x7fffffff) != 0, for bfloat16
// and float16 (bits & 0x7fff) != 0: +0 and -0 are the only zeros.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/float_bits.h"
#include "kernels/parallel.h"
#include "kernels/topk_select.h"  // block_hits_at_least, raw_key

namespace jss {

inline int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

template <typename T>
inline bool block_has_nonzero(const T* x, int64_t lo, int64_t hi) {
  // key != 0 <=> key >= 1: the selection kernels' 16-entry hit mask, so the
  // scan of a zero block runs at memory speed instead of a branch per entry
  int64_t i = lo;
  for (; i + kScanBlock <= hi; i += kScanBlock) {
    if (block_hits_at_least(x + i, 1) != 0) return true;
  }
  for (; i < hi; ++i) {
    if (raw_key(x, i) != 0) return true;
  }
  return false;
}

// Ids of the blocks of x[0..n) that hold a nonzero, ascending.
template <typename T>
void nonzero_blocks(const T* x, int64_t n, int64_t block, std::vector<int64_t>* ids) {
  ids->clear();
  const int64_t nb = num_blocks(n, block);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
    if (block_has_nonzero(x, lo, hi)) ids->push_back(b);
  }
}

// One byte per block: 1 if the block holds a nonzero. Blocks are split over
// `threads` (each writes its own bytes: the same mask for any thread count).
template <typename T>
void block_mask(const T* x, int64_t n, int64_t block, uint8_t* mask, int threads = 1) {
  const int64_t nb = num_blocks(n, block);
  const int parts = static_cast<int>(std::min<int64_t>(std::max(threads, 1), nb > 0 ? nb : 1));
  parallel_chunks(nb, parts, [&](int, int64_t b_lo, int64_t b_hi) {
    for (int64_t b = b_lo; b < b_hi; ++b) {
      const int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
      mask[b] = block_has_nonzero(x, lo, hi) ? 1 : 0;
    }
  });
}

}  // namespace jss
