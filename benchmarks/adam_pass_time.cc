// The fused Adam pass alone (kernels/adam_accumulate.h, adam_accumulate_topk):
// restart masking, the top-k at 1 % with no hint, at the LM's N on one thread,
// deterministic inputs (a third of the entries held in the residual). AGE_T is
// the age buffer's element type of the kernel it is built against (int16_t now;
// float before the int16 ages), so the same file times an older kernel's headers.
// Built and run by benchmarks/adam_pass_time.py; standalone:
//   g++ -O2 -std=c++17 -ffp-contract=off -DAGE_T=int16_t -I. benchmarks/adam_pass_time.cc
//   ./a.out N CALLS   -> one line: the calls' times in ms
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/adam_accumulate.h"

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 10893568;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 11;
  const int64_t k = n / 100;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> g(n), mu(n), nu(n), residual(n);
  std::vector<AGE_T> age(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = normal(rng);
    mu[i] = 0.1f * normal(rng);
    nu[i] = 0.01f * std::fabs(normal(rng));
    const bool held = i % 3 == 0;
    residual[i] = held ? normal(rng) : 0.0f;
    age[i] = static_cast<AGE_T>(held ? -(1 + i % 200) : 1 + i % 200);
  }
  std::vector<float> table;  // 1 - 0.9**a until it rounds to 1.0f
  for (int a = 1;; ++a) {
    table.push_back(1.0f - std::pow(0.9f, static_cast<float>(a)));
    if (table.back() == 1.0f) break;
  }
  jss::AdamDirectionConfig c{0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, jss::MomentumMasking::kRestart,
                             0.5f, 0.5f, 1.0f, table.data(),
                             static_cast<int64_t>(table.size())};
  jss::AdamAccumulateBuffers b;
  b.leaves = {g.data()};
  b.offsets = {0, n};
  b.mu = mu.data();
  b.nu = nu.data();
  b.age = age.data();
  b.residual = residual.data();
  b.accumulate_from = residual.data();
  b.acc = residual.data();
  std::vector<float> values(k);
  std::vector<int32_t> indices(k);
  for (int r = 0; r < calls; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    jss::adam_accumulate_topk(c, b, false, 1.0f, 0, k, n, values.data(), indices.data());
    const auto t1 = std::chrono::steady_clock::now();
    std::printf("%s%.3f", r ? " " : "", std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::printf("\n");
  return 0;
}
