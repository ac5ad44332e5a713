// The device-resident sparse exchange: the sparse allreduce on device buffers in
// which no entry is touched by host code on the allgather path.
//
//   1. On the device: each input slot is checked (index range, finiteness: one
//      SlotReport), the kept (value, index) pairs are compacted into wire
//      entries, and rounded to the wire's value dtype when they are in index order.
//   2. One copy to pinned memory of the report and, where the entries must travel
//      (P > 1, or an algorithm that runs on the host), of the cap entries: O(k)
//      bytes; one synchronize. The header allgather checks every rank's report.
//   3. allgather, plain wire: MPI_Allgatherv between pinned buffers, one copy of
//      the peers' runs back to the device, and the sum formed there in the CPU
//      path's order: the output zeroed, then rank r's run added for r = 0..P-1
//      (a run's indices are unique, so each run's scatter-add is race free):
//      ((0 + v0) + v1) + ..., bit for bit what the CPU path computes. The peers'
//      runs are checked (sorted, unique, in range) and the result's nonzeros
//      counted by the same kernels. At P = 1 no entry leaves the device.
//   4. Other algorithms (recursive doubling, split-allgather, hash partition, an
//      encoded or 16-bit wire): the host runs the CPU algorithm on the pinned
//      entries, the result comes back as its entries (or, past the switch to
//      dense, its dense vector), stored into the zeroed output on the device.
//      The dense and DSAR algorithms, whose results are dense, are not run here.
//   5. The statistics are written on the device (the nonzero count is the
//      device's); one last copy brings the run report, then a synchronize.
//
// The driver is a template over a Device that owns the memory, the copies and
// the kernels: the CUDA module's (ffi/cuda/device_exchange_cuda.cu) and the CPU
// seam's host stand-ins (ffi/collectives/device_exchange_host.h), which run the
// same per-slot and per-entry functions (ffi/collectives/exchange_steps.h) in
// loops, so that the whole protocol but the copies and launches runs under
// mpiexec on any machine (JSS_TEST_DEVICE_PROTOCOL, tests/test_device_protocol.py).
//
// A Device provides (every pointer but the host buffers' is device memory):
//   device_buffer(bytes, &ptr)       memory for this call (freed after it)
//   host_buffer(slot, bytes, &ptr)   the thread's pinned buffer `slot`, reused
//   clear(ptr, bytes)                zero bytes
//   prepare_local(call, size, value_dtype, slots, kept, report)  step 1
//   to_host(h, d, bytes), to_device(d, h, bytes), synchronize()
//   zero_floats(out, n)
//   add_run(out, n, run, count, run_id, check, run_report)       step 3
//   store_entries(out, entries, count)                           step 4
//   write_stats(call, stats, run_report or nullptr)              step 5
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/exchange_steps.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/mpi_comm.h"
#include "xla/ffi/api/ffi.h"

