// CUDA FFI handlers of the optional _jss_cuda module. Each has the same name
// (registered for platform "CUDA") and the same signature as its CPU twin in
// ffi/collectives/sparse_allreduce.h, so the Python ops are the same on both platforms.
//
//   selection (ffi/cuda/selection_cuda.cu): JssTopkCuda, JssBucketTopkCuda,
//       JssThresholdSelectCuda, JssKthMagnitudeCuda
//   compression and dense kernels (ffi/cuda/compression_cuda.cu): JssQsgdQuantizeCuda,
//       JssQsgdDequantizeCuda, JssBlockScanCuda, JssResidualUpdateCuda, JssScatterAddCuda
//   the accumulator and Adam-direction passes (ffi/cuda/accumulate_cuda.cu):
//       JssAccumulateCuda, JssAccumulateTopkCuda, JssAdamDirectionCuda, JssAdamAccumulateCuda
//   MPI collectives (ffi/cuda/mpi_cuda.cc): the sparse (k-sized) inputs are copied to
//       the host on XLA's stream, the stream is synchronized, the CPU algorithm
//       runs, the result is copied back: JssSparseAllreduceCuda,
//       JssOktopkAllreduceCuda, JssBlockAllreduceCuda, JssDenseAllreduceCuda, and
//       the non-blocking pair JssSparseAllreduceStartCuda, JssSparseAllreduceDoneCuda,
//       and chunked_topk_sync's byte allgather JssAllgatherBytesCuda
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JssTopkCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssBucketTopkCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssThresholdSelectCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssKthMagnitudeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssQsgdQuantizeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssQsgdDequantizeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssBlockScanCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssResidualUpdateCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssScatterAddCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAccumulateCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAccumulateTopkCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAdamDirectionCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAdamAccumulateCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSparseAllreduceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssOktopkAllreduceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssBlockAllreduceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssDenseAllreduceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSparseAllreduceStartCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSparseAllreduceDoneCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAllgatherBytesCuda);
// sharded_sync's region reduce on host copies (ffi/cuda/region_reduce_cuda.cu)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssRegionReduceCuda);
