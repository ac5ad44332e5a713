// Algorithm ids of the MPI sparse allreduce. The Python side reads them from
// the nanobind module (algorithm_ids()), so this enum is the only list.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace jss {

enum class Algorithm : int64_t {
  kDense = 0,              // MPI_Allreduce of the densified vector (baseline)
  kAllgather = 1,          // TopkA: allgather of every rank's entries
  kRecursiveDoubling = 2,  // SSAR_Recursive_double
  kSplitAllgather = 3,     // SSAR_Split_allgather
  kDsarSplitAllgather = 4, // DSAR_Split_allgather (dense second phase)
  kOktopk = 5,             // Ok-Topk: Top-k(sum of local top-k); its own handler
  kBlock = 6,              // block-sparse (OmniReduce style), dense input; its own handler
  kHashPartition = 7,      // ZEN: hash-partitioned reduce to owners + sparse allgather
  kRegionReduce = 8,       // sharded_sync: reduce to the fixed regions' owners only; own handler
};

inline const char* algorithm_name(int64_t id) {
  switch (static_cast<Algorithm>(id)) {
    case Algorithm::kDense: return "dense";
    case Algorithm::kAllgather: return "allgather";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kSplitAllgather: return "split_allgather";
    case Algorithm::kDsarSplitAllgather: return "dsar_split_allgather";
    case Algorithm::kOktopk: return "oktopk";
    case Algorithm::kBlock: return "block";
    case Algorithm::kHashPartition: return "hash_partition";
    case Algorithm::kRegionReduce: return "region_reduce";
  }
  return "unknown";
}

}  // namespace jss

XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSparseAllreduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssDenseAllreduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSparseAllreduceStart);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSparseAllreduceDone);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssTopk);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssBucketTopk);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssThresholdSelect);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssKthMagnitude);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssResidualUpdate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssScatterAdd);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAdamDirection);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAccumulate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAccumulateTopk);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssOktopkAllreduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssRegionReduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssBlockAllreduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssBlockScan);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssQsgdQuantize);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssQsgdDequantize);
