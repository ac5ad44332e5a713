// Magnitude keys for floating-point values, shared by every selection kernel.
//
// Clearing the sign bit of an IEEE float gives an unsigned integer whose order is
// the order of |x| (for non-negative floats the bit pattern is monotone). NaN
// patterns sit above +inf, so NaN ranks as the largest magnitude: a NaN is always
// selected and therefore always *seen* by the sync (never hidden in a residual).
#pragma once

#include <cstdint>
#include <cstring>

namespace jss {

// 16-bit float storage types. Arithmetic is done after widening to float.
struct bfloat16_t { uint16_t bits; };
struct float16_t { uint16_t bits; };

template <typename T> struct FloatTraits;

template <> struct FloatTraits<float> {
  using Bits = uint32_t;
  static constexpr int kKeyBits = 31;
  static inline uint32_t key(float v) {
    uint32_t b; std::memcpy(&b, &v, 4); return b & 0x7fffffffu;
  }
  static inline float to_float(float v) { return v; }
};

template <> struct FloatTraits<bfloat16_t> {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 15;
  static inline uint32_t key(bfloat16_t v) { return v.bits & 0x7fffu; }
  static inline float to_float(bfloat16_t v) {
    uint32_t b = static_cast<uint32_t>(v.bits) << 16; float f; std::memcpy(&f, &b, 4); return f;
  }
};

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f; std::memcpy(&f, &bits, 4); return f;
}

template <> struct FloatTraits<float16_t> {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 15;
  static inline uint32_t key(float16_t v) { return v.bits & 0x7fffu; }
  static inline float to_float(float16_t v) { return half_to_float(v.bits); }
};

inline bool is_finite_f32(float v) {
  uint32_t b; std::memcpy(&b, &v, 4); return (b & 0x7f800000u) != 0x7f800000u;
}

}  // namespace jss
