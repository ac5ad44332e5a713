// kernels/dense_fill.h's zero_fill against its definition: every float of
// [out, out + n) is +0.0 afterwards and nothing outside it is written, for
// sizes on both sides of the streaming threshold and starts at every 4-byte
// offset of a 16-byte line (the streaming stores' alignment), over a buffer
// filled with NaN bits first. Built twice by tests/cpp/test_dense_fill.py: with
// the streaming path and with -DJSS_NO_SIMD. Prints the number of bad cases and
// exits non-zero on any.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/dense_fill.h"

int main() {
  const int64_t t = jss::kStreamingFillMin;
  const int64_t sizes[] = {0, 1, 3, 4, 5, 17, t - 1, t, t + 1, t + 2, t + 3, t + 7, 3 * t + 5};
  const uint32_t garbage = 0x7fc00001u;  // a NaN: any float left unwritten shows
  int bad = 0, cases = 0;
  for (int64_t n : sizes) {
    for (int64_t offset = 0; offset < 4; ++offset) {
      // 4 guard floats on each side; the vector's data is 16-byte aligned (new)
      std::vector<uint32_t> buf(static_cast<size_t>(n + offset + 8), garbage);
      float* out = reinterpret_cast<float*>(buf.data()) + offset + 4;
      jss::zero_fill(out, n);
      for (int64_t i = 0; i < static_cast<int64_t>(buf.size()); ++i) {
        const bool inside = i >= offset + 4 && i < offset + 4 + n;
        if (buf[static_cast<size_t>(i)] != (inside ? 0u : garbage)) {
          std::printf("n=%lld offset=%lld: word %lld is %08x\n", static_cast<long long>(n),
                      static_cast<long long>(offset), static_cast<long long>(i),
                      buf[static_cast<size_t>(i)]);
          ++bad;
          break;
        }
      }
      ++cases;
    }
  }
  std::printf("cases %d bad %d\n", cases, bad);
  return bad == 0 ? 0 : 1;
}
