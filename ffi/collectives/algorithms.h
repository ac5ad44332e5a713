// The sparse allreduce algorithms, one function each, called by the FFI
// handler in sparse_allreduce_ffi.cc after the argument check. Each writes the
// dense sum into `out` (identical bit for bit on every rank), or its entries into
// `sparse` where one is given and the result is sparse, and adds what it sends
// and receives to `stats`.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ffi/runtime/mpi_comm.h"
#include "ffi/collectives/peer_checks.h"
#include "ffi/collectives/wire_codec.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// A result given as its entries instead of a dense vector: unique indices, the
// rest of the result zero, each value bit for bit what the dense result holds.
// The CUDA handlers ask for it (run_call's `sparse`) so that O(k P) entries cross
// to the device instead of N floats. An algorithm whose result is dense (dense,
// DSAR, a stream that switched to dense) leaves `used` false and writes `out`;
// where `out` is null (the device protocol: no N-sized host buffer unless the
// result is dense), recursive doubling and split-allgather put a dense result in
// `dense` instead.
struct SparseResult {
  std::vector<SparseEntry> entries;
  bool used = false;
  std::vector<float> dense;
};

constexpr int kTagCount = 7101;
constexpr int kTagData = 7102;

// One SparseEntry (int32 index + float value) as an 8-byte MPI type, so
// counts are in entries, not bytes.
MPI_Datatype entry_type();

// The entries of a received message (ffi/collectives/wire_codec.h), or an error naming
// the sender and the phase when the message is malformed.
inline xla::ffi::Error unpack_message(const char* message, int64_t nbytes, int64_t n,
                                      WireFormat wire, int rank, int from, const char* phase,
                                      std::vector<SparseEntry>* out) {
  std::string error;
  if (!unpack_entries(message, nbytes, n, wire, out, &error)) {
    return xla::ffi::Error::Internal("jax_sparse_sync.sparse_allreduce: rank " +
                                     std::to_string(rank) + " received a malformed message from "
                                     "rank " + std::to_string(from) + " (" + phase + "): " + error);
  }
  return xla::ffi::Error::Success();
}

// Dense allreduce of in[n] on a 16-bit wire (wire_dtype 1 bfloat16, 2 float16):
// MPI_Alltoall of the rounded blocks, each summed in float32 by its owner and
// rounded once, MPI_Allgather (dense_and_allgather.cc).
xla::ffi::Error dense_allreduce_16bit(const float* in, float* out, int64_t n, MPI_Comm comm,
                                      int rank, int nranks, int64_t wire_dtype, WireStats* stats);

xla::ffi::Error dense_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                int nranks, WireFormat wire, float* out, WireStats* stats);

xla::ffi::Error allgather_allreduce(const SparseStream& local,
                                    const std::vector<CallHeader>& headers, int64_t n,
                                    MPI_Comm comm, int rank, int nranks, WireFormat wire,
                                    float* out, WireStats* stats, SparseResult* sparse = nullptr);

xla::ffi::Error recursive_doubling_allreduce(SparseStream local, int64_t n, MPI_Comm comm, int rank,
                                             int nranks, WireFormat wire, float* out,
                                             WireStats* stats, SparseResult* sparse = nullptr);

// How DSAR's dense phase travels: plain float32 (bits = 0) or QSGD codes.
struct DensePhaseQuantization {
  int bits = 0;          // 0, 2, 4 or 8
  int64_t bucket = 1024; // entries per QSGD scale
  uint64_t seed = 0;     // mixed with the owner's rank: each range its own stream
};

// Phase 1 of split-allgather and hash partition: this rank's `entries`, cut into
// P slices (slice q is [slice_begin[q], slice_begin[q + 1]), sorted), sent to
// their owners q in the wire format: the byte counts first (one MPI_Alltoall of
// int64), then non-blocking point-to-point messages in rotated order, empty
// slices not sent. received[src] (src != rank): src's slice for this rank.
// A malformed message leaves received[src] empty and its error in `malformed`
// (the first one): only this rank sees it, so the caller carries on with the
// collectives and announces it in phase 2's block sizes (kMalformedBlock), and
// every rank fails with the same kind of error instead of waiting for this one.
xla::ffi::Error exchange_slices(const std::vector<SparseEntry>& entries,
                                const std::vector<int64_t>& slice_begin, int64_t n,
                                WireFormat wire, MPI_Comm comm, int rank, int nranks,
                                const char* what_counts, const char* phase, WireStats* stats,
                                std::vector<std::vector<SparseEntry>>* received,
                                xla::ffi::Error* malformed);

// Phase 2's block size of an owner that received a malformed phase-1 message.
constexpr int64_t kMalformedBlock = -2;

inline xla::ffi::Error malformed_phase1(int rank, int owner) {
  return xla::ffi::Error::Internal(
      "jax_sparse_sync.sparse_allreduce: rank " + std::to_string(owner) +
      " received a malformed message in phase 1 (its own error names the sender); rank " +
      std::to_string(rank) + " stops with it");
}

// SSAR_Split_allgather (dense_phase = false) and DSAR_Split_allgather (true).
xla::ffi::Error split_allgather_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm,
                                          int rank, int nranks, bool dense_phase,
                                          const DensePhaseQuantization& quantization,
                                          WireFormat wire, float* out, WireStats* stats,
                                          SparseResult* sparse = nullptr);

// The owner of index i in the hash-partitioned allreduce: murmur3's 32-bit
// finalizer of i, mod P. Fixed and data-independent; the axis transport
// (jax_sparse_sync/axis/hash_partition.py) computes the same bits.
inline int hash_owner(int32_t index, int nranks) {
  uint32_t h = static_cast<uint32_t>(index);
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return static_cast<int>(h % static_cast<uint32_t>(nranks));
}

// `entries` (ascending indices) reordered by hash_owner(index, P): a stable
// counting sort, so each owner's slice stays in index order; `begin` (P + 1)
// receives where each owner's slice starts. Shared by the hash-partitioned
// allreduce and Ok-Topk's hash owners, so both send each owner the same slice.
inline std::vector<SparseEntry> sort_by_hash_owner(const std::vector<SparseEntry>& entries,
                                                   int nranks, std::vector<int64_t>* begin) {
  begin->assign(static_cast<size_t>(nranks) + 1, 0);
  std::vector<int> owner(entries.size());
  for (size_t e = 0; e < entries.size(); ++e) {
    owner[e] = hash_owner(entries[e].index, nranks);
    ++(*begin)[static_cast<size_t>(owner[e]) + 1];
  }
  for (int q = 0; q < nranks; ++q) (*begin)[q + 1] += (*begin)[q];
  std::vector<SparseEntry> by_owner(entries.size());
  std::vector<int64_t> at(begin->begin(), begin->end() - 1);
  for (size_t e = 0; e < entries.size(); ++e) by_owner[at[owner[e]]++] = entries[e];
  return by_owner;
}

// Hash-partitioned sparse allreduce (ZEN): reduce to hash owners, allgather.
xla::ffi::Error hash_partition_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm,
                                         int rank, int nranks, WireFormat wire, float* out,
                                         WireStats* stats, SparseResult* sparse = nullptr);

}  // namespace jss
