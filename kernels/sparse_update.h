// Sparse updates of a dense vector, in place: the error-feedback residual
// update (zero the selected entries) and the scatter-add that densifies a
// sparse (values, indices) vector. Index -1 is padding and is skipped; any
// other index outside [0, n) is an error, checked before anything is written.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/float_bits.h"

namespace jss {

// Slot of the first index outside [-1, n), or -1 if every index is valid.
inline int64_t first_bad_index(const int32_t* indices, int64_t cap, int64_t n) {
  for (int64_t j = 0; j < cap; ++j) {
    if (indices[j] < -1 || indices[j] >= n) return j;
  }
  return -1;
}

// acc[indices[j]] = 0 for every j with indices[j] >= 0 (+0 of acc's type).
template <typename T>
void zero_at_indices(T* acc, const int32_t* indices, int64_t cap) {
  for (int64_t j = 0; j < cap; ++j) {
    if (indices[j] >= 0) acc[indices[j]] = T{};
  }
}

// dense[indices[j]] += values[j] for j = 0, 1, ... (slot order), padding
// skipped. The sum for each index is accumulated in float32, starting from
// the dense value, in slot order, and rounded to T once (round to nearest
// even); for float32 that is exactly the sequential `+=`. NaN and Inf follow
// IEEE arithmetic (a NaN value makes its entry NaN).
template <typename T>
void scatter_add(T* dense, const T* values, const int32_t* indices, int64_t cap) {
  using Tr = FloatTraits<T>;
  if constexpr (Tr::kKeyBits == 31) {
    for (int64_t j = 0; j < cap; ++j) {
      if (indices[j] >= 0) dense[indices[j]] += values[j];
    }
  } else {
    // group the slots by index (stable: slot order within an index), then one
    // float32 sum and one rounding per index
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(cap));
    for (int64_t j = 0; j < cap; ++j) {
      if (indices[j] >= 0) order.push_back((static_cast<int64_t>(indices[j]) << 32) | j);
    }
    std::sort(order.begin(), order.end());
    size_t g = 0;
    while (g < order.size()) {
      const int32_t idx = static_cast<int32_t>(order[g] >> 32);
      float sum = Tr::to_float(dense[idx]);
      for (; g < order.size() && static_cast<int32_t>(order[g] >> 32) == idx; ++g) {
        sum += Tr::to_float(values[order[g] & 0xffffffffll]);
      }
      dense[idx] = Tr::from_float(sum);
    }
  }
}

}  // namespace jss
