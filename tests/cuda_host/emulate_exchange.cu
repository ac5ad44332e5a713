// Host emulation of the device-resident exchange's kernels (ffi/cuda/device_exchange_cuda.cu),
// checked bit for bit against the CPU path's code, compiled by nvcc, no GPU needed.
//
// The kernels' per-slot and per-entry functions (ffi/collectives/exchange_steps.h) run
// here in the kernels' grid-stride arrangement, with the threads taken in shuffled
// orders and the atomics (the first bad slot's key, the flags, the nonzero count's
// block sums) emulated, so the reports and the sums must not depend on thread order:
//   - the slot check against prepare_call's sequential scan (first bad position and
//     index, non-finite flag), the compaction + order check + wire rounding against
//     stream_from_coo + round_entries (kernels/sparse_stream.h, ffi/collectives/wire_codec.h);
//   - the run sums (zero, then each rank's run scatter-added, runs in rank order)
//     against the CPU allgather's loop, out and nonzero count, signed zeros included;
//   - the peer-run check against check_peer_entries (first faulty run and entry);
//   - wire_rounded against round_to_wire over a sweep of float bit patterns.
// What it cannot check: the launches, CUB's DeviceSelect and BlockReduce, the PTX
// add's flush to zero; tests/test_cuda_module.py does on a GPU.
//   nvcc -std=c++17 -O1 -I. -isystem $(python -c "import jax.ffi; print(jax.ffi.include_dir())")
//     tests/cuda_host/emulate_exchange.cu -o /tmp/emx && /tmp/emx
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ffi/collectives/exchange_steps.h"
#include "ffi/collectives/peer_checks.h"
#include "ffi/collectives/wire_codec.h"
#include "kernels/float_bits.h"
#include "kernels/sparse_stream.h"

namespace x = jss::exchange;
using jss::SparseEntry;

static int g_failures = 0;
static int g_checks = 0;
#define CHECK(cond, ...)                  \
  do {                                    \
    ++g_checks;                           \
    if (!(cond)) {                        \
      if (++g_failures <= 30) {           \
        std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
        std::printf(__VA_ARGS__);         \
        std::printf("\n");                \
      }                                   \
    }                                     \
  } while (0)

static uint32_t bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }
static float from_bits(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }

// The (block, thread) pairs of a launch in a shuffled order: each visits the items
// i = (block * threads + thread) + k * blocks * threads, as the kernels' loops do.
template <typename Visit>
void grid_stride(int64_t items, int blocks, int threads, std::mt19937& rng, Visit&& visit) {
  std::vector<int64_t> order(static_cast<size_t>(blocks) * threads);
  for (size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int64_t>(t);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t stride = static_cast<int64_t>(blocks) * threads;
  for (int64_t t : order) {
    for (int64_t i = t; i < items; i += stride) visit(t / threads, i);
  }
}

struct Input {
  std::vector<float> values;
  std::vector<int32_t> indices;
};

Input make_input(std::mt19937& rng, int64_t cap, int64_t n, int pattern) {
  Input in{std::vector<float>(cap), std::vector<int32_t>(cap)};
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(n - 1));
  std::normal_distribution<float> normal;
  int32_t next = 0;
  for (int64_t i = 0; i < cap; ++i) {
    in.values[i] = i % 7 == 3 ? -0.0f : normal(rng);
    if (pattern == 0) {  // the selection's layout: increasing, padding at the end
      next += 1 + static_cast<int32_t>(rng() % 3);
      in.indices[i] = i < cap * 3 / 4 && next < n ? next : -1;
    } else if (pattern == 1) {  // bucket_topk's: padding between increasing entries
      next += 1 + static_cast<int32_t>(rng() % 3);
      in.indices[i] = i % 4 == 2 || next >= n ? -1 : next;
    } else {  // hand-built: duplicates, any order, padding, a bad index or a NaN
      in.indices[i] = rng() % 5 == 0 ? -1 : any(rng) % 40;
    }
  }
  if (pattern == 2 && cap > 10) {
    in.indices[cap / 2] = static_cast<int32_t>(n + 5);
    in.indices[cap / 3] = -7;
    in.values[cap / 4] = from_bits(0x7fc00123u);
  }
  return in;
}

