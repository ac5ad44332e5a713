// Checks of kernels/fused_accumulate.cuh (the CUDA twins of jss_accumulate_topk and
// jss_adam_accumulate) against the CPU kernels (kernels/accumulate.h,
// kernels/adam_accumulate.h), bit for bit: the accumulator, the Adam state, the
// top-k's values and indices and hint_used. Included by emulate_kernels.cu (its
// CHECK, emulate_* helpers and, with -DJSS_DEVICE_RUN, DeviceBuffer / DeviceRun).
//
// The emulation runs the fused pass in the kernel's arrangement (chunks of
// kChunkLeaves leaves, tiles, threads, items; leaf_of and the walk to the next
// leaf), the per-entry arithmetic (decayed_entry, adam_accumulate_entry), the
// list of entries above the hint (in a shuffled order: on the device its order
// depends on the atomics), the device's decision (hint_list_holds) and either
// path: the radix select on the list and its marks, or jss.topk's on the whole.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

// one build of the CPU Adam pass (its multi-versioned clones are the same bits)
#ifndef JSS_NO_MULTIVERSION
#define JSS_NO_MULTIVERSION
#endif
#include "kernels/accumulate.h"
#include "kernels/adam_accumulate.h"
#include "kernels/fused_accumulate.cuh"

struct FusedResult {
  std::vector<float> values;
  std::vector<int32_t> indices;
  int32_t hint_used = -7;
};

// The fused pass of fused_pass_launch, chunk by chunk and tile by tile: writes
// acc (and gathered) and returns the list (keys, indices; its count is its size)
// or, without a hint, adds the first-digit histogram to hist0.
template <typename Entry>
std::vector<std::pair<uint32_t, int32_t>> emulate_fused_pass(Entry entry,
                                                             const c::FusedLeaves& leaves,
                                                             float* acc, float* gathered,
                                                             uint32_t hint_key, bool histogram,
                                                             std::vector<ull>* hist0) {
  std::vector<std::pair<uint32_t, int32_t>> list;
  const int count = static_cast<int>(leaves.leaves.size());
  const int shift0 = c::radix_shift(31, 0), width0 = c::radix_width(31, 0);
  for (int first = 0; first < count; first += c::kChunkLeaves) {
    const int in_chunk = std::min(count - first, c::kChunkLeaves);
    const long long* offset = leaves.offsets.data() + first;
    const long long lo = offset[0], hi = offset[in_chunk];
    entry.load();  // once per thread on the device: the same scalars
    for (long long tile = 0; tile < c::num_tiles(hi - lo); ++tile) {
      const long long base = lo + tile * c::kTile;
      for (int t = 0; t < c::kTileThreads; ++t) {
        int j = c::leaf_of(offset, in_chunk, std::min(base + t, hi - 1));
        for (int q = 0; q < c::kTileItems; ++q) {
          const long long i = base + static_cast<long long>(q) * c::kTileThreads + t;
          if (i >= hi) continue;
          while (offset[j + 1] <= i) ++j;
          const long long local = i - offset[j];
          const long long place = leaves.places[first + j] + local;
          const float v = entry(leaves.leaves[first + j][local], place);
          acc[place] = v;
          if (gathered != nullptr) gathered[i] = v;
          const uint32_t key = c::bits_from_float(v) & 0x7fffffffu;
          if (histogram) (*hist0)[c::key_digit(key, shift0, width0)]++;
          if (hint_key != 0 && key >= hint_key) list.emplace_back(key, static_cast<int32_t>(i));
        }
      }
    }
  }
  return list;
}

