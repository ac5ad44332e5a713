// Ok-Topk's O(k) sparse allreduce (Li and Hoefler, PPoPP'22), as an XLA FFI
// handler over MPI. Result = Top-k( sum_i TopK_i ): the ranks' local top-k
// vectors are summed, and the global top-k of that sum is kept.
//
//  1. Regions. Rank q reduces the index range [b_q, b_{q+1}). When asked
//     (every tau' steps), each rank proposes boundaries that split its own
//     top-k entries evenly; the ranks average the P-1 interior boundaries with
//     one small allreduce. Otherwise the boundaries come from the Optax state.
//  2. Split and reduce. Each rank sends every owner its slice, with
//     non-blocking sends in rotated order (step j: to rank + j, from rank - j)
//     and in buckets of kBucketPeers peers: while bucket t travels, the owner
//     merges what bucket t-1 delivered.
//  3. Global threshold. Exact when asked (every tau steps): a distributed radix
//     select over every region's reduced magnitudes (four allreduces of
//     2^8 / 2^8 / 2^8 / 2^7 counts: a fixed 7 KiB, which at small k can still
//     exceed the payload; amortized over the tau steps that reuse it);
//     otherwise the reused one from the state.
//  4. Balance and allgatherv. Each owner keeps its region's entries with
//     |v| >= threshold (with a reused threshold, and region limits given: at
//     least region_min and at most region_max of them, its exact top ones). The sizes are allgathered; if the largest is above 4x
//     the mean, the entries are first moved point to point so that every rank
//     holds an equal share of the concatenation (rank order kept), then one
//     allgatherv. The concatenation is sorted by index (regions are ordered),
//     so every rank gets the same bits.
//  5. Contribution. Which of this rank's input entries made it into the
//     global top-k (their residual is zeroed by oktopk_sync).
//
// Hash owners (partition 1; issue 35, ZEN's partition): index i belongs to
// rank hash_owner(i, P) (ffi/collectives/algorithms.h, as hash_partition.cc) instead of a
// contiguous region. Step 1 is skipped (the boundaries pass through unused);
// step 2 sends each owner its entries (a stable counting sort by owner, so each
// slice stays sorted) and the owner sums them in rank order 0, 1, ..., P-1 once
// all have come (as hash_partition.cc: the same bits as its sum; the regions'
// rotated order would tie the bits to which rank owns the index); steps 3-4
// are unchanged (region_min / region_max now limit each hash owner); after the
// allgatherv the P owners' blocks (each sorted, disjoint) are merged by index,
// so every rank holds the same sorted result. Whatever the support, each
// owner's share is close to 1/P of it: no share explodes on a concentrated
// support (embedding rows), and no repartition is needed.
//
// 16-bit wire (wire_dtype 1 bfloat16, 2 float16; ffi/collectives/wire_codec.h): each rank
// rounds its entries once, before step 2, and keeps the rounded values for its
// own slice too; the slices travel as int32 indices then 16-bit values (6 bytes
// an entry), the owner widens and sums in float32, selects on those float32
// sums (threshold and region limits as above), and rounds the selected sums
// before step 4, whose messages are 16-bit as well. Only owners sum and every
// rank decodes the same bytes, so every rank gets the same bits.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/collectives/collectives_host.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/collectives/peer_checks.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/watchdog.h"
#include "kernels/float_bits.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr int kBucketPeers = 4;

// Interior boundaries that split this rank's (sorted) entries evenly, averaged
// over ranks. Monotone because each proposal is.
ffi::Error balanced_boundaries(const std::vector<SparseEntry>& local, int64_t n, MPI_Comm comm,
                               int rank, int P, std::vector<int64_t>* bounds, WireStats* stats) {
  std::vector<int64_t> mine(P - 1);
  const int64_t m = static_cast<int64_t>(local.size());
  for (int q = 1; q < P; ++q) {
    mine[q - 1] = m == 0 ? n * q / P : local[static_cast<size_t>(m * q / P)].index;
  }
  std::vector<int64_t> sum(P - 1, 0);
  JSS_MPI_CHECK(MPI_Allreduce(mine.data(), sum.data(), P - 1, MPI_INT64_T, MPI_SUM, comm),
                "MPI_Allreduce (region boundaries)", rank);
  const int64_t vol = 2 * (P - 1) * (P - 1) * static_cast<int64_t>(sizeof(int64_t)) / P;
  stats->bytes_sent += vol;
  stats->bytes_received += vol;
  stats->messages += 2 * ceil_log2(P);
  bounds->assign(P + 1, 0);
  (*bounds)[P] = n;
  for (int q = 1; q < P; ++q) (*bounds)[q] = sum[q - 1] / P;
  for (int q = 0; q < P; ++q) {  // every rank's proposal lies in [0, n] and is monotone
    if ((*bounds)[q] > (*bounds)[q + 1] || (*bounds)[q + 1] > n) {
      return corrupt_peer_message(rank, -1, "boundary sum (Ok-Topk)",
                                  "the averaged region boundaries are not monotone in [0, size]");
    }
  }
  return ffi::Error::Success();
}

