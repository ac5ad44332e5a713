// The SIMD hit masks of kernels/topk_select.h (block_hits_at_least,
// block_hits_in) against their definition, entry by entry, on random blocks of
// every key width: raw bit patterns (NaN, inf, subnormals, both zeros) and
// thresholds / prefixes taken from the block itself, so ties at the bound are
// common. Built twice by tests/cpp/test_block_hit_masks.py: with the SSE2 path
// and with -DJSS_NO_SIMD (the plain loops other CPUs compile). Prints the
// number of mismatches per type and exits non-zero on any.
#include <cstdint>
#include <cstdio>
#include <random>

#include "kernels/topk_select.h"

template <typename T, typename Bits>
int mismatches(std::mt19937& rng) {
  constexpr uint32_t kKeyBits = jss::FloatTraits<T>::kKeyBits;
  int bad = 0;
  for (int it = 0; it < 200000; ++it) {
    Bits bits[16];
    // a third of the blocks: full-range patterns; the rest: small keys (many ties)
    const int drop = it % 3 == 0 ? 0 : (sizeof(Bits) == 4 ? 4 : 20);
    for (auto& b : bits) b = static_cast<Bits>(rng() >> drop);
    const T* block = reinterpret_cast<const T*>(bits);
    // the documented domain: 0 <= t <= 2^kKeyBits
    uint32_t t = rng() % ((1u << kKeyBits) + 1);
    if (it % 5 == 0) {
      t = jss::raw_key(block, rng() % 16) + rng() % 3;
      if (t > 0) t -= 1;
    }
    uint32_t expect = 0;
    for (int j = 0; j < 16; ++j) expect |= (jss::raw_key(block, j) >= t ? 1u : 0u) << j;
    bad += expect != jss::block_hits_at_least(block, t);

    const int hi_shift = 1 + static_cast<int>(rng() % (kKeyBits - 1));
    uint32_t prefix = jss::raw_key(block, rng() % 16) >> hi_shift;
    if (it % 7 == 0) prefix = rng() % (1u << (kKeyBits - hi_shift));
    uint32_t expect_in = 0;
    for (int j = 0; j < 16; ++j) {
      expect_in |= ((jss::raw_key(block, j) >> hi_shift) == prefix ? 1u : 0u) << j;
    }
    bad += expect_in != jss::block_hits_in(block, prefix << hi_shift, (1u << hi_shift) - 1);
  }
  return bad;
}

int main() {
  std::mt19937 rng(3);
  const int f32 = mismatches<float, uint32_t>(rng);
  const int bf16 = mismatches<jss::bfloat16_t, uint16_t>(rng);
  const int f16 = mismatches<jss::float16_t, uint16_t>(rng);
  std::printf("mismatches: float32 %d bfloat16 %d float16 %d\n", f32, bf16, f16);
  return f32 + bf16 + f16 == 0 ? 0 : 1;
}
