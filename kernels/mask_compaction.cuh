// Ordered compaction through bit masks, shared by threshold selection and
// exact top-k (kernels/selection.cuh).
//
// The one pass over x that decides which entries are kept writes one bit per
// entry instead of the entries: uint32 words, bit j of word w is entry 32w + j,
// tile by tile (a tile is kTile = 4096 entries = 128 words). Then
//   1. per tile, the bits set in the `greater` mask and in the optional `equal`
//      (tie) mask, packed as (greater << 32) + equal in one uint64, counted by
//      the passes that set the bits (warp sums or single bits added atomically);
//   2. one CUB exclusive scan over the tiles (the packed sums stay apart: a
//      total below 2^32 cannot carry into the greater half);
//   3. mask_compact_kernel: one thread per word; a block scan gives each word
//      the counts before it, and the word's set bits go to their slots in index
//      order, reading x only at those entries.
// The masks are N/8 bytes against 4N for float32 x, so the compaction costs a
// few percent of a pass over x: selection is one read of x (threshold) or two
// (top-k: histogram + filter).
//
// Slots follow the top-k rule (kernels/selection.cuh, topk_slot): an entry of
// the greater mask goes after every greater entry and every kept tie before it;
// the first `ties` entries of the equal mask are kept. Threshold selection has
// no equal mask and ties = 0. Only slots < limit are written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/float_bits.cuh"

