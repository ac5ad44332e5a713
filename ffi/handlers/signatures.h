// The FFI signature (Args, Rets, Attrs, in order) of every target, written
// once and shared by the CPU handler and its CUDA twin, so the two cannot
// drift apart. Each bind_* appends the target's parameters to a binding:
//
//   CPU:  jss::sig::bind_topk(ffi::Ffi::Bind())
//   CUDA: jss::sig::bind_topk(ffi::Ffi::Bind()
//                                 .Ctx<ffi::PlatformStream<cudaStream_t>>()
//                                 .Ctx<ffi::ScratchAllocator>())
//
// Contexts go first (in front of the Args), matching the leading parameters of
// the CUDA Impl functions; decoding follows binding order.
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jss {
namespace sig {

namespace ffi = xla::ffi;

// ---- selection (ffi/handlers/selection_ffi.cc, ffi/cuda/selection_cuda.cu) ----

template <typename B>
auto bind_topk(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Attr<int64_t>("k");
}

template <typename B>
auto bind_bucket_topk(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Attr<int64_t>("bucket")
      .template Attr<int64_t>("k");
}

template <typename B>
auto bind_threshold_select(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::F32>>()  // threshold, scalar
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::S32>>()  // count, scalar
      .template Attr<int64_t>("capacity");
}

template <typename B>
auto bind_kth_magnitude(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>()  // scalar
      .template Attr<int64_t>("k")
      .template Attr<int64_t>("stride");
}

// ---- compression and dense kernels (ffi/handlers/compression_ffi.cc,
//      ffi/collectives/block_allreduce.cc, ffi/cuda/compression_cuda.cu) ----

template <typename B>
auto bind_qsgd_quantize(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::U8>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attr<int64_t>("bits")
      .template Attr<int64_t>("bucket");
}

template <typename B>
auto bind_qsgd_dequantize(B b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::U8>>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attr<int64_t>("bits")
      .template Attr<int64_t>("bucket");
}

template <typename B>
auto bind_block_scan(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::U8>>()
      .template Attr<int64_t>("block_size");
}

// Both aliased: output 0 is input 0 (input_output_aliases={0: 0}).
template <typename B>
auto bind_residual_update(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()         // acc (N,)
      .template Arg<ffi::Buffer<ffi::S32>>()  // indices (cap,), -1 = padding
      .template Ret<ffi::AnyBuffer>();        // acc, updated (aliased)
}

template <typename B>
auto bind_scatter_add(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()         // dense (N,)
      .template Arg<ffi::AnyBuffer>()         // values (cap,)
      .template Arg<ffi::Buffer<ffi::S32>>()  // indices (cap,), -1 = padding
      .template Ret<ffi::AnyBuffer>();        // dense, updated (aliased)
}

// ---- MPI collectives (ffi/collectives/sparse_allreduce_ffi.cc, ffi/collectives/oktopk.cc,
//      ffi/collectives/block_allreduce.cc, ffi/collectives/nonblocking_ffi.cc, ffi/cuda/mpi_cuda.cc) ----

// The sparse allreduce's inputs and attributes, shared by the blocking call
// and the non-blocking start.
template <typename B>
auto sparse_allreduce_inputs(B&& b) {  // a reference: Bindings cannot be moved into a parameter
  return std::forward<B>(b)
      .template Arg<ffi::Token>()
      .template Arg<ffi::Buffer<ffi::F32>>()   // values
      .template Arg<ffi::Buffer<ffi::S32>>()   // indices
      .template Arg<ffi::Buffer<ffi::S32>>();  // seed (QSGD), scalar
}

template <typename B>
auto sparse_allreduce_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<int64_t>("size")
      .template Attr<int64_t>("algorithm")
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("nan_policy")
      .template Attr<int64_t>("quantize_bits")
      .template Attr<int64_t>("qsgd_bucket")
      .template Attr<int64_t>("wire");  // WireFormat word (ffi/collectives/wire_codec.h)
}

template <typename B>
auto bind_sparse_allreduce(B b) {
  return sparse_allreduce_attrs(sparse_allreduce_inputs(std::move(b))
                                    .template Ret<ffi::Token>()
                                    .template Ret<ffi::Buffer<ffi::F32>>()
                                    .template Ret<ffi::AnyBuffer>());  // stats: s64 or s32
}

template <typename B>
auto bind_oktopk_allreduce(B b) {
  return std::move(b)
      .template Arg<ffi::Token>()
      .template Arg<ffi::Buffer<ffi::F32>>()  // values
      .template Arg<ffi::Buffer<ffi::S32>>()  // indices
      .template Arg<ffi::Buffer<ffi::S32>>()  // boundaries, P + 1
      .template Arg<ffi::Buffer<ffi::F32>>()  // global threshold, scalar
      .template Arg<ffi::Buffer<ffi::S32>>()  // recompute flags [bounds, thr]
      .template Ret<ffi::Token>()
      .template Ret<ffi::Buffer<ffi::F32>>()  // dense global top-k sum
      .template Ret<ffi::Buffer<ffi::U8>>()   // contributed, per input slot
      .template Ret<ffi::Buffer<ffi::S32>>()  // boundaries used
      .template Ret<ffi::Buffer<ffi::F32>>()  // threshold used
      .template Ret<ffi::AnyBuffer>()         // stats
      .template Attr<int64_t>("size")
      .template Attr<int64_t>("k")
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("nan_policy")
      .template Attr<int64_t>("region_min")    // per-owner count limits (0: none)
      .template Attr<int64_t>("region_max")    // (INT64_MAX: none)
      .template Attr<int64_t>("wire_dtype")    // values: 0 float32, 1 bfloat16, 2 float16
      .template Attr<int64_t>("partition");    // owners: 0 regions, 1 hash owners
}

template <typename B>
auto bind_block_allreduce(B b) {
  return std::move(b)
      .template Arg<ffi::Token>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Token>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::AnyBuffer>()  // stats
      .template Attr<int64_t>("block_size")
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("nan_policy");
}

// Output 1 aliases operand 1 (the token is operand 0 and result 0): the sum is
// written over the input when XLA can give the input's buffer away.
template <typename B>
auto bind_dense_allreduce(B b) {
  return std::move(b)
      .template Arg<ffi::Token>()
      .template Arg<ffi::Buffer<ffi::F32>>()  // x (N,)
      .template Ret<ffi::Token>()
      .template Ret<ffi::Buffer<ffi::F32>>()  // the sum (N,), aliased to x
      .template Ret<ffi::AnyBuffer>()         // stats
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("nan_policy")
      .template Attr<int64_t>("wire_dtype");  // 0 float32, 1 bfloat16, 2 float16
}

template <typename B>
auto bind_sparse_allreduce_start(B b) {
  return sparse_allreduce_attrs(sparse_allreduce_inputs(std::move(b))
                                    .template Ret<ffi::Token>()
                                    .template Ret<ffi::Buffer<ffi::S32>>())  // handle
      .template Attr<int64_t>("flags");  // kStartWaitPrevious | kStartDeferCheck
}

template <typename B>
auto bind_sparse_allreduce_done(B b) {
  return std::move(b)
      .template Arg<ffi::Token>()
      .template Arg<ffi::Buffer<ffi::S32>>()  // handle
      .template Ret<ffi::Token>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::AnyBuffer>();  // stats
}

// ---- the error-feedback accumulator (ffi/handlers/accumulate_ffi.cc; jss_accumulate_topk's
//      CUDA twin: ffi/cuda/accumulate_cuda.cu) ----

template <typename B>
auto bind_accumulate(B b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::F32>>()  // residual (N,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // decay (1,) (unread if has_decay=0)
      .RemainingArgs()                        // the gradient's leaves, f32, tree order
      .template Ret<ffi::Buffer<ffi::F32>>()  // acc (N,) (aliased)
      .template Attr<int64_t>("has_decay");
}

template <typename B>
auto bind_accumulate_topk(B b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::F32>>()  // residual (N,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // decay (1,) (unread if has_decay=0)
      .template Arg<ffi::Buffer<ffi::F32>>()  // hint (1,): a magnitude <= the k-th, or 0
      .RemainingArgs()                        // the gradient's leaves, f32, tree order
      .template Ret<ffi::Buffer<ffi::F32>>()  // acc (N,) (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // values (k,)
      .template Ret<ffi::Buffer<ffi::S32>>()  // indices (k,), ascending
      .template Ret<ffi::Buffer<ffi::S32>>()  // (1,): 1 if the hint's list was used
      .template Ret<ffi::Buffer<ffi::F32>>()  // gathered (count,), or (1,) for one range
      .template Attr<int64_t>("has_decay")
      .template Attr<int64_t>("k")
      .template Attr<int64_t>("cap")
      // each leaf's first entry in the (N,) residual (one range: the whole, or a group)
      .template Attr<ffi::Span<const int64_t>>("starts");
}

// The Adam-direction pass fused with the accumulator (ffi/handlers/adam_accumulate_ffi.cc,
// ffi/cuda/accumulate_cuda.cu). Outputs 0-6 are inputs 0-6 (input_output_aliases={0: 0,
// ..., 6: 6}): the moments, age, the noise buffers, and the accumulator in the residual's
// buffer.
template <typename B>
auto bind_adam_accumulate(B b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::F32>>()  // mu (N,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // nu (N,)
      .template Arg<ffi::Buffer<ffi::S16>>()  // age (N,), int16
      .template Arg<ffi::Buffer<ffi::F32>>()  // squared second differences' EMA (N,) or (1,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // the last gradient (N,) or (1,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // the one before (N,) or (1,): has_noise=0
      .template Arg<ffi::Buffer<ffi::F32>>()  // the sync's residual (N,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // 1 - b1**a for a = 1..T
      .template Arg<ffi::Buffer<ffi::F32>>()  // scalars (11,), see adam_accumulate_ffi.cc
      .RemainingArgs()                        // the gradient's leaves, f32, tree order
      .template Ret<ffi::Buffer<ffi::F32>>()  // mu (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // nu (aliased)
      .template Ret<ffi::Buffer<ffi::S16>>()  // age (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // squared second differences' EMA (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // the last gradient (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // the one before (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // acc (N,) (aliased to the residual)
      .template Ret<ffi::Buffer<ffi::F32>>()  // values (max(k, 1),), the top-k's
      .template Ret<ffi::Buffer<ffi::S32>>()  // indices (max(k, 1),), ascending
      .template Ret<ffi::Buffer<ffi::S32>>()  // (1,): 1 if the hint's list was used
      .template Ret<ffi::Buffer<ffi::F32>>()  // gathered (count,), or (1,) for one range
      .template Attr<float>("b1")
      .template Attr<float>("one_minus_b1")
      .template Attr<float>("b2")
      .template Attr<float>("one_minus_b2")
      .template Attr<float>("eps")
      .template Attr<int64_t>("masking")
      .template Attr<int64_t>("mask_from_residual")
      .template Attr<int64_t>("has_noise")
      .template Attr<int64_t>("has_decay")
      .template Attr<int64_t>("has_clip")  // 1: clip the gradient by its global norm (scalars 9, 10)
      .template Attr<int64_t>("k")         // 0: the accumulator only
      .template Attr<int64_t>("cap")
      // each leaf's first entry in the (N,) buffers (one range: the whole, or a group)
      .template Attr<ffi::Span<const int64_t>>("starts");
}

// ---- optimizer passes (ffi/handlers/adam_direction_ffi.cc; CPU only: on GPU XLA's fusion is used) ----

template <typename B>
auto bind_adam_direction(B b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::F32>>()  // mu (N,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // nu (N,)
      .template Arg<ffi::Buffer<ffi::S16>>()  // age (N,), int16
      .template Arg<ffi::Buffer<ffi::F32>>()  // squared second differences' EMA (N,) or (1,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // the last gradient (N,) or (1,)
      .template Arg<ffi::Buffer<ffi::F32>>()  // the one before (N,) or (1,): has_noise=0
      .template Arg<ffi::Buffer<ffi::F32>>()  // the sync's residual (N,) (unread if has_residual=0)
      .template Arg<ffi::Buffer<ffi::F32>>()  // 1 - b1**a for a = 1..T
      .template Arg<ffi::Buffer<ffi::F32>>()  // scalars (see adam_direction_ffi.cc)
      .RemainingArgs()                        // the gradient's leaves, f32, tree order
      .template Ret<ffi::Buffer<ffi::F32>>()  // mu (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // nu (aliased)
      .template Ret<ffi::Buffer<ffi::S16>>()  // age (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // squared second differences' EMA (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // the last gradient (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // the one before (aliased)
      .template Ret<ffi::Buffer<ffi::F32>>()  // direction (N,)
      .template Attr<float>("b1")
      .template Attr<float>("one_minus_b1")
      .template Attr<float>("b2")
      .template Attr<float>("one_minus_b2")
      .template Attr<float>("eps")
      .template Attr<int64_t>("masking")
      .template Attr<int64_t>("has_residual")
      .template Attr<int64_t>("has_noise");
}

}  // namespace sig
}  // namespace jss
