// Sparse allreduce over MPI, as XLA FFI handlers (CPU).
//
// Input: fixed-capacity COO (values f32[cap], indices s32[cap], padding index
// -1). Output: the dense sum over ranks, f32[size], identical bit for bit on
// every rank, and the wire statistics of this rank, s64[5].
//
// Every algorithm starts with exchange_headers(): one small allgather that
// checks sizes, algorithm, index ranges and the NaN policy on all ranks at
// once, so bad input fails on every rank with the same message.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ffi/mpi_comm.h"
#include "ffi/sparse_allreduce.h"
#include "kernels/float_bits.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr int kTagCount = 7101;
constexpr int kTagData = 7102;

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

int64_t count_nonzero(const float* x, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += (x[i] != 0.0f);
  return c;
}

// ---- dense: MPI_Allreduce of the densified vector (the baseline) ----------
ffi::Error dense_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                           int nranks, float* out, WireStats* stats) {
  std::fill(out, out + n, 0.0f);
  for (const SparseEntry& e : local.entries) out[e.index] = e.value;
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
ffi::Error allgather_allreduce(const SparseStream& local, const std::vector<CallHeader>& headers,
                               int64_t n, MPI_Comm comm, int rank, int nranks, float* out,
                               WireStats* stats) {
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
  JSS_MPI_CHECK(MPI_Allgatherv_c(local.entries.data(), counts[rank], entry_type(), all.data(),
                                 counts.data(), displs.data(), entry_type(), comm),
                "MPI_Allgatherv", rank);
  const int64_t mine = static_cast<int64_t>(counts[rank]) * sizeof(SparseEntry);
  stats->bytes_sent += mine * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(total) * sizeof(SparseEntry) - mine;
  stats->messages += ceil_log2(nranks);

  std::fill(out, out + n, 0.0f);
  for (const SparseEntry& e : all) out[e.index] += e.value;  // rank order: same on every rank
  return ffi::Error::Success();
}

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
  stats->bytes_sent += sizeof(int64_t) + (mine.dense ? n * sizeof(float)
                                                     : my_count * sizeof(SparseEntry));
  stats->bytes_received += sizeof(int64_t) + (theirs->dense ? n * sizeof(float)
                                                            : their_count * sizeof(SparseEntry));
  stats->messages += 2;
  return ffi::Error::Success();
}

ffi::Error recursive_doubling_allreduce(SparseStream local, int64_t n, MPI_Comm comm, int rank,
                                        int nranks, float* out, WireStats* stats) {
  // delta = N * isize / (isize + csize) = N / 2: past it a sparse stream is
  // larger on the wire than the dense vector.
  const int64_t delta = n / 2;
  int p2 = 1;
  while (p2 * 2 <= nranks) p2 *= 2;
  const int extra = nranks - p2;
  bool sw = false;  // per-merge flag; the final representation is what stats report
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
      local = merge_streams(local, upper, n, delta, &sw);
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int partner = rank ^ mask;
      SparseStream theirs;
      if (auto e = exchange_streams(local, &theirs, n, partner, comm, rank, stats); e.failure())
        return e;
      // f(lower group, upper group) on both partners: bitwise-identical results.
      local = rank < partner ? merge_streams(local, theirs, n, delta, &sw)
                             : merge_streams(theirs, local, n, delta, &sw);
    }
    if (rank < extra) {
      if (auto e = send_stream(local, n, rank + p2, comm, rank, stats); e.failure()) return e;
    }
  }
  if (local.dense) {
    std::memcpy(out, local.values.data(), static_cast<size_t>(n) * sizeof(float));
  } else {
    std::fill(out, out + n, 0.0f);
    for (const SparseEntry& e : local.entries) out[e.index] = e.value;
  }
  // Same on every rank: all ranks end with the same stream.
  stats->switched_to_dense = local.dense ? 1 : 0;
  return ffi::Error::Success();
}

ffi::Error SparseAllreduceImpl(ffi::Token, ffi::Buffer<ffi::F32> values,
                               ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::Token>,
                               ffi::ResultBuffer<ffi::F32> out, ffi::Result<ffi::AnyBuffer> stats_out,
                               int64_t size, int64_t algorithm, int64_t comm_handle,
                               int64_t nan_policy) {
  const int64_t cap = static_cast<int64_t>(values.element_count());
  if (stats_out->element_type() != ffi::S64 && stats_out->element_type() != ffi::S32) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.sparse_allreduce: stats must be s32 or s64");
  }
  if (static_cast<int64_t>(indices.element_count()) != cap) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.sparse_allreduce: `values` and `indices` must have the same length");
  }
  if (static_cast<int64_t>(out->element_count()) != size) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.sparse_allreduce: output size mismatch");
  }
  MPI_Comm comm = comm_from_handle(comm_handle);
  int rank = 0, nranks = 1;
  JSS_MPI_CHECK(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", -1);
  JSS_MPI_CHECK(MPI_Comm_size(comm, &nranks), "MPI_Comm_size", rank);

  const float* v = values.typed_data();
  const int32_t* idx = indices.typed_data();
  CallHeader header;
  header.size = size;
  header.algorithm = algorithm;
  for (int64_t i = 0; i < cap; ++i) {
    if (idx[i] < -1 || idx[i] >= size) {
      if (!(header.flags & CallHeader::kBadIndex)) {
        header.flags |= CallHeader::kBadIndex;
        header.bad_index = idx[i];
        header.bad_position = i;
      }
    } else if (idx[i] >= 0 && !is_finite_f32(v[i])) {
      header.flags |= CallHeader::kNonFinite;
    }
  }
  // The stream (padding dropped, duplicates merged) is what travels, so its
  // length is the count the other ranks must expect.
  SparseStream local;
  if (!(header.flags & CallHeader::kBadIndex)) stream_from_coo(v, idx, cap, &local);
  header.nnz = static_cast<int64_t>(local.entries.size());
  WireStats stats;
  std::vector<CallHeader> headers;
  if (auto e = exchange_headers(header, comm, rank, nranks, static_cast<NanPolicy>(nan_policy),
                                "sparse_allreduce", &headers, &stats);
      e.failure()) {
    return e;
  }

  float* dst = out->typed_data();
  ffi::Error err = ffi::Error::Success();
  switch (static_cast<Algorithm>(algorithm)) {
    case Algorithm::kDense:
      err = dense_allreduce(local, size, comm, rank, nranks, dst, &stats);
      break;
    case Algorithm::kAllgather:
      err = allgather_allreduce(local, headers, size, comm, rank, nranks, dst, &stats);
      break;
    case Algorithm::kRecursiveDoubling:
      err = recursive_doubling_allreduce(std::move(local), size, comm, rank, nranks, dst, &stats);
      break;
    default:
      return ffi::Error::InvalidArgument(
          "jax_sparse_sync.sparse_allreduce: unknown algorithm id " + std::to_string(algorithm));
  }
  if (err.failure()) return err;
  stats.result_nnz = count_nonzero(dst, size);
  stats.algorithm = algorithm;
  if (stats_out->element_type() == ffi::S64) {
    stats.write(reinterpret_cast<int64_t*>(stats_out->untyped_data()));
  } else {
    stats.write(reinterpret_cast<int32_t*>(stats_out->untyped_data()));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSparseAllreduce, jss::SparseAllreduceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Token>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Token>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()  // stats: s64, or s32 without x64
                                  .Attr<int64_t>("size")
                                  .Attr<int64_t>("algorithm")
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("nan_policy"));
