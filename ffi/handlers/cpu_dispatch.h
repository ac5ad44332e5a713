// The CPU handlers' dtype dispatch and typed views of FFI buffers
// (ffi/handlers/selection_ffi.cc, ffi/handlers/compression_ffi.cc, ffi/collectives/block_allreduce.cc).
#pragma once

#include <utility>

#include "ffi/handlers/argument_checks.h"
#include "kernels/float_bits.h"
#include "xla/ffi/api/ffi.h"

namespace jss {
namespace cpu_ffi {

namespace ffi = xla::ffi;

// fn(T{}) -> ffi::Error with T = float, bfloat16_t or float16_t for the
// buffer type; any other type gives the dtype error naming `arg` of `op`.
template <typename Fn>
ffi::Error for_float_dtype(ffi::DataType type, const char* op, const char* arg, Fn&& fn) {
  return checks::dispatch_float_dtype<float, bfloat16_t, float16_t>(type, op, arg,
                                                                    std::forward<Fn>(fn));
}

template <typename T>
const T* data_as(const ffi::AnyBuffer& b) {
  return reinterpret_cast<const T*>(b.untyped_data());
}

template <typename T>
T* data_as(ffi::Result<ffi::AnyBuffer>& b) {
  return reinterpret_cast<T*>(b->untyped_data());
}

}  // namespace cpu_ffi
}  // namespace jss
