// The gradient's leaves of an FFI call (its RemainingArgs, float32, tree order)
// as kernels/leaf_spans.h's GradientLeaves, checked against the flat length.
#pragma once

#include <algorithm>
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

// The leaves of one call on a part of a flat (total,) buffer: `starts` gives each
// leaf's first entry there (one per leaf, each fitting `what`, e.g. "the
// residual's"); the leaves gathered in their own order (out.offsets: the part's
// layout) and `one_range` set when they follow one another in the buffer.
inline xla::ffi::Error gather_placed_leaves(const char* op, const xla::ffi::RemainingArgs& args,
                                            xla::ffi::Span<const int64_t> starts, int64_t total,
                                            const char* what, GradientLeaves& out,
                                            bool& one_range) {
  if (starts.size() != args.size()) {
    return xla::ffi::Error::InvalidArgument(std::string(op) + ": one start per gradient leaf; "
                                            "got " + std::to_string(starts.size()) + " for " +
                                            std::to_string(args.size()) + " leaves");
  }
  int64_t n = 0;  // the call's entries: the leaves' (checked against themselves)
  for (size_t j = 0; j < args.size(); ++j) {
    auto leaf = args.get<xla::ffi::Buffer<xla::ffi::F32>>(j);
    if (leaf.has_value()) n += static_cast<int64_t>(leaf->element_count());
  }
  if (auto e = gather_gradient_leaves(op, args, n, "the leaves", out); e.failure()) return e;
  one_range = true;
  for (size_t j = 0; j < starts.size(); ++j) {
    const int64_t len = out.offsets[j + 1] - out.offsets[j];
    if (starts[j] < 0 || starts[j] > total - len) {
      return xla::ffi::Error::InvalidArgument(
          std::string(op) + ": leaf " + std::to_string(j) + " at " + std::to_string(starts[j]) +
          " of " + std::to_string(len) + " entries does not fit " + what + " " +
          std::to_string(total));
    }
    one_range &= starts[j] - starts[0] == out.offsets[j];
  }
  return xla::ffi::Error::Success();
}

// The top-k outputs of a call on the `n` entries of gather_placed_leaves: min_k <= k
// <= n < 2^31 (min_k 1, or 0 where k = 0 selects nothing), max(k, 1) values and
// indices, and a gathered buffer of n entries (1, unused, for one range).
inline xla::ffi::Error check_topk_outputs(const char* op, int64_t min_k, int64_t k, int64_t n,
                                          bool one_range, size_t values, size_t indices,
                                          size_t gathered) {
  const size_t out_k = static_cast<size_t>(std::max<int64_t>(k, 1));
  if (k < min_k || k > n || n >= (int64_t{1} << 31) || values != out_k || indices != out_k ||
      gathered != static_cast<size_t>(one_range ? 1 : n)) {
    return xla::ffi::Error::InvalidArgument(
        std::string(op) + ": need " + std::to_string(min_k) + " <= k <= count < 2^31, " +
        (min_k == 0 ? "max(k, 1)" : "k") + " values and indices and the gathered buffer's "
        "length; got k = " + std::to_string(k) + ", count = " + std::to_string(n));
  }
  return xla::ffi::Error::Success();
}

}  // namespace jss
