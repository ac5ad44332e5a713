// Shared plumbing of the CUDA FFI handlers (ffi/cuda/selection_cuda.cu,
// ffi/cuda/compression_cuda.cu): dtype dispatch to the kernel storage traits,
// scratch allocation and CUDA error -> ffi::Error conversion. A handler is its
// argument check, then for_float_dtype(..., [&](auto traits) { return
// cuda_error(op, launch) or launch_with_scratch(...); }). The handlers' files
// take all of it with `using namespace cuda_ffi`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "ffi/handlers/argument_checks.h"
#include "kernels/float_bits.cuh"
#include "xla/ffi/api/ffi.h"

namespace jss {
namespace cuda_ffi {

namespace ffi = xla::ffi;

// The platform the shared argument checks (ffi/handlers/argument_checks.h) name.
constexpr auto kPlatform = checks::Platform::kCuda;

// fn(Traits{}) -> ffi::Error for a float32 / bfloat16 / float16 buffer type,
// else the same dtype error as the CPU handlers' (ffi/handlers/argument_checks.h).
template <typename Fn>
ffi::Error for_float_dtype(ffi::DataType type, const char* op, const char* arg, Fn&& fn) {
  return checks::dispatch_float_dtype<cuda::F32, cuda::BF16, cuda::F16>(type, op, arg,
                                                                         std::forward<Fn>(fn));
}

inline ffi::Error cuda_error(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("jax_sparse_sync.") + op + " (CUDA): " +
                              cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Device scratch from XLA's allocator (freed when the handler returns, in
// stream order with the kernels it enqueued). bytes == 0 gives nullptr.
// XLA's FFI accepts alignments up to 16 only ("Unsupported alignment"), and
// CUB and kernels/scratch_layout.cuh want 256: ask for 255 bytes more and
// align the pointer here.
constexpr size_t kScratchAlignment = 256;

inline ffi::Error allocate_scratch(ffi::ScratchAllocator& scratch, size_t bytes, const char* op,
                                   void** out) {
  *out = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  auto ptr = scratch.Allocate(bytes + kScratchAlignment - 1, 16);
  if (!ptr.has_value() || *ptr == nullptr) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string("jax_sparse_sync.") + op + " (CUDA): cannot allocate " +
                          std::to_string(bytes) + " bytes of scratch memory");
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(*ptr);
  *out = reinterpret_cast<void*>((base + kScratchAlignment - 1) & ~(kScratchAlignment - 1));
  return ffi::Error::Success();
}

// Scratch of `bytes` from XLA's allocator (see allocate_scratch), then
// launch(work) -> cudaError_t, as one ffi::Error.
template <typename Launch>
ffi::Error launch_with_scratch(ffi::ScratchAllocator& scratch, size_t bytes, const char* op,
                               Launch&& launch) {
  void* work = nullptr;
  if (auto e = allocate_scratch(scratch, bytes, op, &work); e.failure()) return e;
  return cuda_error(op, launch(work));
}

template <typename F>
const typename F::Bits* bits_of(const ffi::AnyBuffer& b) {
  return reinterpret_cast<const typename F::Bits*>(b.untyped_data());
}

template <typename F>
typename F::Bits* bits_of(ffi::Result<ffi::AnyBuffer>& b) {
  return reinterpret_cast<typename F::Bits*>(b->untyped_data());
}

}  // namespace cuda_ffi
}  // namespace jss
