// Small helpers shared by the CUDA launchers in kernels/*.cuh.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

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
// A fixed larger grid would run in 1.5 waves, the last half-empty. The
// occupancy query is made once per (kernel, threads, device): the launchers
// ask on every call, and a failed query falls back to one block per SM (the
// kernels loop over their work with any grid; the launch reports real errors).
template <typename Kernel>
unsigned int resident_grid(Kernel kernel, int threads, long long work) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, long long> resident;  // -> blocks
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, device);
  long long blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto found = resident.find(key);
    if (found != resident.end()) blocks = found->second;
  }
  if (blocks == 0) {
    int sms = 1, per_sm = 1;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess ||
        per_sm < 1) {
      per_sm = 1;
    }
    blocks = static_cast<long long>(sms) * per_sm;
    std::lock_guard<std::mutex> lock(mutex);
    resident[key] = blocks;
  }
  return static_cast<unsigned int>(work < 1 ? 1 : (blocks < work ? blocks : work));
}

}  // namespace cuda
}  // namespace jss
