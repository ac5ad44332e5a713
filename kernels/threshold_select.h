// Threshold selection with compaction into a fixed capacity: one read of the
// input. Keeps the entries with |x| >= threshold (and x != 0), in index order.
// NaN compares above every threshold (it is selected, so it is seen).
// Returns how many entries qualified; when that is more than `capacity` only
// the first `capacity` are written and the caller must treat it as overflow
// (the Optax transforms fall back to exact top-k) - nothing is dropped silently.
//
// The comparison is on magnitude keys in x's own type (key_of_threshold), so
// 16-bit inputs are never widened. The scan goes in blocks of 16 whose hit
// mask is a few SIMD compares (for_each_key_at_least); only the hits are
// visited. Chunks run on several threads: chunk 0 writes straight to the
// output, the others into small local buffers that are copied behind it in
// chunk order, so the output is the same for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/float_bits.h"
#include "kernels/parallel.h"
#include "kernels/topk_select.h"  // for_each_key_at_least

namespace jss {

// Appends the entries of x[lo..hi) with key >= t (t >= 1) to (values, indices)
// while fewer than `room` are stored; returns how many qualified in total.
template <typename T>
int64_t select_chunk(const T* x, int64_t lo, int64_t hi, uint32_t t, int64_t room, T* values,
                     int32_t* indices) {
  int64_t count = 0;
  for_each_key_at_least(x, lo, hi, t, [&](int64_t j) {
    if (count < room) {
      values[count] = x[j];
      indices[count] = static_cast<int32_t>(j);
    }
    ++count;
  });
  return count;
}

template <typename T>
int64_t threshold_select(const T* x, int64_t n, float threshold, int64_t capacity, T* values,
                         int32_t* indices, int threads) {
  // key != 0 (x != 0) folds into the comparison: t >= 1
  const uint32_t t = std::max<uint32_t>(1u, key_of_threshold<T>(threshold));
  threads = std::max(1, threads);
  std::vector<int64_t> counts(threads, 0);
  std::vector<std::vector<T>> local_values(threads);
  std::vector<std::vector<int32_t>> local_indices(threads);
  parallel_chunks(n, threads, [&](int c, int64_t lo, int64_t hi) {
    if (c == 0) {
      counts[0] = select_chunk(x, lo, hi, t, capacity, values, indices);
      return;
    }
    // A chunk never needs to keep more than `capacity` entries. Each piece is
    // compacted into a reused scratch and only its hits are appended, so the
    // input is read once and the local buffers hold only selected entries.
    std::vector<T>& v = local_values[c];
    std::vector<int32_t>& ix = local_indices[c];
    constexpr int64_t kPiece = int64_t{1} << 14;
    std::unique_ptr<T[]> piece_values(new T[kPiece]);
    std::unique_ptr<int32_t[]> piece_indices(new int32_t[kPiece]);
    int64_t count = 0;
    for (int64_t a = lo; a < hi; a += kPiece) {
      const int64_t b = std::min(hi, a + kPiece);
      const int64_t room = std::max<int64_t>(0, capacity - static_cast<int64_t>(v.size()));
      const int64_t got = select_chunk(x, a, b, t, std::min(room, b - a), piece_values.get(),
                                       piece_indices.get());
      const int64_t keep = std::min(got, room);
      v.insert(v.end(), piece_values.get(), piece_values.get() + keep);
      ix.insert(ix.end(), piece_indices.get(), piece_indices.get() + keep);
      count += got;
    }
    counts[c] = count;
  });
  int64_t total = counts[0];
  for (int c = 1; c < threads; ++c) {
    const int64_t at = total;
    total += counts[c];
    if (at >= capacity) continue;
    const int64_t take = std::min<int64_t>(capacity - at, static_cast<int64_t>(local_values[c].size()));
    std::copy_n(local_values[c].begin(), take, values + at);
    std::copy_n(local_indices[c].begin(), take, indices + at);
  }
  for (int64_t j = total; j < capacity; ++j) {
    values[j] = T{};
    indices[j] = -1;
  }
  return total;
}

}  // namespace jss
