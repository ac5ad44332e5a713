// Threshold selection with compaction into a fixed capacity: one read of the
// input. Keeps the entries with |x| >= threshold (and x != 0), in index order.
// NaN compares above every threshold (it is selected, so it is seen).
// Returns how many entries qualified; when that is more than `capacity` only
// the first `capacity` are written and the caller must treat it as overflow
// (the Optax transforms fall back to exact top-k) - nothing is dropped silently.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/float_bits.h"

namespace jss {

inline uint32_t magnitude_key_of_threshold(float threshold) {
  return FloatTraits<float>::key(threshold < 0.0f ? 0.0f : threshold);
}

template <typename T>
int64_t threshold_select(const T* x, int64_t n, float threshold, int64_t capacity, T* values,
                         int32_t* indices) {
  using Tr = FloatTraits<T>;
  const uint32_t t = magnitude_key_of_threshold(threshold);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = FloatTraits<float>::key(Tr::to_float(x[i]));
    if (key >= t && key != 0) {
      if (count < capacity) {
        values[count] = x[i];
        indices[count] = static_cast<int32_t>(i);
      }
      ++count;
    }
  }
  for (int64_t j = count; j < capacity; ++j) {
    values[j] = T{};
    indices[j] = -1;
  }
  return count;
}

}  // namespace jss
