// The sparse allreduce algorithms, one function each, called by the FFI
// handler in sparse_allreduce_ffi.cc after the argument check. Each writes the
// dense sum into `out` (identical bit for bit on every rank), or its entries into
// `sparse` where one is given and the result is sparse, and adds what it sends
// and receives to `stats`.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "ffi/mpi_comm.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// A result given as its entries instead of a dense vector: unique indices, the
// rest of the result zero, each value bit for bit what the dense result holds.
// The CUDA handlers ask for it (run_call's `sparse`) so that O(k P) entries cross
// to the device instead of N floats. An algorithm whose result is dense (dense,
// DSAR, a stream that switched to dense) leaves `used` false and writes `out`.
struct SparseResult {
  std::vector<SparseEntry> entries;
  bool used = false;
};

constexpr int kTagCount = 7101;
constexpr int kTagData = 7102;

// One SparseEntry (int32 index + float value) as an 8-byte MPI type, so
// counts are in entries, not bytes.
MPI_Datatype entry_type();

xla::ffi::Error dense_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                int nranks, float* out, WireStats* stats);

xla::ffi::Error allgather_allreduce(const SparseStream& local,
                                    const std::vector<CallHeader>& headers, int64_t n,
                                    MPI_Comm comm, int rank, int nranks, float* out,
                                    WireStats* stats, SparseResult* sparse = nullptr);

xla::ffi::Error recursive_doubling_allreduce(SparseStream local, int64_t n, MPI_Comm comm, int rank,
                                             int nranks, float* out, WireStats* stats,
                                             SparseResult* sparse = nullptr);

// How DSAR's dense phase travels: plain float32 (bits = 0) or QSGD codes.
struct DensePhaseQuantization {
  int bits = 0;          // 0, 2, 4 or 8
  int64_t bucket = 1024; // entries per QSGD scale
  uint64_t seed = 0;     // mixed with the owner's rank: each range its own stream
};

// SSAR_Split_allgather (dense_phase = false) and DSAR_Split_allgather (true).
xla::ffi::Error split_allgather_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm,
                                          int rank, int nranks, bool dense_phase,
                                          const DensePhaseQuantization& quantization, float* out,
                                          WireStats* stats, SparseResult* sparse = nullptr);

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

// Hash-partitioned sparse allreduce (ZEN): reduce to hash owners, allgather.
xla::ffi::Error hash_partition_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm,
                                         int rank, int nranks, float* out, WireStats* stats,
                                         SparseResult* sparse = nullptr);

}  // namespace jss