// Split and reduce: returns this rank's region, summed over ranks.
// `local` holds the P owners' slices back to back (slice q: [begin[q],
// begin[q + 1]), sorted); with regions (`bounds` given) owner q's indices lie in
// [bounds[q], bounds[q + 1]), with hash owners (`bounds` null) hash_owner(i, P) == q.
ffi::Error split_and_reduce(const std::vector<SparseEntry>& local,
                            const std::vector<int64_t>& begin, const std::vector<int64_t>* bounds,
                            int64_t n, WireFormat wire, MPI_Comm comm, int rank, int P,
                            std::vector<SparseEntry>* region, WireStats* stats) {
  const int64_t lo = bounds != nullptr ? (*bounds)[rank] : 0;
  const int64_t hi = bounds != nullptr ? (*bounds)[rank + 1] : n;
  std::vector<int64_t> send_counts(P), recv_counts;
  for (int q = 0; q < P; ++q) send_counts[q] = begin[q + 1] - begin[q];
  if (auto e = exchange_counts(send_counts, &recv_counts, comm, rank, P,
                               "MPI_Waitall (slice sizes)", stats);
      e.failure()) {
    return e;
  }

  for (int q = 0; q < P; ++q) {
    if (q == rank) continue;
    if (auto e = check_peer_count(recv_counts[q], hi - lo, rank, q, "slice size (Ok-Topk)");
        e.failure()) {
      return e;
    }
  }
  region->assign(local.begin() + begin[rank], local.begin() + begin[rank + 1]);
  std::vector<std::vector<SparseEntry>> inbox(P);
  // A 16-bit wire: messages packed by ffi/collectives/wire_codec.h, decoded into inbox.
  const bool packed = !wire.plain();
  std::vector<std::vector<char>> inbox_bytes(packed ? P : 0), outbox(packed ? P : 0);
  std::vector<SparseEntry> scratch;
  // Two buckets' requests can be posted at once (the one in flight and the
  // next): on any early return (an MPI error, or a malformed message of the
  // bucket that arrived while the next one travels) the guard cancels the
  // receives of both (cancel_pending, with each bucket's peers: which are sends)
  // before the buffers above go away, so none is left pending (a receive into
  // `inbox`, matching the next call's slices). A bucket's completed wait leaves
  // every entry MPI_REQUEST_NULL: nothing to cancel. The peers (for the
  // watchdog's report and the kinds) are declared before the guard, which
  // reads them when it runs.
  std::vector<MPI_Request> inflight, next;
  std::vector<RequestPeer> inflight_peers, next_peers;
  struct CancelOnReturn {
    std::vector<MPI_Request>* inflight;
    const std::vector<RequestPeer>& inflight_peers;
    std::vector<MPI_Request>* next;
    const std::vector<RequestPeer>& next_peers;
    ~CancelOnReturn() {
      cancel_pending(inflight, inflight_peers);
      cancel_pending(next, next_peers);
    }
  } cancel_on_return{&inflight, inflight_peers, &next, next_peers};
  std::vector<int> inflight_sources;
  int bucket = 0;  // 1-based number of the bucket in flight
  auto finish_bucket = [&]() -> ffi::Error {
    {
      BlockedLabel label("oktopk split-and-reduce bucket", bucket);
      if (int rc = wait_all_tracked(&inflight, inflight_peers, "MPI_Waitall (bucket)", comm);
          rc != MPI_SUCCESS) {
        return mpi_error(rc, "MPI_Waitall (bucket)", rank);  // `next`: the guard cancels
      }
    }
    for (int src : inflight_sources) {
      if (packed) {
        if (auto e = unpack_message(inbox_bytes[src].data(),
                                    static_cast<int64_t>(inbox_bytes[src].size()), n, wire, rank,
                                    src, "Ok-Topk split", &inbox[src]);
            e.failure()) {
          return e;
        }
        std::vector<char>().swap(inbox_bytes[src]);
      }
      if (auto e = check_peer_entries(inbox[src].data(), static_cast<int64_t>(inbox[src].size()),
                                      lo, hi, rank, src, "slice (Ok-Topk)");
          e.failure()) {
        return e;
      }
      if (bounds == nullptr) {  // hash owners: every index must be this rank's
        for (const SparseEntry& entry : inbox[src]) {
          if (hash_owner(entry.index, P) != rank) {
            return corrupt_peer_message(rank, src, "slice (Ok-Topk, hash owners)",
                                        "an index this rank does not own");
          }
        }
      }
    }
    if (bounds != nullptr) {  // regions: reduce what the bucket delivered
      for (int src : inflight_sources) {
        merge_sparse(*region, inbox[src], &scratch);
        region->swap(scratch);
        std::vector<SparseEntry>().swap(inbox[src]);
      }
    }
    inflight.clear();
    inflight_peers.clear();
    inflight_sources.clear();
    return ffi::Error::Success();
  };
  for (int first = 1; first < P; first += kBucketPeers) {
    // `next` and `next_peers` are empty here: finish_bucket cleared the bucket
    // swapped into them
    std::vector<int> next_sources;
    for (int j = first; j < std::min(P, first + kBucketPeers); ++j) {
      const int dst = (rank + j) % P, src = (rank - j + P) % P;  // destination rotation
      if (recv_counts[src] > 0) {
        next.push_back(MPI_REQUEST_NULL);
        if (packed) {
          const int64_t bytes = list_message_bytes(recv_counts[src], wire);
          inbox_bytes[src].resize(static_cast<size_t>(bytes));
          next_peers.push_back(RequestPeer{src, 0, bytes});
          JSS_MPI_CHECK_POSTED(MPI_Irecv_c(inbox_bytes[src].data(), bytes, MPI_BYTE, src,
                                           kTagData, comm, &next.back()),
                               "MPI_Irecv (bucket)", rank, &next, next_peers);
          stats->bytes_received += bytes;
        } else {
          inbox[src].resize(static_cast<size_t>(recv_counts[src]));
          next_peers.push_back(
              RequestPeer{src, 0, recv_counts[src] * int64_t{sizeof(SparseEntry)}});
          JSS_MPI_CHECK_POSTED(MPI_Irecv_c(inbox[src].data(), recv_counts[src], entry_type(), src,
                                           kTagData, comm, &next.back()),
                               "MPI_Irecv (bucket)", rank, &next, next_peers);
          stats->bytes_received += recv_counts[src] * static_cast<int64_t>(sizeof(SparseEntry));
        }
        next_sources.push_back(src);
      }
      if (send_counts[dst] > 0) {
        next.push_back(MPI_REQUEST_NULL);
        if (packed) {
          pack_entries(local.data() + begin[dst], send_counts[dst], wire, &outbox[dst]);
          const int64_t bytes = static_cast<int64_t>(outbox[dst].size());
          next_peers.push_back(RequestPeer{dst, 1, bytes});
          JSS_MPI_CHECK_POSTED(MPI_Isend_c(outbox[dst].data(), bytes, MPI_BYTE, dst, kTagData,
                                           comm, &next.back()),
                               "MPI_Isend (bucket)", rank, &next, next_peers);
          stats->bytes_sent += bytes;
        } else {
          next_peers.push_back(
              RequestPeer{dst, 1, send_counts[dst] * int64_t{sizeof(SparseEntry)}});
          JSS_MPI_CHECK_POSTED(MPI_Isend_c(local.data() + begin[dst], send_counts[dst],
                                           entry_type(), dst, kTagData, comm, &next.back()),
                               "MPI_Isend (bucket)", rank, &next, next_peers);
          stats->bytes_sent += send_counts[dst] * static_cast<int64_t>(sizeof(SparseEntry));
        }
        stats->messages += 1;
      }
    }
    // The previous bucket is reduced while this one is on the wire.
    if (auto e = finish_bucket(); e.failure()) return e;
    inflight.swap(next);
    inflight_peers.swap(next_peers);
    inflight_sources.swap(next_sources);
    ++bucket;
  }
  if (auto e = finish_bucket(); e.failure()) return e;
  if (bounds == nullptr) {
    // Hash owners: the slices summed in rank order 0, 1, ..., P-1 once all have
    // come, as hash_partition.cc sums them, so the kept sums are the hash
    // partition's bits (a region's owner adds its own slice first, then ranks
    // rank-1, rank-2, ...: an order that follows the owner, which for a given
    // index differs between the two partitions; the sums then differ by rounding
    // where three or more ranks hold the index).
    std::vector<SparseEntry> own;
    own.swap(*region);
    for (int q = 0; q < P; ++q) {
      merge_sparse(*region, q == rank ? own : inbox[q], &scratch);
      region->swap(scratch);
      std::vector<SparseEntry>().swap(inbox[q]);
    }
  }
  return ffi::Error::Success();
}

