// Hash-partitioned sparse allreduce (ZEN, OSDI '25: "hash_partition").
//
// SSAR_Split_allgather's owners hold contiguous ranges, so when the gradients
// concentrate (an embedding table's rows, the last layers) one owner receives
// most of the entries. Here index i belongs to rank hash_owner(i, P), a fixed,
// data-independent hash (murmur3's 32-bit finalizer, mod P): whatever the
// support, every owner's share is close to 1/P of it.
//
// Phase 1: every rank sends each owner the (index-sorted) entries it owns,
// with non-blocking point-to-point calls in rotated order after an
// MPI_Alltoall of the int64 counts; empty slices are not sent. The owner
// merges the P slices in rank order (only the owner sums, so every rank later
// receives the same bits). Phase 2: a sparse allgather of the merged streams:
// an MPI_Allgather of the int64 block sizes, then each owner sends its block
// to every other rank point to point (broadcast_blocks). No dense switch: an owner's
// indices are scattered over [0, N), so there is no contiguous range to send
// dense (at densities where that would pay, use split_allgather or dense).
#include <mpi.h>

#include <cstring>
#include <vector>

#include "ffi/algorithms.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr int kTagBlock = 7104;

// Phase 2's allgather of the owners' blocks (sizes[q] bytes each, known on
// every rank) as direct point-to-point messages: each owner sends its block to
// every other rank, all at once, in rotated order; empty blocks are not sent.
// The same bytes as MPI_Allgatherv, which MPICH runs as a ring of P - 1
// dependent steps: with ranks sharing cores each step waits for a peer to be
// scheduled (320 kB blocks, P = 4 on 2 cores: MPI_Allgatherv 134 ms, these
// P - 1 independent messages 7 ms; docs/topics/wire_formats.md).
ffi::Error broadcast_blocks(const std::vector<char>& message, const std::vector<int64_t>& sizes,
                            const std::vector<MPI_Aint>& displs, MPI_Comm comm, int rank, int P,
                            std::vector<char>* gathered) {
  std::vector<MPI_Request> requests;
  std::vector<RequestPeer> peers;  // for the watchdog's report
  requests.reserve(static_cast<size_t>(2 * P));
  peers.reserve(static_cast<size_t>(2 * P));
  for (int j = 1; j < P; ++j) {
    const int src = (rank - j + P) % P;
    if (sizes[src] <= 0) continue;
    requests.emplace_back();
    peers.push_back(RequestPeer{src, 0, sizes[src]});
    JSS_MPI_CHECK(MPI_Irecv_c(gathered->data() + displs[src], sizes[src], MPI_BYTE, src, kTagBlock,
                              comm, &requests.back()),
                  "MPI_Irecv (hash block)", rank);
  }
  const int64_t my_size = sizes[rank];
  if (my_size > 0) {
    std::memcpy(gathered->data() + displs[rank], message.data(), static_cast<size_t>(my_size));
    for (int j = 1; j < P; ++j) {
      const int dst = (rank + j) % P;
      requests.emplace_back();
      peers.push_back(RequestPeer{dst, 1, my_size});
      JSS_MPI_CHECK(MPI_Isend_c(message.data(), my_size, MPI_BYTE, dst, kTagBlock, comm,
                                &requests.back()),
                    "MPI_Isend (hash block)", rank);
    }
  }
  if (int rc = wait_all_tracked(&requests, peers, "MPI_Waitall (hash blocks)", comm);
      rc != MPI_SUCCESS) {
    return mpi_error(rc, "MPI_Waitall (hash blocks)", rank);
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error hash_partition_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                    int nranks, WireFormat wire, float* out, WireStats* stats,
                                    SparseResult* sparse) {
  const int P = nranks;
  // Counting sort of the local stream by owner; stable, so each slice stays sorted.
  std::vector<int64_t> send_counts(P, 0), recv_counts(P, 0), slice_begin(P + 1, 0);
  std::vector<int> owner(local.entries.size());
  for (size_t e = 0; e < local.entries.size(); ++e) {
    owner[e] = hash_owner(local.entries[e].index, P);
    ++send_counts[owner[e]];
  }
  for (int q = 0; q < P; ++q) slice_begin[q + 1] = slice_begin[q] + send_counts[q];
  std::vector<SparseEntry> by_owner(local.entries.size());
  {
    std::vector<int64_t> at(slice_begin.begin(), slice_begin.end() - 1);
    for (size_t e = 0; e < local.entries.size(); ++e) by_owner[at[owner[e]]++] = local.entries[e];
  }

  std::vector<std::vector<SparseEntry>> received(P);
  ffi::Error malformed = ffi::Error::Success();
  if (auto e = exchange_slices(by_owner, slice_begin, n, wire, comm, rank, P,
                               "MPI_Waitall (hash slice sizes)", "hash-partition phase 1", stats,
                               &received, &malformed);
      e.failure()) {
    return e;
  }
  received[rank].assign(by_owner.begin() + slice_begin[rank],
                        by_owner.begin() + slice_begin[rank + 1]);

  // The owner's sum of its indices, merged in rank order.
  std::vector<SparseEntry> mine, scratch;
  for (int q = 0; q < P; ++q) {
    merge_sparse(mine, received[q], &scratch);
    mine.swap(scratch);
  }

  // Phase 2: sparse allgather of the owners' merged streams, each in the wire
  // format (ffi/wire_codec.h): the byte counts first, then the messages.
  std::vector<char> message;
  pack_entries(mine.data(), static_cast<int64_t>(mine.size()), wire, &message);
  std::vector<int64_t> sizes(P);
  // A malformed phase-1 message becomes kMalformedBlock, so every rank fails alike.
  if (malformed.failure()) message.clear();
  const int64_t my_size = malformed.failure() ? kMalformedBlock
                                              : static_cast<int64_t>(message.size());
  std::vector<MPI_Aint> displs(P);
  if (P > 1) {
    JSS_MPI_CHECK(MPI_Allgather(&my_size, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm),
                  "MPI_Allgather (hash block sizes)", rank);
    stats->bytes_sent += static_cast<int64_t>(sizeof(int64_t)) * (P - 1);
    stats->bytes_received += static_cast<int64_t>(sizeof(int64_t)) * (P - 1);
    stats->messages += ceil_log2(P);
  } else {
    sizes[0] = my_size;
  }
  if (malformed.failure()) return malformed;
  for (int q = 0; q < P; ++q) {
    if (sizes[q] == kMalformedBlock) return malformed_phase1(rank, q);
    if (q == rank) continue;
    if (auto e = check_peer_count(sizes[q], max_message_bytes(n, wire), rank, q,
                                  "block length (hash-partition phase 2)");
        e.failure()) {
      return e;
    }
  }
  MPI_Aint total = 0;
  for (int q = 0; q < P; ++q) {
    displs[q] = total;
    total += static_cast<MPI_Aint>(sizes[q]);
  }
  std::vector<char> gathered(static_cast<size_t>(total));
  if (P > 1) {
    if (auto e = broadcast_blocks(message, sizes, displs, comm, rank, P, &gathered); e.failure()) {
      return e;
    }
    stats->bytes_sent += my_size * (P - 1);
    stats->bytes_received += static_cast<int64_t>(total) - my_size;
    stats->messages += my_size > 0 ? P - 1 : 0;
  } else {
    gathered = message;
  }
  // Every rank decodes every block, its own included: all hold the same values.
  std::vector<SparseEntry> all, block;
  for (int q = 0; q < P; ++q) {
    if (auto e = unpack_message(gathered.data() + displs[q], sizes[q], n, wire, rank, q,
                                "hash-partition phase 2", &block);
        e.failure()) {
      return e;
    }
    all.insert(all.end(), block.begin(), block.end());
  }
  stats->result_nnz = count_nonzero_values(all);
  stats->switched_to_dense = 0;
  if (sparse != nullptr) {  // the owners' indices are disjoint: the entries are the result
    sparse->entries = std::move(all);
    sparse->used = true;
    return ffi::Error::Success();
  }
  std::fill(out, out + n, 0.0f);
  for (const SparseEntry& e : all) out[e.index] = e.value;
  return ffi::Error::Success();
}

}  // namespace jss
