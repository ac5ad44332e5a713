// The allgather of one fixed-size byte payload per rank (jss_allgather_bytes):
// the exchange of chunked_topk_sync, whose payload (chunk offsets, packed value
// codes, per-chunk scales) is encoded and decoded in JAX, so that both
// transports (this one and the mesh axis's all_gather) move the same bytes and
// every rank decodes and sums the same bits in rank order.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "ffi/runtime/mpi_comm.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// The argument check every collective begins with (the 56-byte header
// allgather: the payload length and `param` must agree; under nan_policy
// "raise" a rank whose `non_finite` is set makes every rank fail), then one
// MPI_Allgather of `bytes` bytes per rank: out[r * bytes, (r + 1) * bytes)
// holds rank r's payload. `out` must not alias `in`. Counted in `stats` as an
// allgather: (P - 1) * bytes sent and received, ceil(log2 P) messages.
xla::ffi::Error allgather_bytes_host(const uint8_t* in, int64_t bytes, bool non_finite,
                                     int64_t param, MPI_Comm comm, int64_t nan_policy,
                                     uint8_t* out, WireStats* stats);

namespace sig {

// token, payload (B,) u8, non_finite (1,) s32 -> token, gathered (P, B) u8, stats
template <typename B>
auto bind_allgather_bytes(B b) {
  return std::move(b)
      .template Arg<xla::ffi::Token>()
      .template Arg<xla::ffi::Buffer<xla::ffi::U8>>()   // this rank's payload (B,)
      .template Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // (1,): nonzero if a value is NaN/Inf
      .template Ret<xla::ffi::Token>()
      .template Ret<xla::ffi::Buffer<xla::ffi::U8>>()   // every rank's payload (P, B)
      .template Ret<xla::ffi::AnyBuffer>()              // stats
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("nan_policy")
      .template Attr<int64_t>("param");  // must agree across ranks (the entries per chunk)
}

}  // namespace sig
}  // namespace jss

XLA_FFI_DECLARE_HANDLER_SYMBOL(JssAllgatherBytes);
