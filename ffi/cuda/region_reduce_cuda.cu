// sharded_sync's region reduce on GPU buffers (JssRegionReduceCuda): the CPU
// collective (ffi/collectives/region_reduce.cc) on host copies, as the handlers of
// ffi/cuda/mpi_cuda.cc do. The k-sized COO input is copied to the host on XLA's
// stream, the stream synchronized (MPI reads finished copies), the owners' sums
// computed by region_reduce_host, and this rank's region (ceil(N / P) floats, N / P
// of the model: the reduce's result is the region, not the vector) and the
// statistics copied back, the stream synchronized again before the host buffers go.
// It synchronizes, so it declares no command-buffer (CUDA graph) compatibility.
#include <cuda_runtime.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "ffi/collectives/region_reduce.h"
#include "ffi/cuda/cuda_handlers.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/runtime/watchdog.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

constexpr const char* kOp = "region_reduce";

ffi::Error cuda_failed(cudaError_t code, const char* call) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_sparse_sync.region_reduce (CUDA): ") + call + " failed: " +
                        cudaGetErrorName(code) + ": " + cudaGetErrorString(code));
}

#define JSS_REGION_CUDA(expr, call)                                  \
  do {                                                               \
    cudaError_t _rc = (expr);                                        \
    if (_rc != cudaSuccess) return cuda_failed(_rc, call);           \
  } while (0)

ffi::Error RegionReduceCudaImpl(cudaStream_t stream, ffi::Token, ffi::Buffer<ffi::F32> values,
                                ffi::Buffer<ffi::S32> indices, ffi::Result<ffi::Token>,
                                ffi::ResultBuffer<ffi::F32> out,
                                ffi::Result<ffi::AnyBuffer> stats_out, int64_t size,
                                int64_t comm_handle, int64_t nan_policy) {
  const int64_t cap = static_cast<int64_t>(values.element_count());
  const int64_t slot = static_cast<int64_t>(out->element_count());
  const bool wide = stats_out->element_type() == ffi::S64;
  if (static_cast<int64_t>(indices.element_count()) != cap ||
      (!wide && stats_out->element_type() != ffi::S32) ||
      static_cast<int64_t>(stats_out->element_count()) != WireStats::kFields) {
    return ffi::Error::InvalidArgument(
        "jax_sparse_sync.region_reduce: `values`/`indices` lengths differ or the stats are not "
        "s32/s64");
  }
  std::vector<float> host_values(static_cast<size_t>(cap)), host_out(static_cast<size_t>(slot));
  std::vector<int32_t> host_indices(static_cast<size_t>(cap));
  if (cap > 0) {
    JSS_REGION_CUDA(cudaMemcpyAsync(host_values.data(), values.typed_data(), cap * 4,
                                    cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (values)");
    JSS_REGION_CUDA(cudaMemcpyAsync(host_indices.data(), indices.typed_data(), cap * 4,
                                    cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (indices)");
  }
  JSS_REGION_CUDA(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  MPI_Comm comm = comm_from_handle(comm_handle);
  WatchdogScope watchdog(kOp, comm);
  WireStats stats;
  if (auto e = region_reduce_host(host_values.data(), host_indices.data(), cap, size, comm,
                                  nan_policy, host_out.data(), &stats);
      e.failure()) {
    return e;
  }
  int64_t wide_stats[WireStats::kFields];
  int32_t narrow_stats[WireStats::kFields];
  stats.write(wide_stats);
  stats.write(narrow_stats);
  JSS_REGION_CUDA(cudaMemcpyAsync(out->typed_data(), host_out.data(), slot * 4,
                                  cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (region)");
  JSS_REGION_CUDA(cudaMemcpyAsync(stats_out->untyped_data(),
                                  wide ? static_cast<void*>(wide_stats) : narrow_stats,
                                  WireStats::kFields * (wide ? 8 : 4), cudaMemcpyHostToDevice,
                                  stream), "cudaMemcpyAsync (stats)");
  JSS_REGION_CUDA(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // host buffers go
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssRegionReduceCuda, jss::RegionReduceCudaImpl,
                              jss::sig::bind_region_reduce(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));
