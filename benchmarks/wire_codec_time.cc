// The wire codec's cost per message (ffi/collectives/wire_codec.h): pack_entries and
// unpack_entries of one rank's sorted support, index_encoding "auto", float32
// values, one thread. Built and run by benchmarks/wire_codec_time.py, which
// writes the JSON and the plot; standalone:
//   g++ -O2 -std=c++17 -I. -I<the venv's jaxlib include> benchmarks/wire_codec_time.cc
//   ./a.out N DENSITY REPEATS   -> one JSON object per line
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ffi/collectives/wire_codec.h"

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 10893568;
  const double density = argc > 2 ? std::atof(argv[2]) : 0.25;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 7;
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(density * static_cast<double>(n)));
  // a uniform support of k of n indices (a selection sampling pass: sorted, distinct)
  std::mt19937_64 rng(0);
  std::vector<jss::SparseEntry> e;
  e.reserve(static_cast<size_t>(k));
  int64_t need = k;
  for (int64_t i = 0; i < n && need > 0; ++i) {
    if (static_cast<double>(rng() >> 11) * 0x1.0p-53 * static_cast<double>(n - i) <
        static_cast<double>(need)) {
      e.push_back(jss::SparseEntry{static_cast<int32_t>(i), 1.0f + static_cast<float>(need)});
      --need;
    }
  }
  const jss::WireFormat f{0, 1};
  std::vector<char> message;
  std::vector<jss::SparseEntry> back;
  std::string error;
  std::vector<double> pack_ms, unpack_ms;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    jss::pack_entries(e.data(), static_cast<int64_t>(e.size()), f, &message);
    const auto t1 = std::chrono::steady_clock::now();
    const bool ok = jss::unpack_entries(message.data(), static_cast<int64_t>(message.size()), n, f,
                                        &back, &error);
    const auto t2 = std::chrono::steady_clock::now();
    if (!ok || back.size() != e.size() || back.back().index != e.back().index) {
      std::fprintf(stderr, "round trip failed: %s\n", error.c_str());
      return 1;
    }
    pack_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    unpack_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  std::sort(pack_ms.begin(), pack_ms.end());
  std::sort(unpack_ms.begin(), unpack_ms.end());
  std::printf("{\"n\": %lld, \"density\": %g, \"m\": %zu, \"kind\": %d, \"bytes\": %zu, "
              "\"pack_ms\": %.3f, \"unpack_ms\": %.3f, \"repeats\": %d}\n",
              static_cast<long long>(n), density, e.size(), static_cast<int>(message[0]),
              message.size(), pack_ms[pack_ms.size() / 2], unpack_ms[unpack_ms.size() / 2],
              repeats);
  return 0;
}