// fused_accumulate_launch: the pass, the decision, and the path it picks.
template <typename Entry>
FusedResult emulate_fused_accumulate(Entry entry, const c::FusedLeaves& leaves, float* acc,
                                     float* gathered, const float* x, float hint, long long k,
                                     long long cap, std::mt19937_64& rng) {
  const long long n = leaves.size();
  FusedResult r;
  const uint32_t hint_key = k >= 1 && cap >= k ? c::hint_key_of(hint) : 0u;
  std::vector<ull> hist0(c::kMaxBins, 0);
  auto list = emulate_fused_pass(entry, leaves, acc, gathered, hint_key,
                                 k >= 1 && k < n && hint_key == 0, &hist0);
  if (k <= 0) {
    r.values = {0.0f};
    r.indices = {-1};
    r.hint_used = 0;
    return r;
  }
  const bool listed = c::hint_list_holds(hint_key, list.size(), k, cap);
  r.hint_used = listed ? 1 : 0;
  r.values.assign(k, -7.0f);
  r.indices.assign(k, -7);
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
  auto* out = reinterpret_cast<uint32_t*>(r.values.data());
  if (k == n) {
    for (long long i = 0; i < n; ++i) {
      out[i] = bits[i];
      r.indices[i] = static_cast<int32_t>(i);
    }
  } else if (listed) {  // the list's path: its order is the atomics', any will do
    std::shuffle(list.begin(), list.end(), rng);
    std::vector<uint32_t> keys;
    for (const auto& e : list) keys.push_back(e.first);
    const c::RadixState st =
        emulate_radix_select<c::F32>(keys.data(), static_cast<long long>(keys.size()), 1, k);
    std::vector<uint32_t> greater(c::num_tiles(n) * c::kTileWords, 0u), equal(greater.size(), 0u);
    for (const auto& e : list) {  // candidate_mark_kernel
      if (e.first > st.prefix) greater[e.second >> 5] |= 1u << (e.second & 31);
      if (e.first == st.prefix) equal[e.second >> 5] |= 1u << (e.second & 31);
    }
    emulate_mask_compact<uint32_t>(bits, n, greater, &equal, st.ties, k, out, r.indices.data());
  } else {
    emulate_topk<c::F32>(bits, n, k, out, r.indices.data());
  }
  return r;
}

// Leaves of the given sizes cut from one flat gradient (separate buffers, as XLA
// gives them), placed one after the other from `start` or at `places`.
struct TestLeaves {
  std::vector<std::vector<float>> data;
  c::FusedLeaves fused;
  jss::GradientLeaves cpu;
};

TestLeaves make_leaves(const std::vector<float>& flat, const std::vector<long long>& sizes,
                       const std::vector<long long>& places) {
  TestLeaves t;
  long long at = 0;
  t.fused.offsets.push_back(0);
  t.cpu.offsets.push_back(0);
  for (size_t j = 0; j < sizes.size(); ++j) {
    t.data.emplace_back(flat.begin() + at, flat.begin() + at + sizes[j]);
    at += sizes[j];
    t.fused.offsets.push_back(at);
    t.cpu.offsets.push_back(at);
  }
  for (size_t j = 0; j < sizes.size(); ++j) {
    t.fused.leaves.push_back(t.data[j].data());
    t.cpu.leaves.push_back(t.data[j].data());
  }
  t.fused.places = places;
  return t;
}

std::vector<float> make_values(long long n, std::mt19937_64& rng, int flavor) {
  const std::vector<uint32_t> bits = make_input<c::F32>(n, rng, flavor);
  std::vector<float> v(n);
  for (long long i = 0; i < n; ++i) v[i] = c::float_from_bits(bits[i]);
  return v;
}

// Equal bit for bit, or NaN on both sides whatever its payload: x86 passes an
// operand's NaN on, a GPU gives its canonical 0x7fffffff (the H200's --device fused
// run differed only there, in the accumulators of flavor 2's NaN entries).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    if (c::bits_from_float(a[i]) != c::bits_from_float(b[i]) && !both_nan) return false;
  }
  return true;
}

// The k-th magnitude of `acc` (its key), for hints that hold or miss by design.
float kth_of(const std::vector<float>& acc, long long k) {
  std::vector<uint32_t> keys;
  for (float v : acc) keys.push_back(c::bits_from_float(v) & 0x7fffffffu);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint32_t>());
  return c::float_from_bits(keys[k - 1]);
}