// k-th largest magnitude key over the union of every rank's region (distributed
// radix select; bins as cost_model.THRESHOLD_HISTOGRAM_BINS). 0 when fewer
// than k nonzero entries exist: select them all.
ffi::Error global_kth_key(const std::vector<SparseEntry>& region, int64_t k, int64_t n,
                          MPI_Comm comm, int rank, int P, uint32_t* key_out, WireStats* stats) {
  // Four rounds of 8/8/8/7 bits over the 31-bit magnitude key: 896 int64
  // counts in all (7 KiB), one more latency than three wider rounds but a
  // quarter of their bytes (the fixed cost matters at small k).
  static constexpr int kRounds = 4;
  static constexpr int kShift[kRounds] = {23, 15, 7, 0};
  static constexpr int kBits[kRounds] = {8, 8, 8, 7};
  uint32_t prefix = 0;  // the key bits fixed so far
  int64_t remaining = k;
  for (int round = 0; round < kRounds; ++round) {
    const int shift = kShift[round], bits = kBits[round];
    const uint32_t high_shift = shift + bits;
    std::vector<int64_t> hist(size_t{1} << bits, 0), total(size_t{1} << bits, 0);
    for (const SparseEntry& e : region) {
      const uint32_t key = FloatTraits<float>::key(e.value);
      if (key == 0) continue;
      if (high_shift < 32 && (key >> high_shift) != (prefix >> high_shift)) continue;
      hist[(key >> shift) & ((1u << bits) - 1)]++;
    }
    JSS_MPI_CHECK(MPI_Allreduce(hist.data(), total.data(), static_cast<int>(hist.size()),
                                MPI_INT64_T, MPI_SUM, comm),
                  "MPI_Allreduce (global threshold)", rank);
    const int64_t vol =
        2 * (P - 1) * static_cast<int64_t>(hist.size() * sizeof(int64_t)) / std::max(P, 1);
    stats->bytes_sent += vol;
    stats->bytes_received += vol;
    stats->messages += 2 * ceil_log2(P);
    // Each rank counts at most n entries (unique indices): every sum lies in [0, P n].
    for (const int64_t count : total) {
      if (auto e = check_peer_count(count, int64_t{P} * n, rank, -1, "histogram sum (Ok-Topk)");
          e.failure()) {
        return e;
      }
    }
    int64_t digit = static_cast<int64_t>(hist.size()) - 1;
    for (; digit >= 0; --digit) {
      if (total[digit] >= remaining) break;
      remaining -= total[digit];
    }
    if (digit < 0) {  // fewer than k nonzero entries in all regions: keep them all
      *key_out = 0;       // (only possible in round 0: later rounds refine a digit
      return ffi::Error::Success();  // that held at least `remaining` entries)
    }
    prefix |= static_cast<uint32_t>(digit) << shift;
  }
  *key_out = prefix;
  return ffi::Error::Success();
}

