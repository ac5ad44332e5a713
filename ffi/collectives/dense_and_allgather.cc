// dense (MPI_Allreduce baseline) and allgather (TopkA) of the sparse
// allreduce, and the dense allreduce's own FFI handler (jss_dense_allreduce:
// dense_sync and every dense phase of the sparse transforms).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/collectives_host.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/watchdog.h"
#include "kernels/dense_fill.h"
#include "kernels/float_bits.h"
#include "xla/ffi/api/ffi.h"

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

namespace {

// One MPI_Allreduce of n floats (in place when in == out) and its bytes: the
// dense algorithm of the sparse allreduce and the dense allreduce's own handler.
ffi::Error float_allreduce(const float* in, float* out, int64_t n, MPI_Comm comm, int rank,
                           int nranks, WireStats* stats) {
  JSS_MPI_CHECK(MPI_Allreduce_c(in == out ? MPI_IN_PLACE : in, out, static_cast<MPI_Count>(n),
                                MPI_FLOAT, MPI_SUM, comm),
                "MPI_Allreduce", rank);
  // Bandwidth-optimal (Rabenseifner) volume: reduce-scatter + allgather.
  const int64_t vol = 2 * (nranks - 1) * n * static_cast<int64_t>(sizeof(float)) / nranks;
  stats->bytes_sent += vol;
  stats->bytes_received += vol;
  stats->messages += 2 * ceil_log2(nranks);
  return ffi::Error::Success();
}

}  // namespace

// ---- dense: MPI_Allreduce of the densified vector (the baseline) ----------
ffi::Error dense_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                           int nranks, WireFormat wire, float* out, WireStats* stats) {
  if (local.dense) {  // the input was the dense vector (see prepare_call)
    if (n > 0) std::memcpy(out, local.values.data(), static_cast<size_t>(n) * sizeof(float));
  } else {
    zero_fill(out, n);
    for (const SparseEntry& e : local.entries) out[e.index] = e.value;
  }
  // A 16-bit wire: the dense allreduce's own (no indices travel, so the index
  // encoding does not apply).
  if (wire.value_dtype != 0 && n > 0) {
    return dense_allreduce_16bit(out, out, n, comm, rank, nranks, wire.value_dtype, stats);
  }
  if (nranks > 1) return float_allreduce(out, out, n, comm, rank, nranks, stats);
  return ffi::Error::Success();
}

