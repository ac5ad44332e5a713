// Small helpers shared by the CUDA launchers in kernels/*.cuh.
#pragma once

#include <cuda_runtime.h>

namespace jss {
namespace cuda {

// Returns the error of the last launch (or enqueue) from the enclosing launcher.
#define JSS_CUDA_RETURN_IF_ERROR(expr)            \
  do {                                            \
    const cudaError_t jss_err_ = (expr);          \
    if (jss_err_ != cudaSuccess) return jss_err_; \
  } while (0)

inline cudaError_t last_launch_error() { return cudaGetLastError(); }

// Blocks for a grid-stride loop over `work` items: at least 1, at most max_blocks.
inline unsigned int grid_for(long long work, int per_block, int max_blocks) {
  const long long blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

}  // namespace cuda
}  // namespace jss