// The `count` nonzero entries of `region` (sorted by index) of largest
// magnitude, ties broken by the lower index, sorted by index again.
void select_region_top(const std::vector<SparseEntry>& region, int64_t count,
                       std::vector<SparseEntry>* out) {
  out->clear();
  for (const SparseEntry& e : region) {
    if (FloatTraits<float>::key(e.value) != 0) out->push_back(e);
  }
  if (count < static_cast<int64_t>(out->size())) {
    auto before = [](const SparseEntry& a, const SparseEntry& b) {
      const uint32_t ka = FloatTraits<float>::key(a.value), kb = FloatTraits<float>::key(b.value);
      return ka != kb ? ka > kb : a.index < b.index;
    };
    std::nth_element(out->begin(), out->begin() + count, out->end(), before);
    out->resize(static_cast<size_t>(count));
    std::sort(out->begin(), out->end(),
              [](const SparseEntry& a, const SparseEntry& b) { return a.index < b.index; });
  }
}

// One message of the balancing step with peer q (send 1: to q from `buf`; 0: from
// q into `buf`, then writable), `count` items of `type`, `bytes` bytes: posted as
// the last of `requests`, its peer record appended to `peers`, counted in `stats`.
ffi::Error post_balance_message(int32_t send, const void* buf, int64_t count, MPI_Datatype type,
                                int64_t bytes, int q, MPI_Comm comm, int rank,
                                std::vector<MPI_Request>* requests,
                                std::vector<RequestPeer>* peers, WireStats* stats) {
  requests->push_back(MPI_REQUEST_NULL);
  peers->push_back(RequestPeer{q, send, bytes});
  if (send) {
    JSS_MPI_CHECK_POSTED(MPI_Isend_c(buf, count, type, q, kTagCount, comm, &requests->back()),
                         "MPI_Isend (balance)", rank, requests, *peers);
    stats->bytes_sent += bytes;
  } else {
    JSS_MPI_CHECK_POSTED(MPI_Irecv_c(const_cast<void*>(buf), count, type, q, kTagCount, comm,
                                     &requests->back()),
                         "MPI_Irecv (balance)", rank, requests, *peers);
    stats->bytes_received += bytes;
  }
  return ffi::Error::Success();
}

