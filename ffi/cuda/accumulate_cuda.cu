// CUDA twins of the accumulator and Adam-direction handlers: jss_accumulate and
// jss_accumulate_topk (the CPU's in ffi/handlers/accumulate_ffi.cc), jss_adam_direction
// (adam_direction_ffi.cc) and jss_adam_accumulate (adam_accumulate_ffi.cc), same
// target names, signatures (ffi/handlers/signatures.h), argument checks and outputs,
// bit for bit (kernels/fused_accumulate.cuh): a step on GPU arrays computes what the
// same step on the CPU does, whichever of the passes it fuses. Everything
// runs on XLA's stream with scratch from XLA's allocator; nothing here reads device
// data on the host or synchronizes (the hint, the decay and Adam's step scalars
// are read by the kernels).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

// the CPU Adam pass's multi-versioned clones are never compiled here (host code of
// a .cu file): only its constants and argument checks are used
#define JSS_NO_MULTIVERSION
#include "ffi/cuda/cuda_ffi_common.cuh"
#include "ffi/cuda/cuda_handlers.h"
#include "ffi/handlers/adam_state_args.h"
#include "ffi/handlers/gradient_leaves.h"
#include "ffi/handlers/signatures.h"
#include "kernels/fused_accumulate.cuh"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

using namespace cuda_ffi;  // the handlers' plumbing (cuda_ffi_common.cuh)

using F32 = ffi::Buffer<ffi::F32>;
using F32Out = ffi::ResultBuffer<ffi::F32>;

static_assert(cuda::kAdamMaxAge == kMaxAge, "the CUDA Adam entry saturates ages as the CPU's");

// The call's leaves as the kernels take them: each at its place in the whole buffers
// (starts; one range: the range's start + the leaf's offset, the same numbers).
cuda::FusedLeaves placed(const GradientLeaves& b, ffi::Span<const int64_t> starts) {
  cuda::FusedLeaves f;
  f.leaves = b.leaves;
  f.offsets.assign(b.offsets.begin(), b.offsets.end());
  f.places.assign(starts.begin(), starts.end());
  return f;
}

// `out` holds `in` (len floats or int16s): a copy on the stream where XLA did not
// alias them. Returns the buffer the kernel updates in place.
template <typename T>
cudaError_t alias_on_device(const T* in, T* out, int64_t len, cudaStream_t stream) {
  if (in == out || len == 0) return cudaSuccess;
  return cudaMemcpyAsync(out, in, sizeof(T) * static_cast<size_t>(len),
                         cudaMemcpyDeviceToDevice, stream);
}

// One pass, no selection: acc = decay * residual + the gradient (in place).
ffi::Error AccumulateCudaImpl(cudaStream_t stream, F32 residual, F32 decay,
                              ffi::RemainingArgs leaves, F32Out acc, int64_t has_decay) {
  const char* op = "jax_sparse_sync.accumulate";
  const int64_t n = static_cast<int64_t>(residual.element_count());
  if (acc->element_count() != residual.element_count() || decay.element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the accumulator must have the "
                                       "residual's length and the decay one entry");
  }
  GradientLeaves b;
  if (auto e = gather_gradient_leaves(op, leaves, n, "the residual", b); e.failure()) return e;
  const cuda::AccumulateEntry entry{residual.typed_data(), decay.typed_data(), has_decay != 0};
  cuda::FusedLeaves placed_leaves;
  placed_leaves.leaves = b.leaves;
  placed_leaves.offsets.assign(b.offsets.begin(), b.offsets.end());
  placed_leaves.places.assign(b.offsets.begin(), b.offsets.end() - 1);
  return cuda_error("accumulate", cuda::fused_pass_launch(entry, placed_leaves, acc->typed_data(),
                                                          nullptr, cuda::FusedSelect{}, stream));
}