// The slot check, compaction, order check and rounding of prepare_local, in the
// kernels' arrangement, against prepare_call's scan and stream_from_coo.
void check_prepare(std::mt19937& rng, int64_t cap, int64_t n, int pattern, int64_t dtype) {
  const Input in = make_input(rng, cap, n, pattern);
  x::SlotReport report;
  std::vector<SparseEntry> slots(cap), kept;
  grid_stride(cap, 3, 32, rng, [&](int64_t, int64_t i) {
    slots[i] = x::slot_entry(in.values[i], in.indices[i]);
    if (x::slot_index_bad(in.indices[i], n)) {
      report.bad_position_key = std::max(report.bad_position_key, x::bad_position_key(i));
    } else if (x::slot_nonfinite(in.values[i], in.indices[i], n)) {
      report.nonfinite = 1;
    }
  });
  for (const SparseEntry& e : slots) {  // DeviceSelect::If is stable: slot order
    if (x::KeepSlot()(e)) kept.push_back(e);
  }
  grid_stride(static_cast<int64_t>(kept.size()), 2, 32, rng, [&](int64_t, int64_t j) {
    if (j >= 1 && x::out_of_order(kept.data(), j)) report.unsorted = 1;
  });
  // prepare_call's sequential scan (ffi/collectives/sparse_allreduce_ffi.cc)
  int64_t bad_position = -1;
  bool nonfinite = false;
  for (int64_t i = 0; i < cap; ++i) {
    if (in.indices[i] < -1 || in.indices[i] >= n) {
      if (bad_position < 0) bad_position = i;
    } else if (in.indices[i] >= 0 && !jss::is_finite_f32(in.values[i])) {
      nonfinite = true;
    }
  }
  CHECK((report.bad_position_key != 0) == (bad_position >= 0), "bad slot found: pattern %d", pattern);
  if (bad_position >= 0) {
    CHECK(x::bad_position_of(report.bad_position_key) == bad_position, "first bad slot %lld",
          static_cast<long long>(x::bad_position_of(report.bad_position_key)));
    return;  // no stream is built (prepare_call's rule)
  }
  CHECK(static_cast<bool>(report.nonfinite) == nonfinite, "non-finite flag, pattern %d", pattern);
  jss::SparseStream want;
  jss::stream_from_coo(in.values.data(), in.indices.data(), cap, &want);
  jss::round_entries(&want.entries, dtype);
  if (report.unsorted) {  // the host's fallback is stream_from_coo itself
    CHECK(pattern == 2, "pattern %d reported out of order", pattern);
    return;
  }
  grid_stride(static_cast<int64_t>(kept.size()), 2, 32, rng, [&](int64_t, int64_t j) {
    kept[j].value = x::wire_rounded(kept[j].value, dtype);
  });
  CHECK(kept.size() == want.entries.size(), "kept %zu, stream %zu", kept.size(), want.entries.size());
  for (size_t j = 0; j < std::min(kept.size(), want.entries.size()); ++j) {
    CHECK(kept[j].index == want.entries[j].index && bits(kept[j].value) == bits(want.entries[j].value),
          "entry %zu differs (dtype %lld)", j, static_cast<long long>(dtype));
  }
}

// The runs of P ranks summed as the kernels do (zero, then one launch per run in
// rank order, block sums of the nonzero count's change) against the CPU path.
void check_sums(std::mt19937& rng, int nranks, int64_t n) {
  std::vector<std::vector<SparseEntry>> runs(nranks);
  for (int r = 0; r < nranks; ++r) {
    for (int32_t i = 0; i < n; ++i) {
      if (rng() % 3 != 0) continue;
      const uint32_t pick = rng() % 6;
      const float v = pick == 0 ? 0.0f : pick == 1 ? -0.0f : pick == 2 ? (r % 2 ? -1.5f : 1.5f)
                                                                       : std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      runs[r].push_back(SparseEntry{i, v});
    }
  }
  std::vector<float> want(n, 0.0f), out(n, 0.0f);
  int64_t want_nnz = 0, nnz = 0;
  for (int r = 0; r < nranks; ++r) {
    for (const SparseEntry& e : runs[r]) {  // dense_and_allgather.cc's loop
      const float before = want[e.index], after = before + e.value;
      want[e.index] = after;
      want_nnz += static_cast<int64_t>(after != 0.0f) - static_cast<int64_t>(before != 0.0f);
    }
  }
  for (int r = 0; r < nranks; ++r) {
    std::vector<long long> block_sums(4, 0);
    grid_stride(static_cast<int64_t>(runs[r].size()), 4, 16, rng, [&](int64_t block, int64_t i) {
      CHECK(!x::entry_faulty(runs[r].data(), i, n), "a sorted run flagged at %lld", static_cast<long long>(i));
      block_sums[block] += x::add_entry(out.data(), runs[r][i]);
    });
    for (long long s : block_sums) nnz += s;
  }
  CHECK(nnz == want_nnz, "nonzeros %lld, CPU path %lld", static_cast<long long>(nnz),
        static_cast<long long>(want_nnz));
  for (int64_t i = 0; i < n; ++i) {
    CHECK(bits(out[i]) == bits(want[i]), "out[%lld] %08x, CPU path %08x", static_cast<long long>(i),
          bits(out[i]), bits(want[i]));
  }
}