// Balance (when skewed) and allgatherv of the selected entries, in rank order.
// `owner_offset` (P + 1): where each owner's selection lies in `all`. With
// regions (`sorted_blocks` false) `all` is sorted and unique as a whole; with
// hash owners each block is (the caller merges them).
ffi::Error balance_and_allgatherv(const std::vector<SparseEntry>& selected, int64_t n,
                                  WireFormat wire, MPI_Comm comm, int rank, int P,
                                  bool sorted_blocks, std::vector<SparseEntry>* all,
                                  std::vector<int64_t>* owner_offset, WireStats* stats,
                                  bool* balanced) {
  // A 16-bit wire: every message packed by ffi/collectives/wire_codec.h (6 bytes an entry;
  // the values are already rounded, so packing them again loses nothing).
  const bool packed = !wire.plain();
  const int64_t mine = static_cast<int64_t>(selected.size());
  std::vector<int64_t> sizes(P);
  if (auto e = allgather_int64(mine, sizes.data(), comm, rank, P,
                               "MPI_Allgather (selected sizes)", stats);
      e.failure()) {
    return e;
  }
  for (int q = 0; q < P; ++q) {
    if (q == rank) continue;
    if (auto e = check_peer_count(sizes[q], n, rank, q, "selection size (Ok-Topk)"); e.failure()) {
      return e;
    }
  }
  std::vector<int64_t> offset(P + 1, 0);
  for (int q = 0; q < P; ++q) offset[q + 1] = offset[q] + sizes[q];
  const int64_t total = offset[P];
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  // Skewed: largest above 4x the mean (4 * total / P).
  *balanced = total > 0 && largest * P > 4 * total;

  std::vector<SparseEntry> share;  // what this rank contributes to the allgatherv
  std::vector<int64_t> share_offset(P + 1, 0);
  if (*balanced) {
    // Target: rank q holds entries [q T / P, (q+1) T / P) of the concatenation.
    for (int q = 0; q <= P; ++q) share_offset[q] = total * q / P;
    const int64_t lo = share_offset[rank], hi = share_offset[rank + 1];
    share.resize(static_cast<size_t>(hi - lo));
    // On an MPI error, the receives posted are cancelled (cancel_pending): none
    // is left pending (a receive into `inbox` or `share`, which go away,
    // matching the next call's messages).
    std::vector<MPI_Request> requests;
    std::vector<RequestPeer> request_peers;  // the watchdog's report; which are sends
    std::vector<std::vector<char>> inbox(packed ? P : 0), outbox(packed ? P : 0);
    std::vector<int64_t> inbox_at(P, 0);
    for (int q = 0; q < P; ++q) {
      // entries owned now by q that this rank must hold: [offset[q], offset[q+1]) ∩ [lo, hi)
      const int64_t a = std::max(offset[q], lo), b = std::min(offset[q + 1], hi);
      if (a < b) {
        if (q == rank) {
          std::memcpy(share.data() + (a - lo), selected.data() + (a - offset[q]),
                      static_cast<size_t>(b - a) * sizeof(SparseEntry));
        } else if (packed) {
          const int64_t bytes = list_message_bytes(b - a, wire);
          inbox[q].resize(static_cast<size_t>(bytes));
          inbox_at[q] = a - lo;
          if (auto e = post_balance_message(0, inbox[q].data(), bytes, MPI_BYTE, bytes, q, comm,
                                            rank, &requests, &request_peers, stats);
              e.failure()) {
            return e;
          }
        } else if (auto e = post_balance_message(0, share.data() + (a - lo), b - a, entry_type(),
                                                 (b - a) * int64_t{sizeof(SparseEntry)}, q, comm,
                                                 rank, &requests, &request_peers, stats);
                   e.failure()) {
          return e;
        }
      }
      // entries this rank owns now that q must hold
      const int64_t c = std::max(offset[rank], share_offset[q]);
      const int64_t d = std::min(offset[rank + 1], share_offset[q + 1]);
      if (c < d && q != rank) {
        if (packed) {
          pack_entries(selected.data() + (c - offset[rank]), d - c, wire, &outbox[q]);
          const int64_t bytes = static_cast<int64_t>(outbox[q].size());
          if (auto e = post_balance_message(1, outbox[q].data(), bytes, MPI_BYTE, bytes, q, comm,
                                            rank, &requests, &request_peers, stats);
              e.failure()) {
            return e;
          }
        } else if (auto e = post_balance_message(1, selected.data() + (c - offset[rank]), d - c,
                                                 entry_type(),
                                                 (d - c) * int64_t{sizeof(SparseEntry)}, q, comm,
                                                 rank, &requests, &request_peers, stats);
                   e.failure()) {
          return e;
        }
        stats->messages += 1;
      }
    }
    if (int rc = wait_all_tracked(&requests, request_peers, "MPI_Waitall (balance)", comm);
        rc != MPI_SUCCESS) {
      return mpi_error(rc, "MPI_Waitall (balance)", rank);
    }
    std::vector<SparseEntry> piece;
    for (int q = 0; q < static_cast<int>(inbox.size()); ++q) {
      if (inbox[q].empty()) continue;
      if (auto e = unpack_message(inbox[q].data(), static_cast<int64_t>(inbox[q].size()), n, wire,
                                  rank, q, "Ok-Topk balance", &piece);
          e.failure()) {
        return e;
      }
      std::copy(piece.begin(), piece.end(), share.begin() + inbox_at[q]);
    }
  } else {
    share = selected;
    share_offset = offset;
  }
  std::vector<MPI_Count> counts(P);
  std::vector<MPI_Aint> displs(P);
  for (int q = 0; q < P; ++q) {
    counts[q] = static_cast<MPI_Count>(share_offset[q + 1] - share_offset[q]);
    displs[q] = static_cast<MPI_Aint>(share_offset[q]);
  }
  all->resize(static_cast<size_t>(total));
  if (packed) {  // the same blocks, each a packed message of counts[q] entries
    std::vector<char> message, gathered(static_cast<size_t>(list_message_bytes(total, wire)));
    pack_entries(share.data(), static_cast<int64_t>(share.size()), wire, &message);
    std::vector<MPI_Count> byte_counts(P);
    std::vector<MPI_Aint> byte_displs(P);
    for (int q = 0; q < P; ++q) {
      byte_counts[q] = static_cast<MPI_Count>(list_message_bytes(counts[q], wire));
      byte_displs[q] = static_cast<MPI_Aint>(list_message_bytes(displs[q], wire));
    }
    if (auto e = allgather_blocks(message.data(), gathered.data(), byte_counts, byte_displs,
                                  MPI_BYTE, comm, rank, "MPI_Allgatherv");
        e.failure()) {
      return e;
    }
    std::vector<SparseEntry> block;
    for (int q = 0; q < P; ++q) {  // every rank decodes every block, its own included
      if (auto e = unpack_message(gathered.data() + byte_displs[q], byte_counts[q], n, wire, rank,
                                  q, "Ok-Topk allgatherv", &block);
          e.failure()) {
        return e;
      }
      std::copy(block.begin(), block.end(), all->begin() + displs[q]);
    }
  } else if (auto e = allgather_blocks(share.data(), all->data(), counts, displs, entry_type(),
                                       comm, rank, "MPI_Allgatherv");
             e.failure()) {
    return e;
  }
  // The selected entries of the ordered regions: sorted and unique over [0, n);
  // of hash owners: each owner's block is.
  for (int q = 0; q < (sorted_blocks ? P : 1); ++q) {
    const int64_t from = sorted_blocks ? offset[q] : 0, to = sorted_blocks ? offset[q + 1] : total;
    if (auto e = check_peer_entries(all->data() + from, to - from, 0, n, rank,
                                    sorted_blocks ? q : -1, "selection (Ok-Topk)");
        e.failure()) {
      return e;
    }
  }
  *owner_offset = offset;
  const int64_t my_bytes = list_message_bytes(static_cast<int64_t>(counts[rank]), wire);
  stats->bytes_sent += my_bytes * (P - 1);
  stats->bytes_received += list_message_bytes(total, wire) - my_bytes;
  stats->messages += ceil_log2(P);
  return ffi::Error::Success();
}

