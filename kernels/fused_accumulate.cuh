// CUDA twins of the fused passes of kernels/accumulate.h (jss_accumulate_topk)
// and kernels/adam_accumulate.h (jss_adam_accumulate): one pass reads the
// gradient (its leaves' own buffers) and the residual (and, for Adam, mu, nu,
// age and the noise buffers), writes the accumulator once (and the Adam state in
// place), and collects the top-k's candidates while each entry is in registers.
// The same bits as the CPU handlers: each entry is computed by one thread with
// the CPU's operations in the CPU's order, each rounded alone (mul_rn, add_rn,
// div_rn, sqrt_rn: no fused multiply-add), and the top-k is jss.topk's (ascending
// index order, ties to the lower index, NaN first). One exception: the clip's
// division is XLA's on the device (div_as_xla), so that max_grad_norm= equals
// optax.clip_by_global_norm in front on the same device, as on the CPU.
//
// The candidates (compute_topk in kernels/accumulate.h): with a usable hint (a
// magnitude at most the k-th, from the last step), every entry whose key is >= the
// hint's is appended, (key, index), to a list of `cap` slots (one atomic per tile
// for the block's slots). Its length decides on the device, without a host round
// trip, which of two enqueued paths runs (the other's kernels return at once):
//   * the list holds at least k and at most cap entries (the hint held): the
//     radix select runs on the list alone (kernels/selection.cuh's candidate
//     kernels), and its entries above / equal to the k-th key go to the masks of
//     the ordered compaction. The accumulator is read once, by the compaction, at
//     the k entries it writes.
//   * otherwise, jss.topk's passes run on the accumulator: its first-digit
//     histogram (made by the fused pass itself when there was no hint), the
//     filter pass, the remaining digits, the compaction.
// hint_used is 1 exactly where the CPU handler's is (the same count decides).
//
// The gradient's leaves reach the kernel as a table in its parameters
// (__grid_constant__, kChunkLeaves leaves a launch; more leaves take more
// launches over consecutive ranges), copied to shared memory by each block.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda_common.cuh"
#include "kernels/float_bits.cuh"
#include "kernels/mask_compaction.cuh"
#include "kernels/scratch_layout.cuh"
#include "kernels/selection.cuh"