ffi::Error AccumulateTopkCudaImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, F32 residual,
                                  F32 decay, F32 hint, ffi::RemainingArgs leaves, F32Out acc,
                                  F32Out values, ffi::ResultBuffer<ffi::S32> indices,
                                  ffi::ResultBuffer<ffi::S32> hint_used, F32Out gathered,
                                  int64_t has_decay, int64_t k, int64_t cap,
                                  ffi::Span<const int64_t> starts) {
  const char* op = "jax_sparse_sync.accumulate_topk";
  const int64_t total = static_cast<int64_t>(residual.element_count());
  if (acc->element_count() != residual.element_count() || decay.element_count() != 1 ||
      hint.element_count() != 1 || hint_used->element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": the accumulator must have the "
                                       "residual's length, the decay and the hint one entry");
  }
  GradientLeaves b;
  bool one_range;
  if (auto e = gather_placed_leaves(op, leaves, starts, total, "the residual's", b, one_range);
      e.failure()) {
    return e;
  }
  const int64_t n = b.offsets.back();
  if (auto e = check_topk_outputs(op, 1, k, n, one_range, values->element_count(),
                                  indices->element_count(), gathered->element_count());
      e.failure()) {
    return e;
  }
  float* whole = acc->typed_data();
  if (n < total) {  // not aliased: the entries outside the call's are the residual's
    if (auto e = cuda_error("accumulate_topk",
                            alias_on_device(residual.typed_data(), whole, total, stream));
        e.failure()) {
      return e;
    }
  }
  const cuda::AccumulateEntry entry{residual.typed_data(), decay.typed_data(), has_decay != 0};
  const cuda::FusedLeaves placed_leaves = placed(b, starts);
  // one range: selected from the accumulator itself; else from the call's gathered copy
  float* gather_to = one_range ? nullptr : gathered->typed_data();
  const float* x = one_range ? whole + starts[0] : gather_to;
  return launch_with_scratch(
      scratch, cuda::fused_accumulate_scratch_bytes(n, k, cap), "accumulate_topk",
      [&](void* w) {
        return cuda::fused_accumulate_launch(entry, placed_leaves, whole, gather_to, x,
                                             hint.typed_data(), k, cap, values->typed_data(),
                                             indices->typed_data(), hint_used->typed_data(), w,
                                             stream);
      });
}

// The Adam state's outputs: each input copied to its output where XLA did not
// alias them; the kernel's buffers point at the outputs.
cudaError_t bind_adam_outputs(AdamStateArgs& state, cuda::AdamBuffers& b, cudaStream_t stream) {
  const int64_t n = state.size(), noise = state.noise_size();
  JSS_CUDA_RETURN_IF_ERROR(alias_on_device(state.mu.typed_data(), state.mu_out->typed_data(), n,
                                           stream));
  JSS_CUDA_RETURN_IF_ERROR(alias_on_device(state.nu.typed_data(), state.nu_out->typed_data(), n,
                                           stream));
  JSS_CUDA_RETURN_IF_ERROR(alias_on_device(state.age.typed_data(), state.age_out->typed_data(),
                                           n, stream));
  JSS_CUDA_RETURN_IF_ERROR(alias_on_device(state.diff_sq.typed_data(),
                                           state.diff_sq_out->typed_data(), noise, stream));
  JSS_CUDA_RETURN_IF_ERROR(alias_on_device(state.last.typed_data(), state.last_out->typed_data(),
                                           noise, stream));
  JSS_CUDA_RETURN_IF_ERROR(alias_on_device(state.before_last.typed_data(),
                                           state.before_last_out->typed_data(), noise, stream));
  b.mu = state.mu_out->typed_data();
  b.nu = state.nu_out->typed_data();
  b.age = state.age_out->typed_data();
  b.diff_sq = state.diff_sq_out->typed_data();
  b.last = state.last_out->typed_data();
  b.before_last = state.before_last_out->typed_data();
  return cudaSuccess;
}

// The Adam-direction pass alone (ffi/handlers/adam_direction_ffi.cc): the state in
// place and the direction (N,); scalars (7,), read on the device.
ffi::Error AdamDirectionCudaImpl(cudaStream_t stream, F32 mu, F32 nu, AgeBuffer age, F32 diff_sq,
                                 F32 last, F32 before_last, F32 residual, F32 bias1_table,
                                 F32 scalars, ffi::RemainingArgs leaves, F32Out mu_out,
                                 F32Out nu_out, AgeResult age_out, F32Out diff_sq_out,
                                 F32Out last_out, F32Out before_last_out, F32Out direction,
                                 float b1, float one_minus_b1, float b2, float one_minus_b2,
                                 float eps, int64_t masking, int64_t has_residual,
                                 int64_t has_noise) {
  const char* op = "jax_sparse_sync.adam_direction_sync";
  AdamStateArgs state{mu, nu, age, diff_sq, last, before_last, mu_out, nu_out, age_out,
                      diff_sq_out, last_out, before_last_out, has_noise};
  const size_t n = mu.element_count();
  if (auto e = state.check(op, {has_residual ? residual.element_count() : n,
                                direction->element_count()},
                           "the residual and the direction", 7, scalars, masking, bias1_table,
                           /*table_on_host=*/false);
      e.failure()) {
    return e;
  }
  GradientLeaves b;
  if (auto e = gather_gradient_leaves(op, leaves, state.size(), "the state", b); e.failure()) {
    return e;
  }
  cuda::AdamDirectionEntry entry{};
  entry.c = cuda::AdamConstants{b1, one_minus_b1, b2, one_minus_b2, eps,
                                static_cast<int>(masking),
                                static_cast<long long>(bias1_table.element_count()),
                                has_noise != 0, false, false};
  entry.scalars = scalars.typed_data();
  if (auto e = cuda_error("adam_direction", bind_adam_outputs(state, entry.b, stream));
      e.failure()) {
    return e;
  }
  entry.b.mask_from = has_residual ? residual.typed_data() : nullptr;
  entry.b.bias1 = bias1_table.typed_data();
  cuda::FusedLeaves placed_leaves;
  placed_leaves.leaves = b.leaves;
  placed_leaves.offsets.assign(b.offsets.begin(), b.offsets.end());
  placed_leaves.places.assign(b.offsets.begin(), b.offsets.end() - 1);
  return cuda_error("adam_direction",
                    cuda::fused_pass_launch(entry, placed_leaves, direction->typed_data(),
                                            nullptr, cuda::FusedSelect{}, stream));
}

