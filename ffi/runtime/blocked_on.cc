#include "ffi/runtime/blocked_on.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace jss {
namespace {

// Threads that run collectives: XLA's, the non-blocking workers (one per
// operation, each releasing its slot when it exits). Past this many at once,
// further threads record nothing.
constexpr int kSlots = 256;

BlockedSlot* table() {
  static BlockedSlot* slots = new BlockedSlot[kSlots];  // never freed: threads outlive statics
  return slots;
}

// Stores the pending list of a slot under its sequence counter.
void store_pending(BlockedSlot* slot, const std::vector<MPI_Request>& requests,
                   const std::vector<RequestPeer>& peers) {
  const uint32_t v = slot->version.load(std::memory_order_relaxed);
  slot->version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  int pending = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    if (pending < kListedPeers) {
      slot->listed_peer[pending].store(peers[i].peer, std::memory_order_relaxed);
      slot->listed_send[pending].store(peers[i].send, std::memory_order_relaxed);
      slot->listed_bytes[pending].store(peers[i].bytes, std::memory_order_relaxed);
    }
    ++pending;
  }
  slot->pending.store(pending, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot->version.store(v + 2, std::memory_order_relaxed);
}

}  // namespace

namespace blocked_detail {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace blocked_detail

BlockedSlot* claim_blocked_slot() {
  BlockedSlot* slots = table();
  for (int i = 0; i < kSlots; ++i) {
    uint32_t free = 0;
    if (slots[i].owned.load(std::memory_order_relaxed) == 0 &&
        slots[i].owned.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) {
      slots[i].call.store(nullptr, std::memory_order_relaxed);
      slots[i].label.store(nullptr, std::memory_order_relaxed);
      slots[i].step.store(-1, std::memory_order_relaxed);
      return &slots[i];
    }
  }
  return nullptr;
}

void release_blocked_slot(BlockedSlot* slot) {
  if (slot == nullptr) return;
  slot->call.store(nullptr, std::memory_order_relaxed);
  slot->owned.store(0, std::memory_order_release);
}

int wait_all_tracked(std::vector<MPI_Request>* requests, const std::vector<RequestPeer>& peers,
                     const char* call, MPI_Comm comm) {
  const int n = static_cast<int>(requests->size());
  if (n == 0) return MPI_SUCCESS;
  BlockedOn blocked(call, comm, WaitKind::kRequests, -1, -1);
  BlockedSlot* slot = this_thread_blocked_slot();
  if (slot == nullptr) {
    const int rc = MPI_Waitall(n, requests->data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) cancel_pending(requests, peers);
    return rc;
  }
  std::vector<int> done(static_cast<size_t>(n));
  int remaining = 0;
  for (const MPI_Request& r : *requests) remaining += r != MPI_REQUEST_NULL;
  while (remaining > 0) {
    store_pending(slot, *requests, peers);
    int outcount = 0;
    const int rc = MPI_Waitsome(n, requests->data(), &outcount, done.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      cancel_pending(requests, peers);  // no receive left pending on the error path
      return rc;
    }
    if (outcount == MPI_UNDEFINED) break;  // no active request left
    remaining -= outcount;
  }
  return MPI_SUCCESS;
}

void cancel_pending(std::vector<MPI_Request>* requests, const std::vector<RequestPeer>& peers) {
  const size_t recorded = std::min(requests->size(), peers.size());
  if (recorded != requests->size()) {
    // a posting site that did not record a request's kind (a bug in this library):
    // its receives stay posted rather than risk cancelling a send; say so
    std::fprintf(stderr, "jax_sparse_sync: internal error: %zu of %zu requests have no "
                 "RequestPeer record; they are not cancelled\n",
                 requests->size() - recorded, requests->size());
  }
  for (size_t i = 0; i < recorded; ++i) {
    if ((*requests)[i] != MPI_REQUEST_NULL && !peers[i].send) MPI_Cancel(&(*requests)[i]);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  bool active = true;
  while (active) {
    active = false;
    for (MPI_Request& r : *requests) {
      if (r == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // an error completes nothing more
        r = MPI_REQUEST_NULL;
        continue;
      }
      active = active || !done;
    }
    if (active && std::chrono::steady_clock::now() > deadline) break;
  }
}

double blocked_on_pair_cost_ns(int64_t iterations) {
  const int64_t t0 = blocked_detail::steady_ns();
  for (int64_t i = 0; i < iterations; ++i) {
    BlockedOn blocked("blocked_on benchmark", MPI_COMM_WORLD, WaitKind::kRecv, 1, 4096);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // keep the pair in the loop
  }
  return static_cast<double>(blocked_detail::steady_ns() - t0) /
         static_cast<double>(iterations > 0 ? iterations : 1);
}

std::vector<BlockedSnapshot> blocked_snapshots() {
  std::vector<BlockedSnapshot> out;
  BlockedSlot* slots = table();
  for (int i = 0; i < kSlots; ++i) {
    BlockedSlot& s = slots[i];
    if (s.owned.load(std::memory_order_acquire) == 0) continue;
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const uint32_t v1 = s.version.load(std::memory_order_acquire);
      if (v1 & 1) continue;
      const char* call = s.call.load(std::memory_order_relaxed);
      if (call == nullptr) break;  // not in a call
      BlockedSnapshot snap;
      const char* label = s.label.load(std::memory_order_relaxed);
      snap.label = label ? label : "";
      snap.step = s.step.load(std::memory_order_relaxed);
      snap.call = call;
      snap.kind = static_cast<WaitKind>(s.kind.load(std::memory_order_relaxed));
      snap.peer = s.peer.load(std::memory_order_relaxed);
      snap.bytes = s.bytes.load(std::memory_order_relaxed);
      snap.bytes_out = s.bytes_out.load(std::memory_order_relaxed);
      snap.comm = s.comm.load(std::memory_order_relaxed);
      snap.since_ns = s.since_ns.load(std::memory_order_relaxed);
      snap.pending = s.pending.load(std::memory_order_relaxed);
      for (int j = 0; j < std::min(snap.pending, kListedPeers); ++j) {
        snap.listed.push_back(RequestPeer{s.listed_peer[j].load(std::memory_order_relaxed),
                                          s.listed_send[j].load(std::memory_order_relaxed),
                                          s.listed_bytes[j].load(std::memory_order_relaxed)});
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.version.load(std::memory_order_relaxed) != v1) continue;  // written meanwhile
      out.push_back(std::move(snap));
      break;
    }
  }
  return out;
}

}  // namespace jss