namespace jss {
namespace cuda {

// --- per-entry arithmetic (host + device, checked by tests/cuda_host) ----------

// decay * r + add (r + add without a decay), the product and the sum each rounded
// alone: kernels/accumulate.h's decayed_sum.
JSS_HD float decayed_entry(float r, float add, bool has_decay, float decay) {
  return has_decay ? add_rn(mul_rn(r, decay), add) : add_rn(r, add);
}

// std::max(a, b) as the CPU kernel takes it: b only when a < b (a NaN `a` stays).
JSS_HD float max_like_std(float a, float b) { return a < b ? b : a; }

//: kernels/adam_direction.h's kMaxAge (int16 ages saturate there)
constexpr int32_t kAdamMaxAge = 32767;

// jss_adam_accumulate's attributes (the CPU handler's AdamDirectionConfig, the
// parts known when the call is built).
struct AdamConstants {
  float b1, one_minus_b1, b2, one_minus_b2, eps;
  int masking;            // MomentumMasking: 0 restart, 1 zero, 2 off
  long long table_size;   // entries of the 1 - b1**a table
  bool has_noise, has_decay, has_clip;
};

// The (11,) scalars as the CPU handler reads them (device data: read by the kernel).
struct AdamScalars {
  float bias2, bias1_t, scale, noise_norm, update_noise, keep, floor, decay;
  bool clip;
  float clip_norm, clip_max_norm;
};

JSS_HD AdamScalars read_adam_scalars(const float* sc, const AdamConstants& c) {
  AdamScalars s;
  s.bias2 = sc[0];
  s.bias1_t = sc[1];
  s.scale = sc[2];
  s.noise_norm = c.has_noise ? sc[3] : 0.0f;
  s.update_noise = c.has_noise ? sc[4] : 0.0f;
  s.keep = c.has_noise ? sc[5] : 0.0f;
  s.floor = c.has_noise ? sc[6] : 1.0f;
  // jss_adam_direction's scalars end here: it reads neither the decay nor a clip
  s.decay = c.has_decay ? sc[7] : 1.0f;
  // optax's trigger: clipped unless norm < max_norm (a NaN norm clips)
  s.clip = c.has_clip && !(sc[9] < sc[10]);
  s.clip_norm = c.has_clip ? sc[9] : 1.0f;
  s.clip_max_norm = c.has_clip ? sc[10] : 1.0f;
  return s;
}

// The Adam state of one call, indexed by an entry's place in the whole buffers.
struct AdamBuffers {
  float* mu;
  float* nu;
  int16_t* age;
  const float* mask_from;        // the residual (pending masks), or nullptr: no masking
  float* diff_sq;                // second_moment="mean" (has_noise), else unread
  float* last;
  float* before_last;
  const float* bias1;            // 1 - b1**a for a = 1 .. table_size
  const float* accumulate_from;  // the residual the accumulator adds to
};

// One entry of kernels/adam_direction.h's adam_direction_block: updates the state
// at `p` and returns the direction's entry.
JSS_HD float adam_direction_entry(const AdamConstants& c, const AdamScalars& s,
                                  const AdamBuffers& b, float g_in, long long p) {
  // optax's (g / norm) * max_norm, its division as XLA compiles it on this device
  const float g = s.clip ? mul_rn(div_as_xla(g_in, s.clip_norm), s.clip_max_norm) : g_in;
  const int32_t old = b.age[p];
  const int32_t magnitude = old < 0 ? -old : old;
  float mu = b.mu[p];
  int32_t a;
  if (b.mask_from != nullptr) {
    // sent at the last step after being held back: restart its moment
    const float r = b.mask_from[p];
    const bool sent = old < 0 && r == 0.0f;
    if (sent) mu = 0.0f;
    a = (sent ? 0 : (magnitude < kAdamMaxAge - 1 ? magnitude : kAdamMaxAge - 1)) + 1;
    b.age[p] = static_cast<int16_t>(r != 0.0f ? -a : a);  // held now: a mask may follow
  } else {
    a = (magnitude < kAdamMaxAge - 1 ? magnitude : kAdamMaxAge - 1) + 1;
    b.age[p] = static_cast<int16_t>(a);
  }
  const long long at = a < c.table_size ? a : c.table_size;  // the clamped lookup
  const float bias1 = c.masking == 0 ? b.bias1[at - 1] : s.bias1_t;
  const float m = add_rn(mul_rn(c.b1, mu), mul_rn(c.one_minus_b1, g));
  const float v = add_rn(mul_rn(c.b2, b.nu[p]), mul_rn(mul_rn(c.one_minus_b2, g), g));
  b.mu[p] = m;
  b.nu[p] = v;
  float denominator;
  if (c.has_noise) {  // the mean gradient's second moment, estimated
    const float last = b.last[p], before = b.before_last[p], dsq = b.diff_sq[p];
    const float d = add_rn(sub_rn(g, mul_rn(2.0f, last)), before);
    const float ds = s.update_noise != 0.0f
                         ? add_rn(mul_rn(c.b2, dsq), mul_rn(mul_rn(c.one_minus_b2, d), d))
                         : dsq;
    b.diff_sq[p] = ds;
    b.before_last[p] = last;
    b.last[p] = g;
    const float v_hat = div_rn(v, s.bias2);
    denominator = max_like_std(sub_rn(v_hat, mul_rn(s.keep, mul_rn(ds, s.noise_norm))),
                               mul_rn(v_hat, s.floor));
  } else {
    denominator = div_rn(v, s.bias2);
  }
  return mul_rn(s.scale, div_rn(div_rn(m, bias1), add_rn(sqrt_rn(denominator), c.eps)));
}

// One entry of kernels/adam_accumulate.h's adam_accumulate_range (the direction,
// then decayed_sum): updates the state at `p` and returns the accumulator's entry.
JSS_HD float adam_accumulate_entry(const AdamConstants& c, const AdamScalars& s,
                                   const AdamBuffers& b, float g_in, long long p) {
  return decayed_entry(b.accumulate_from[p], adam_direction_entry(c, s, b, g_in, p),
                       c.has_decay, s.decay);
}

// The accumulator's entry of jss_accumulate_topk. load() reads the device scalar
// once per thread.
struct AccumulateEntry {
  const float* residual;  // the whole (total,) residual
  const float* decay;     // device scalar, read with has_decay
  bool has_decay;
  float factor = 1.0f;
  JSS_HD void load() { factor = has_decay ? *decay : 1.0f; }
  JSS_HD float operator()(float g, long long p) const {
    return decayed_entry(residual[p], g, has_decay, factor);
  }
};

// The Adam pass's entry (jss_adam_accumulate): the state updated, the accumulator's
// entry returned.
struct AdamEntry {
  AdamConstants c;
  AdamBuffers b;
  const float* scalars;  // device (11,)
  AdamScalars s;
  JSS_HD void load() { s = read_adam_scalars(scalars, c); }
  JSS_HD float operator()(float g, long long p) const {
    return adam_accumulate_entry(c, s, b, g, p);
  }
};

// jss_adam_direction's entry: the state updated, the direction's entry returned
// (scalars: its (7,); neither a decay nor a clip).
struct AdamDirectionEntry {
  AdamConstants c;
  AdamBuffers b;
  const float* scalars;
  AdamScalars s;
  JSS_HD void load() { s = read_adam_scalars(scalars, c); }
  JSS_HD float operator()(float g, long long p) const {
    return adam_direction_entry(c, s, b, g, p);
  }
};

// The hint's key: 0 (no list) for a hint that is not a positive finite float, as
// the CPU handlers read it.
JSS_HD uint32_t hint_key_of(float h) {
  return (h > 0.0f && h <= 3.4e38f) ? (bits_from_float(h) & 0x7fffffffu) : 0u;
}

// compute_topk's test: the list holds the top k (at least k entries above the
// hint) and all of it was kept (at most cap).
JSS_HD bool hint_list_holds(uint32_t hint_key, unsigned long long listed, long long k,
                            long long cap) {
  return hint_key != 0 && cap >= k && listed >= static_cast<unsigned long long>(k) &&
         listed <= static_cast<unsigned long long>(cap);
}

// The leaf of flat entry i: the last j with offset[j] <= i (offset[0] <= i).
JSS_HD int leaf_of(const long long* offset, int count, long long i) {
  int lo = 0, hi = count;  // offset[lo] <= i < offset[hi] (or hi == count)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offset[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// --- the leaf table and the selection's side of the pass ----------------------

constexpr int kChunkLeaves = 64;

// Leaves [first, first + count) of a call: leaf j is the call's flat entries
// [offset[j], offset[j + 1]), at place[j] in the whole (total,) buffers.
struct LeafChunk {
  int count;
  const float* leaf[kChunkLeaves];
  long long offset[kChunkLeaves + 1];
  long long place[kChunkLeaves];
};

struct FusedSelect {
  bool select = false;                  // k >= 1: collect for a top-k
  bool use_hint = false;                // cap >= k: a list can hold the top k
  const float* hint = nullptr;          // device scalar
  unsigned long long* hist0 = nullptr;  // first-digit histogram without a list (or nullptr)
  uint32_t* list_keys = nullptr;
  int32_t* list_index = nullptr;
  unsigned int* list_count = nullptr;   // entries at or above the hint (all, kept or not)
  long long list_room = 0;              // slots of the list
};

#ifdef __CUDACC__

// Appends the tile's flagged entries (bit q of `flags`: item q, key keys[q]) to
// the list: the block's total takes its slots with one atomic. All threads of
// the block call it; warp_total / block_slot are the block's shared words.
__device__ __forceinline__ void append_to_list(uint32_t flags, const uint32_t (&keys)[kTileItems],
                                               long long base, const FusedSelect& sel,
                                               unsigned int* warp_total,
                                               unsigned long long* block_slot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t mine = static_cast<uint32_t>(popcount32(flags));
  uint32_t upto = mine;  // inclusive scan over the warp's lanes
JSS_UNROLL
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, upto, o);
    if (lane >= o) upto += v;
  }
  if (lane == 31) warp_total[warp] = upto;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int total = 0;
    for (int w = 0; w < kTileThreads / 32; ++w) {
      const unsigned int t = warp_total[w];
      warp_total[w] = total;  // now the warp's first slot in the block's
      total += t;
    }
    *block_slot = total != 0 ? atomicAdd(sel.list_count, total) : 0u;
  }
  __syncthreads();
  unsigned long long slot = *block_slot + warp_total[warp] + (upto - mine);
JSS_UNROLL
  for (int q = 0; q < kTileItems; ++q) {
    if ((flags >> q) & 1u) {
      if (slot < static_cast<unsigned long long>(sel.list_room)) {
        sel.list_keys[slot] = keys[q];
        sel.list_index[slot] = static_cast<int32_t>(base + q * kTileThreads + threadIdx.x);
      }
      ++slot;
    }
  }
}