#ifdef JSS_DEVICE_RUN
FusedResult device_fused_accumulate(const c::AccumulateEntry& host_entry,
                                    const c::FusedLeaves& leaves, float* acc, long long total,
                                    float hint, long long k, long long cap, long long start) {
  // the same call on the device: leaves, residual, decay and hint copied over; acc
  // is the residual's buffer (aliased, as XLA does it)
  std::vector<DeviceBuffer<float>> dleaves;
  dleaves.reserve(leaves.leaves.size());  // built in place: a DeviceBuffer frees on destruction
  c::FusedLeaves dl = leaves;
  for (size_t j = 0; j < leaves.leaves.size(); ++j) {
    dleaves.emplace_back(leaves.leaves[j], leaves.offsets[j + 1] - leaves.offsets[j]);
  }
  for (size_t j = 0; j < leaves.leaves.size(); ++j) dl.leaves[j] = dleaves[j].ptr;
  DeviceBuffer<float> dres(host_entry.residual, total), ddecay(host_entry.decay, 1),
      dhint(&hint, 1), dv(std::max(k, 1LL));
  DeviceBuffer<int32_t> di(std::max(k, 1LL)), dused(1);
  c::AccumulateEntry e{dres.ptr, ddecay.ptr, host_entry.has_decay};
  const long long n = leaves.size();
  DeviceRun run(c::fused_accumulate_scratch_bytes(n, k, cap));
  run.finish(c::fused_accumulate_launch(e, dl, dres.ptr, nullptr, dres.ptr + start, dhint.ptr, k,
                                        cap, dv.ptr, di.ptr, dused.ptr, run.scratch, run.stream));
  FusedResult r;
  r.values.resize(std::max(k, 1LL));
  r.indices.resize(std::max(k, 1LL));
  dv.to_host(r.values.data());
  di.to_host(r.indices.data());
  dused.to_host(&r.hint_used);
  dres.to_host(acc);
  return r;
}
#endif

