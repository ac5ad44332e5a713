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

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/float_bits.h"
#include "kernels/parallel.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace jss {

struct QsgdLayout {
  int64_t n;       // entries
  int bits;        // 2, 4 or 8
  int64_t bucket;  // entries per scale

  int64_t num_buckets() const { return (n + bucket - 1) / bucket; }
  int64_t packed_bytes() const { return (n * bits + 7) / 8; }
  int64_t levels() const { return (int64_t{1} << (bits - 1)) - 1; }
};

// QSGD computes with IEEE subnormals on every device. XLA's CPU threads run
// with denormals-are-zero and flush-to-zero set (MXCSR), under which a bucket
// of subnormals got scale 0 here but its true scale on a GPU, and s / scale
// and |v| / scale could read a subnormal as 0 (0 / 0). This scope clears both
// bits on the calling thread (threads it starts inherit its floating-point
// environment) and restores them on exit.
class IeeeSubnormalsScope {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  IeeeSubnormalsScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~kFlushBits); }
  ~IeeeSubnormalsScope() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushBits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned saved_;
#elif defined(__aarch64__)
  IeeeSubnormalsScope() {
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t ieee = saved_ & ~kFlushToZero;
    __asm__ volatile("msr fpcr, %0" : : "r"(ieee));
  }
  ~IeeeSubnormalsScope() { __asm__ volatile("msr fpcr, %0" : : "r"(saved_)); }

 private:
  static constexpr uint64_t kFlushToZero = uint64_t{1} << 24;  // FPCR.FZ
  uint64_t saved_;
#else
  IeeeSubnormalsScope() = default;
#endif
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

// u[j] = uniform01(seed, base + j) for j < m. Integer hashing only, so the
// vectorized clones (64-bit multiplies need AVX-512DQ) give the same numbers.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && \
    !defined(__CUDACC__)  // "arch=x86-64-v4" needs GCC 11
__attribute__((target_clones("default", "arch=x86-64-v4")))
#endif
inline void fill_uniform01(uint64_t seed, uint64_t base, int64_t m, float* u) {
  for (int64_t j = 0; j < m; ++j) u[j] = uniform01(seed, base + static_cast<uint64_t>(j));
}

// Where the code of entry i goes when codes are kBits wide: byte i >> kLog2,
// shift (i & kMask) * kBits (8 / kBits codes per byte).
template <int kBits>
struct CodeBytes {
  static constexpr int kLog2 = kBits == 8 ? 0 : (kBits == 4 ? 1 : 2);
  static constexpr int64_t kPerByte = int64_t{1} << kLog2;
  static constexpr int64_t kMask = kPerByte - 1;
};

// fn(std::integral_constant<int, bits>{}) for bits = 2, 4 or 8 (checked by the caller).
template <typename Fn>
void with_code_bits(int bits, Fn&& fn) {
  switch (bits) {
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    default: fn(std::integral_constant<int, 8>{}); break;
  }
}

// Buckets [b_lo, b_hi) of qsgd_quantize, with kBits a compile-time constant
// so that the code's byte and shift are shifts and masks, not divisions.
// The caller zeroes the bytes these buckets' codes go to.
template <int kBits, typename T>
void qsgd_quantize_buckets(const T* x, const QsgdLayout& layout, uint64_t seed, uint8_t* packed,
                           float* scales, int64_t b_lo, int64_t b_hi) {
  using Tr = FloatTraits<T>;
  constexpr int kPerByteLog2 = CodeBytes<kBits>::kLog2;
  constexpr int64_t kPerByteMask = CodeBytes<kBits>::kMask;
  const int64_t s = layout.levels();
  for (int64_t b = b_lo; b < b_hi; ++b) {
    const int64_t lo = b * layout.bucket;
    const int64_t hi = lo + layout.bucket < layout.n ? lo + layout.bucket : layout.n;
    // The largest magnitude as the largest key (|v|'s bits: keys order like
    // magnitudes); a key above +inf's is a NaN. An integer max vectorizes.
    uint32_t max_key = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t key = Tr::key(x[i]);
      max_key = key > max_key ? key : max_key;
    }
    const float max_abs = std::fabs(Tr::from_key(max_key));
    const bool finite = std::isfinite(max_abs);
    const float scale = finite ? max_abs : NAN;
    scales[b] = scale;
    if (!(scale > 0.0f)) continue;  // all zero (codes stay 0) or non-finite (NaN scale)
    // s / scale overflows to inf for a tiny (subnormal) scale: then each entry
    // is divided by the scale first (|v| / scale <= 1), never inf * 0 or an
    // out-of-range float-to-int conversion. The CUDA kernel does the same.
    const float to_level = static_cast<float>(s) / scale;
    const bool tiny_scale = std::isinf(to_level);
    // In slices of kSlice entries: the random numbers (a loop of integer
    // hashes the compiler can vectorize), the codes (branch-free: rounding and
    // sign are coin flips a branch predictor gets wrong half the time), then
    // the packing, a whole byte at a time (an |= per entry would chain every
    // entry on the store of the one before).
    constexpr int64_t kSlice = 256;
    constexpr int64_t kPerByte = CodeBytes<kBits>::kPerByte;
    const int32_t s32 = static_cast<int32_t>(s);
    float u[kSlice];
    uint8_t codes[kSlice];
    for (int64_t base = lo; base < hi; base += kSlice) {
      const int64_t m = hi - base < kSlice ? hi - base : kSlice;
      fill_uniform01(seed, static_cast<uint64_t>(base), m, u);
      for (int64_t j = 0; j < m; ++j) {
        const float v = Tr::to_float(x[base + j]);
        const float r = tiny_scale ? (std::fabs(v) / scale) * static_cast<float>(s)
                                   : std::fabs(v) * to_level;  // in [0, s]
        int32_t level = static_cast<int32_t>(r);
        level += static_cast<int32_t>((level < s32) & (u[j] < r - static_cast<float>(level)));
        const uint32_t negative = static_cast<uint32_t>(std::signbit(v)) & (level > 0);
        codes[j] = static_cast<uint8_t>(static_cast<uint32_t>(level) | (negative << (kBits - 1)));
      }
      const auto put = [&](int64_t j) {  // one entry into its byte
        const int64_t i = base + j;
        packed[i >> kPerByteLog2] |= static_cast<uint8_t>(codes[j] << ((i & kPerByteMask) * kBits));
      };
      int64_t j = 0;
      for (; j < m && ((base + j) & kPerByteMask) != 0; ++j) put(j);
      for (; j + kPerByte <= m; j += kPerByte) {
        uint32_t byte = 0;
        for (int t = 0; t < kPerByte; ++t) {
          byte |= static_cast<uint32_t>(codes[j + t]) << (t * kBits);
        }
        packed[(base + j) >> kPerByteLog2] |= static_cast<uint8_t>(byte);
      }
      for (; j < m; ++j) put(j);
    }
  }
}