// The fused pass over the call's entries [lo, hi) (leaves of `chunk`): entry(g, p)
// computes each accumulator entry (and its side effects) at its place p, written
// to acc[p] and, when given, gathered[i] (the call's order). With a selection:
// each entry's key goes to the list (key >= hint's) or, without a hint, to the
// first-digit histogram. Item q of thread t of a tile is entry base + q * 256 + t:
// a warp reads and writes 32 consecutive floats of a leaf.
template <typename Entry>
__global__ void __launch_bounds__(kTileThreads)
    fused_accumulate_kernel(Entry entry, const __grid_constant__ LeafChunk chunk, long long lo,
                            long long hi, float* acc, float* gathered, FusedSelect sel) {
  // acc may be the residual's own buffer (aliased), read by entry(): no __restrict__
  __shared__ unsigned int bins[kMaxBins];
  __shared__ long long offset[kChunkLeaves + 1];
  __shared__ const float* leaf_data[kChunkLeaves];
  __shared__ long long place[kChunkLeaves];
  __shared__ unsigned int warp_total[kTileThreads / 32];
  __shared__ unsigned long long block_slot;
  entry.load();
  for (int j = threadIdx.x; j <= chunk.count; j += blockDim.x) {
    offset[j] = chunk.offset[j];
    if (j < chunk.count) {
      leaf_data[j] = chunk.leaf[j];
      place[j] = chunk.place[j];
    }
  }
  // the same in every thread: the block's branches below are uniform
  const uint32_t hint_key = sel.select && sel.use_hint ? hint_key_of(*sel.hint) : 0u;
  const bool histogram = sel.select && hint_key == 0 && sel.hist0 != nullptr;
  const int shift0 = radix_shift(F32::kKeyBits, 0), width0 = radix_width(F32::kKeyBits, 0);
  if (histogram) {
    for (int b = threadIdx.x; b < (1 << width0); b += blockDim.x) bins[b] = 0;
  }
  __syncthreads();
  const long long tiles = num_tiles(hi - lo);
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const long long base = lo + tile * kTile;
    int j = leaf_of(offset, chunk.count, base + threadIdx.x < hi ? base + threadIdx.x : hi - 1);
    uint32_t keys[kTileItems];
    uint32_t flags = 0;
JSS_UNROLL
    for (int q = 0; q < kTileItems; ++q) {
      const long long i = base + q * kTileThreads + threadIdx.x;
      keys[q] = 0;
      if (i < hi) {
        while (offset[j + 1] <= i) ++j;
        const long long local = i - offset[j];
        const float v = entry(leaf_data[j][local], place[j] + local);
        acc[place[j] + local] = v;
        if (gathered != nullptr) gathered[i] = v;
        const uint32_t key = bits_from_float(v) & 0x7fffffffu;
        keys[q] = key;
        if (histogram) atomicAdd(&bins[key_digit(key, shift0, width0)], 1u);
        flags |= (hint_key != 0 && key >= hint_key ? 1u : 0u) << q;
      }
    }
    if (hint_key != 0) append_to_list(flags, keys, base, sel, warp_total, &block_slot);
  }
  if (histogram) {
    __syncthreads();
    flush_bins(bins, 1 << width0, sel.hist0);
  }
}

