// Non-blocking sparse allreduce: a start call returns a handle, a done call
// waits for it and returns the result, so several can be in flight at once and
// overlap computation.
//
// start: checks the arguments on all ranks (the same header allgather as the
//   blocking call, on the calling thread, so bad input fails at start on every
//   rank), copies the sparse input, and runs the algorithm on a worker thread.
// done:  joins that thread and writes the result into XLA's buffer (a sparse
//   result as zeros and its entries, a dense one by a copy).
//
// Concurrent collectives must never share a communicator (MPI matches
// collectives by order per communicator, and threads have none). Operation
// number s runs on slot s mod kSlots, each slot owning a duplicate of the
// user's communicator. Both calls carry the ordered effect, so every rank
// issues starts in the same order: operation numbers, slots and the collective
// MPI_Comm_dup of a slot's first use agree across ranks. An operation whose
// slot is still busy waits on its worker thread for the slot's previous
// operation to finish before it touches the slot's communicator: the start
// itself never waits, so more than kSlots groups started in the middle of the
// backward pass do not stall XLA's thread (they queue, kSlots on the wire).
//
// Two flags and a window serve the grouped sync (ASC-WFBP), where starts are
// issued in the middle of the backward pass and must not stall it:
//   window w (flags bits 8-15, 1..255): the worker puts nothing on the wire
//     until every operation started on this communicator at least w starts
//     before it has finished, so at most w are in flight, itself included
//     (a "simultaneous" group under the planner's max_concurrent = w); the
//     caller never blocks. The last kHistory starts per communicator count.
//   kStartWaitPrevious: window 1, every earlier operation has finished (a
//     "normal" group: the link is free first).
//   kStartDeferCheck: the argument check (a header allgather) also runs on the
//     worker, so start makes no MPI call on XLA's thread; a bad argument then
//     fails at done, on every rank alike.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/collectives_host.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/watchdog.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr int kSlots = kNonblockingSlots;  // collectives_host.h