// A peer's run with one planted fault: the first faulty (run, entry) by the atomic
// maximum of fault keys, whatever the thread order, is check_peer_entries's.
void check_faults(std::mt19937& rng, int64_t n) {
  std::vector<std::vector<SparseEntry>> runs(3);
  for (auto& run : runs) {
    for (int32_t i = 0; i < n; i += 1 + static_cast<int32_t>(rng() % 4)) run.push_back({i, 1.0f});
  }
  const int bad_run = 1 + static_cast<int>(rng() % 2);
  const size_t at = rng() % runs[bad_run].size();
  const int kind = static_cast<int>(rng() % 3);
  runs[bad_run][at].index = kind == 0 ? static_cast<int32_t>(n) : kind == 1 ? -3
                          : (at > 0 ? runs[bad_run][at - 1].index : -1);
  if (runs[2].size() > 5 && bad_run == 1) runs[2][5].index = static_cast<int32_t>(n + 1);  // a later fault
  uint64_t key = 0;
  for (int r = 0; r < 3; ++r) {
    grid_stride(static_cast<int64_t>(runs[r].size()), 2, 8, rng, [&](int64_t, int64_t i) {
      if (x::entry_faulty(runs[r].data(), i, n)) key = std::max(key, x::fault_key(r, i));
    });
  }
  int want_run = -1;
  int64_t want_entry = -1;
  for (int r = 0; r < 3 && want_run < 0; ++r) {
    auto e = jss::check_peer_entries(runs[r].data(), static_cast<int64_t>(runs[r].size()), 0, n, 0, r,
                                     "entries (allgather)");
    if (e.failure()) {
      want_run = r;
      const std::string m = e.message();
      want_entry = std::atoll(m.c_str() + m.find("entry ") + 6);
    }
  }
  CHECK(key != 0 && x::fault_run(key) == want_run && x::fault_entry(key) == want_entry,
        "fault at run %lld entry %lld, check_peer_entries: run %d entry %lld",
        static_cast<long long>(x::fault_run(key)), static_cast<long long>(x::fault_entry(key)),
        want_run, static_cast<long long>(want_entry));
}

void check_rounding() {
  auto one = [](uint32_t b) {
    for (int64_t dtype = 1; dtype <= 2; ++dtype) {
      const float v = from_bits(b);
      CHECK(bits(x::wire_rounded(v, dtype)) == bits(jss::round_to_wire(v, dtype)),
            "wire_rounded(%08x, %lld)", b, static_cast<long long>(dtype));
    }
  };
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4099) one(static_cast<uint32_t>(b));
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {  // bfloat16's ties and their neighbours
    for (uint32_t lo : {0x7fffu, 0x8000u, 0x8001u}) one((hi << 16) | lo);
  }
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                     0xffc12345u, 0x00000001u, 0x80000001u, 0x477ff000u, 0x477fefffu, 0x33000000u,
                     0x33000001u, 0x387fc000u, 0x38800000u}) {
    one(b);
  }
}

int main() {
  std::mt19937 rng(12345);
  for (int round = 0; round < 40; ++round) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      for (int64_t dtype = 0; dtype <= 2; ++dtype) {
        check_prepare(rng, 1 + static_cast<int64_t>(rng() % 300), 2000, pattern, dtype);
      }
    }
    check_sums(rng, 1 + static_cast<int>(rng() % 5), 500);
    check_faults(rng, 300);
  }
  check_prepare(rng, 0, 10, 0, 0);  // an empty capacity
  check_rounding();
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