// hint_used and the gates of the two paths: flags[0] the list's path, flags[1]
// the whole accumulator's, flags[2] the whole accumulator's first-digit
// histogram (not made by the fused pass: there was a hint).
static __global__ void fused_decide_kernel(const float* __restrict__ hint, bool use_hint,
                                           const unsigned int* __restrict__ list_count,
                                           long long k, long long cap,
                                           int32_t* __restrict__ hint_used,
                                           unsigned int* __restrict__ flags) {
  const uint32_t hint_key = use_hint ? hint_key_of(*hint) : 0u;
  const bool listed = hint_list_holds(hint_key, *list_count, k, cap);
  *hint_used = listed ? 1 : 0;
  if (flags != nullptr) {
    flags[0] = listed ? 1u : 0u;
    flags[1] = listed ? 0u : 1u;
    flags[2] = !listed && hint_key != 0 ? 1u : 0u;
  }
}

// k = 0 (the accumulator alone): values[0] = 0, indices[0] = -1, hint_used = 0.
static __global__ void fused_no_topk_kernel(float* values, int32_t* indices, int32_t* hint_used) {
  values[0] = 0.0f;
  indices[0] = -1;
  *hint_used = 0;
}

#endif  // __CUDACC__

// --- launcher ------------------------------------------------------------------

