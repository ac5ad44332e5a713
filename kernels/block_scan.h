// Block scan: which blocks of `block` consecutive entries hold a nonzero, in
// one pass (OmniReduce's sparsity unit). A NaN counts as nonzero.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace jss {

inline int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Ids of the blocks of x[0..n) that hold a nonzero, ascending.
inline void nonzero_blocks(const float* x, int64_t n, int64_t block, std::vector<int64_t>* ids) {
  ids->clear();
  const int64_t nb = num_blocks(n, block);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, 4);
      if (bits & 0x7fffffffu) {  // not +0 or -0
        ids->push_back(b);
        break;
      }
    }
  }
}

// One byte per block: 1 if the block holds a nonzero.
inline void block_mask(const float* x, int64_t n, int64_t block, uint8_t* mask) {
  const int64_t nb = num_blocks(n, block);
  std::memset(mask, 0, static_cast<size_t>(nb));
  std::vector<int64_t> ids;
  nonzero_blocks(x, n, block, &ids);
  for (int64_t b : ids) mask[b] = 1;
}

}  // namespace jss
