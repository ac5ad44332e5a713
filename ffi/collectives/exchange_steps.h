// What one thread of the device-resident sparse exchange does for one slot or
// one entry (ffi/collectives/device_exchange.h), as __host__ __device__
// functions: the CUDA kernels (ffi/cuda/device_exchange_cuda.cu) call them on the
// device, the CPU seam's host stand-ins (ffi/collectives/device_exchange_host.h)
// call the same functions in loops, so the seam checks the kernels' arithmetic
// and checks bit for bit, under mpiexec, on a machine without a GPU.
#pragma once

#include <cstdint>

#include "kernels/float_bits.cuh"
#include "kernels/sparse_stream.h"

namespace jss {
namespace exchange {

// What the inspection of the input slots finds, written on the device and read
// by the host after the one copy that brings it with the entries. Zero bytes
// are "nothing found" (the device clears it with one memset).
struct SlotReport {
  int64_t count = 0;              // entries kept (index >= 0), after the compaction
  uint64_t bad_position_key = 0;  // kNoBad, or kLastKey - (first slot with a bad index)
  int64_t bad_index = 0;          // that slot's index
  uint32_t nonfinite = 0;         // a slot with a valid index holds NaN or +-Inf
  uint32_t unsorted = 0;          // the kept indices do not increase strictly, slot after slot
};

// The first bad slot is found with an atomic maximum of kLastKey - position (a
// memset's zero is "none"), so the smallest position wins whatever the thread order.
constexpr uint64_t kLastKey = ~uint64_t{0};
JSS_HD uint64_t bad_position_key(int64_t position) {
  return kLastKey - static_cast<uint64_t>(position);
}
JSS_HD int64_t bad_position_of(uint64_t key) { return static_cast<int64_t>(kLastKey - key); }

// What adding the runs finds, read by the host after the call's last copy: the
// result's nonzero count, and the first entry of a peer's run that was not sorted,
// unique and in range (kLastKey - (run << 40 | entry); zero: none).
struct RunReport {
  int64_t nnz = 0;
  uint64_t fault_key = 0;
};
constexpr int kRunShift = 40;  // entries of one run < 2^40; runs (ranks) < 2^23
JSS_HD uint64_t fault_key(int64_t run, int64_t entry) {
  return kLastKey - ((static_cast<uint64_t>(run) << kRunShift) | static_cast<uint64_t>(entry));
}
JSS_HD int64_t fault_run(uint64_t key) { return static_cast<int64_t>((kLastKey - key) >> kRunShift); }
JSS_HD int64_t fault_entry(uint64_t key) {
  return static_cast<int64_t>((kLastKey - key) & ((uint64_t{1} << kRunShift) - 1));
}

// The argument check of one input slot, as prepare_call makes it on the host:
// an index below -1 or at least `size` is bad; a kept slot (index in [0, size))
// whose value is NaN or +-Inf is non-finite.
JSS_HD bool slot_index_bad(int32_t index, int64_t size) { return index < -1 || index >= size; }
JSS_HD bool slot_nonfinite(float value, int32_t index, int64_t size) {
  return index >= 0 && index < size &&
         (cuda::bits_from_float(value) & 0x7f800000u) == 0x7f800000u;
}

// The entry a slot contributes (padding, index < 0, is dropped by the compaction).
JSS_HD SparseEntry slot_entry(float value, int32_t index) {
  SparseEntry e;
  e.index = index;
  e.value = value;
  return e;
}
struct KeepSlot {  // the compaction's predicate
  JSS_HD bool operator()(const SparseEntry& e) const { return e.index >= 0; }
};

// Whether kept entry j (j >= 1) breaks the strictly increasing order: then the
// host merges duplicates and sorts, as stream_from_coo does.
JSS_HD bool out_of_order(const SparseEntry* entries, int64_t j) {
  return entries[j].index <= entries[j - 1].index;
}

// v rounded to the wire's value dtype (0 float32: v itself; 1 bfloat16; 2 float16,
// nearest even) and widened back: what every receiver of v sums, the sender too.
JSS_HD float wire_rounded(float v, int64_t dtype) {
  if (dtype == 1) return cuda::float_from_bits(cuda::BF16::widen(cuda::BF16::narrow(v)));
  if (dtype == 2) return cuda::float_from_bits(cuda::F16::widen(cuda::F16::narrow(v)));
  return v;
}

// Whether entry i of a peer's run may be added: index in [0, n) and above the
// previous entry's (a run is sorted and unique, so its scatter-add is race free).
JSS_HD bool entry_faulty(const SparseEntry* run, int64_t i, int64_t n) {
  const int32_t index = run[i].index;
  return index < 0 || index >= n || (i > 0 && index <= run[i - 1].index);
}

// a + b as the CPU handlers add: XLA's CPU runtime runs them with subnormal
// inputs and results flushed to (signed) zero (x86 DAZ + FTZ), so the device adds
// with .ftz; on the host the calling thread's mode applies (the CPU seam runs
// inside the CPU handler; the CUDA handler sets the same mode, device_exchange_cuda.cu).
JSS_HD float add_as_cpu(float a, float b) {
#ifdef __CUDA_ARCH__
  float sum;
  asm("add.rn.ftz.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
  return sum;
#else
  return a + b;
#endif
}

// out[e.index] += e.value, the CPU path's sum for one entry (the first run adds to
// the zeros, (0 + v0) + v1 ...); returns the change of the nonzero count.
JSS_HD int add_entry(float* out, SparseEntry e) {
  const float before = out[e.index];
  const float after = add_as_cpu(before, e.value);
  out[e.index] = after;
  return static_cast<int>(after != 0.0f) - static_cast<int>(before != 0.0f);
}

// The statistics output (s64, or s32 saturated when JAX runs without x64), with
// the nonzero count the device found: fields as WireStats::write.
template <typename Int>
JSS_HD void write_stats_field(Int* out, int field, int64_t value) {
  if (sizeof(Int) == 4 && value > 2147483647) value = 2147483647;
  out[field] = static_cast<Int>(value);
}

}  // namespace exchange
}  // namespace jss
