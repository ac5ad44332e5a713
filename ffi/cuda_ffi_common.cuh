// Shared plumbing of the CUDA FFI handlers (ffi/selection_cuda.cu,
// ffi/compression_cuda.cu): dtype dispatch to the kernel storage traits,
// scratch allocation and CUDA error -> ffi::Error conversion.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ffi/argument_checks.h"
#include "kernels/float_bits.cuh"
#include "xla/ffi/api/ffi.h"

namespace jss {
namespace cuda_ffi {

namespace ffi = xla::ffi;

// Calls fn(Traits{}) for a float32 / bfloat16 / float16 buffer type; returns
// false for any other type.
template <typename Fn>
bool dispatch_float(ffi::DataType type, Fn&& fn) {
  switch (type) {
    case ffi::DataType::F32: fn(cuda::F32{}); return true;
    case ffi::DataType::BF16: fn(cuda::BF16{}); return true;
    case ffi::DataType::F16: fn(cuda::F16{}); return true;
    default: return false;
  }
}

// The same message as the CPU handlers' (ffi/argument_checks.h).
inline ffi::Error dtype_error(const char* op, const char* arg) {
  return checks::float_dtype_error(op, arg);
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
