// QSGD quantization (Alistarh et al.), as SparCML uses it on DSAR's dense phase.
//
// The vector is cut into buckets of `bucket` entries. Each bucket is scaled
// by its largest magnitude and every entry is rounded *stochastically* to one
// of s = 2^(bits-1) - 1 levels, so E[dequantize(quantize(x))] = x (unbiased).
// A code is `bits` wide: the top bit is the sign, the rest the level. With
// bits in {2, 4, 8} codes never straddle a byte.
//
// The random numbers are a counter-based hash of (seed, position): the same
// seed gives the same codes on any machine and any thread count, so runs are
// reproducible and ranks that quantize the same data with the same seed agree.
#pragma once

#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>

#include "kernels/float_bits.h"

namespace jss {

struct QsgdLayout {
  int64_t n;       // entries
  int bits;        // 2, 4 or 8
  int64_t bucket;  // entries per scale

  int64_t num_buckets() const { return (n + bucket - 1) / bucket; }
  int64_t packed_bytes() const { return (n * bits + 7) / 8; }
  int64_t levels() const { return (int64_t{1} << (bits - 1)) - 1; }
};

inline bool qsgd_bits_supported(int bits) { return bits == 2 || bits == 4 || bits == 8; }

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 random bits, from (seed, i).
inline float uniform01(uint64_t seed, uint64_t i) {
  return static_cast<float>(splitmix64(seed ^ splitmix64(i)) >> 40) * (1.0f / 16777216.0f);
}

// packed: layout.packed_bytes() bytes; scales: layout.num_buckets() floats.
// A bucket holding a NaN or Inf gets a NaN scale (dequantizes to NaN), so
// non-finite values are never silently turned into finite ones. T is float,
// bfloat16_t or float16_t; 16-bit inputs are widened exactly to float32 one
// element at a time, so they quantize to the same codes as their float32 cast.
template <typename T>
void qsgd_quantize(const T* x, const QsgdLayout& layout, uint64_t seed, uint8_t* packed,
                   float* scales) {
  using Tr = FloatTraits<T>;
  const int64_t s = layout.levels();
  const int per_byte = 8 / layout.bits;
  std::memset(packed, 0, static_cast<size_t>(layout.packed_bytes()));
  for (int64_t b = 0; b < layout.num_buckets(); ++b) {
    const int64_t lo = b * layout.bucket;
    const int64_t hi = lo + layout.bucket < layout.n ? lo + layout.bucket : layout.n;
    float scale = 0.0f;
    bool finite = true;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = Tr::to_float(x[i]);
      finite &= std::isfinite(v);
      scale = std::fmax(scale, std::fabs(v));
    }
    if (!finite) scale = NAN;
    scales[b] = scale;
    if (!(scale > 0.0f) || !finite) continue;  // all zero (codes stay 0) or non-finite
    // s / scale overflows to inf for a tiny (subnormal) scale: then each entry
    // is divided by the scale first (|v| / scale <= 1), never inf * 0 or an
    // out-of-range float-to-int conversion. The CUDA kernel does the same.
    const float to_level = static_cast<float>(s) / scale;
    const bool tiny_scale = std::isinf(to_level);
    for (int64_t i = lo; i < hi; ++i) {
      const float v = Tr::to_float(x[i]);
      const float r = tiny_scale ? (std::fabs(v) / scale) * static_cast<float>(s)
                                 : std::fabs(v) * to_level;  // in [0, s]
      int64_t level = static_cast<int64_t>(r);
      if (level < s && uniform01(seed, static_cast<uint64_t>(i)) < r - static_cast<float>(level)) {
        ++level;
      }
      const uint32_t code = static_cast<uint32_t>(level) |
                            (std::signbit(v) && level > 0 ? 1u << (layout.bits - 1) : 0u);
      packed[i / per_byte] |= static_cast<uint8_t>(code << ((i % per_byte) * layout.bits));
    }
  }
}

inline void qsgd_dequantize(const uint8_t* packed, const float* scales, const QsgdLayout& layout,
                            float* out) {
  const int64_t s = layout.levels();
  const int per_byte = 8 / layout.bits;
  const uint32_t mask = (1u << layout.bits) - 1;
  const uint32_t sign_bit = 1u << (layout.bits - 1);
  for (int64_t i = 0; i < layout.n; ++i) {
    const float scale = scales[i / layout.bucket];
    const uint32_t code = (packed[i / per_byte] >> ((i % per_byte) * layout.bits)) & mask;
    // A NaN scale (non-finite bucket) gives the quiet NaN 0x7fc00000 (sign from
    // the code), spelled out so that every device writes the same bits.
    const float magnitude = std::isnan(scale)
                                ? std::numeric_limits<float>::quiet_NaN()
                                : static_cast<float>(code & ~sign_bit) * (scale / static_cast<float>(s));
    out[i] = (code & sign_bit) ? -magnitude : magnitude;
  }
}

}  // namespace jss