// scalars, starts and the outputs as the CPU handler (ffi/handlers/adam_accumulate_ffi.cc)
// takes them; the scalars are read on the device.
ffi::Error AdamAccumulateCudaImpl(
    cudaStream_t stream, ffi::ScratchAllocator scratch, F32 mu, F32 nu, AgeBuffer age,
    F32 diff_sq, F32 last, F32 before_last, F32 residual, F32 bias1_table, F32 scalars,
    ffi::RemainingArgs leaves, F32Out mu_out, F32Out nu_out, AgeResult age_out,
    F32Out diff_sq_out, F32Out last_out, F32Out before_last_out, F32Out acc, F32Out values,
    ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::S32> hint_used, F32Out gathered,
    float b1, float one_minus_b1, float b2, float one_minus_b2, float eps, int64_t masking,
    int64_t mask_from_residual, int64_t has_noise, int64_t has_decay, int64_t has_clip, int64_t k,
    int64_t cap, ffi::Span<const int64_t> starts) {
  const char* op = "jax_sparse_sync.adam_direction_sync (fused accumulate)";
  AdamStateArgs state{mu, nu, age, diff_sq, last, before_last, mu_out, nu_out, age_out,
                      diff_sq_out, last_out, before_last_out, has_noise};
  const int64_t total = state.size();
  if (auto e = state.check(op, {residual.element_count(), acc->element_count()},
                           "the residual and the accumulator", 11, scalars, masking,
                           bias1_table, /*table_on_host=*/false);
      e.failure()) {
    return e;
  }
  if (hint_used->element_count() != 1) {
    return ffi::Error::InvalidArgument(std::string(op) + ": bad hint_used output");
  }
  GradientLeaves b;
  bool one_range;
  if (auto e = gather_placed_leaves(op, leaves, starts, total, "the state's", b, one_range);
      e.failure()) {
    return e;
  }
  const int64_t n = b.offsets.back();
  if (auto e = check_topk_outputs(op, 0, k, n, one_range, values->element_count(),
                                  indices->element_count(), gathered->element_count());
      e.failure()) {
    return e;
  }
  cuda::AdamEntry entry{};
  entry.c = cuda::AdamConstants{b1, one_minus_b1, b2, one_minus_b2, eps,
                                static_cast<int>(masking),
                                static_cast<long long>(bias1_table.element_count()),
                                has_noise != 0, has_decay != 0, has_clip != 0};
  entry.scalars = scalars.typed_data();
  if (auto e = cuda_error("adam_accumulate", bind_adam_outputs(state, entry.b, stream));
      e.failure()) {
    return e;
  }
  float* whole = acc->typed_data();
  if (n < total) {  // not aliased: the entries outside the call's are the residual's
    if (auto e = cuda_error("adam_accumulate",
                            alias_on_device(residual.typed_data(), whole, total, stream));
        e.failure()) {
      return e;
    }
  }
  // every read of the residual (the masking, the sum) goes to the input
  entry.b.mask_from = mask_from_residual ? residual.typed_data() : nullptr;
  entry.b.accumulate_from = residual.typed_data();
  entry.b.bias1 = bias1_table.typed_data();
  const cuda::FusedLeaves placed_leaves = placed(b, starts);
  float* gather_to = one_range ? nullptr : gathered->typed_data();
  const float* x = one_range ? whole + (starts.size() ? starts[0] : 0) : gather_to;
  return launch_with_scratch(
      scratch, cuda::fused_accumulate_scratch_bytes(n, k, cap), "adam_accumulate", [&](void* w) {
        return cuda::fused_accumulate_launch(entry, placed_leaves, whole, gather_to, x,
                                             scalars.typed_data() + 8, k, cap,
                                             values->typed_data(), indices->typed_data(),
                                             hint_used->typed_data(), w, stream);
      });
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAccumulateCuda, jss::AccumulateCudaImpl,
                              jss::sig::bind_accumulate(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAccumulateTopkCuda, jss::AccumulateTopkCudaImpl,
                              jss::sig::bind_accumulate_topk(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAdamDirectionCuda, jss::AdamDirectionCudaImpl,
                              jss::sig::bind_adam_direction(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssAdamAccumulateCuda, jss::AdamAccumulateCudaImpl,
                              jss::sig::bind_adam_accumulate(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()));