// jss_accumulate_topk: one range at `start` of a larger buffer, several leaf
// layouts (more than a chunk of leaves, leaves of 1 entry), hints that hold, that
// list too few or too many entries, none; against kernels/accumulate.h.
void check_fused_accumulate_topk(std::mt19937_64& rng) {
  const std::vector<std::vector<long long>> layouts = {
      {1}, {5000}, {1, 4095, 1, 4097, 300}, std::vector<long long>(150, 61)};
  for (const auto& sizes : layouts) {
    long long n = 0;
    for (long long s : sizes) n += s;
    for (int flavor = 0; flavor < 3; ++flavor) {
      const std::vector<float> grad = make_values(n, rng, flavor);
      const long long start = 7, total = n + 20;
      const std::vector<float> residual = make_values(total, rng, flavor == 2 ? 1 : flavor);
      std::vector<long long> places;
      for (size_t j = 0; j < sizes.size(); ++j) {
        places.push_back(start + (j == 0 ? 0 : places.back() - start + sizes[j - 1]));
      }
      TestLeaves leaves = make_leaves(grad, sizes, places);
      for (bool has_decay : {false, true}) {
        const float decay = 0.9f;
        std::vector<float> cpu_acc = residual;
        jss::AccumulateBuffers b;
        static_cast<jss::GradientLeaves&>(b) = leaves.cpu;
        b.residual = residual.data() + start;
        b.acc = cpu_acc.data() + start;
        jss::accumulate(b, has_decay, decay);
        const std::vector<float> part(cpu_acc.begin() + start, cpu_acc.begin() + start + n);
        for (long long k : {1LL, std::max(1LL, n / 100), n / 3 + 1, n}) {
          const float kth = kth_of(part, k);
          for (float hint : {0.0f, kth * 0.95f, kth * 1.5f + 1.0f, 1e-30f}) {
            for (long long cap : {std::min(n, 16 * k), k, std::max(k - 1, 1LL)}) {
              std::vector<float> cv(k), acc2 = residual;
              std::vector<int32_t> ci(k);
              b.acc = acc2.data() + start;
              const bool used = jss::accumulate_topk(
                  b, has_decay, decay, cap >= k ? c::hint_key_of(hint) : 0u, k, cap, cv.data(),
                  ci.data());
              std::vector<float> acc = residual;
              c::AccumulateEntry e{residual.data(), &decay, has_decay};
              FusedResult g;
#ifdef JSS_DEVICE_RUN
              if (g_on_device) {
                g = device_fused_accumulate(e, leaves.fused, acc.data(), total, hint, k, cap,
                                            start);
              } else
#endif
                g = emulate_fused_accumulate(e, leaves.fused, acc.data(), nullptr,
                                             acc.data() + start, hint, k, cap, rng);
              CHECK(same_bits(acc, acc2) && same_bits(g.values, cv) && g.indices == ci &&
                        g.hint_used == (used ? 1 : 0),
                    "accumulate_topk n=%lld leaves=%zu flavor=%d decay=%d k=%lld cap=%lld "
                    "hint=%g: acc %d values %d indices %d hint_used %d vs %d",
                    n, sizes.size(), flavor, has_decay, k, cap, hint, same_bits(acc, acc2),
                    same_bits(g.values, cv), g.indices == ci, g.hint_used, used);
            }
          }
        }
      }
      // leaves in another order than the buffer's (a group that is not one range):
      // the accumulator at each leaf's place and the selection over the gathered copy
      // equal the call on the entries cut out (flat.py's cut_at)
      if (sizes.size() > 1) {
        std::vector<long long> scattered(sizes.size());
        long long at = total;
        for (size_t j = 0; j < sizes.size(); ++j) scattered[j] = (at -= sizes[j]) - 3;
        TestLeaves moved = make_leaves(grad, sizes, scattered);
        std::vector<float> cut(n);
        for (size_t j = 0; j < sizes.size(); ++j) {
          std::copy_n(residual.begin() + scattered[j], sizes[j],
                      cut.begin() + moved.fused.offsets[j]);
        }
        const long long k = std::max(1LL, n / 50);
        std::vector<float> acc = residual, gathered(n), acc_cut = cut;
        c::AccumulateEntry e{residual.data(), nullptr, false};
        const FusedResult g = emulate_fused_accumulate(e, moved.fused, acc.data(),
                                                       gathered.data(), gathered.data(), 0.0f, k,
                                                       16 * k, rng);
        jss::AccumulateBuffers b;
        static_cast<jss::GradientLeaves&>(b) = moved.cpu;
        b.residual = cut.data();
        b.acc = acc_cut.data();
        std::vector<float> cv(k);
        std::vector<int32_t> ci(k);
        jss::accumulate_topk(b, false, 1.0f, 0u, k, 16 * k, cv.data(), ci.data());
        bool placed_right = same_bits(gathered, acc_cut);
        for (size_t j = 0; j < sizes.size(); ++j) {
          placed_right &= std::memcmp(acc.data() + scattered[j],
                                      acc_cut.data() + moved.fused.offsets[j],
                                      sizeof(float) * sizes[j]) == 0;
        }
        CHECK(placed_right && same_bits(g.values, cv) && g.indices == ci,
              "accumulate_topk scattered leaves n=%lld: placed %d values %d indices %d", n,
              placed_right, same_bits(g.values, cv), g.indices == ci);
      }
    }
  }
}

// One Adam state for jss_adam_accumulate's checks: masks pending and not, ages near
// saturation, a 1 - b1**a table ending at 1.0.
struct AdamCase {
  std::vector<float> mu, nu, residual, diff_sq, last, before_last, table, scalars;
  std::vector<int16_t> age;
};

AdamCase make_adam_case(long long n, std::mt19937_64& rng) {
  AdamCase a;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  for (long long i = 0; i < n; ++i) {
    a.mu.push_back(normal(rng) * 0.1f);
    a.nu.push_back(std::fabs(normal(rng)) * 0.01f);
    a.residual.push_back(pick(rng) < 3 ? (pick(rng) < 5 ? 0.0f : -0.0f) : normal(rng));
    const int p = pick(rng);
    a.age.push_back(static_cast<int16_t>(p == 0 ? 32767 : p == 1 ? -32767 : p == 2 ? -3 : p + 1));
    a.diff_sq.push_back(std::fabs(normal(rng)) * 0.1f);
    a.last.push_back(normal(rng));
    a.before_last.push_back(normal(rng));
  }
  for (int t = 1;; ++t) {  // adam_pass.bias1_table(0.9)
    a.table.push_back(1.0f - std::pow(0.9f, static_cast<float>(t)));
    if (a.table.back() == 1.0f) break;
  }
  return a;
}

