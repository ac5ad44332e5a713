// See sparse_result_cuda.h.
#include "ffi/cuda/sparse_result_cuda.h"

#include <algorithm>

namespace jss {
namespace {

__global__ void scatter_entries(const SparseEntry* entries, int64_t count, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const SparseEntry e = entries[i];
    out[e.index] = e.value;
  }
}

}  // namespace

cudaError_t write_sparse_result_on_device(const SparseEntry* entries, int64_t count, int64_t size,
                                          float* out, cudaStream_t stream) {
  // +0.0f is all zero bits: the same zeros as the CPU's std::fill(out, out + n, 0.0f)
  cudaError_t rc = cudaMemsetAsync(out, 0, static_cast<size_t>(size) * sizeof(float), stream);
  if (rc != cudaSuccess || count == 0) return rc;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 4096);
  scatter_entries<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(entries, count, out);
  return cudaGetLastError();
}

}  // namespace jss