// ---- allgather (TopkA): gather every rank's entries, sum in rank order ----
ffi::Error allgather_allreduce(const SparseStream& local,
                               const std::vector<CallHeader>& headers,
                               int64_t n, MPI_Comm comm, int rank, int nranks, WireFormat wire,
                               float* out, WireStats* stats, SparseResult* sparse) {
  std::vector<MPI_Count> counts(nranks);
  std::vector<MPI_Aint> displs(nranks);
  MPI_Aint total = 0;
  std::vector<SparseEntry> all;  // plain wire: every rank's entries, rank after rank
  // encoded wire: every rank's message, rank after rank, bytes[r] at byte_displs[r]
  std::vector<char> gathered;
  std::vector<int64_t> bytes(nranks);
  std::vector<MPI_Aint> byte_displs(nranks);
  for (int r = 0; r < nranks; ++r) {  // a peer's count sizes what this rank allocates
    if (r == rank) continue;
    if (auto e = check_peer_count(headers[r].nnz, n, rank, r, "entry count (allgather)");
        e.failure()) {
      return e;
    }
  }
  if (wire.plain()) {  // the entries themselves, 8 bytes each; counts from the headers
    for (int r = 0; r < nranks; ++r) {
      counts[r] = static_cast<MPI_Count>(r == rank ? static_cast<int64_t>(local.entries.size())
                                                   : headers[r].nnz);
      displs[r] = total;
      total += static_cast<MPI_Aint>(counts[r]);
    }
    all.resize(static_cast<size_t>(total));
    if (auto e = allgather_blocks(local.entries.data(), all.data(), counts, displs, entry_type(),
                                  comm, rank, "MPI_Allgatherv");
        e.failure()) {
      return e;
    }
    for (int r = 0; r < nranks; ++r) {  // the entries are used as indices below
      if (r == rank) continue;
      if (auto e = check_peer_entries(all.data() + displs[r], counts[r], 0, n, rank, r,
                                      "entries (allgather)");
          e.failure()) {
        return e;
      }
    }
    const int64_t mine = static_cast<int64_t>(counts[rank]) * sizeof(SparseEntry);
    stats->bytes_sent += mine * (nranks - 1);
    stats->bytes_received += static_cast<int64_t>(total) * sizeof(SparseEntry) - mine;
    stats->messages += ceil_log2(nranks);
  } else {
    // Every rank's message in the wire format (ffi/collectives/wire_codec.h). With int32
    // indices its length follows from the headers' counts; an encoded message's
    // does not, so the byte counts are allgathered first (8 bytes per rank).
    std::vector<char> message;
    pack_entries(local.entries.data(), static_cast<int64_t>(local.entries.size()), wire, &message);
    if (wire.index_encoding == 0) {
      for (int r = 0; r < nranks; ++r) bytes[r] = list_message_bytes(headers[r].nnz, wire);
      bytes[rank] = static_cast<int64_t>(message.size());
    } else {
      const int64_t my_bytes = static_cast<int64_t>(message.size());
      if (auto e = allgather_int64(my_bytes, bytes.data(), comm, rank, nranks,
                                   "MPI_Allgather (message sizes)", stats);
          e.failure()) {
        return e;
      }
      for (int r = 0; r < nranks; ++r) {
        if (r == rank) continue;
        if (auto e = check_peer_count(bytes[r], max_message_bytes(n, wire), rank, r,
                                      "message length (allgather)");
            e.failure()) {
          return e;
        }
      }
    }
    std::vector<MPI_Count> byte_counts(nranks);
    MPI_Aint total_bytes = 0;
    for (int r = 0; r < nranks; ++r) {
      byte_counts[r] = static_cast<MPI_Count>(bytes[r]);
      byte_displs[r] = total_bytes;
      total_bytes += static_cast<MPI_Aint>(bytes[r]);
    }
    gathered.resize(static_cast<size_t>(total_bytes));
    if (auto e = allgather_blocks(message.data(), gathered.data(), byte_counts, byte_displs,
                                  MPI_BYTE, comm, rank, "MPI_Allgatherv (messages)");
        e.failure()) {
      return e;
    }
    stats->bytes_sent += static_cast<int64_t>(message.size()) * (nranks - 1);
    stats->bytes_received += static_cast<int64_t>(total_bytes) - static_cast<int64_t>(message.size());
    stats->messages += ceil_log2(nranks);
  }

  // Rank r's entries, r = 0..P-1 in that order: the sums below add each index's
  // values in rank order, the same on every rank. Over a plain wire they are
  // `all`'s blocks; over an encoded one this rank's own are its stream (already
  // rounded to the wire dtype by prepare_call, so the same values and indices
  // its message decodes to: the others' copies of them) and a peer's are its
  // message decoded into one reused block, summed before the next is decoded
  // (no copy of all P blocks; at P = 2 one decode a call instead of two).
  std::vector<SparseEntry> block;
  auto for_each_block = [&](auto&& visit) -> ffi::Error {
    for (int r = 0; r < nranks; ++r) {
      if (wire.plain()) {
        visit(all.data() + displs[r], static_cast<int64_t>(counts[r]));
      } else if (r == rank) {
        visit(local.entries.data(), static_cast<int64_t>(local.entries.size()));
      } else {
        if (auto e = unpack_message(gathered.data() + byte_displs[r], bytes[r], n, wire, rank, r,
                                    "allgather", &block);
            e.failure()) {
          return e;
        }
        visit(block.data(), static_cast<int64_t>(block.size()));
      }
    }
    return ffi::Error::Success();
  };

  if (sparse != nullptr) {
    // The same sums as below, entry by entry. Each rank's run is sorted and
    // unique; merging them one after the other in rank order adds each index's
    // values in rank order, ((v0 + v1) + v2)..., and the final 0 + s gives what
    // out's sums from +0 give (they differ from these only in the sign of a zero).
    std::vector<SparseEntry>& acc = sparse->entries;
    std::vector<SparseEntry> run, merged;
    acc.clear();
    bool first = true;
    if (auto e = for_each_block([&](const SparseEntry* begin, int64_t m) {
          run.assign(begin, begin + m);
          if (first) {
            acc.swap(run);
            first = false;
          } else {
            merge_sparse(acc, run, &merged);
            acc.swap(merged);
          }
        });
        e.failure()) {
      return e;
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
  // Summed in rank order (the same on every rank): out = ((0 + v0) + v1) + ...
  // out is zeroed first (streaming stores for a large one: kernels/dense_fill.h;
  // at 10K entries into 10M that fill is most of the call), rank 0's block is
  // written as 0 + v, and the later blocks add into out. The nonzero count
  // follows each entry's change of its slot, so no scan of out is needed.
  int64_t nnz = 0;
  bool first = true;
  zero_fill(out, n);
  if (auto e = for_each_block([&](const SparseEntry* begin, int64_t m) {
        if (first) {
          first = false;
          for (const SparseEntry* it = begin; it != begin + m; ++it) {
            const float after = 0.0f + it->value;
            out[it->index] = after;
            nnz += static_cast<int64_t>(after != 0.0f);
          }
          return;
        }
        for (const SparseEntry* it = begin; it != begin + m; ++it) {
          const float before = out[it->index];
          const float after = before + it->value;
          out[it->index] = after;
          nnz += static_cast<int64_t>(after != 0.0f) - static_cast<int64_t>(before != 0.0f);
        }
      });
      e.failure()) {
    return e;
  }
  stats->result_nnz = nnz;
  return ffi::Error::Success();
}

// ---- the dense allreduce of a float32 vector (jss_dense_allreduce) -------
// No indices, no stream, no scatter: the argument check (the 56-byte header
// allgather every collective begins with), then one MPI_Allreduce written
// straight into `out`, in place when XLA aliased `out` to `in` (the operand is
// a temporary of the step or a donated buffer: jax_sparse_sync/mpi/dense_allreduce.py).
//
// Why MPI_Allreduce and not reduce-scatter + allgather: the MPI standard only
// recommends (MPI-4.1 §6.9.1, "advice to implementors") that a reduction give
// the same result on every process. MPICH's allreduce algorithms do: in
// reduce-scatter + allgather (Rabenseifner), ring and reduce + broadcast
// (shared-memory release/gather) each entry's sum is computed on one rank and
// copied to the others; in recursive doubling / exchange (k = 2) both
// partners add the same two operands (IEEE addition is commutative bit for
// bit), so both hold the same sums after every round. tests/mpi checks the
// bytes across ranks at every rank count of the suite, odd ones included.
namespace {

// The 16-bit wire (wire_dtype bfloat16 / float16): each rank rounds its vector
// to W (nearest even) and sends rank q the q-th of P equal blocks (MPI_Alltoall;
// the vector is padded with zeros to P blocks of ceil(N/P)); rank q sums the P
// blocks it received in float32, in rank order, rounds that sum to W once and
// the blocks are gathered to every rank (MPI_Allgather). Half of float32's
// bytes (exactly, when P divides N), two roundings to W per entry (the input,
// the sum), and the same bits on every rank by construction (each block's sum
// is computed by one rank).
template <typename W>
ffi::Error dense_allreduce_16bit_as(const float* in, float* out, int64_t n, MPI_Comm comm, int rank,
                                    int nranks, WireStats* stats) {
  using Tr = FloatTraits<W>;
  const int64_t block = (n + nranks - 1) / nranks;
  const size_t padded = static_cast<size_t>(block) * nranks;
  // Two buffers of P blocks, not value-initialised (no zero fill of N entries): the
  // sums (`mine`) go into `send`'s first block once the all-to-all has read it, and the
  // allgather lands in `recv` once the sums have read it.
  std::unique_ptr<uint16_t[]> send_buffer(new uint16_t[padded]), recv_buffer(new uint16_t[padded]);
  uint16_t* send = send_buffer.get();
  uint16_t* recv = recv_buffer.get();
  for (int64_t i = 0; i < n; ++i) send[i] = Tr::from_float(in[i]).bits;
  std::fill(send + n, send + padded, uint16_t{0});  // the padding: zeros
  JSS_MPI_CHECK(MPI_Alltoall_c(send, static_cast<MPI_Count>(block), MPI_UINT16_T, recv,
                               static_cast<MPI_Count>(block), MPI_UINT16_T, comm),
                "MPI_Alltoall (dense_allreduce, 16-bit wire)", rank);
  // The sums in rank order, a block at a time (loops that vectorise), in `out`'s
  // first block: `in` (which may be `out`) has been read, and `out` is written last.
  uint16_t* mine = send;
  float* acc = out;
  for (int64_t i = 0; i < block; ++i) acc[i] = Tr::to_float(W{recv[i]});
  for (int r = 1; r < nranks; ++r) {
    const uint16_t* theirs = recv + static_cast<size_t>(r) * block;
    for (int64_t i = 0; i < block; ++i) acc[i] += Tr::to_float(W{theirs[i]});
  }
  for (int64_t i = 0; i < block; ++i) mine[i] = Tr::from_float(acc[i]).bits;
  uint16_t* all = recv;
  JSS_MPI_CHECK(MPI_Allgather_c(mine, static_cast<MPI_Count>(block), MPI_UINT16_T, all,
                                static_cast<MPI_Count>(block), MPI_UINT16_T, comm),
                "MPI_Allgather (dense_allreduce, 16-bit wire)", rank);
  for (int64_t i = 0; i < n; ++i) out[i] = Tr::to_float(W{all[i]});
  const int64_t vol = 2 * (nranks - 1) * block * static_cast<int64_t>(sizeof(uint16_t));
  stats->bytes_sent += vol;
  stats->bytes_received += vol;
  stats->messages += (nranks - 1) + ceil_log2(nranks);
  return ffi::Error::Success();
}

}  // namespace

ffi::Error dense_allreduce_16bit(const float* in, float* out, int64_t n, MPI_Comm comm, int rank,
                                 int nranks, int64_t wire_dtype, WireStats* stats) {
  return wire_dtype == 1
             ? dense_allreduce_16bit_as<bfloat16_t>(in, out, n, comm, rank, nranks, stats)
             : dense_allreduce_16bit_as<float16_t>(in, out, n, comm, rank, nranks, stats);
}

ffi::Error dense_allreduce_host(const float* in, float* out, int64_t n, MPI_Comm comm,
                                int64_t nan_policy, int64_t wire_dtype, WireStats* stats) {
  if (wire_dtype < 0 || wire_dtype > 2) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.dense_allreduce: wire_dtype must be 0 (float32), 1 (bfloat16) or 2 "
        "(float16)");
  }
  BlockedLabel label("dense_allreduce");
  int rank = 0, nranks = 1;
  JSS_MPI_CHECK(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", -1);
  JSS_MPI_CHECK(MPI_Comm_size(comm, &nranks), "MPI_Comm_size", rank);
  CallHeader header;
  header.size = n;
  header.nnz = n;
  header.algorithm = static_cast<int64_t>(Algorithm::kDense);
  header.param = wire_dtype;  // must agree: the blocks' byte counts depend on it
  if (static_cast<NanPolicy>(nan_policy) == NanPolicy::kRaise) {
    // One read of the input (not the sum: an overflow to Inf is no error, as in
    // the sparse algorithms), only under nan_policy="raise".
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) finite &= is_finite_f32(in[i]);
    if (!finite) header.flags |= CallHeader::kNonFinite;
  }
  std::vector<CallHeader> headers;
  if (auto e = exchange_headers(header, comm, rank, nranks, static_cast<NanPolicy>(nan_policy),
                                "dense_allreduce", &headers, stats);
      e.failure()) {
    return e;
  }
  if (wire_dtype != 0 && n > 0) {
    if (auto e = dense_allreduce_16bit(in, out, n, comm, rank, nranks, wire_dtype, stats);
        e.failure()) {
      return e;
    }
  } else if (nranks > 1 && n > 0) {
    if (auto e = float_allreduce(in, out, n, comm, rank, nranks, stats); e.failure()) return e;
  } else if (in != out && n > 0) {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
  }
  // The result is dense: its nonzero count is not scanned for (one more read
  // of N floats per call), as in the axis transport's dense psum.
  stats->result_nnz = n;
  stats->algorithm = static_cast<int64_t>(Algorithm::kDense);
  return ffi::Error::Success();
}

namespace {

ffi::Error DenseAllreduceImpl(ffi::Token, ffi::Buffer<ffi::F32> x, ffi::Result<ffi::Token>,
                              ffi::ResultBuffer<ffi::F32> out,
                              ffi::Result<ffi::AnyBuffer> stats_out, int64_t comm_handle,
                              int64_t nan_policy, int64_t wire_dtype) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (static_cast<int64_t>(out->element_count()) != n) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.dense_allreduce: output size does not match the input");
  }
  WireStats stats;
  MPI_Comm comm = comm_from_handle(comm_handle);
  WatchdogScope watchdog("dense_allreduce", comm);
  if (auto e = dense_allreduce_host(x.typed_data(), out->typed_data(), n, comm, nan_policy,
                                    wire_dtype, &stats);
      e.failure()) {
    return e;
  }
  return write_stats(stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssDenseAllreduce, jss::DenseAllreduceImpl,
                              jss::sig::bind_dense_allreduce(ffi::Ffi::Bind()));
