// Stand-in handlers for platform "CUDA" (defined in the CPU module): each only
// returns its error. See cuda_missing.cc and jax_sparse_sync/_ext.py.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace jss {

// The texts are checked by tests/test_cuda_module.py.
inline constexpr const char* kCudaModuleMissingMessage =
    "jax_sparse_sync was built without its CUDA module: rebuild with "
    "JSS_CUDA=ON bash scripts/setup.sh, or run on CPU";

inline constexpr const char* kNoCudaImplementationMessage =
    "jax_sparse_sync: this operation has no CUDA implementation (the non-blocking "
    "sparse_allreduce_start/sparse_allreduce_done run on CPU only): use the blocking "
    "jss.sparse_allreduce on GPU, or place the arguments on the CPU";

}  // namespace jss

// Registered for every target the CUDA module lacks when it was not built.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssCudaModuleMissing);
// Registered for targets that have no CUDA handler even in the CUDA module.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssNoCudaImplementation);
