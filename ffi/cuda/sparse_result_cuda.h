// Writes a sparse allreduce result (unique (index, value) entries, the rest zero)
// into a dense device vector: the CUDA handlers' way to bring back O(k P) entries
// instead of N floats (ffi/cuda/mpi_cuda.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sparse_stream.h"

namespace jss {

// out[0:size] = 0, then out[e.index] = e.value for each of the `count` entries,
// which the kernel reads from `entries` (device-accessible memory: pinned host
// memory under unified addressing is). Indices must be unique and in [0, size):
// each entry is one plain store, so the result does not depend on thread order.
cudaError_t write_sparse_result_on_device(const SparseEntry* entries, int64_t count, int64_t size,
                                          float* out, cudaStream_t stream);

}  // namespace jss
