// Magnitude keys and bit-level float conversions for the CUDA kernels.
//
// The same policy as kernels/float_bits.h (the CPU kernels): clearing the sign
// bit of an IEEE float gives an unsigned integer ordered like |x|, and NaN
// patterns sit above +inf, so NaN ranks as the largest magnitude. 16-bit floats
// (bfloat16, float16) are handled as raw uint16 bits and widened to float32 by
// bit manipulation, so host and device give identical results.
//
// Everything here is __host__ __device__ so tests/cuda_host/ can check it on a
// machine without a GPU.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define JSS_HD __host__ __device__ __forceinline__
#else
#define JSS_HD inline
#endif

// Full unrolling keeps per-thread item arrays in registers on the device.
#ifdef __CUDA_ARCH__
#define JSS_UNROLL _Pragma("unroll")
#else
#define JSS_UNROLL
#endif

namespace jss {
namespace cuda {

// float32 bits -> float and back without type punning through unions: the
// device's reinterpreting intrinsics, a 4-byte copy on the host.
#ifdef __CUDA_ARCH__
JSS_HD float float_from_bits(uint32_t bits) { return __uint_as_float(bits); }
JSS_HD uint32_t bits_from_float(float f) { return __float_as_uint(f); }
#else
template <typename To, typename From>
JSS_HD To copy_bits(From from) {
  static_assert(sizeof(To) == sizeof(From), "copy_bits: sizes differ");
  To to;
  __builtin_memcpy(&to, &from, sizeof(To));
  return to;
}
JSS_HD float float_from_bits(uint32_t bits) { return copy_bits<float>(bits); }
JSS_HD uint32_t bits_from_float(float f) { return copy_bits<uint32_t>(f); }
#endif

// Explicitly rounded float operations: nvcc never contracts them into an FMA
// (which would round differently from the CPU kernels, built with
// -ffp-contract=off or for a baseline without FMA), and the device's division
// and square root are the correctly rounded ones whatever the flags.
JSS_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
JSS_HD float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// Division as XLA's GPU backend compiles `a / b` in float32: div.full.f32 (XLA
// sets -nvptx-prec-divf32=1), within 2 ulp rather than correctly rounded. Only
// for what must equal a jax.numpy expression on the same GPU bit for bit
// (optax.clip_by_global_norm's `g / norm` in the Adam pass's clip): with div_rn
// the clip differed from optax's in the last bit of ~1 % of entries on the H200.
// The host build divides exactly, as XLA's CPU backend does.
JSS_HD float div_as_xla(float a, float b) {
#ifdef __CUDA_ARCH__
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
#else
  return a / b;
#endif
}
JSS_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
JSS_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
JSS_HD float sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);  // sqrtss: correctly rounded, as std::sqrt(float)
#endif
}

// IEEE binary16 bits -> binary32 bits (exact: every half is a float).
JSS_HD uint32_t half_bits_to_float_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return sign;  // +-0
    // Subnormal m * 2^-24: shift the leading one up to bit 10 to normalize.
    int e = 0;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      ++e;
    }
    return sign | (static_cast<uint32_t>(127 - 14 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  if (exp == 0x1f) return sign | 0x7f800000u | (man << 13);  // inf / NaN (payload kept)
  return sign | ((exp + 127 - 15) << 23) | (man << 13);
}

// float32 bits -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN.
JSS_HD uint16_t float_bits_to_bf16_bits(uint32_t f) {
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
  return static_cast<uint16_t>((f + rounding) >> 16);  // a carry into the exponent is correct
}

// float32 bits -> IEEE binary16 bits, round to nearest even, overflow to inf,
// gradual underflow to subnormals; NaN stays a quiet NaN with the top payload
// bits kept (as kernels/float_bits.h does on the CPU).
JSS_HD uint16_t float_bits_to_half_bits(uint32_t f) {
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t a = f & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  const int32_t exp = static_cast<int32_t>(a >> 23) - 127;              // unbiased
  if (exp >= -14) {
    // Normal half: keep 10 mantissa bits of 23, round the 13 dropped bits.
    const uint32_t man = a & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (man >> 13);
    const uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal (2^-25): rounds to 0
  // Subnormal half: value = m * 2^-24 with m = (1.man) * 2^(exp + 24).
  const uint32_t man = (a & 0x7fffffu) | 0x800000u;  // 24 significant bits, value man * 2^(exp-23)
  const int shift = -exp - 1;                          // man >> shift == m (14 <= shift <= 24)
  uint32_t m = man >> shift;
  const uint32_t rest = man & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (m & 1u))) ++m;  // may become the smallest normal: correct
  return static_cast<uint16_t>(sign | m);
}

// Storage traits. Bits is what the kernels load and store; values are copied
// as raw bits, so outputs are bit-identical to inputs.
struct F32 {
  using Bits = uint32_t;
  static constexpr int kKeyBits = 31;
  JSS_HD static uint32_t key(Bits b) { return b & 0x7fffffffu; }
  JSS_HD static uint32_t widen(Bits b) { return b; }  // float32 bits
  JSS_HD static Bits narrow(float f) { return bits_from_float(f); }
  static constexpr Bits kNonzeroMask = 0x7fffffffu;
};

struct BF16 {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 15;
  JSS_HD static uint32_t key(Bits b) { return b & 0x7fffu; }
  JSS_HD static uint32_t widen(Bits b) { return static_cast<uint32_t>(b) << 16; }
  JSS_HD static Bits narrow(float f) { return float_bits_to_bf16_bits(bits_from_float(f)); }
  static constexpr Bits kNonzeroMask = 0x7fffu;
};

struct F16 {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 15;
  JSS_HD static uint32_t key(Bits b) { return b & 0x7fffu; }
  JSS_HD static uint32_t widen(Bits b) { return half_bits_to_float_bits(b); }
  JSS_HD static Bits narrow(float f) { return float_bits_to_half_bits(bits_from_float(f)); }
  static constexpr Bits kNonzeroMask = 0x7fffu;
};

// A magnitude key of type F widened to float32 (the k-th magnitude output).
template <typename F>
JSS_HD float key_to_float(uint32_t key) {
  return float_from_bits(F::widen(static_cast<typename F::Bits>(key)));
}

// Threshold selection compares float32 keys of the widened values (like the
// CPU kernel); a negative threshold selects every nonzero entry.
JSS_HD uint32_t threshold_key(float threshold) {
  return bits_from_float(threshold < 0.0f ? 0.0f : threshold) & 0x7fffffffu;
}

}  // namespace cuda
}  // namespace jss
