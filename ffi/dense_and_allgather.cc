// dense (MPI_Allreduce baseline) and allgather (TopkA).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ffi/algorithms.h"

namespace ffi = xla::ffi;

namespace jss {

MPI_Datatype entry_type() {
  // One SparseEntry (int32 index + float value) as an 8-byte contiguous type,
  // so counts are in entries, not bytes.
  static MPI_Datatype type = [] {
    MPI_Datatype t;
    MPI_Type_contiguous(static_cast<int>(sizeof(SparseEntry)), MPI_BYTE, &t);
    MPI_Type_commit(&t);
    return t;
  }();
  return type;
}

// ---- dense: MPI_Allreduce of the densified vector (the baseline) ----------
ffi::Error dense_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                           int nranks, float* out, WireStats* stats) {
  if (local.dense) {  // the input was the dense vector (see prepare_call)
    if (n > 0) std::memcpy(out, local.values.data(), static_cast<size_t>(n) * sizeof(float));
  } else {
    std::fill(out, out + n, 0.0f);
    for (const SparseEntry& e : local.entries) out[e.index] = e.value;
  }
  if (nranks > 1) {
    JSS_MPI_CHECK(MPI_Allreduce_c(MPI_IN_PLACE, out, static_cast<MPI_Count>(n), MPI_FLOAT,
                                  MPI_SUM, comm),
                  "MPI_Allreduce", rank);
    // Bandwidth-optimal (Rabenseifner) volume: reduce-scatter + allgather.
    const int64_t vol = 2 * (nranks - 1) * n * static_cast<int64_t>(sizeof(float)) / nranks;
    stats->bytes_sent += vol;
    stats->bytes_received += vol;
    stats->messages += 2 * ceil_log2(nranks);
  }
  return ffi::Error::Success();
}

// ---- allgather (TopkA): gather every rank's entries, sum in rank order ----
ffi::Error allgather_allreduce(const SparseStream& local,
                               const std::vector<CallHeader>& headers,
                               int64_t n, MPI_Comm comm, int rank, int nranks, float* out,
                               WireStats* stats, SparseResult* sparse) {
  std::vector<MPI_Count> counts(nranks);
  std::vector<MPI_Aint> displs(nranks);
  MPI_Aint total = 0;
  for (int r = 0; r < nranks; ++r) {
    counts[r] = static_cast<MPI_Count>(r == rank ? static_cast<int64_t>(local.entries.size())
                                                 : headers[r].nnz);
    displs[r] = total;
    total += static_cast<MPI_Aint>(counts[r]);
  }
  std::vector<SparseEntry> all(static_cast<size_t>(total));
  if (auto e = allgather_blocks(local.entries.data(), all.data(), counts, displs, entry_type(),
                                comm, rank, "MPI_Allgatherv");
      e.failure()) {
    return e;
  }
  const int64_t mine = static_cast<int64_t>(counts[rank]) * sizeof(SparseEntry);
  stats->bytes_sent += mine * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(total) * sizeof(SparseEntry) - mine;
  stats->messages += ceil_log2(nranks);

  if (sparse != nullptr) {
    // The same sums as below, entry by entry. Each rank's run is sorted and
    // unique; merging them one after the other in rank order adds each index's
    // values in rank order, ((v0 + v1) + v2)..., and the final 0 + s gives what
    // out's sums from +0 give (they differ from these only in the sign of a zero).
    std::vector<SparseEntry>& acc = sparse->entries;
    std::vector<SparseEntry> run, merged;
    acc.clear();
    for (int r = 0; r < nranks; ++r) {
      const SparseEntry* begin = all.data() + displs[r];
      run.assign(begin, begin + counts[r]);
      if (r == 0) {
        acc.swap(run);
      } else {
        merge_sparse(acc, run, &merged);
        acc.swap(merged);
      }
    }
    int64_t nnz = 0;
    for (SparseEntry& e : acc) {
      e.value = 0.0f + e.value;
      nnz += static_cast<int64_t>(e.value != 0.0f);
    }
    sparse->used = true;
    stats->result_nnz = nnz;
    return ffi::Error::Success();
  }
  std::fill(out, out + n, 0.0f);
  // Summed in rank order (the same on every rank); the nonzero count follows
  // each entry's change of its slot, so no scan of out is needed.
  int64_t nnz = 0;
  for (const SparseEntry& e : all) {
    const float before = out[e.index];
    const float after = before + e.value;
    out[e.index] = after;
    nnz += static_cast<int64_t>(after != 0.0f) - static_cast<int64_t>(before != 0.0f);
  }
  stats->result_nnz = nnz;
  return ffi::Error::Success();
}

}  // namespace jss
