// One sparse allreduce call, in two parts: prepare_call() checks the
// arguments on all ranks (the header allgather) and builds the local stream;
// run_call() runs the algorithm. The blocking handler does both at once; the
// non-blocking pair runs the second part on a worker thread.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "ffi/runtime/mpi_comm.h"
#include "kernels/sparse_stream.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

struct CallConfig {
  int64_t size = 0;
  int64_t algorithm = 0;
  int64_t nan_policy = 0;
  int64_t quantize_bits = 0;
  int64_t qsgd_bucket = 1024;
  uint32_t seed = 0;
  int64_t param = 0;  // must agree across ranks (Ok-Topk: k)
  int64_t wire = 0;   // WireFormat word: value dtype, index encoding (ffi/collectives/wire_codec.h)
};

struct PreparedCall {
  int rank = 0;
  int nranks = 1;
  SparseStream local;
  std::vector<CallHeader> headers;
  WireStats stats;
};

xla::ffi::Error prepare_call(const float* values, const int32_t* indices, int64_t cap,
                             const CallConfig& config, MPI_Comm comm, PreparedCall* call);

// The parts of prepare_call that do not read the input, shared with the device
// protocol (ffi/collectives/device_exchange.h): the attribute check (the same
// error on every rank, before any MPI) and the header's fixed fields.
xla::ffi::Error check_call_config(const CallConfig& config);
CallHeader call_header(const CallConfig& config);

// `sparse` (optional): where a sparse result goes as entries instead of `out` (see
// SparseResult in algorithms.h); `out` is written only when sparse->used is false.
// `out` may be null where `sparse` is given: a dense result (recursive doubling or
// split-allgather past their switch) then goes to sparse->dense; the dense and
// DSAR algorithms always need `out`.
struct SparseResult;
xla::ffi::Error run_call(PreparedCall* call, const CallConfig& config, MPI_Comm comm, float* out,
                         SparseResult* sparse = nullptr);

// JSS_TEST_SPARSE_RESULT=1 in the environment: the CPU handlers take results as
// entries and write them the way the CUDA handlers do on the device, so that the
// CPU tests check that path of every algorithm bit for bit (a test seam).
bool sparse_result_seam();

// JSS_TEST_DEVICE_PROTOCOL in the environment: the CPU handler of the sparse
// allreduce runs the device-resident exchange (ffi/collectives/device_exchange.h)
// through its host stand-ins (device_exchange_host.h) for every algorithm the
// protocol covers: 1 alone, "compare" followed by the CPU path on the same call,
// whose output and statistics it must equal bit for bit (else the call fails).
// 0: off, 1: on, 2: compare. A test seam, read once.
int device_protocol_seam();

// Writes a sparse result into the dense out[size] (zeros, then the entries).
void write_sparse_result(const SparseResult& sparse, int64_t size, float* out);
xla::ffi::Error write_stats(const WireStats& stats, xla::ffi::Result<xla::ffi::AnyBuffer>& out);

}  // namespace jss
