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

// Blocks for a persistent kernel (each block loops over work items): as many
// as can be resident on the device at once, at most `work` (and at least 1).
// A fixed larger grid would run in 1.5 waves, the last half-empty.
template <typename Kernel>
unsigned int resident_grid(Kernel kernel, int threads, long long work) {
  int device = 0, sms = 1, per_sm = 1;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess ||
      per_sm < 1) {
    per_sm = 1;  // the launch that follows reports a real error
  }
  const long long blocks = static_cast<long long>(sms) * per_sm;
  return static_cast<unsigned int>(work < 1 ? 1 : (blocks < work ? blocks : work));
}

}  // namespace cuda
}  // namespace jss