int64_t now_ns() {
  // steady_clock is CLOCK_MONOTONIC on Linux: Python's time.monotonic_ns() reads the same clock
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct PendingCall {
  TimelineRecord times;
  CallConfig config;
  PreparedCall call;
  std::vector<float> in_values;     // the inputs, kept for a deferred check
  std::vector<int32_t> in_indices;
  std::promise<void> finished;      // set when the worker is done
  std::shared_future<void> finished_future = finished.get_future().share();
  // The result: its entries when sparse (the usual case), else the dense vector,
  // allocated by the worker and never zero-filled (the algorithm writes all of
  // it), so a sparse result costs no N-sized buffer, page faults or copy: done
  // writes the zeros and the entries straight into XLA's buffer.
  SparseResult sparse;
  std::unique_ptr<float[]> dense;
  std::thread worker;
  ffi::Error error = ffi::Error::Success();
  WatchdogTicket watchdog;          // from start until the worker finishes
};

struct Registry {
  std::mutex mu;
  int64_t next_op = 0;
  std::unordered_map<int32_t, std::unique_ptr<PendingCall>> pending;
  std::map<std::pair<int64_t, int>, MPI_Comm> slot_comms;  // (user comm, slot) -> duplicate
  std::map<std::pair<int64_t, int>, std::shared_future<void>> slot_busy;  // its last operation
  std::deque<TimelineRecord> timeline;                      // finished operations, oldest first
  // user comm -> its last kHistory operations, oldest first
  std::map<int64_t, std::deque<std::shared_future<void>>> history;
};

constexpr size_t kHistory = 256;  // > the largest window (255)

constexpr size_t kTimelineCapacity = 1 << 16;

// Never destroyed: worker threads and MPI may outlive static destruction order.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

ffi::Error start_allreduce_host(const float* values, const int32_t* indices, int64_t cap,
                                const CallConfig& config, int64_t comm_handle, int64_t flags,
                                int32_t* handle_out) {
  if (flags & ~(kStartWaitPrevious | kStartDeferCheck | (kStartWindowMask << kStartWindowShift))) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.sparse_allreduce_start: unknown flags " +
                                       std::to_string(flags));
  }
  const bool defer = (flags & kStartDeferCheck) != 0;
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jax_sparse_sync.sparse_allreduce_start needs MPI initialized with "
                      "MPI_THREAD_MULTIPLE (mpi4py's default; check mpi4py.rc.thread_level)");
  }
  auto op = std::make_unique<PendingCall>();
  op->times.start_ns = now_ns();
  op->times.size = config.size;
  op->config = config;
  // keyed below (slots, history, watchdog) by the Fortran handle, as the blocking calls'
  // watchdog scopes are (MPI_Comm_c2f of their communicator)
  comm_handle = fortran_handle(comm_handle);
  MPI_Comm comm = comm_from_handle(comm_handle);
  // One watched operation from start until its worker finishes: entered here,
  // on XLA's thread, so its number on the communicator agrees across ranks.
  op->watchdog = watchdog_enter("sparse_allreduce_start", comm_handle, comm);
  if (defer) {
    op->in_values.assign(values, values + cap);
    op->in_indices.assign(indices, indices + cap);
  } else if (auto e = prepare_call(values, indices, cap, op->config, comm, &op->call);
             e.failure()) {
    watchdog_exit(op->watchdog);
    return e;
  }

  Registry& reg = registry();
  std::unique_lock<std::mutex> lock(reg.mu);
  const int64_t op_number = reg.next_op++;
  const int32_t id = static_cast<int32_t>(op_number & 0x7fffffff);
  const auto slot = std::make_pair(comm_handle, static_cast<int>(op_number % kSlots));
  // The slot's previous operation: the worker waits for it (the caller does not).
  std::shared_future<void> slot_previous;
  if (auto it = reg.slot_busy.find(slot); it != reg.slot_busy.end()) {
    slot_previous = it->second;
  }
  MPI_Comm slot_comm;
  if (auto it = reg.slot_comms.find(slot); it != reg.slot_comms.end()) {
    slot_comm = it->second;
  } else {
    if (int rc = MPI_Comm_dup(comm, &slot_comm); rc != MPI_SUCCESS) {
      watchdog_exit(op->watchdog);
      return mpi_error(rc, "MPI_Comm_dup", op->call.rank);
    }
    MPI_Comm_set_errhandler(slot_comm, MPI_ERRORS_RETURN);
    reg.slot_comms[slot] = slot_comm;
    // The same ranks as `comm`: the watchdog's report names the worker's peers by world rank.
    watchdog_note_duplicate(static_cast<int64_t>(MPI_Comm_c2f(slot_comm)), comm_handle, comm);
  }
  reg.slot_busy[slot] = op->finished_future;
  // The operations this one waits for: those started at least `window` starts before.
  const int64_t window = (flags & kStartWaitPrevious) ? 1 : ((flags >> kStartWindowShift) &
                                                             kStartWindowMask);
  std::vector<std::shared_future<void>> previous;
  auto& history = reg.history[comm_handle];
  if (window > 0) {
    const int64_t last = static_cast<int64_t>(history.size()) - window;  // inclusive
    for (int64_t i = 0; i <= last; ++i) {
      if (history[i].wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        previous.push_back(history[i]);
      }
    }
  }
  history.push_back(op->finished_future);
  if (history.size() > kHistory) history.pop_front();
  PendingCall* raw = op.get();
  reg.pending[id] = std::move(op);
  raw->times.op = op_number;
  raw->times.checked_ns = now_ns();  // the argument check (a header allgather) is done
  raw->worker = std::thread([raw, slot_comm, slot_previous, previous, defer] {
    {
      BlockedOn blocked("the earlier non-blocking operations it must follow (its slot, its "
                        "window) to finish", WaitKind::kLocal);
      if (slot_previous.valid()) slot_previous.wait();  // the slot's communicator is free
      for (const auto& f : previous) f.wait();
    }
    if (defer) {
      raw->error = prepare_call(raw->in_values.data(), raw->in_indices.data(),
                                static_cast<int64_t>(raw->in_values.size()), raw->config,
                                slot_comm, &raw->call);
      raw->times.checked_ns = now_ns();
    }
    raw->times.wire_begin_ns = now_ns();
    if (raw->error.success()) {
      raw->dense.reset(new float[static_cast<size_t>(raw->config.size)]);  // untouched if sparse
      raw->error = run_call(&raw->call, raw->config, slot_comm, raw->dense.get(), &raw->sparse);
      if (raw->sparse.used) raw->dense.reset();
    }
    raw->times.wire_end_ns = now_ns();
    watchdog_exit(raw->watchdog);
    raw->finished.set_value();
  });
  *handle_out = id;
  return ffi::Error::Success();
}

