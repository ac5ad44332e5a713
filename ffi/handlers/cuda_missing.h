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
    "jax_sparse_sync: this operation has no CUDA implementation in this build's CUDA "
    "module (it was built without some of its CUDA sources, see the CMake warnings): "
    "rebuild with JSS_CUDA=ON bash scripts/setup.sh from a complete checkout, or run on CPU";

}  // namespace jss

// Registered for every target the CUDA module lacks when it was not built.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssCudaModuleMissing);
// Registered for targets the CUDA module lacks (built without some sources).
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssNoCudaImplementation);
