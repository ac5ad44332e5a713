// The CPU seam of the device-resident sparse exchange (ffi/collectives/device_exchange.h):
// a Device whose "device" memory is host memory, whose copies are memcpy and
// whose kernels are loops over the same per-slot and per-entry functions as the
// CUDA kernels' threads (ffi/collectives/exchange_steps.h). The CPU handler runs
// the protocol through it when JSS_TEST_DEVICE_PROTOCOL is set (see
// device_protocol_seam in allreduce_call.h), so every step but the copies and
// the launches is checked under mpiexec, bit for bit against the CPU path, on a
// machine without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ffi/collectives/device_exchange.h"
#include "ffi/collectives/exchange_steps.h"
#include "xla/ffi/api/ffi.h"

namespace jss {
namespace exchange {

class HostDevice {
 public:
  xla::ffi::Error device_buffer(size_t bytes, void** out) { return allocate(bytes, out); }
  // Fresh memory each call (the seam is a test path): a pinned buffer's reuse is
  // the CUDA module's concern, what is in it is the protocol's.
  xla::ffi::Error host_buffer(int slot, size_t bytes, void** out) { return allocate(bytes, out); }

  xla::ffi::Error clear(void* p, size_t bytes) {
    if (bytes > 0) std::memset(p, 0, bytes);
    return xla::ffi::Error::Success();
  }

  // The CUDA kernels' steps in order: inspect every slot, compact the kept ones
  // (stable: slot order), check their order, round them (in order only).
  xla::ffi::Error prepare_local(const DeviceCall& call, int64_t size, int64_t value_dtype,
                                SparseEntry* slots, SparseEntry* kept, SlotReport* report) {
    for (int64_t i = 0; i < call.cap; ++i) {
      const float v = call.values[i];
      const int32_t index = call.indices[i];
      slots[i] = slot_entry(v, index);
      if (slot_index_bad(index, size)) {
        report->bad_position_key = std::max(report->bad_position_key, bad_position_key(i));
      } else if (slot_nonfinite(v, index, size)) {
        report->nonfinite = 1;
      }
    }
    int64_t count = 0;
    for (int64_t i = 0; i < call.cap; ++i) {
      if (KeepSlot()(slots[i])) kept[count++] = slots[i];
    }
    report->count = count;
    for (int64_t j = 1; j < count; ++j) report->unsorted |= out_of_order(kept, j) ? 1u : 0u;
    if (report->bad_position_key != 0) {
      report->bad_index = call.indices[bad_position_of(report->bad_position_key)];
    }
    if (value_dtype != 0 && !report->unsorted) {
      for (int64_t j = 0; j < count; ++j) kept[j].value = wire_rounded(kept[j].value, value_dtype);
    }
    return xla::ffi::Error::Success();
  }

  xla::ffi::Error to_host(void* host, const void* device, size_t bytes) {
    if (bytes > 0) std::memcpy(host, device, bytes);
    return xla::ffi::Error::Success();
  }
  xla::ffi::Error to_device(void* device, const void* host, size_t bytes) {
    if (bytes > 0) std::memcpy(device, host, bytes);
    return xla::ffi::Error::Success();
  }
  xla::ffi::Error synchronize() { return xla::ffi::Error::Success(); }

  xla::ffi::Error zero_floats(float* out, int64_t n) {
    std::fill(out, out + n, 0.0f);
    return xla::ffi::Error::Success();
  }

  xla::ffi::Error add_run(float* out, int64_t n, const SparseEntry* run, int64_t count,
                          int64_t run_id, bool check, RunReport* report) {
    int64_t delta = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (check && entry_faulty(run, i, n)) {
        report->fault_key = std::max(report->fault_key, fault_key(run_id, i));
        continue;
      }
      delta += add_entry(out, run[i]);
    }
    report->nnz += delta;
    return xla::ffi::Error::Success();
  }

  xla::ffi::Error store_entries(float* out, const SparseEntry* entries, int64_t count) {
    for (int64_t i = 0; i < count; ++i) out[entries[i].index] = entries[i].value;
    return xla::ffi::Error::Success();
  }

  xla::ffi::Error write_stats(const DeviceCall& call, const WireStats& stats,
                              const RunReport* report) {
    WireStats final_stats = stats;
    if (report != nullptr) final_stats.result_nnz = report->nnz;
    if (call.stats_s64) {
      final_stats.write(static_cast<int64_t*>(call.stats));
    } else {
      final_stats.write(static_cast<int32_t*>(call.stats));
    }
    return xla::ffi::Error::Success();
  }

 private:
  xla::ffi::Error allocate(size_t bytes, void** out) {
    owned_.emplace_back(new char[bytes > 0 ? bytes : 1]);
    *out = owned_.back().get();
    return xla::ffi::Error::Success();
  }
  std::vector<std::unique_ptr<char[]>> owned_;
};

}  // namespace exchange
}  // namespace jss
