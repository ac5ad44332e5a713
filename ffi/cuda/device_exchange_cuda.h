// The sparse allreduce of the CUDA module through the device-resident exchange
// (ffi/collectives/device_exchange.h): the CUDA Device (kernels, copies on XLA's
// stream, pinned buffers sized by k) is in device_exchange_cuda.cu; the FFI
// handler (ffi/cuda/mpi_cuda.cc) calls this for every algorithm
// exchange::runs_on_device accepts.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdint>

#include "ffi/collectives/allreduce_call.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// values / indices [cap] and out [config.size] are device buffers; stats is the
// statistics output (WireStats::kFields of int64 where stats_s64, else int32).
// Synchronizes `stream` before returning (MPI reads pinned copies of device data).
xla::ffi::Error sparse_allreduce_cuda(cudaStream_t stream, xla::ffi::ScratchAllocator& scratch,
                                      const float* values, const int32_t* indices, int64_t cap,
                                      float* out, void* stats, bool stats_s64,
                                      const CallConfig& config, MPI_Comm comm);

}  // namespace jss
