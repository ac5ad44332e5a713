// The region reduce of jss.sharded_sync (region_reduce.cc): each rank's sparse
// entries summed at the owner of their fixed region, nothing gathered after it.
// The CPU handler calls region_reduce_host on the input buffers; the CUDA handler
// (ffi/cuda/region_reduce_cuda.cu) on host copies of them.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <utility>

#include "ffi/runtime/mpi_comm.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// values[cap], indices[cap] (index -1: padding): this rank's entries. Writes this
// rank's region of their sum over the ranks into out[ceil(size / P)] (zero past
// the region's end) and what it sent and received into `stats`. Collective: the
// argument check (header allgather) first, so bad input fails on every rank.
xla::ffi::Error region_reduce_host(const float* values, const int32_t* indices, int64_t cap,
                                   int64_t size, MPI_Comm comm, int64_t nan_policy, float* out,
                                   WireStats* stats);

namespace sig {

template <typename B>
auto bind_region_reduce(B b) {
  return std::move(b)
      .template Arg<xla::ffi::Token>()
      .template Arg<xla::ffi::Buffer<xla::ffi::F32>>()  // values (cap,)
      .template Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // indices (cap,), -1 padding
      .template Ret<xla::ffi::Token>()
      .template Ret<xla::ffi::Buffer<xla::ffi::F32>>()  // the region's sum, ceil(N / P)
      .template Ret<xla::ffi::AnyBuffer>()              // stats: s64 or s32
      .template Attr<int64_t>("size")
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("nan_policy");
}

}  // namespace sig
}  // namespace jss
