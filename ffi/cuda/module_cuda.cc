// nanobind module of the CUDA FFI targets (optional, built with JSS_CUDA=ON).
// registrations() maps each target name to its handler; the names are those
// of the CPU module, so jax_sparse_sync/_ext.py registers them for platform
// "CUDA" and the Python ops are the same on both platforms.
//
// CMake defines JSS_CUDA_HAS_SELECTION / JSS_CUDA_HAS_COMPRESSION /
// JSS_CUDA_HAS_ACCUMULATE when ffi/cuda/selection_cuda.cu / compression_cuda.cu /
// accumulate_cuda.cu are part of the build; a
// target whose handler was not built is simply absent here, and _ext.py
// registers a stand-in for it that says so.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "ffi/cuda/cuda_handlers.h"
#include "ffi/runtime/timeline_binding.h"
#include "ffi/runtime/watchdog_binding.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jss_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
#ifdef JSS_CUDA_HAS_SELECTION
    d["jss_topk"] = encapsulate(JssTopkCuda);
    d["jss_bucket_topk"] = encapsulate(JssBucketTopkCuda);
    d["jss_threshold_select"] = encapsulate(JssThresholdSelectCuda);
    d["jss_kth_magnitude"] = encapsulate(JssKthMagnitudeCuda);
#endif
#ifdef JSS_CUDA_HAS_COMPRESSION
    d["jss_qsgd_quantize"] = encapsulate(JssQsgdQuantizeCuda);
    d["jss_qsgd_dequantize"] = encapsulate(JssQsgdDequantizeCuda);
    d["jss_block_scan"] = encapsulate(JssBlockScanCuda);
    d["jss_residual_update"] = encapsulate(JssResidualUpdateCuda);
    d["jss_scatter_add"] = encapsulate(JssScatterAddCuda);
#endif
#ifdef JSS_CUDA_HAS_ACCUMULATE
    d["jss_accumulate"] = encapsulate(JssAccumulateCuda);
    d["jss_accumulate_topk"] = encapsulate(JssAccumulateTopkCuda);
    d["jss_adam_direction"] = encapsulate(JssAdamDirectionCuda);
    d["jss_adam_accumulate"] = encapsulate(JssAdamAccumulateCuda);
#endif
    d["jss_sparse_allreduce"] = encapsulate(JssSparseAllreduceCuda);
    d["jss_oktopk_allreduce"] = encapsulate(JssOktopkAllreduceCuda);
    d["jss_block_allreduce"] = encapsulate(JssBlockAllreduceCuda);
    d["jss_dense_allreduce"] = encapsulate(JssDenseAllreduceCuda);
    d["jss_sparse_allreduce_start"] = encapsulate(JssSparseAllreduceStartCuda);
    d["jss_sparse_allreduce_done"] = encapsulate(JssSparseAllreduceDoneCuda);
    d["jss_allgather_bytes"] = encapsulate(JssAllgatherBytesCuda);
    d["jss_region_reduce"] = encapsulate(JssRegionReduceCuda);  // region_reduce_cuda.cu
    return d;
  });
  // The CUDA runtime this module was built with (major * 1000 + minor * 10).
  m.def("cuda_runtime_version", []() {
    int version = 0;
    (void)cudaRuntimeGetVersion(&version);
    return version;
  });
  // The timeline of the non-blocking operations this module ran (on GPU buffers).
  jss::def_nonblocking_timeline(m);
  jss::def_watchdog(m, "cuda");
}
