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
// receives the same bits). Phase 2: a sparse allgather of the merged streams
// (int64 block sizes first, then the entries). No dense switch: an owner's
// indices are scattered over [0, N), so there is no contiguous range to send
// dense (at densities where that would pay, use split_allgather or dense).
#include <mpi.h>

#include <cstring>
#include <vector>

#include "ffi/collectives/algorithms.h"

namespace ffi = xla::ffi;

namespace jss {

ffi::Error hash_partition_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                    int nranks, WireFormat wire, float* out, WireStats* stats,
                                    SparseResult* sparse) {
  const int P = nranks;
  std::vector<int64_t> slice_begin;
  const std::vector<SparseEntry> by_owner = sort_by_hash_owner(local.entries, P, &slice_begin);

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
  // format (ffi/collectives/wire_codec.h): the byte counts first, then the messages.
  std::vector<char> message;
  pack_entries(mine.data(), static_cast<int64_t>(mine.size()), wire, &message);
  std::vector<int64_t> sizes(P);
  // A malformed phase-1 message becomes kMalformedBlock, so every rank fails alike.
  if (malformed.failure()) message.clear();
  const int64_t my_size = malformed.failure() ? kMalformedBlock
                                              : static_cast<int64_t>(message.size());
  std::vector<MPI_Count> counts(P);
  std::vector<MPI_Aint> displs(P);
  if (auto e = allgather_lengths(my_size, sizes.data(), comm, rank, P,
                                 "MPI_Allgather (hash block sizes)", stats);
      e.failure()) {
    return e;
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
    counts[q] = static_cast<MPI_Count>(sizes[q]);
    displs[q] = total;
    total += static_cast<MPI_Aint>(sizes[q]);
  }
  std::vector<char> gathered(static_cast<size_t>(total));
  if (auto e = allgather_messages(message, &gathered, counts, displs, comm, rank, P,
                                  "MPI_Allgatherv (hash blocks)", stats);
      e.failure()) {
    return e;
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