// The call's gradient on the host side of the launch: leaf j's device pointer, its
// flat entries [offsets[j], offsets[j + 1]) of the call, its place in the whole
// buffers.
struct FusedLeaves {
  std::vector<const float*> leaves;
  std::vector<long long> offsets;  // leaves.size() + 1 entries, from 0
  std::vector<long long> places;
  long long size() const { return offsets.empty() ? 0 : offsets.back(); }
};

// Scratch: jss.topk's (for 1 <= k < n), then the list, its count and the gates.
struct FusedScratch {
  bool with_topk = false;
  TopkScratch topk;
  size_t list_keys = 0, list_index = 0, list_count = 0, flags = 0, total = 0;
  long long list_room = 0;
  FusedScratch(long long n, long long k, long long cap)
      : with_topk(k >= 1 && k < n), topk(with_topk ? n : 1, F32::kKeyBits) {
    ScratchLayout layout;
    if (with_topk) layout.add(topk.total);  // at offset 0: TopkScratch's own offsets
    // the list only where it can be selected from (k < n: with k = n every entry
    // is kept; its count still sets hint_used)
    list_room = with_topk && cap >= k ? cap : 0;
    list_keys = layout.add(sizeof(uint32_t) * static_cast<size_t>(list_room));
    list_index = layout.add(sizeof(int32_t) * static_cast<size_t>(list_room));
    list_count = layout.add(sizeof(unsigned int));
    flags = layout.add(3 * sizeof(unsigned int));
    total = layout.total();
  }
};

inline size_t fused_accumulate_scratch_bytes(long long n, long long k, long long cap) {
  return FusedScratch(n, k, cap).total;
}

#ifdef __CUDACC__