// The hash owners' gathered blocks (block q: [offset[q], offset[q + 1]),
// each sorted by index, the owners' indices disjoint) merged into one sorted
// vector, pairwise in log2(P) rounds. An index in two blocks (a corrupt peer)
// is an error, so that every rank's result stays unique.
ffi::Error merge_owner_blocks(std::vector<SparseEntry>* all, const std::vector<int64_t>& offset,
                              int rank) {
  const int P = static_cast<int>(offset.size()) - 1;
  auto by_index = [](const SparseEntry& a, const SparseEntry& b) { return a.index < b.index; };
  for (int width = 1; width < P; width *= 2) {
    for (int q = 0; q + width < P; q += 2 * width) {
      const int64_t first = offset[q], middle = offset[q + width];
      const int64_t last = offset[std::min(P, q + 2 * width)];
      std::inplace_merge(all->begin() + first, all->begin() + middle, all->begin() + last,
                         by_index);
    }
  }
  for (size_t i = 1; i < all->size(); ++i) {
    if ((*all)[i - 1].index == (*all)[i].index) {
      return corrupt_peer_message(rank, -1, "selection (Ok-Topk, hash owners)",
                                  "two owners selected the same index");
    }
  }
  return ffi::Error::Success();
}

// mask[i] = 1 where slot i's index is among the result's (sorted, unique)
// indices. The selection kernels give sorted indices (padding -1 first or last):
// then one merge walk, O(cap + |all|); otherwise a binary search per slot.
void contributed_mask(const int32_t* idx, int64_t cap, const std::vector<SparseEntry>& all,
                      uint8_t* mask) {
  bool sorted = true;
  int32_t last = -1;
  for (int64_t i = 0; i < cap && sorted; ++i) {
    if (idx[i] < 0) continue;
    sorted = idx[i] > last;
    last = idx[i];
  }
  if (sorted) {
    size_t j = 0;
    for (int64_t i = 0; i < cap; ++i) {
      if (idx[i] < 0) {
        mask[i] = 0;
        continue;
      }
      while (j < all.size() && all[j].index < idx[i]) ++j;
      mask[i] = j < all.size() && all[j].index == idx[i];
    }
    return;
  }
  for (int64_t i = 0; i < cap; ++i) {
    mask[i] = idx[i] >= 0 &&
              std::binary_search(all.begin(), all.end(), SparseEntry{idx[i], 0.0f},
                                 [](const SparseEntry& a, const SparseEntry& b) {
                                   return a.index < b.index;
                                 });
  }
}

}  // namespace