ffi::Error finish_allreduce_host(int32_t id, int64_t size, float* out, WireStats* stats) {
  Registry& reg = registry();
  const int64_t done_ns = now_ns();
  std::unique_ptr<PendingCall> op;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    auto it = reg.pending.find(id);
    if (it == reg.pending.end()) {
      return ffi::Error::InvalidArgument(
          "jax_sparse_sync.sparse_allreduce_done: unknown handle " + std::to_string(id) +
          " (already completed, not started in this process, or started on the other platform: "
          "the CPU and CUDA handlers keep separate tables, finish where it started)");
    }
    if (it->second->worker.joinable()) {
      std::thread& t = it->second->worker;
      reg.mu.unlock();
      BlockedOn blocked("the worker thread of its non-blocking operation to finish",
                        WaitKind::kLocal);
      t.join();
      reg.mu.lock();
    }
    op = std::move(it->second);
    reg.pending.erase(id);
  }
  if (op->error.failure()) return op->error;
  if (size != op->config.size) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.sparse_allreduce_done: size mismatch");
  }
  if (op->sparse.used) {
    write_sparse_result(op->sparse, size, out);  // zeros, then the entries: one pass
  } else {
    std::memcpy(out, op->dense.get(), static_cast<size_t>(size) * sizeof(float));
  }
  *stats = op->call.stats;
  op->times.done_ns = done_ns;
  op->times.done_exit_ns = now_ns();
  op->times.bytes_sent = op->call.stats.bytes_sent;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    if (reg.timeline.size() == kTimelineCapacity) reg.timeline.pop_front();
    reg.timeline.push_back(op->times);
  }
  return ffi::Error::Success();
}

std::vector<TimelineRecord> nonblocking_timeline(bool clear) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<TimelineRecord> out(reg.timeline.begin(), reg.timeline.end());
  if (clear) reg.timeline.clear();
  return out;
}

namespace {

ffi::Error StartImpl(ffi::Token, ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> indices,
                     ffi::Buffer<ffi::S32> seed, ffi::Result<ffi::Token>,
                     ffi::ResultBuffer<ffi::S32> handle_out, int64_t size, int64_t algorithm,
                     int64_t comm_handle, int64_t nan_policy, int64_t quantize_bits,
                     int64_t qsgd_bucket, int64_t wire, int64_t flags) {
  const int64_t cap = static_cast<int64_t>(values.element_count());
  if (static_cast<int64_t>(indices.element_count()) != cap) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce_start: `values` and `indices` lengths differ");
  }
  CallConfig config{size, algorithm, nan_policy, quantize_bits, qsgd_bucket,
                    static_cast<uint32_t>(seed.typed_data()[0])};
  config.wire = wire;
  return start_allreduce_host(values.typed_data(), indices.typed_data(), cap, config, comm_handle,
                              flags, handle_out->typed_data());
}

ffi::Error DoneImpl(ffi::Token, ffi::Buffer<ffi::S32> handle, ffi::Result<ffi::Token>,
                    ffi::ResultBuffer<ffi::F32> out, ffi::Result<ffi::AnyBuffer> stats_out) {
  WireStats stats;
  if (auto e = finish_allreduce_host(handle.typed_data()[0],
                                     static_cast<int64_t>(out->element_count()),
                                     out->typed_data(), &stats);
      e.failure()) {
    return e;
  }
  return write_stats(stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduceStart, jss::StartImpl,
                              jss::sig::bind_sparse_allreduce_start(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduceDone, jss::DoneImpl,
                              jss::sig::bind_sparse_allreduce_done(ffi::Ffi::Bind()));
