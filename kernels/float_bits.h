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
  static inline float from_float(float v) { return v; }
  static inline float from_key(uint32_t key) { float f; std::memcpy(&f, &key, 4); return f; }
};

// float -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN).
// Branch-free (a select), so that loops over arrays of it vectorise.
inline uint16_t float_to_bfloat16_bits(float f) {
  uint32_t x; std::memcpy(&x, &f, 4);
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

template <> struct FloatTraits<bfloat16_t> {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 15;
  static inline uint32_t key(bfloat16_t v) { return v.bits & 0x7fffu; }
  static inline float to_float(bfloat16_t v) {
    uint32_t b = static_cast<uint32_t>(v.bits) << 16; float f; std::memcpy(&f, &b, 4); return f;
  }
  static inline bfloat16_t from_float(float v) { return bfloat16_t{float_to_bfloat16_bits(v)}; }
  static inline float from_key(uint32_t key) { return to_float(bfloat16_t{static_cast<uint16_t>(key)}); }
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

// float -> IEEE half bits, round to nearest even (overflow -> inf, NaN stays NaN).
inline uint16_t float_to_half_bits(float f) {
  uint32_t x; std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN (NaN keeps its top payload bits, made quiet)
    return static_cast<uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {  // below 2^-14: a half subnormal (or zero), in units of 2^-24
    float mag; std::memcpy(&mag, &a, 4);
    const float units = mag * 16777216.0f;  // exact: scaling by a power of two
    uint32_t m = static_cast<uint32_t>(units);
    const float rest = units - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;  // 1024 carries into the smallest normal
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t h = (((a >> 23) - 127u + 15u) << 10) | ((a & 0x7fffffu) >> 13);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may give inf: correct
  return static_cast<uint16_t>(sign | h);
}

template <> struct FloatTraits<float16_t> {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 15;
  static inline uint32_t key(float16_t v) { return v.bits & 0x7fffu; }
  static inline float to_float(float16_t v) { return half_to_float(v.bits); }
  static inline float16_t from_float(float v) { return float16_t{float_to_half_bits(v)}; }
  static inline float from_key(uint32_t key) { return half_to_float(static_cast<uint16_t>(key)); }
};

// The smallest magnitude key of type T whose value is >= `threshold` in the
// magnitude-key order of float32 (NaN above +inf), or 2^kKeyBits if none is.
// A negative threshold counts as 0. Key order is value order, so comparing
// keys of T against this is comparing |x| >= threshold without widening.
template <typename T>
uint32_t key_of_threshold(float threshold) {
  using Tr = FloatTraits<T>;
  uint32_t t;
  const float nonneg = threshold < 0.0f ? 0.0f : threshold;
  std::memcpy(&t, &nonneg, 4);
  t &= 0x7fffffffu;
  if constexpr (Tr::kKeyBits == 31) {
    return t;
  } else {
    auto widened = [](uint32_t key) {
      uint32_t b; const float f = Tr::from_key(key); std::memcpy(&b, &f, 4); return b & 0x7fffffffu;
    };
    uint32_t lo = 0, hi = 1u << Tr::kKeyBits;  // answer in [lo, hi]
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (widened(mid) >= t) hi = mid; else lo = mid + 1;
    }
    return lo;
  }
}

inline bool is_finite_f32(float v) {
  uint32_t b; std::memcpy(&b, &v, 4); return (b & 0x7f800000u) != 0x7f800000u;
}

}  // namespace jss