ffi::Error oktopk_allreduce_host(const OktopkHostArgs& args, MPI_Comm comm,
                                 OktopkHostResults* results) {
  const int64_t cap = args.cap;
  const int64_t n = args.size;
  const int64_t k = args.k;
  CallConfig config;
  config.size = args.size;
  config.algorithm = static_cast<int64_t>(Algorithm::kOktopk);
  config.nan_policy = args.nan_policy;
  config.param = k;
  // value dtype only: Ok-Topk's counts are entries (no index encoding), and
  // prepare_call rounds the local entries to it (the sender keeps what it sends)
  config.wire = args.wire_dtype;
  if (args.wire_dtype < 0 || args.wire_dtype > 2) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.oktopk_allreduce: wire_dtype must be 0 (float32), 1 (bfloat16) or 2 "
        "(float16); got " + std::to_string(args.wire_dtype));
  }
  WatchdogScope watchdog("oktopk_allreduce", comm);
  BlockedLabel label("oktopk");
  PreparedCall call;
  if (auto e = prepare_call(args.values, args.indices, cap, config, comm, &call); e.failure()) {
    return e;
  }
  const int rank = call.rank, P = call.nranks;
  const WireFormat wire{args.wire_dtype, 0};
  if (args.num_boundaries != P + 1) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.oktopk_allreduce: `boundaries` must have "
                                       "P + 1 entries (P = ranks of `comm`)");
  }
  WireStats& stats = call.stats;
  if (args.partition != 0 && args.partition != 1) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.oktopk_allreduce: partition must be 0 (regions) or 1 (hash owners); "
        "got " + std::to_string(args.partition));
  }
  const bool hashed = args.partition == 1;
  const bool new_bounds = args.recompute_boundaries && !hashed;
  const bool new_threshold = args.recompute_threshold;

  std::vector<int64_t> bounds(P + 1);
  if (hashed) {  // unused: passed through as given
    for (int q = 0; q <= P; ++q) bounds[q] = args.boundaries_in[q];
  } else if (new_bounds && P > 1) {
    if (auto e = balanced_boundaries(call.local.entries, n, comm, rank, P, &bounds, &stats);
        e.failure()) {
      return e;
    }
  } else {
    for (int q = 0; q <= P; ++q) bounds[q] = args.boundaries_in[q];
    bool ok = bounds[0] == 0 && bounds[P] == n;
    for (int q = 0; q < P; ++q) ok &= bounds[q] <= bounds[q + 1];
    if (!ok) {
      return ffi::Error::InvalidArgument(
          "jax_sparse_sync.oktopk_allreduce: `boundaries` must start at 0, end at `size` and "
          "never decrease (pass recompute_boundaries=True to compute them)");
    }
  }

  std::vector<SparseEntry> region;
  if (P > 1 && hashed) {
    std::vector<int64_t> begin;
    const std::vector<SparseEntry> by_owner = sort_by_hash_owner(call.local.entries, P, &begin);
    if (auto e = split_and_reduce(by_owner, begin, nullptr, n, wire, comm, rank, P, &region,
                                  &stats);
        e.failure()) {
      return e;
    }
  } else if (P > 1) {
    if (auto e = split_and_reduce(call.local.entries, slice_offsets(call.local.entries, bounds),
                                  &bounds, n, wire, comm, rank, P, &region, &stats);
        e.failure()) {
      return e;
    }
  } else {
    region = call.local.entries;
  }

  float threshold = args.threshold_in;
  if (new_threshold) {
    uint32_t key = 0;
    if (auto e = global_kth_key(region, k, n, comm, rank, P, &key, &stats); e.failure()) return e;
    std::memcpy(&threshold, &key, sizeof(float));
  }
  const uint32_t tkey = FloatTraits<float>::key(threshold < 0.0f ? 0.0f : threshold);
  std::vector<SparseEntry> selected;
  int64_t nonzero = 0;
  for (const SparseEntry& e : region) {
    const uint32_t key = FloatTraits<float>::key(e.value);
    nonzero += key != 0;
    if (key != 0 && key >= tkey) selected.push_back(e);
  }
  // Per-region count limits, with a reused threshold only (an exact one picks
  // k): keep between min(region_min, nonzero) and region_max entries, the
  // region's exact top by magnitude when the threshold picks fewer or more
  // (ties: the lower index first).
  if (!new_threshold) {
    const int64_t above = static_cast<int64_t>(selected.size());
    const int64_t want =
        std::min(std::max(above, std::min(args.region_min, nonzero)), args.region_max);
    if (want != above) select_region_top(region, want, &selected);
  }
  // What this owner gathers to every rank, itself included: its sums on the wire.
  round_entries(&selected, wire.value_dtype);

  std::vector<SparseEntry> all;
  bool balanced = false;
  if (P > 1) {
    std::vector<int64_t> owner_offset;
    if (auto e = balance_and_allgatherv(selected, n, wire, comm, rank, P, hashed, &all,
                                        &owner_offset, &stats, &balanced);
        e.failure()) {
      return e;
    }
    if (hashed) {
      if (auto e = merge_owner_blocks(&all, owner_offset, rank); e.failure()) return e;
    }
  } else {
    all.swap(selected);
  }

  // `all` is sorted by index: regions are ordered and each is sorted (hash
  // owners' blocks: merged above).
  contributed_mask(args.indices, cap, all, results->contributed);
  if (results->sparse != nullptr) {  // the entries themselves (the CUDA handler's way)
    results->sparse->entries.swap(all);
    results->sparse->used = true;
  } else {
    float* dst = results->out;
    std::fill(dst, dst + n, 0.0f);
    for (const SparseEntry& e : all) dst[e.index] = e.value;
  }
  for (int q = 0; q <= P; ++q) results->boundaries_out[q] = static_cast<int32_t>(bounds[q]);
  *results->threshold_out = threshold;
  stats.result_nnz = static_cast<int64_t>(
      results->sparse != nullptr ? results->sparse->entries.size() : all.size());
  stats.switched_to_dense = balanced ? 1 : 0;  // Ok-Topk: 1 = the balancing step ran
  stats.algorithm = static_cast<int64_t>(Algorithm::kOktopk);
  results->stats = stats;
  return ffi::Error::Success();
}

