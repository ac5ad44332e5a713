// What each thread of this rank is blocked on inside a collective: the MPI call
// it is in, the peer(s) it waits for and the bytes it expects, so that the
// watchdog (ffi/runtime/watchdog.h) can say, when a link died and every rank entered
// the operation, which peer this rank waits for ("rank 0 waits for a message
// from rank 1 (recursive_doubling round 1, ...)").
//
// Every blocking MPI call of the collectives goes through JSS_MPI_CHECK
// (ffi/runtime/mpi_comm.h), which records the call's name here for its duration; the
// point-to-point calls record their peer and byte count too
// (JSS_MPI_CHECK_BLOCKED), and the MPI_Waitall of a set of point-to-point
// requests is wait_all_tracked(), which waits with MPI_Waitsome and keeps the
// list of peers still pending up to date. The collective's algorithm (and a
// step, e.g. a round of recursive doubling) is a label set once per
// operation (BlockedLabel).
//
// Each thread owns one slot of a fixed table (claimed at its first call,
// released when it exits); only that thread writes it, with relaxed atomic
// stores under a sequence counter, and the watchdog thread reads it without a
// lock (retrying while the counter is odd or moves). Cost per blocking MPI
// call: about ten relaxed stores into memory the thread already owns (no
// lock, no system call, no shared cache line).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace jss {

enum class WaitKind : int32_t {
  kNone = 0,        // not in an MPI call
  kCollective = 1,  // a collective of every rank of the communicator (or a local MPI call)
  kRecv = 2,        // a message from `peer`
  kSend = 3,        // sending to `peer` (waits for it to take the message)
  kSendrecv = 4,    // MPI_Sendrecv with `peer`: its message in, ours out
  kRequests = 5,    // point-to-point requests to / from the listed peers
  kLocal = 6,       // not MPI: waits for another thread of this process
};

constexpr int kListedPeers = 8;  // pending requests listed by peer (the rest counted)

struct BlockedSlot {
  std::atomic<uint32_t> owned{0};    // a live thread holds it
  std::atomic<uint32_t> version{0};  // odd while the owner writes
  std::atomic<const char*> label{nullptr};  // the algorithm / phase (BlockedLabel)
  std::atomic<int32_t> step{-1};            // its step (a round), -1: none
  std::atomic<const char*> call{nullptr};   // the MPI call (JSS_MPI_CHECK's name)
  std::atomic<int32_t> kind{0};
  std::atomic<int32_t> peer{-1};            // kRecv / kSend / kSendrecv: the communicator rank
  std::atomic<int64_t> bytes{-1};           // bytes expected from the peer (-1: unknown)
  std::atomic<int64_t> bytes_out{-1};       // kSendrecv / kSend: bytes sent to it
  std::atomic<int64_t> comm{0};             // Fortran handle of the communicator
  std::atomic<int64_t> since_ns{0};         // steady clock when the call began
  std::atomic<int32_t> pending{0};          // kRequests: how many still pending
  std::atomic<int32_t> listed_peer[kListedPeers];
  std::atomic<int32_t> listed_send[kListedPeers];  // 1: a send to it, 0: a receive from it
  std::atomic<int64_t> listed_bytes[kListedPeers];
};

// This thread's slot (nullptr when the table is full: then nothing is recorded).
BlockedSlot* claim_blocked_slot();
void release_blocked_slot(BlockedSlot* slot);

namespace blocked_detail {
struct ThreadSlot {
  BlockedSlot* slot = claim_blocked_slot();
  ~ThreadSlot() { release_blocked_slot(slot); }
};
int64_t steady_ns();
// Test hook (JSS_TEST_FREEZE_AT, see watchdog.cc): inert unless that variable is set.
extern std::atomic<bool> freeze_armed;
void freeze_point(const BlockedSlot* slot);
}  // namespace blocked_detail

inline BlockedSlot* this_thread_blocked_slot() {
  thread_local blocked_detail::ThreadSlot t;
  return t.slot;
}

// One point-to-point request: the peer (communicator rank), whether this rank
// sends to it, and the bytes of the message. The one record of a request's kind:
// wait_all_tracked reports it to the watchdog, and cancel_pending cancels only
// the requests whose record is a receive. Each posting site appends it next to
// the request (before posting: JSS_MPI_CHECK_POSTED), so the two vectors line up.
struct RequestPeer {
  int32_t peer;
  int32_t send;
  int64_t bytes;
};

// Records, for its lifetime, that this thread is in the MPI call `call`.
class BlockedOn {
 public:
  // A collective (or any call whose peer is not one rank); kLocal: `call`
  // describes what this thread waits for in this process.
  explicit BlockedOn(const char* call, WaitKind kind = WaitKind::kCollective)
      : BlockedOn(call, kind, 0, -1, -1, -1) {}
  // A point-to-point call with `peer` (a rank of `comm`): `bytes` expected from
  // it, `bytes_out` sent to it (-1: none / unknown).
  BlockedOn(const char* call, MPI_Comm comm, WaitKind kind, int peer, int64_t bytes,
            int64_t bytes_out = -1)
      : BlockedOn(call, kind, static_cast<int64_t>(MPI_Comm_c2f(comm)), peer, bytes, bytes_out) {}
  ~BlockedOn() {
    if (slot_ == nullptr) return;
    slot_->call.store(nullptr, std::memory_order_relaxed);  // one store: the reader checks it first
  }
  BlockedOn(const BlockedOn&) = delete;
  BlockedOn& operator=(const BlockedOn&) = delete;