namespace jss {
namespace cuda {

constexpr int kTileThreads = 256;
constexpr int kTileItems = 16;
constexpr int kTile = kTileThreads * kTileItems;  // 4096 entries per tile
constexpr int kTileWords = kTile / 32;            // 128 mask words per tile
// Per-thread counts inside a tile are packed as (greater << 16) | equal, tile
// counts and offsets as (greater << 32) + equal (pack_counts).
static_assert(kTile < (1 << 16), "a tile's counts must fit in 16 bits");

JSS_HD unsigned long long pack_counts(unsigned long long greater, unsigned long long equal) {
  return (greater << 32) + equal;
}
JSS_HD unsigned long long packed_greater(unsigned long long packed) { return packed >> 32; }
JSS_HD unsigned long long packed_equal(unsigned long long packed) { return packed & 0xffffffffull; }

JSS_HD int popcount32(uint32_t w) {
#ifdef __CUDA_ARCH__
  return __popc(w);
#else
  return __builtin_popcount(w);
#endif
}

JSS_HD int lowest_bit(uint32_t w) {  // w != 0
#ifdef __CUDA_ARCH__
  return __ffs(static_cast<int>(w)) - 1;
#else
  return __builtin_ctz(w);
#endif
}

// Output slot of a selected entry: everything strictly above the k-th key
// before it, plus the tied entries before it that are kept (the first `ties`).
JSS_HD unsigned long long topk_slot(unsigned long long greater_before,
                                    unsigned long long equal_before, unsigned long long ties) {
  return greater_before + (equal_before < ties ? equal_before : ties);
}

// A tile's entries are read as 16-byte vectors: vector r of thread t holds
// entries (r * kTileThreads + t) * kPerVector + [0, kPerVector), so each load
// instruction of a warp reads 512 contiguous bytes. Item q of a thread is
// entry tile_item_offset<F>(t, q) of its tile.
template <typename F>
struct TileVectors {
  static constexpr int kPerVector = 16 / sizeof(typename F::Bits);  // 4 (f32) or 8 (16-bit)
  static constexpr int kVectors = kTileItems / kPerVector;          // per thread
  static constexpr int kLanesPerWord = 32 / kPerVector;             // lanes sharing a mask word
};

template <typename F>
JSS_HD int tile_item_offset(int thread, int q) {
  using V = TileVectors<F>;
  return ((q / V::kPerVector) * kTileThreads + thread) * V::kPerVector + q % V::kPerVector;
}

// Writes the set bits of one mask word (entries first_index + j) to their
// slots; greater_before / equal_before count the bits of all earlier words.
template <typename Bits>
JSS_HD void compact_word(uint32_t greater, uint32_t equal, long long first_index,
                         unsigned long long greater_before, unsigned long long equal_before,
                         unsigned long long ties, long long limit, const Bits* x, Bits* values,
                         int32_t* indices) {
  uint32_t any = greater | equal;
  while (any != 0) {
    const int j = lowest_bit(any);
    const uint32_t bit = 1u << j;
    const uint32_t below = bit - 1u;
    const unsigned long long e = equal_before + static_cast<unsigned long long>(popcount32(equal & below));
    if ((greater & bit) != 0 || e < ties) {
      const unsigned long long g =
          greater_before + static_cast<unsigned long long>(popcount32(greater & below));
      const unsigned long long slot = topk_slot(g, e, ties);
      if (slot < static_cast<unsigned long long>(limit)) {
        values[slot] = x[first_index + j];
        indices[slot] = static_cast<int32_t>(first_index + j);
      }
    }
    any &= any - 1u;
  }
}

#ifdef __CUDACC__

// Thread t's 16 items of the tile at `base`; `valid` gets bit q for items
// inside [0, n). Full tiles of a 16-byte aligned x use vector loads.
template <typename F>
__device__ __forceinline__ uint32_t load_tile_items(const typename F::Bits* __restrict__ x,
                                                    long long n, long long base,
                                                    typename F::Bits (&items)[kTileItems]) {
  using Bits = typename F::Bits;
  using V = TileVectors<F>;
  const int t = threadIdx.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  if (aligned && base + kTile <= n) {
    const uint4* vx = reinterpret_cast<const uint4*>(x + base);
JSS_UNROLL
    for (int r = 0; r < V::kVectors; ++r) {
      const uint4 v = __ldg(vx + r * kTileThreads + t);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
JSS_UNROLL
      for (int e = 0; e < V::kPerVector; ++e) {
        if constexpr (sizeof(Bits) == 4) {
          items[r * V::kPerVector + e] = words[e];
        } else {
          items[r * V::kPerVector + e] = static_cast<Bits>(words[e / 2] >> (16 * (e % 2)));
        }
      }
    }
    return 0xffffu;
  }
  uint32_t valid = 0;
JSS_UNROLL
  for (int q = 0; q < kTileItems; ++q) {
    const long long i = base + tile_item_offset<F>(t, q);
    items[q] = i < n ? x[i] : Bits(0);
    valid |= (i < n ? 1u : 0u) << q;
  }
  return valid;
}

// Stores the 16 bits `bits` (bit q for item q) of every thread of the block as
// the tile's mask words (`mask` points at the tile's first word). All threads
// of the block must call it.
template <typename F>
__device__ __forceinline__ void store_tile_mask(uint32_t bits, uint32_t* __restrict__ mask) {
  using V = TileVectors<F>;
  const int t = threadIdx.x;
  const int group = t % V::kLanesPerWord;
JSS_UNROLL
  for (int r = 0; r < V::kVectors; ++r) {
    const uint32_t part = (bits >> (r * V::kPerVector)) & ((1u << V::kPerVector) - 1u);
    uint32_t word = part << (group * V::kPerVector);
JSS_UNROLL
    for (int o = 1; o < V::kLanesPerWord; o <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, o);
    if (group == 0) mask[(r * kTileThreads + t) / V::kLanesPerWord] = word;
  }
}

// Sum over a warp (every lane gets it).
__device__ __forceinline__ uint32_t warp_sum(uint32_t v) {
JSS_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One thread per word, the block's tiles one after the other (grid-stride: several
// tiles per block with a resident grid; one block per tile with a grid of `tiles`
// blocks, as before): writes each tile's selected entries. tile_offset: packed
// counts of all earlier tiles; ties: device scalar (the top-k state's ties) or
// nullptr for none.
template <typename Bits>
__global__ void __launch_bounds__(kTileWords)
    mask_compact_kernel(const Bits* __restrict__ x, const uint32_t* __restrict__ greater,
                        const uint32_t* __restrict__ equal,
                        const unsigned long long* __restrict__ tile_offset,
                        const unsigned long long* __restrict__ ties_in, long long limit,
                        long long tiles, Bits* __restrict__ values,
                        int32_t* __restrict__ indices) {
  using Scan = cub::BlockScan<uint32_t, kTileWords>;
  __shared__ typename Scan::TempStorage storage;
  const unsigned long long ties = ties_in != nullptr ? *ties_in : 0ull;
  // the loop bounds are the same for the whole block: every thread reaches the scans
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const long long word = tile * kTileWords + threadIdx.x;
    const uint32_t g = greater[word];
    const uint32_t e = equal != nullptr ? equal[word] : 0u;
    uint32_t before;
    Scan(storage).ExclusiveSum((static_cast<uint32_t>(popcount32(g)) << 16) |
                                   static_cast<uint32_t>(popcount32(e)),
                               before);
    if ((g | e) != 0) {
      const unsigned long long offset = tile_offset[tile];
      compact_word<Bits>(g, e, word * 32, packed_greater(offset) + (before >> 16),
                         packed_equal(offset) + (before & 0xffffu), ties, limit, x, values,
                         indices);
    }
    __syncthreads();  // the scan's storage is reused by the next tile
  }
}

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace jss
