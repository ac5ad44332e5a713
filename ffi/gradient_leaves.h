// The gradient's leaves of an FFI call (its RemainingArgs, float32, tree order)
// as kernels/leaf_spans.h's GradientLeaves, checked against the flat length.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/leaf_spans.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// An error naming `op` if a leaf is not float32 or the leaves do not add up to
// `n` entries (the length of `against`, e.g. "the residual").
inline xla::ffi::Error gather_gradient_leaves(const char* op, const xla::ffi::RemainingArgs& args,
                                              int64_t n, const char* against,
                                              GradientLeaves& out) {
  out.offsets.assign(1, 0);
  for (size_t j = 0; j < args.size(); ++j) {
    auto leaf = args.get<xla::ffi::Buffer<xla::ffi::F32>>(j);
    if (!leaf.has_value()) {
      return xla::ffi::Error::InvalidArgument(std::string(op) + ": gradient leaf " +
                                              std::to_string(j) + " is not float32");
    }
    out.leaves.push_back(leaf->typed_data());
    out.offsets.push_back(out.offsets.back() + static_cast<int64_t>(leaf->element_count()));
  }
  if (out.offsets.back() != n) {
    return xla::ffi::Error::InvalidArgument(std::string(op) + ": the gradient has " +
                                            std::to_string(out.offsets.back()) +
                                            " entries but " + against + " " + std::to_string(n));
  }
  return xla::ffi::Error::Success();
}

}  // namespace jss
