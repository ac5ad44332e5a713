// nanobind module of the CPU FFI targets: one registrations() dict, as JAX's
// FFI examples do, plus the algorithm ids and the MPI library the module was
// linked against (checked against mpi4py's at import).
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <nanobind/stl/pair.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ffi/collectives/allgather_bytes.h"
#include "ffi/collectives/collectives_host.h"
#include "ffi/handlers/cuda_missing.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/timeline_binding.h"
#include "ffi/runtime/watchdog_binding.h"
#include "ffi/collectives/wire_codec.h"

namespace nb = nanobind;

// ffi/handlers/adam_accumulate_ffi.cc
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
    d["jss_region_reduce"] = encapsulate(JssRegionReduce);
    d["jss_block_allreduce"] = encapsulate(JssBlockAllreduce);
    d["jss_block_scan"] = encapsulate(JssBlockScan);
    d["jss_sparse_allreduce"] = encapsulate(JssSparseAllreduce);
    d["jss_dense_allreduce"] = encapsulate(JssDenseAllreduce);
    d["jss_allgather_bytes"] = encapsulate(JssAllgatherBytes);
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
    d["region_reduce"] = static_cast<int64_t>(jss::Algorithm::kRegionReduce);
    return d;
  });
  // Stand-ins that _ext.py registers for platform "CUDA" (see cuda_missing.cc).
  m.def("cuda_fallback_handlers", []() {
    nb::dict d;
    d["module_missing"] = encapsulate(JssCudaModuleMissing);
    d["no_cuda_implementation"] = encapsulate(JssNoCudaImplementation);
    return d;
  });
  // The wire format of the sparse allreduce's messages (ffi/collectives/wire_codec.h), for
  // tests and benchmarks to compare with jax_sparse_sync/ops/index_encoding.py:
  // the message of sorted distinct int32 indices and their float32 values, and
  // its entries back (ValueError on a malformed message).
  m.def("wire_pack_entries", [](nb::bytes indices, nb::bytes values, int64_t wire) {
    const int64_t m = static_cast<int64_t>(indices.size()) / 4;
    if (static_cast<int64_t>(indices.size()) != 4 * m ||
        static_cast<int64_t>(values.size()) != 4 * m) {
      throw std::invalid_argument("wire_pack_entries: int32 indices and float32 values of one length");
    }
    std::vector<jss::SparseEntry> entries(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(&entries[j].index, indices.c_str() + 4 * j, 4);
      std::memcpy(&entries[j].value, values.c_str() + 4 * j, 4);
    }
    std::vector<char> message;
    jss::pack_entries(entries.data(), m, jss::WireFormat::from_word(wire), &message);
    return nb::bytes(message.data(), message.size());
  });
  m.def("wire_unpack_entries", [](nb::bytes message, int64_t n, int64_t wire) {
    std::vector<jss::SparseEntry> entries;
    std::string error;
    if (!jss::unpack_entries(message.c_str(), static_cast<int64_t>(message.size()), n,
                             jss::WireFormat::from_word(wire), &entries, &error)) {
      throw std::invalid_argument("malformed message: " + error);
    }
    std::vector<int32_t> idx(entries.size());
    std::vector<float> val(entries.size());
    for (size_t j = 0; j < entries.size(); ++j) {
      idx[j] = entries[j].index;
      val[j] = entries[j].value;
    }
    return std::make_pair(nb::bytes(reinterpret_cast<const char*>(idx.data()), 4 * idx.size()),
                          nb::bytes(reinterpret_cast<const char*>(val.data()), 4 * val.size()));
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
