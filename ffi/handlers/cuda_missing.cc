// Stand-in CUDA handlers, part of the CPU module. _ext.py registers them for
// platform "CUDA" under every target name the CUDA module does not provide, so
// a jax_sparse_sync call on a GPU fails with a message that says what to do
// instead of XLA's "no registered implementation" for the custom call.
//
// They accept any arguments, results and attributes (nothing is bound but the
// remaining args/rets; with no bound attributes XLA checks none) and touch no
// buffer: they only return the error.
#include "ffi/handlers/cuda_missing.h"

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

ffi::Error CudaModuleMissingImpl(ffi::RemainingArgs, ffi::RemainingRets) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented, kCudaModuleMissingMessage);
}

ffi::Error NoCudaImplementationImpl(ffi::RemainingArgs, ffi::RemainingRets) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented, kNoCudaImplementationMessage);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssCudaModuleMissing, jss::CudaModuleMissingImpl,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssNoCudaImplementation, jss::NoCudaImplementationImpl,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets());
