// Reads a fuzz input front to back: the call's configuration and this rank's
// own arguments first, then whatever is left is what the peers send
// (fake_mpi.h). Reads past the end give zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), left_(size) {}

  template <typename T>
  T take() {
    T v{};
    const size_t n = sizeof(T) < left_ ? sizeof(T) : left_;
    std::memcpy(&v, data_, n);
    data_ += n;
    left_ -= n;
    return v;
  }
  // A value in [lo, hi] (hi >= lo), from one or two bytes.
  int64_t in_range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t raw = span <= 256 ? take<uint8_t>() : take<uint16_t>();
    return lo + static_cast<int64_t>(raw % span);
  }
  // An index for a COO slot: mostly in [-1, n) (-1 is padding), sometimes any int32
  // (out-of-range indices must be rejected by the argument check).
  int32_t index(int64_t n) {
    const uint8_t mode = take<uint8_t>();
    if (mode == 0xff) return take<int32_t>();
    return static_cast<int32_t>(in_range(-1, n - 1));
  }
  // A float: mostly small integers (sums stay exact), sometimes any bit pattern.
  float value() {
    const uint8_t mode = take<uint8_t>();
    if (mode >= 0xf0) return take<float>();
    return static_cast<float>(static_cast<int>(mode % 16) - 8);
  }
  const uint8_t* rest() const { return data_; }
  size_t rest_size() const { return left_; }

 private:
  const uint8_t* data_;
  size_t left_;
};

}  // namespace fuzz
