// The sparse allreduce algorithms, one function each, called by the FFI
// handler in sparse_allreduce_ffi.cc after the argument check. Each writes the
// dense sum into `out` (identical bit for bit on every rank) and adds what it
// sends and receives to `stats`.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "ffi/mpi_comm.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

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
                                    WireStats* stats);

xla::ffi::Error recursive_doubling_allreduce(SparseStream local, int64_t n, MPI_Comm comm, int rank,
                                             int nranks, float* out, WireStats* stats);

// SSAR_Split_allgather (dense_phase = false) and DSAR_Split_allgather (true).
xla::ffi::Error split_allgather_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm,
                                          int rank, int nranks, bool dense_phase, float* out,
                                          WireStats* stats);

}  // namespace jss