namespace {

ffi::Error OktopkImpl(ffi::Token, ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> indices,
                      ffi::Buffer<ffi::S32> boundaries_in, ffi::Buffer<ffi::F32> threshold_in,
                      ffi::Buffer<ffi::S32> recompute, ffi::Result<ffi::Token>,
                      ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::U8> contributed,
                      ffi::ResultBuffer<ffi::S32> boundaries_out,
                      ffi::ResultBuffer<ffi::F32> threshold_out,
                      ffi::Result<ffi::AnyBuffer> stats_out, int64_t size, int64_t k,
                      int64_t comm_handle, int64_t nan_policy, int64_t region_min,
                      int64_t region_max, int64_t wire_dtype, int64_t partition) {
  OktopkHostArgs args;
  args.values = values.typed_data();
  args.indices = indices.typed_data();
  args.cap = static_cast<int64_t>(values.element_count());
  args.boundaries_in = boundaries_in.typed_data();
  args.num_boundaries = static_cast<int64_t>(boundaries_in.element_count());
  args.threshold_in = threshold_in.typed_data()[0];
  args.recompute_boundaries = recompute.typed_data()[0] != 0;
  args.recompute_threshold = recompute.typed_data()[1] != 0;
  set_oktopk_attributes(&args, size, k, nan_policy, region_min, region_max, wire_dtype,
                        partition);
  OktopkHostResults results;
  results.out = out->typed_data();
  results.contributed = contributed->typed_data();
  results.boundaries_out = boundaries_out->typed_data();
  results.threshold_out = threshold_out->typed_data();
  SparseResult sparse;  // the CUDA handler's path, under the CPU tests' seam
  if (sparse_result_seam()) results.sparse = &sparse;
  if (auto e = oktopk_allreduce_host(args, comm_from_handle(comm_handle), &results);
      e.failure()) {
    return e;
  }
  if (sparse.used) write_sparse_result(sparse, size, out->typed_data());
  return write_stats(results.stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssOktopkAllreduce, jss::OktopkImpl,
                              jss::sig::bind_oktopk_allreduce(ffi::Ffi::Bind()));