// jss_adam_accumulate on one range: every masking, with and without the mean
// gradient's second moment, the decay, the clipping (below and above max_norm) and
// the pending masks; k = 0 (the accumulator only) and a top-k with a hint that holds;
// and jss_adam_direction (the direction alone) against kernels/adam_direction.h.
void check_fused_adam_accumulate(std::mt19937_64& rng) {
  const std::vector<long long> sizes = {3, 2000, 1, 4500};
  const long long n = 6504;
  const std::vector<float> grad = make_values(n, rng, 1);
  const AdamCase base = make_adam_case(n, rng);
  const TestLeaves leaves = make_leaves(grad, sizes, {0, 3, 2003, 2004});
  for (int masking : {0, 1, 2}) {
    for (int variant = 0; variant < 16; ++variant) {
      const bool has_noise = variant & 1, has_decay = variant & 2, has_clip = variant & 4,
                 mask = variant & 8;
      const float norm = (variant & 4) && masking == 1 ? 0.5f : 3.0f;  // below / above max
      AdamCase cpu = base, gpu = base;
      std::vector<float> sc = {1 - 0.999f * 0.999f, 1 - 0.9f * 0.9f, 0.01f, 0.25f,
                               masking == 2 ? 0.0f : 1.0f, 0.5f, 0.5f, 0.95f, 0.0f, norm, 1.0f};
      jss::AdamDirectionConfig cfg{0.9f, 0.1f, 0.999f, 0.001f, 1e-8f,
                                   static_cast<jss::MomentumMasking>(masking), sc[0], sc[1],
                                   sc[2], cpu.table.data(),
                                   static_cast<int64_t>(cpu.table.size())};
      if (has_noise) {
        cfg.noise_norm = sc[3];
        cfg.update_noise = sc[4];
        cfg.keep = sc[5];
        cfg.floor = sc[6];
      }
      if (has_clip) {
        cfg.clip = !(sc[9] < sc[10]);
        cfg.clip_norm = sc[9];
        cfg.clip_max_norm = sc[10];
      }
      jss::AdamAccumulateBuffers b;
      static_cast<jss::GradientLeaves&>(b) = leaves.cpu;
      b.mu = cpu.mu.data();
      b.nu = cpu.nu.data();
      b.age = cpu.age.data();
      b.residual = mask ? cpu.residual.data() : nullptr;
      b.direction = nullptr;
      if (has_noise) {
        b.diff_sq = cpu.diff_sq.data();
        b.last = cpu.last.data();
        b.before_last = cpu.before_last.data();
      }
      std::vector<float> cpu_acc(n);
      b.accumulate_from = cpu.residual.data();
      b.acc = cpu_acc.data();
      jss::adam_accumulate(cfg, b, has_decay, sc[7]);
      c::AdamEntry e{};
      e.c = c::AdamConstants{0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, masking,
                             static_cast<long long>(gpu.table.size()), has_noise, has_decay,
                             has_clip};
      e.b = c::AdamBuffers{gpu.mu.data(), gpu.nu.data(), gpu.age.data(),
                           mask ? gpu.residual.data() : nullptr, gpu.diff_sq.data(),
                           gpu.last.data(), gpu.before_last.data(), gpu.table.data(),
                           gpu.residual.data()};
      e.scalars = sc.data();
      std::vector<float> acc(n);
      const FusedResult g = emulate_fused_accumulate(e, leaves.fused, acc.data(), nullptr,
                                                     acc.data(), 0.0f, 0, 0, rng);
      const bool noise_same = !has_noise || (same_bits(gpu.diff_sq, cpu.diff_sq) &&
                                             same_bits(gpu.last, cpu.last) &&
                                             same_bits(gpu.before_last, cpu.before_last));
      CHECK(same_bits(acc, cpu_acc) && same_bits(gpu.mu, cpu.mu) && same_bits(gpu.nu, cpu.nu) &&
                gpu.age == cpu.age && noise_same && g.hint_used == 0 && g.indices[0] == -1,
            "adam_accumulate masking=%d variant=%d: acc %d mu %d nu %d age %d noise %d", masking,
            variant, same_bits(acc, cpu_acc), same_bits(gpu.mu, cpu.mu),
            same_bits(gpu.nu, cpu.nu), gpu.age == cpu.age, noise_same);
      // jss_adam_direction: the direction alone (its 7 scalars; no decay, no clip)
      if (!has_decay && !has_clip) {
        AdamCase cpu_d = base, gpu_d = base;
        jss::AdamDirectionBuffers d;
        static_cast<jss::GradientLeaves&>(d) = leaves.cpu;
        d.mu = cpu_d.mu.data();
        d.nu = cpu_d.nu.data();
        d.age = cpu_d.age.data();
        d.residual = mask ? cpu_d.residual.data() : nullptr;
        if (has_noise) {
          d.diff_sq = cpu_d.diff_sq.data();
          d.last = cpu_d.last.data();
          d.before_last = cpu_d.before_last.data();
        }
        std::vector<float> cpu_dir(n), dir(n);
        d.direction = cpu_dir.data();
        jss::adam_direction(cfg, d);
        const std::vector<float> sc7(sc.begin(), sc.begin() + 7);
        c::AdamDirectionEntry de{};
        de.c = e.c;
        de.b = c::AdamBuffers{gpu_d.mu.data(), gpu_d.nu.data(), gpu_d.age.data(),
                              mask ? gpu_d.residual.data() : nullptr, gpu_d.diff_sq.data(),
                              gpu_d.last.data(), gpu_d.before_last.data(), gpu_d.table.data(),
                              nullptr};
        de.scalars = sc7.data();
        c::FusedLeaves from0 = leaves.fused;
        from0.places.assign(from0.offsets.begin(), from0.offsets.end() - 1);
        std::vector<ull> unused;
        emulate_fused_pass(de, from0, dir.data(), nullptr, 0u, false, &unused);
        CHECK(same_bits(dir, cpu_dir) && same_bits(gpu_d.mu, cpu_d.mu) &&
                  same_bits(gpu_d.nu, cpu_d.nu) && gpu_d.age == cpu_d.age &&
                  (!has_noise || same_bits(gpu_d.diff_sq, cpu_d.diff_sq)),
              "adam_direction masking=%d variant=%d differs", masking, variant);
      }
      // the top-k of the same step, with a hint that holds (the list's path)
      const long long k = n / 100;
      sc[8] = kth_of(cpu_acc, k) * 0.95f;
      AdamCase cpu2 = base, gpu2 = base;
      b.mu = cpu2.mu.data();
      b.nu = cpu2.nu.data();
      b.age = cpu2.age.data();
      b.residual = mask ? cpu2.residual.data() : nullptr;
      if (has_noise) {
        b.diff_sq = cpu2.diff_sq.data();
        b.last = cpu2.last.data();
        b.before_last = cpu2.before_last.data();
      }
      b.accumulate_from = cpu2.residual.data();
      std::vector<float> cv(k), acc2(n);
      std::vector<int32_t> ci(k);
      b.acc = acc2.data();
      const bool used = jss::adam_accumulate_topk(cfg, b, has_decay, sc[7],
                                                  c::hint_key_of(sc[8]), k, 16 * k, cv.data(),
                                                  ci.data());
      e.b = c::AdamBuffers{gpu2.mu.data(), gpu2.nu.data(), gpu2.age.data(),
                           mask ? gpu2.residual.data() : nullptr, gpu2.diff_sq.data(),
                           gpu2.last.data(), gpu2.before_last.data(), gpu2.table.data(),
                           gpu2.residual.data()};
      const FusedResult t = emulate_fused_accumulate(e, leaves.fused, acc.data(), nullptr,
                                                     acc.data(), sc[8], k, 16 * k, rng);
      CHECK(used && t.hint_used == 1 && same_bits(t.values, cv) && t.indices == ci &&
                same_bits(acc, acc2),
            "adam_accumulate_topk masking=%d variant=%d: hint_used %d / %d", masking, variant,
            t.hint_used, used);
    }
  }
}

