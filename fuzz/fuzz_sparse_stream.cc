// Fuzz target: the sparse-stream merge of kernels/sparse_stream.h
// (stream_from_coo, merge_streams with its dense switch, slice_offsets)
// against a plain dense reference, bit for bit. Any mismatch aborts (a
// finding), as do out-of-bounds accesses (ASan) and undefined behavior (UBSan).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "kernels/sparse_stream.h"

namespace {

// One side of a merge: a COO input turned into a stream, or a dense vector;
// `ref`/`present` is what it means densely (duplicates summed in input order).
struct Side {
  jss::SparseStream stream;
  std::vector<float> ref;
  std::vector<bool> present;
};

Side make_side(fuzz::Input& in, int64_t n) {
  Side s;
  s.ref.assign(static_cast<size_t>(n), 0.0f);
  s.present.assign(static_cast<size_t>(n), false);
  if (in.take<uint8_t>() % 4 == 0) {
    s.stream.dense = true;
    s.stream.values.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      s.stream.values[i] = s.ref[i] = in.value();
      s.present[i] = true;
    }
    return s;
  }
  const int64_t cap = in.in_range(0, 2 * n);
  std::vector<float> values(static_cast<size_t>(cap));
  std::vector<int32_t> indices(static_cast<size_t>(cap));
  for (int64_t i = 0; i < cap; ++i) {
    indices[i] = static_cast<int32_t>(in.in_range(-1, n - 1));
    values[i] = in.value();
    if (indices[i] < 0) continue;
    s.ref[indices[i]] = s.present[indices[i]] ? s.ref[indices[i]] + values[i] : values[i];
    s.present[indices[i]] = true;
  }
  jss::stream_from_coo(values.data(), indices.data(), cap, &s.stream);
  return s;
}

// Bitwise equal, or both NaN: a NaN's payload after a + b is not specified
// (the compiler may swap the operands).
bool same(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0 || (a != a && b != b);
}

void fail(const char* what, int64_t i) {
  std::fprintf(stderr, "fuzz_sparse_stream: %s at %lld\n", what, static_cast<long long>(i));
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int64_t n = in.in_range(1, 200);
  const int64_t threshold = in.in_range(0, n);
  Side lower = make_side(in, n);
  Side upper = make_side(in, n);
  for (const Side* s : {&lower, &upper}) {
    if (s->stream.dense) continue;
    for (size_t i = 0; i < s->stream.entries.size(); ++i) {
      const jss::SparseEntry& e = s->stream.entries[i];
      if (e.index < 0 || e.index >= n) fail("stream index out of range", i);
      if (i > 0 && s->stream.entries[i - 1].index >= e.index) fail("stream not sorted/unique", i);
      if (!same(e.value, s->ref[e.index])) fail("stream value", i);
    }
  }
  const jss::SparseStream merged = jss::merge_streams(lower.stream, upper.stream, n, threshold);
  std::vector<float> got(static_cast<size_t>(n), 0.0f);
  if (merged.dense) {
    if (static_cast<int64_t>(merged.values.size()) != n) fail("dense result length", 0);
    got = merged.values;
  } else {
    if (static_cast<int64_t>(merged.entries.size()) > threshold) fail("missed dense switch", 0);
    for (const jss::SparseEntry& e : merged.entries) got[e.index] = e.value;
  }
  for (int64_t i = 0; i < n; ++i) {
    float want = 0.0f;
    if (lower.present[i] && upper.present[i]) {
      want = lower.ref[i] + upper.ref[i];
    } else if (lower.present[i]) {
      want = lower.ref[i];
    } else if (upper.present[i]) {
      want = upper.ref[i];
    }
    if (!same(want, got[i])) fail("merged value", i);
  }
  // Slicing a sparse result by sorted boundaries 0 = b0 <= ... <= bP = n.
  if (!merged.dense) {
    const int64_t P = in.in_range(1, 8);
    std::vector<int64_t> bounds(static_cast<size_t>(P + 1));
    bounds[0] = 0;
    bounds[P] = n;
    for (int64_t q = 1; q < P; ++q) bounds[q] = in.in_range(bounds[q - 1], n);
    const std::vector<int64_t> off = jss::slice_offsets(merged.entries, bounds);
    for (int64_t q = 0; q < P; ++q) {
      if (off[q] > off[q + 1]) fail("slice offsets decrease", q);
      for (int64_t i = off[q]; i < off[q + 1]; ++i) {
        const int32_t idx = merged.entries[i].index;
        if (idx < bounds[q] || idx >= bounds[q + 1]) fail("entry in the wrong slice", i);
      }
    }
  }
  return 0;
}