// Buckets [b_lo, b_hi) of qsgd_dequantize (see qsgd_quantize_buckets). A
// bucket's 2^kBits possible outputs are tabulated once (the same expression
// per code as entry by entry), then every entry is one table lookup.
template <int kBits>
void qsgd_dequantize_buckets(const uint8_t* __restrict packed, const float* scales,
                             const QsgdLayout& layout, float* __restrict out, int64_t b_lo,
                             int64_t b_hi) {
  constexpr int kPerByteLog2 = CodeBytes<kBits>::kLog2;
  constexpr int64_t kPerByteMask = CodeBytes<kBits>::kMask;
  constexpr uint32_t kCodes = 1u << kBits;
  constexpr uint32_t kSignBit = 1u << (kBits - 1);
  const float s = static_cast<float>(layout.levels());
  float table[kCodes];
  for (int64_t b = b_lo; b < b_hi; ++b) {
    const int64_t lo = b * layout.bucket;
    const int64_t hi = lo + layout.bucket < layout.n ? lo + layout.bucket : layout.n;
    const float scale = scales[b];
    // A NaN scale (non-finite bucket) gives the quiet NaN 0x7fc00000 (sign from
    // the code), spelled out so that every device writes the same bits.
    const bool nan_scale = std::isnan(scale);
    const float step = scale / s;
    for (uint32_t code = 0; code < kCodes; ++code) {
      const float magnitude = nan_scale ? std::numeric_limits<float>::quiet_NaN()
                                        : static_cast<float>(code & ~kSignBit) * step;
      table[code] = (code & kSignBit) ? -magnitude : magnitude;
    }
    for (int64_t i = lo; i < hi; ++i) {
      out[i] = table[(packed[i >> kPerByteLog2] >> ((i & kPerByteMask) * kBits)) & (kCodes - 1)];
    }
  }
}

// Splits the buckets over `threads` chunks whose first bucket index is a
// multiple of 4: b * bucket is then a multiple of the codes per byte (1, 2 or
// 4), so no two chunks write to the same byte. Codes do not depend on the
// chunking (the random number is a hash of the position).
template <typename Fn>
void qsgd_parallel_buckets(const QsgdLayout& layout, int threads, Fn&& fn) {
  const int64_t nb = layout.num_buckets();
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, nb / 4)));
  parallel_chunks(nb, parts, [&](int t, int64_t, int64_t) {
    const auto aligned = [&](int c) {
      return c >= parts ? nb : (chunk_begin(nb, parts, c) & ~int64_t{3});
    };
    fn(aligned(t), aligned(t + 1));
  });
}

// packed: layout.packed_bytes() bytes; scales: layout.num_buckets() floats.
// A bucket holding a NaN or Inf gets a NaN scale (dequantizes to NaN), so
// non-finite values are never silently turned into finite ones. T is float,
// bfloat16_t or float16_t; 16-bit inputs are widened exactly to float32 one
// element at a time, so they quantize to the same codes as their float32 cast.
// The same codes for any `threads`.
template <typename T>
void qsgd_quantize(const T* x, const QsgdLayout& layout, uint64_t seed, uint8_t* packed,
                   float* scales, int threads = 1) {
  const IeeeSubnormalsScope ieee;
  const int per_byte = 8 / layout.bits;
  qsgd_parallel_buckets(layout, threads, [&](int64_t b_lo, int64_t b_hi) {
    if (b_lo >= b_hi) return;
    const int64_t first = b_lo * layout.bucket / per_byte;  // exact: see qsgd_parallel_buckets
    const int64_t end = (std::min(b_hi * layout.bucket, layout.n) * layout.bits + 7) / 8;
    std::memset(packed + first, 0, static_cast<size_t>(end - first));
    with_code_bits(layout.bits, [&](auto bits) {
      qsgd_quantize_buckets<bits()>(x, layout, seed, packed, scales, b_lo, b_hi);
    });
  });
}

inline void qsgd_dequantize(const uint8_t* packed, const float* scales, const QsgdLayout& layout,
                            float* out, int threads = 1) {
  const IeeeSubnormalsScope ieee;
  qsgd_parallel_buckets(layout, threads, [&](int64_t b_lo, int64_t b_hi) {
    with_code_bits(layout.bits, [&](auto bits) {
      qsgd_dequantize_buckets<bits()>(packed, scales, layout, out, b_lo, b_hi);
    });
  });
}

}  // namespace jss