void check_fused_leaf_lookup() {
  const long long offsets[] = {0, 0, 3, 3, 3, 10, 11};  // empty leaves too
  for (long long i = 0; i < 11; ++i) {
    const int j = c::leaf_of(offsets, 6, i);
    CHECK(offsets[j] <= i && i < offsets[j + 1], "leaf_of(%lld) = %d", i, j);
  }
  CHECK(c::hint_key_of(0.0f) == 0 && c::hint_key_of(-1.0f) == 0 && c::hint_key_of(NAN) == 0 &&
            c::hint_key_of(INFINITY) == 0 && c::hint_key_of(1.0f) == 0x3f800000u,
        "hint keys");
  CHECK(c::hint_list_holds(5, 10, 10, 20) && !c::hint_list_holds(5, 9, 10, 20) &&
            !c::hint_list_holds(5, 21, 10, 20) && !c::hint_list_holds(0, 10, 10, 20) &&
            !c::hint_list_holds(5, 10, 10, 9),
        "the list's test");
}

#ifdef JSS_DEVICE_RUN
// --bench: the fused pass against the unfused step it replaces (XLA's add: one
// read of residual and gradient, one write; then jss.topk), at 1 % with a hint
// that holds, with none (the first step) and one that misses.
void bench_fused(long long n) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n), r(n);
  for (auto& v : g) v = normal(rng);
  for (auto& v : r) v = normal(rng) * 0.5f;
  const long long k = n / 100, cap = 16 * k;
  std::vector<float> acc(n);
  for (long long i = 0; i < n; ++i) acc[i] = r[i] + g[i];
  const float kth = kth_of(acc, k);
  DeviceBuffer<float> dg(g.data(), n), dr(r.data(), n), dacc(n), dv(k), one(1);
  DeviceBuffer<int32_t> di(k), used(1);
  const float hints[] = {kth * 0.95f, 0.0f, kth * 2.0f};
  DeviceBuffer<float> dh(hints, 3);
  c::FusedLeaves leaves;
  leaves.leaves = {dg.ptr};
  leaves.offsets = {0, n};
  leaves.places = {0};
  DeviceRun run(std::max(c::fused_accumulate_scratch_bytes(n, k, cap),
                         c::topk_scratch_bytes<c::F32>(n, k)));
  const c::AccumulateEntry e{dr.ptr, one.ptr, false};
  const char* names[] = {"accumulate_topk hint", "accumulate_topk none", "accumulate_topk miss"};
  for (int h = 0; h < 3; ++h) {
    const double ms = time_ms(run.stream, [&] {
      return c::fused_accumulate_launch(e, leaves, dacc.ptr, nullptr, dacc.ptr, dh.ptr + h, k,
                                        cap, dv.ptr, di.ptr, used.ptr, run.scratch, run.stream);
    });
    std::printf("N=%lld k=%lld %-22s %8.3f ms  %7.1f GB/s (residual, gradient, acc)\n", n, k,
                names[h], ms, 12.0 * n / ms / 1e6);
  }
  const double topk_ms = time_ms(run.stream, [&] {
    return c::topk_launch<c::F32>(reinterpret_cast<const uint32_t*>(dacc.ptr), n, k,
                                  reinterpret_cast<uint32_t*>(dv.ptr), di.ptr, run.scratch,
                                  run.stream);
  });
  std::printf("N=%lld k=%lld %-22s %8.3f ms  (the unfused step: an add pass, then this)\n", n, k,
              "topk of acc", topk_ms);
}
#endif
