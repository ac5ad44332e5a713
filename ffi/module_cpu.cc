// nanobind module of the CPU FFI targets: one registrations() dict, as JAX's
// FFI examples do, plus the algorithm ids and the MPI library the module was
// linked against (checked against mpi4py's at import).
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "ffi/collectives_host.h"
#include "ffi/cuda_missing.h"
#include "ffi/sparse_allreduce.h"
#include "ffi/timeline_binding.h"
#include "ffi/watchdog_binding.h"

namespace nb = nanobind;

// ffi/adam_accumulate_ffi.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAdamAccumulate);

namespace {

template <typename T>
nb::capsule encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jss_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["jss_topk"] = encapsulate(JssTopk);
    d["jss_bucket_topk"] = encapsulate(JssBucketTopk);
    d["jss_threshold_select"] = encapsulate(JssThresholdSelect);
    d["jss_kth_magnitude"] = encapsulate(JssKthMagnitude);
    d["jss_residual_update"] = encapsulate(JssResidualUpdate);
    d["jss_scatter_add"] = encapsulate(JssScatterAdd);
    d["jss_oktopk_allreduce"] = encapsulate(JssOktopkAllreduce);
    d["jss_block_allreduce"] = encapsulate(JssBlockAllreduce);
    d["jss_block_scan"] = encapsulate(JssBlockScan);
    d["jss_sparse_allreduce"] = encapsulate(JssSparseAllreduce);
    d["jss_dense_allreduce"] = encapsulate(JssDenseAllreduce);
    d["jss_sparse_allreduce_start"] = encapsulate(JssSparseAllreduceStart);
    d["jss_sparse_allreduce_done"] = encapsulate(JssSparseAllreduceDone);
    d["jss_qsgd_quantize"] = encapsulate(JssQsgdQuantize);
    d["jss_qsgd_dequantize"] = encapsulate(JssQsgdDequantize);
    d["jss_adam_direction"] = encapsulate(JssAdamDirection);
    d["jss_accumulate"] = encapsulate(JssAccumulate);
    d["jss_accumulate_topk"] = encapsulate(JssAccumulateTopk);
    d["jss_adam_accumulate"] = encapsulate(JssAdamAccumulate);
    return d;
  });
  m.def("algorithm_ids", []() {
    nb::dict d;
    d["dense"] = static_cast<int64_t>(jss::Algorithm::kDense);
    d["allgather"] = static_cast<int64_t>(jss::Algorithm::kAllgather);
    d["recursive_doubling"] = static_cast<int64_t>(jss::Algorithm::kRecursiveDoubling);
    d["split_allgather"] = static_cast<int64_t>(jss::Algorithm::kSplitAllgather);
    d["dsar_split_allgather"] = static_cast<int64_t>(jss::Algorithm::kDsarSplitAllgather);
    d["oktopk"] = static_cast<int64_t>(jss::Algorithm::kOktopk);
    d["block"] = static_cast<int64_t>(jss::Algorithm::kBlock);
    d["hash_partition"] = static_cast<int64_t>(jss::Algorithm::kHashPartition);
    return d;
  });
  // Stand-ins that _ext.py registers for platform "CUDA" (see cuda_missing.cc).
  m.def("cuda_fallback_handlers", []() {
    nb::dict d;
    d["module_missing"] = encapsulate(JssCudaModuleMissing);
    d["no_cuda_implementation"] = encapsulate(JssNoCudaImplementation);
    return d;
  });
  jss::def_nonblocking_timeline(m);
  jss::def_watchdog(m, "cpu");
  m.def("mpi_library_version", []() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(text, &len);
    return std::string(text, static_cast<size_t>(len));
  });
}