 private:
  BlockedOn(const char* call, WaitKind kind, int64_t comm, int peer, int64_t bytes,
            int64_t bytes_out)
      : slot_(this_thread_blocked_slot()) {
    if (slot_ == nullptr) return;
    const uint32_t v = slot_->version.load(std::memory_order_relaxed);
    slot_->version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot_->kind.store(static_cast<int32_t>(kind), std::memory_order_relaxed);
    slot_->comm.store(comm, std::memory_order_relaxed);
    slot_->peer.store(peer, std::memory_order_relaxed);
    slot_->bytes.store(bytes, std::memory_order_relaxed);
    slot_->bytes_out.store(bytes_out, std::memory_order_relaxed);
    slot_->pending.store(0, std::memory_order_relaxed);
    slot_->since_ns.store(blocked_detail::steady_ns(), std::memory_order_relaxed);
    slot_->call.store(call, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot_->version.store(v + 2, std::memory_order_relaxed);
    if (blocked_detail::freeze_armed.load(std::memory_order_relaxed)) {
      blocked_detail::freeze_point(slot_);
    }
  }
  BlockedSlot* slot_;
};

// Labels what this thread runs (an algorithm of a collective, or one of its
// phases, a string literal) and its step, for its lifetime; restores the outer
// label after.
class BlockedLabel {
 public:
  explicit BlockedLabel(const char* label, int step = -1) : slot_(this_thread_blocked_slot()) {
    if (slot_ == nullptr) return;
    outer_label_ = slot_->label.load(std::memory_order_relaxed);
    outer_step_ = slot_->step.load(std::memory_order_relaxed);
    set(label, step);
  }
  // A new step of the same label (a round of recursive doubling).
  void set_step(int step) { set(slot_ ? slot_->label.load(std::memory_order_relaxed) : nullptr, step); }
  ~BlockedLabel() { set(outer_label_, outer_step_); }
  BlockedLabel(const BlockedLabel&) = delete;
  BlockedLabel& operator=(const BlockedLabel&) = delete;

 private:
  void set(const char* label, int step) {
    if (slot_ == nullptr) return;
    const uint32_t v = slot_->version.load(std::memory_order_relaxed);
    slot_->version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot_->label.store(label, std::memory_order_relaxed);
    slot_->step.store(step, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot_->version.store(v + 2, std::memory_order_relaxed);
  }
  BlockedSlot* slot_;
  const char* outer_label_ = nullptr;
  int outer_step_ = -1;
};

// MPI_Waitall of `requests` (requests[i] exchanges with peers[i]), recorded as
// blocked on the peers whose requests are still pending: waits with
// MPI_Waitsome and updates the list after each completion. Returns the MPI code;
// on an error, the receives still active are cancelled first
// (cancel_pending(requests, peers)).
int wait_all_tracked(std::vector<MPI_Request>* requests, const std::vector<RequestPeer>& peers,
                     const char* call, MPI_Comm comm);

// On an error path: cancels every receive of `requests` still active and tests
// all of them for at most 100 ms, so that no receive is left pending: one left
// posted would write into a buffer that goes away with the failed call, and would
// match (by posting order) the message of the next call on the communicator with
// its tag. Receives complete once cancelled. Sends are never cancelled (MPICH's
// ch4 cannot, MPI-4 deprecates it, and MPI_Cancel of a send that had just
// completed inside the UCX netmod segfaulted): one above the eager limit whose
// peer never receives it is left in flight rather than waited for (a wait could
// block the error path for good); a message sent before the error may still reach
// the peer (jss.mpi.reset_after_mpi_error moves the library to a fresh
// communicator for that). Which requests are sends: the caller's records, the
// same ones wait_all_tracked reports to the watchdog (peers[i] describes
// requests[i]; cancelled where !peers[i].send). A request without a record (i
// past peers' end) is not cancelled: never a send by mistake. Errors are ignored
// (the call already fails). Entries MPI_REQUEST_NULL are skipped: set the one
// whose call failed to it first (a failed call's request handle is undefined).
void cancel_pending(std::vector<MPI_Request>* requests, const std::vector<RequestPeer>& peers);

// Average cost in ns of recording one MPI call (a BlockedOn constructed and
// destroyed, no MPI call) on this thread: for benchmarks/blocked_on_cost.py.
double blocked_on_pair_cost_ns(int64_t iterations);

// A consistent copy of one slot in use, for the watchdog's report.
struct BlockedSnapshot {
  std::string label;
  int step = -1;
  std::string call;
  WaitKind kind = WaitKind::kNone;
  int peer = -1;
  int64_t bytes = -1, bytes_out = -1;
  int64_t comm = 0;
  int64_t since_ns = 0;
  int pending = 0;
  std::vector<RequestPeer> listed;
};

// Every thread of this process (this module) that is in a recorded call now.
std::vector<BlockedSnapshot> blocked_snapshots();

}  // namespace jss