namespace jss {
namespace exchange {

// One call's buffers, on the device.
struct DeviceCall {
  const float* values = nullptr;    // [cap]
  const int32_t* indices = nullptr; // [cap], -1: padding
  int64_t cap = 0;
  float* out = nullptr;             // [size]
  void* stats = nullptr;            // WireStats::kFields int64 (stats_s64) or int32
  bool stats_s64 = true;
};

// The algorithms the protocol runs: all but those whose result is dense by design.
inline bool runs_on_device(int64_t algorithm) {
  return algorithm != static_cast<int64_t>(Algorithm::kDense) &&
         algorithm != static_cast<int64_t>(Algorithm::kDsarSplitAllgather);
}

// Pinned host buffers of a call, by slot (each slot grows separately).
enum HostSlot : int { kSlotLocal = 0, kSlotGathered = 1, kSlotRunReport = 2 };

// This rank's entries after step 1.
struct LocalRun {
  SparseEntry* device = nullptr;  // the kept entries on the device (cap slots)
  SparseEntry* host = nullptr;    // their copy on the host, or null
  int64_t count = 0;
  SlotReport report;
  std::vector<SparseEntry> normalized;  // input not in index order: the host's stream
  RunReport* run_report = nullptr;      // on the device, cleared
};

inline size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Input whose kept indices do not increase (hand-built COO: duplicates, any
// order): the host builds the stream as prepare_call does (stream_from_coo on the
// kept entries, which the device compacted in slot order, then the wire rounding)
// and puts it back on the device. The library's selections never take this path.
template <typename Device>
xla::ffi::Error normalize_on_host(Device& dev, int64_t value_dtype, SparseEntry* staged,
                                  LocalRun* local) {
  if (local->host == nullptr) {
    if (auto e = dev.to_host(staged, local->device, local->count * sizeof(SparseEntry));
        e.failure()) {
      return e;
    }
    if (auto e = dev.synchronize(); e.failure()) return e;
  }
  std::vector<float> values(static_cast<size_t>(local->count));
  std::vector<int32_t> indices(static_cast<size_t>(local->count));
  for (int64_t j = 0; j < local->count; ++j) {
    values[j] = staged[j].value;
    indices[j] = staged[j].index;
  }
  SparseStream stream;
  stream_from_coo(values.data(), indices.data(), local->count, &stream);
  round_entries(&stream.entries, value_dtype);
  local->normalized = std::move(stream.entries);
  local->count = static_cast<int64_t>(local->normalized.size());
  local->host = local->normalized.data();
  return dev.to_device(local->device, local->host, local->count * sizeof(SparseEntry));
}

// Step 1 and 2's copy: the input checked and compacted on the device, the report
// (and the entries, where `entries_to_host`) brought to pinned memory.
template <typename Device>
xla::ffi::Error prepare_local_run(Device& dev, const DeviceCall& call, const CallConfig& config,
                                  bool entries_to_host, LocalRun* local) {
  const size_t entry_bytes = static_cast<size_t>(call.cap) * sizeof(SparseEntry);
  const size_t reports = aligned(sizeof(SlotReport)) + aligned(sizeof(RunReport));
  char* base = nullptr;
  if (auto e = dev.device_buffer(reports + 2 * aligned(entry_bytes), reinterpret_cast<void**>(&base));
      e.failure()) {
    return e;
  }
  auto* report = reinterpret_cast<SlotReport*>(base);
  local->run_report = reinterpret_cast<RunReport*>(base + aligned(sizeof(SlotReport)));
  local->device = reinterpret_cast<SparseEntry*>(base + reports);
  auto* slots = reinterpret_cast<SparseEntry*>(base + reports + aligned(entry_bytes));
  char* host = nullptr;
  if (auto e = dev.host_buffer(kSlotLocal, aligned(sizeof(SlotReport)) + entry_bytes,
                               reinterpret_cast<void**>(&host));
      e.failure()) {
    return e;
  }
  auto* staged = reinterpret_cast<SparseEntry*>(host + aligned(sizeof(SlotReport)));
  const int64_t dtype = WireFormat::from_word(config.wire).value_dtype;
  if (auto e = dev.clear(base, reports); e.failure()) return e;
  if (auto e = dev.prepare_local(call, config.size, dtype, slots, local->device, report);
      e.failure()) {
    return e;
  }
  if (auto e = dev.to_host(host, report, sizeof(SlotReport)); e.failure()) return e;
  if (entries_to_host) {
    if (auto e = dev.to_host(staged, local->device, entry_bytes); e.failure()) return e;
  }
  if (auto e = dev.synchronize(); e.failure()) return e;  // MPI reads finished copies
  std::memcpy(&local->report, host, sizeof(SlotReport));
  local->count = local->report.count;
  local->host = entries_to_host ? staged : nullptr;
  if (local->report.bad_position_key != 0 || !local->report.unsorted) {
    return xla::ffi::Error::Success();
  }
  return normalize_on_host(dev, dtype, staged, local);
}

// The header the argument check exchanges, from the device's report.
inline CallHeader header_of(const CallConfig& config, const LocalRun& local) {
  CallHeader header = call_header(config);
  if (local.report.bad_position_key != 0) {
    header.flags |= CallHeader::kBadIndex;
    header.bad_index = local.report.bad_index;
    header.bad_position = bad_position_of(local.report.bad_position_key);
  }
  if (local.report.nonfinite) header.flags |= CallHeader::kNonFinite;
  // A bad index builds no stream (prepare_call's rule): nothing is announced.
  header.nnz = header.flags & CallHeader::kBadIndex ? 0 : local.count;
  return header;
}

// Step 3's MPI part: every rank's run gathered into pinned memory, the peers'
// copied to the device (`device_runs`: run r at displs[r]; this rank's stays
// where it is). Counts come from the checked headers.
template <typename Device>
xla::ffi::Error gather_runs(Device& dev, const LocalRun& local,
                            const std::vector<CallHeader>& headers, int64_t n, MPI_Comm comm,
                            int rank, int nranks, std::vector<MPI_Count>* counts,
                            std::vector<MPI_Aint>* displs, SparseEntry** gathered,
                            SparseEntry** device_runs, WireStats* stats) {
  MPI_Aint total = 0;
  for (int r = 0; r < nranks; ++r) {
    if (r != rank) {
      if (auto e = check_peer_count(headers[r].nnz, n, rank, r, "entry count (allgather)");
          e.failure()) {
        return e;
      }
    }
    (*counts)[r] = static_cast<MPI_Count>(r == rank ? local.count : headers[r].nnz);
    (*displs)[r] = total;
    total += static_cast<MPI_Aint>((*counts)[r]);
  }
  if (nranks == 1) return xla::ffi::Error::Success();  // nothing leaves the device
  const size_t bytes = static_cast<size_t>(total) * sizeof(SparseEntry);
  if (auto e = dev.host_buffer(kSlotGathered, bytes, reinterpret_cast<void**>(gathered));
      e.failure()) {
    return e;
  }
  if (auto e = allgather_blocks(local.host, *gathered, *counts, *displs, entry_type(), comm, rank,
                                "MPI_Allgatherv");
      e.failure()) {
    return e;
  }
  const int64_t mine = static_cast<int64_t>(local.count) * sizeof(SparseEntry);
  stats->bytes_sent += mine * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(bytes) - mine;
  stats->messages += ceil_log2(nranks);
  if (auto e = dev.device_buffer(bytes, reinterpret_cast<void**>(device_runs)); e.failure()) {
    return e;
  }
  // The runs before this rank's and those after it: two copies, own run left out.
  const size_t before = static_cast<size_t>((*displs)[rank]) * sizeof(SparseEntry);
  const size_t after_at = before + static_cast<size_t>(mine);
  if (auto e = dev.to_device(*device_runs, *gathered, before); e.failure()) return e;
  return dev.to_device(reinterpret_cast<char*>(*device_runs) + after_at,
                       reinterpret_cast<char*>(*gathered) + after_at, bytes - after_at);
}

// Step 3: the allgather algorithm, summed on the device.
template <typename Device>
xla::ffi::Error allgather_on_device(Device& dev, const DeviceCall& call, const LocalRun& local,
                                    const std::vector<CallHeader>& headers, int64_t n,
                                    MPI_Comm comm, int rank, int nranks, WireStats* stats,
                                    std::vector<MPI_Count>* counts, std::vector<MPI_Aint>* displs,
                                    SparseEntry** gathered) {
  SparseEntry* device_runs = nullptr;
  if (auto e = gather_runs(dev, local, headers, n, comm, rank, nranks, counts, displs, gathered,
                           &device_runs, stats);
      e.failure()) {
    return e;
  }
  if (auto e = dev.zero_floats(call.out, n); e.failure()) return e;
  for (int r = 0; r < nranks; ++r) {  // rank order: the CPU path's sums
    const SparseEntry* run = r == rank ? local.device : device_runs + (*displs)[r];
    if (auto e = dev.add_run(call.out, n, run, static_cast<int64_t>((*counts)[r]), r, r != rank,
                             local.run_report);
        e.failure()) {
      return e;
    }
  }
  return dev.write_stats(call, *stats, local.run_report);
}

// Step 4: the CPU algorithm on the host's copy of the entries; its result stored
// into the output on the device.
template <typename Device>
xla::ffi::Error host_algorithm(Device& dev, const DeviceCall& call, LocalRun* local,
                               std::vector<CallHeader> headers, const CallConfig& config,
                               MPI_Comm comm, int rank, int nranks, WireStats* stats) {
  PreparedCall prepared;
  prepared.rank = rank;
  prepared.nranks = nranks;
  prepared.headers = std::move(headers);
  prepared.stats = *stats;
  if (!local->normalized.empty()) {
    prepared.local.entries = std::move(local->normalized);
  } else {
    prepared.local.entries.assign(local->host, local->host + local->count);
  }
  SparseResult sparse;
  if (auto e = run_call(&prepared, config, comm, nullptr, &sparse); e.failure()) return e;
  *stats = prepared.stats;
  if (!sparse.used) {  // switched to dense: the vector itself
    if (auto e = dev.to_device(call.out, sparse.dense.data(),
                               static_cast<size_t>(config.size) * sizeof(float));
        e.failure()) {
      return e;
    }
    return dev.write_stats(call, *stats, nullptr);
  }
  const int64_t count = static_cast<int64_t>(sparse.entries.size());
  SparseEntry* entries = nullptr;
  const size_t bytes = static_cast<size_t>(count) * sizeof(SparseEntry);
  if (auto e = dev.device_buffer(bytes, reinterpret_cast<void**>(&entries)); e.failure()) return e;
  if (auto e = dev.to_device(entries, sparse.entries.data(), bytes); e.failure()) return e;
  if (auto e = dev.zero_floats(call.out, config.size); e.failure()) return e;
  if (auto e = dev.store_entries(call.out, entries, count); e.failure()) return e;
  return dev.write_stats(call, *stats, nullptr);
}

// Step 5's check: a peer's run that was not sorted, unique and in range fails the
// call with the CPU path's message (check_peer_entries on the host's copy of it).
inline xla::ffi::Error fault_error(const RunReport& report, const SparseEntry* gathered,
                                   const std::vector<MPI_Count>& counts,
                                   const std::vector<MPI_Aint>& displs, int64_t n, int rank) {
  const int run = static_cast<int>(fault_run(report.fault_key));
  if (gathered != nullptr && run < static_cast<int>(counts.size())) {
    auto e = check_peer_entries(gathered + displs[run], static_cast<int64_t>(counts[run]), 0, n,
                                rank, run, "entries (allgather)");
    if (e.failure()) return e;
  }
  return corrupt_peer_message(rank, run, "entries (allgather)",
                              "entry " + std::to_string(fault_entry(report.fault_key)) +
                                  " is not sorted, unique and in range");
}

// The sparse allreduce of `call` through the device protocol (an algorithm for
// which runs_on_device holds).
template <typename Device>
xla::ffi::Error sparse_allreduce_on_device(Device& dev, const DeviceCall& call,
                                           const CallConfig& config, MPI_Comm comm) {
  if (auto e = check_call_config(config); e.failure()) return e;
  BlockedLabel label(algorithm_name(config.algorithm));
  int rank = 0, nranks = 1;
  JSS_MPI_CHECK(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", -1);
  JSS_MPI_CHECK(MPI_Comm_size(comm, &nranks), "MPI_Comm_size", rank);
  const WireFormat wire = WireFormat::from_word(config.wire);
  const bool on_device = config.algorithm == static_cast<int64_t>(Algorithm::kAllgather) &&
                         wire.plain();
  LocalRun local;
  if (auto e = prepare_local_run(dev, call, config, nranks > 1 || !on_device, &local);
      e.failure()) {
    return e;
  }
  WireStats stats;
  std::vector<CallHeader> headers;
  if (auto e = exchange_headers(header_of(config, local), comm, rank, nranks,
                                static_cast<NanPolicy>(config.nan_policy), "sparse_allreduce",
                                &headers, &stats);
      e.failure()) {
    return e;
  }
  stats.algorithm = config.algorithm;
  if (!on_device) {
    if (auto e = host_algorithm(dev, call, &local, std::move(headers), config, comm, rank, nranks,
                                &stats);
        e.failure()) {
      return e;
    }
    return dev.synchronize();  // the host's buffers are reused by the next call
  }
  std::vector<MPI_Count> counts(nranks);
  std::vector<MPI_Aint> displs(nranks);
  SparseEntry* gathered = nullptr;
  if (auto e = allgather_on_device(dev, call, local, headers, config.size, comm, rank, nranks,
                                   &stats, &counts, &displs, &gathered);
      e.failure()) {
    return e;
  }
  RunReport* report = nullptr;
  if (auto e = dev.host_buffer(kSlotRunReport, sizeof(RunReport), reinterpret_cast<void**>(&report));
      e.failure()) {
    return e;
  }
  if (auto e = dev.to_host(report, local.run_report, sizeof(RunReport)); e.failure()) return e;
  if (auto e = dev.synchronize(); e.failure()) return e;
  if (report->fault_key == 0) return xla::ffi::Error::Success();
  return fault_error(*report, gathered, counts, displs, config.size, rank);
}

}  // namespace exchange
}  // namespace jss
