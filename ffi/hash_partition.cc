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

#include "ffi/algorithms.h"
#include "ffi/peer_checks.h"

namespace ffi = xla::ffi;

namespace jss {

ffi::Error hash_partition_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                    int nranks, float* out, WireStats* stats,
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
  if (P > 1) {
    if (auto e = exchange_counts(send_counts, &recv_counts, comm, rank, P,
                                 "MPI_Alltoall (hash slice sizes)", stats);
        e.failure()) {
      return e;
    }
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (auto e = check_peer_count(recv_counts[q], n, rank, q, "slice size (hash partition)");
          e.failure()) {
        return e;
      }
    }
    std::vector<MPI_Request> requests;
    requests.reserve(2 * P);
    for (int j = 1; j < P; ++j) {
      const int src = (rank - j + P) % P;
      if (recv_counts[src] == 0) continue;
      received[src].resize(static_cast<size_t>(recv_counts[src]));
      requests.emplace_back();
      JSS_MPI_CHECK(MPI_Irecv_c(received[src].data(), recv_counts[src], entry_type(), src,
                                kTagData, comm, &requests.back()),
                    "MPI_Irecv", rank);
      stats->bytes_received += recv_counts[src] * static_cast<int64_t>(sizeof(SparseEntry));
    }
    for (int j = 1; j < P; ++j) {
      const int dst = (rank + j) % P;  // destination rotation
      if (send_counts[dst] == 0) continue;
      requests.emplace_back();
      JSS_MPI_CHECK(MPI_Isend_c(by_owner.data() + slice_begin[dst], send_counts[dst],
                                entry_type(), dst, kTagData, comm, &requests.back()),
                    "MPI_Isend", rank);
      stats->bytes_sent += send_counts[dst] * static_cast<int64_t>(sizeof(SparseEntry));
      stats->messages += 1;
    }
    JSS_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                              MPI_STATUSES_IGNORE),
                  "MPI_Waitall", rank);
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (auto e = check_peer_entries(received[q].data(), static_cast<int64_t>(received[q].size()),
                                      0, n, rank, q, "slice (hash partition)");
          e.failure()) {
        return e;
      }
    }
  }
  received[rank].assign(by_owner.begin() + slice_begin[rank],
                        by_owner.begin() + slice_begin[rank + 1]);

  // The owner's sum of its indices, merged in rank order.
  std::vector<SparseEntry> mine, scratch;
  for (int q = 0; q < P; ++q) {
    merge_sparse(mine, received[q], &scratch);
    mine.swap(scratch);
  }

  // Phase 2: sparse allgather of the owners' merged streams.
  std::vector<int64_t> sizes(P);
  const int64_t my_size = static_cast<int64_t>(mine.size());
  std::vector<MPI_Count> counts(P);
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
  MPI_Aint total = 0;
  for (int q = 0; q < P; ++q) {
    if (q != rank) {
      if (auto e = check_peer_count(sizes[q], n, rank, q, "block size (hash partition)");
          e.failure()) {
        return e;
      }
    }
    counts[q] = static_cast<MPI_Count>(sizes[q]);
    displs[q] = total;
    total += static_cast<MPI_Aint>(sizes[q]);
  }
  std::vector<SparseEntry> all(static_cast<size_t>(total));
  if (P > 1) {
    if (auto e = allgather_blocks(mine.data(), all.data(), counts, displs, entry_type(), comm,
                                  rank, "MPI_Allgatherv (hash blocks)");
        e.failure()) {
      return e;
    }
    const int64_t entry = static_cast<int64_t>(sizeof(SparseEntry));
    stats->bytes_sent += my_size * entry * (P - 1);
    stats->bytes_received += (static_cast<int64_t>(total) - my_size) * entry;
    stats->messages += ceil_log2(P);
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (auto e = check_peer_entries(all.data() + displs[q], sizes[q], 0, n, rank, q,
                                      "block (hash partition)");
          e.failure()) {
        return e;
      }
    }
  } else {
    all = mine;
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
