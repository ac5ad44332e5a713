// SSAR_Recursive_double: log P rounds of exchanging and merging sorted sparse
// streams, dense past delta = N/2; non-power-of-two P folds the extra ranks in.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ffi/algorithms.h"
#include "ffi/peer_checks.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

// ---- recursive doubling (SSAR_Recursive_double) ---------------------------
ffi::Error send_stream(const SparseStream& s, int64_t n, int dest, MPI_Comm comm, int rank,
                       WireStats* stats) {
  const int64_t count = s.dense ? -1 : static_cast<int64_t>(s.entries.size());
  JSS_MPI_CHECK(MPI_Send(&count, 1, MPI_INT64_T, dest, kTagCount, comm), "MPI_Send", rank);
  if (s.dense) {
    JSS_MPI_CHECK(MPI_Send_c(s.values.data(), n, MPI_FLOAT, dest, kTagData, comm), "MPI_Send", rank);
  } else {
    JSS_MPI_CHECK(MPI_Send_c(s.entries.data(), count, entry_type(), dest, kTagData, comm),
                  "MPI_Send", rank);
  }
  stats->bytes_sent += sizeof(int64_t) + (s.dense ? n * sizeof(float) : count * sizeof(SparseEntry));
  stats->messages += 2;
  return ffi::Error::Success();
}

ffi::Error recv_stream(SparseStream* s, int64_t n, int src, MPI_Comm comm, int rank,
                       WireStats* stats) {
  int64_t count = 0;
  JSS_MPI_CHECK(MPI_Recv(&count, 1, MPI_INT64_T, src, kTagCount, comm, MPI_STATUS_IGNORE),
                "MPI_Recv", rank);
  if (count < -1 || count > n) {  // -1: dense; a sparse stream has unique indices < n
    return check_peer_count(count, n, rank, src, "stream length (recursive doubling)");
  }
  s->dense = count < 0;
  if (s->dense) {
    s->entries.clear();
    s->values.resize(static_cast<size_t>(n));
    JSS_MPI_CHECK(MPI_Recv_c(s->values.data(), n, MPI_FLOAT, src, kTagData, comm,
                             MPI_STATUS_IGNORE), "MPI_Recv", rank);
  } else {
    s->values.clear();
    s->entries.resize(static_cast<size_t>(count));
    JSS_MPI_CHECK(MPI_Recv_c(s->entries.data(), count, entry_type(), src, kTagData, comm,
                             MPI_STATUS_IGNORE), "MPI_Recv", rank);
    if (auto e = check_peer_entries(s->entries.data(), count, 0, n, rank, src,
                                    "stream (recursive doubling)");
        e.failure()) {
      return e;
    }
  }
  stats->bytes_received += sizeof(int64_t) + (s->dense ? n * sizeof(float)
                                                       : count * sizeof(SparseEntry));
  return ffi::Error::Success();
}

// Both directions of one round at once (MPI_Sendrecv), counts first.
ffi::Error exchange_streams(const SparseStream& mine, SparseStream* theirs, int64_t n, int partner,
                            MPI_Comm comm, int rank, WireStats* stats) {
  const int64_t my_count = mine.dense ? -1 : static_cast<int64_t>(mine.entries.size());
  int64_t their_count = 0;
  JSS_MPI_CHECK(MPI_Sendrecv(&my_count, 1, MPI_INT64_T, partner, kTagCount, &their_count, 1,
                             MPI_INT64_T, partner, kTagCount, comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv", rank);
  if (their_count < -1 || their_count > n) {
    return check_peer_count(their_count, n, rank, partner, "stream length (recursive doubling)");
  }
  theirs->dense = their_count < 0;
  const void* sbuf = mine.dense ? static_cast<const void*>(mine.values.data())
                                : static_cast<const void*>(mine.entries.data());
  const MPI_Count scount = mine.dense ? n : my_count;
  MPI_Datatype stype = mine.dense ? MPI_FLOAT : entry_type();
  void* rbuf;
  MPI_Count rcount;
  MPI_Datatype rtype;
  if (theirs->dense) {
    theirs->entries.clear();
    theirs->values.resize(static_cast<size_t>(n));
    rbuf = theirs->values.data(); rcount = n; rtype = MPI_FLOAT;
  } else {
    theirs->values.clear();
    theirs->entries.resize(static_cast<size_t>(their_count));
    rbuf = theirs->entries.data(); rcount = their_count; rtype = entry_type();
  }
  JSS_MPI_CHECK(MPI_Sendrecv_c(sbuf, scount, stype, partner, kTagData, rbuf, rcount, rtype, partner,
                               kTagData, comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv", rank);
  if (auto e = check_peer_entries(theirs->entries.data(), theirs->dense ? 0 : their_count, 0, n,
                                  rank, partner, "stream (recursive doubling)");
      e.failure()) {
    return e;
  }
  stats->bytes_sent += sizeof(int64_t) + (mine.dense ? n * sizeof(float)
                                                     : my_count * sizeof(SparseEntry));
  stats->bytes_received += sizeof(int64_t) + (theirs->dense ? n * sizeof(float)
                                                            : their_count * sizeof(SparseEntry));
  stats->messages += 2;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error recursive_doubling_allreduce(SparseStream local, int64_t n, MPI_Comm comm, int rank,
                                        int nranks, float* out, WireStats* stats,
                                        SparseResult* sparse) {
  // delta = N * isize / (isize + csize) = N / 2: past it a sparse stream is
  // larger on the wire than the dense vector.
  const int64_t delta = n / 2;
  int p2 = 1;
  while (p2 * 2 <= nranks) p2 *= 2;
  const int extra = nranks - p2;
  if (!local.dense && static_cast<int64_t>(local.entries.size()) > delta) {
    densify(local.entries, n, &local.values);  // already past delta before any round
    local.entries.clear();
    local.dense = true;
  }

  // Fold: ranks p2..P-1 hand their stream to rank - p2 and wait for the result.
  if (rank >= p2) {
    if (auto e = send_stream(local, n, rank - p2, comm, rank, stats); e.failure()) return e;
    if (auto e = recv_stream(&local, n, rank - p2, comm, rank, stats); e.failure()) return e;
  } else {
    if (rank < extra) {
      SparseStream upper;
      if (auto e = recv_stream(&upper, n, rank + p2, comm, rank, stats); e.failure()) return e;
      local = merge_streams(local, upper, n, delta);
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int partner = rank ^ mask;
      SparseStream theirs;
      if (auto e = exchange_streams(local, &theirs, n, partner, comm, rank, stats); e.failure())
        return e;
      // f(lower group, upper group) on both partners: bitwise-identical results.
      local = rank < partner ? merge_streams(local, theirs, n, delta)
                             : merge_streams(theirs, local, n, delta);
    }
    if (rank < extra) {
      if (auto e = send_stream(local, n, rank + p2, comm, rank, stats); e.failure()) return e;
    }
  }
  if (local.dense) {
    std::memcpy(out, local.values.data(), static_cast<size_t>(n) * sizeof(float));
  } else if (sparse != nullptr) {
    stats->result_nnz = count_nonzero_values(local.entries);
    sparse->entries = std::move(local.entries);
    sparse->used = true;
  } else {
    std::fill(out, out + n, 0.0f);
    for (const SparseEntry& e : local.entries) out[e.index] = e.value;
    stats->result_nnz = count_nonzero_values(local.entries);  // a dense result is scanned
  }
  // Same on every rank: all ranks end with the same stream.
  stats->switched_to_dense = local.dense ? 1 : 0;
  return ffi::Error::Success();
}

}  // namespace jss