// The fused pass, chunk by chunk of kChunkLeaves leaves.
template <typename Entry>
cudaError_t fused_pass_launch(const Entry& entry, const FusedLeaves& leaves, float* acc,
                              float* gathered, const FusedSelect& sel, cudaStream_t stream) {
  const int count = static_cast<int>(leaves.leaves.size());
  for (int first = 0; first < count; first += kChunkLeaves) {
    LeafChunk chunk;
    chunk.count = count - first < kChunkLeaves ? count - first : kChunkLeaves;
    for (int j = 0; j < chunk.count; ++j) {
      chunk.leaf[j] = leaves.leaves[first + j];
      chunk.offset[j] = leaves.offsets[first + j];
      chunk.place[j] = leaves.places[first + j];
    }
    chunk.offset[chunk.count] = leaves.offsets[first + chunk.count];
    const long long lo = chunk.offset[0], hi = chunk.offset[chunk.count];
    if (hi <= lo) continue;
    const unsigned int grid =
        resident_grid(fused_accumulate_kernel<Entry>, kTileThreads, num_tiles(hi - lo));
    fused_accumulate_kernel<Entry><<<grid, kTileThreads, 0, stream>>>(entry, chunk, lo, hi, acc,
                                                                     gathered, sel);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  return cudaSuccess;
}

// The selection after the fused pass when 1 <= k < n: the list's path and the
// whole accumulator's, both enqueued, gated by the decide kernel's flags; then
// the ordered compaction of `x` (the call's accumulator, n entries).
inline cudaError_t fused_select_launch(const FusedScratch& fs, const float* x_float, long long n,
                                       long long k, float* values, int32_t* indices,
                                       void* scratch, cudaStream_t stream) {
  using F = F32;
  const uint32_t* x = reinterpret_cast<const uint32_t*>(x_float);
  const TopkScratch& s = fs.topk;
  const long long tiles = num_tiles(n);
  RadixState* state = ScratchLayout::at<RadixState>(scratch, s.radix.state);
  auto* hist = ScratchLayout::at<unsigned long long>(scratch, s.radix.hist);
  uint32_t* greater = ScratchLayout::at<uint32_t>(scratch, s.masks.greater);
  uint32_t* equal = ScratchLayout::at<uint32_t>(scratch, s.masks.equal);
  auto* tile_count = ScratchLayout::at<unsigned long long>(scratch, s.masks.tile_count);
  unsigned int* flags = ScratchLayout::at<unsigned int>(scratch, fs.flags);
  const unsigned int filter_grid = resident_grid(topk_filter_kernel<F>, kTileThreads, tiles);
  CandidateBuffer cand = s.candidates(scratch, filter_grid);
  cand.only_if_set = flags + 1;
  // the list as a candidate buffer of one region; "overflowed" where it is not used
  const long long room = fs.list_room > 0 ? fs.list_room : 1;
  const CandidateBuffer list{ScratchLayout::at<uint32_t>(scratch, fs.list_keys),
                             ScratchLayout::at<int32_t>(scratch, fs.list_index),
                             ScratchLayout::at<unsigned int>(scratch, fs.list_count),
                             flags + 1, room, fs.list_room};
  const unsigned int list_grid = resident_grid(candidate_histogram_kernel, kHistThreads,
                                               grid_for(room, kHistThreads, kHistMaxBlocks));
  const int shift0 = radix_shift(F::kKeyBits, 0), width0 = radix_width(F::kKeyBits, 0);
  for (int pass = 0; pass < radix_passes(F::kKeyBits); ++pass) {
    const int shift = radix_shift(F::kKeyBits, pass), width = radix_width(F::kKeyBits, pass);
    unsigned long long* pass_hist = hist + static_cast<size_t>(pass) * kMaxBins;
    if (fs.list_room > 0) {
      candidate_histogram_kernel<<<list_grid, kHistThreads, 0, stream>>>(list, state, shift,
                                                                         width, pass_hist);
      JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    }
    if (pass == 0) {  // the fused pass made it where there was no hint
      tile_histogram_kernel<F><<<resident_grid(tile_histogram_kernel<F>, kTileThreads, tiles),
                                 kTileThreads, 0, stream>>>(x, n, shift, width, pass_hist,
                                                            flags + 2);
    } else if (pass == 1) {
      topk_filter_kernel<F><<<filter_grid, kTileThreads, 0, stream>>>(
          x, n, state, shift0, width0, shift, width, pass_hist, greater, tile_count, cand,
          flags + 1);
    } else {
      candidate_histogram_kernel<<<resident_grid(candidate_histogram_kernel, kHistThreads,
                                                 grid_for(cand.slots, kHistThreads,
                                                          kHistMaxBlocks)),
                                   kHistThreads, 0, stream>>>(cand, state, shift, width,
                                                              pass_hist);
      JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
      radix_histogram_kernel<F><<<resident_grid(radix_histogram_kernel<F>, kHistThreads,
                                                grid_for(n, kHistThreads, kHistMaxBlocks)),
                                  kHistThreads, 0, stream>>>(x, n, 1, state, shift, width,
                                                             pass_hist, cand.overflow);
    }
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    radix_choose_kernel<<<1, kChooseThreads, 0, stream>>>(pass_hist, shift, width, state);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  // the entries above / equal to the k-th key join the masks: from the list, or
  // from the filter's candidates (from x where they overflowed)
  if (fs.list_room > 0) {
    candidate_mark_kernel<<<resident_grid(candidate_mark_kernel, kFillThreads,
                                          grid_for(room, kFillThreads, kFillMaxBlocks)),
                            kFillThreads, 0, stream>>>(list, state, greater, equal, tile_count);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  }
  candidate_mark_kernel<<<resident_grid(candidate_mark_kernel, kFillThreads,
                                        grid_for(cand.slots, kFillThreads, kFillMaxBlocks)),
                          kFillThreads, 0, stream>>>(cand, state, greater, equal, tile_count);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  const uint32_t first_mask = ((1u << width0) - 1u) << shift0;
  overflow_mark_kernel<F><<<resident_grid(overflow_mark_kernel<F>, kFillThreads,
                                          grid_for(n, kFillThreads, kFillMaxBlocks)),
                            kFillThreads, 0, stream>>>(x, n, state, cand.overflow, first_mask,
                                                       greater, equal, tile_count);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  return mask_compact_launch<uint32_t>(x, n, s.masks, true, scratch, &state->ties, k,
                                       reinterpret_cast<uint32_t*>(values), indices, stream);
}

// The fused pass over the call's n = leaves.size() entries and, for 1 <= k <= n,
// the exact top-k of the accumulator: values / indices (k each; for k = 0 one
// each, 0 and -1) and hint_used, as the CPU handler gives them. acc: the whole
// buffer the entries are written to at their places; gathered: the call's order
// (nullptr for one range); x: where the selection reads the call's accumulator
// (acc + the range's start, or gathered). hint: device scalar. Scratch:
// fused_accumulate_scratch_bytes(n, k, cap).
template <typename Entry>
cudaError_t fused_accumulate_launch(const Entry& entry, const FusedLeaves& leaves, float* acc,
                                    float* gathered, const float* x, const float* hint,
                                    long long k, long long cap, float* values, int32_t* indices,
                                    int32_t* hint_used, void* scratch, cudaStream_t stream) {
  const long long n = leaves.size();
  if (k <= 0) {
    JSS_CUDA_RETURN_IF_ERROR(fused_pass_launch(entry, leaves, acc, gathered, FusedSelect{},
                                               stream));
    fused_no_topk_kernel<<<1, 1, 0, stream>>>(values, indices, hint_used);
    return last_launch_error();
  }
  const FusedScratch fs(n, k, cap);
  FusedSelect sel;
  sel.select = true;
  sel.use_hint = cap >= k;
  sel.hint = hint;
  sel.list_keys = ScratchLayout::at<uint32_t>(scratch, fs.list_keys);
  sel.list_index = ScratchLayout::at<int32_t>(scratch, fs.list_index);
  sel.list_count = ScratchLayout::at<unsigned int>(scratch, fs.list_count);
  sel.list_room = fs.list_room;
  unsigned int* flags = ScratchLayout::at<unsigned int>(scratch, fs.flags);
  JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sel.list_count, 0, sizeof(unsigned int), stream));
  if (!fs.with_topk) {  // k = n: every entry, in index order
    JSS_CUDA_RETURN_IF_ERROR(fused_pass_launch(entry, leaves, acc, gathered, sel, stream));
    fused_decide_kernel<<<1, 1, 0, stream>>>(hint, sel.use_hint, sel.list_count, k, cap,
                                             hint_used, nullptr);
    JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
    copy_all_kernel<F32><<<grid_for(n, kFillThreads, kFillMaxBlocks), kFillThreads, 0, stream>>>(
        reinterpret_cast<const uint32_t*>(x), n, reinterpret_cast<uint32_t*>(values), indices);
    return last_launch_error();
  }
  const TopkScratch& s = fs.topk;
  sel.hist0 = ScratchLayout::at<unsigned long long>(scratch, s.radix.hist);
  // the histograms, the overflow flag, the equal mask, the tile counts and the greater
  // mask (the list's path sets its bits one by one; the filter pass, which writes
  // every word, may not run): one memset
  JSS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sel.hist0, 0, s.zeroed_bytes(true), stream));
  radix_init_kernel<<<1, 1, 0, stream>>>(ScratchLayout::at<RadixState>(scratch, s.radix.state),
                                         static_cast<unsigned long long>(k));
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  JSS_CUDA_RETURN_IF_ERROR(fused_pass_launch(entry, leaves, acc, gathered, sel, stream));
  fused_decide_kernel<<<1, 1, 0, stream>>>(hint, sel.use_hint, sel.list_count, k, cap, hint_used,
                                           flags);
  JSS_CUDA_RETURN_IF_ERROR(last_launch_error());
  return fused_select_launch(fs, x, n, k, values, indices, scratch, stream);
}

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace jss
