// Sparse streams: the unit the sparse allreduce algorithms exchange and merge.
//
// A stream is either sparse (entries sorted by index, no duplicates) or dense
// (a float vector of the full dimension). Merges are written as f(lower, upper),
// where `lower` is always the data of the lower-ranked group: two partners of a
// recursive-doubling round compute the same f on the same inputs and therefore
// hold bitwise-identical results afterwards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace jss {

struct SparseEntry {
  int32_t index;
  float value;
};
static_assert(sizeof(SparseEntry) == 8, "wire format: 4-byte index + 4-byte value");

struct SparseStream {
  bool dense = false;
  std::vector<SparseEntry> entries;  // when !dense: sorted by index, unique
  std::vector<float> values;         // when dense: full dimension

  int64_t nnz() const { return dense ? static_cast<int64_t>(values.size())
                                     : static_cast<int64_t>(entries.size()); }
};

// Sorted merge of two sparse streams; equal indices are summed (lower + upper).
inline void merge_sparse(const std::vector<SparseEntry>& lower,
                         const std::vector<SparseEntry>& upper,
                         std::vector<SparseEntry>* out) {
  out->clear();
  out->reserve(lower.size() + upper.size());
  size_t a = 0, b = 0;
  while (a < lower.size() && b < upper.size()) {
    if (lower[a].index < upper[b].index) {
      out->push_back(lower[a++]);
    } else if (upper[b].index < lower[a].index) {
      out->push_back(upper[b++]);
    } else {
      out->push_back(SparseEntry{lower[a].index, lower[a].value + upper[b].value});
      ++a; ++b;
    }
  }
  while (a < lower.size()) out->push_back(lower[a++]);
  while (b < upper.size()) out->push_back(upper[b++]);
}

// The result statistics' count of nonzeros (x != 0: -0 counts as zero, NaN
// does not): over a dense vector, and over a merged stream's entries (their
// indices are unique, so each is one entry of the dense result).
inline int64_t count_nonzero(const float* x, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += (x[i] != 0.0f);
  return c;
}

inline int64_t count_nonzero_values(const std::vector<SparseEntry>& entries) {
  int64_t c = 0;
  for (const SparseEntry& e : entries) c += (e.value != 0.0f);
  return c;
}

inline void densify(const std::vector<SparseEntry>& entries, int64_t n, std::vector<float>* out) {
  out->assign(static_cast<size_t>(n), 0.0f);
  for (const SparseEntry& e : entries) (*out)[e.index] = e.value;
}

// result = lower + upper, where at least one side is dense. Entries present on
// one side only keep their value unchanged (no "+ 0"), whichever side is dense.
inline void merge_into_dense(const SparseStream& lower, const SparseStream& upper, int64_t n,
                             std::vector<float>* out) {
  if (lower.dense && upper.dense) {
    out->resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) (*out)[i] = lower.values[i] + upper.values[i];
  } else if (lower.dense) {
    *out = lower.values;
    for (const SparseEntry& e : upper.entries) (*out)[e.index] = lower.values[e.index] + e.value;
  } else {
    *out = upper.values;
    for (const SparseEntry& e : lower.entries) (*out)[e.index] = e.value + upper.values[e.index];
  }
}

// Returns lower + upper as the stream of the union group. A sparse result
// switches to dense once it holds more than `dense_threshold` entries
// (delta = N/2 for 4-byte indices and values); the result's `dense` says so.
inline SparseStream merge_streams(const SparseStream& lower, const SparseStream& upper,
                                  int64_t n, int64_t dense_threshold) {
  SparseStream out;
  if (!lower.dense && !upper.dense) {
    merge_sparse(lower.entries, upper.entries, &out.entries);
    if (static_cast<int64_t>(out.entries.size()) > dense_threshold) {
      densify(out.entries, n, &out.values);
      out.entries.clear();
      out.dense = true;
    }
    return out;
  }
  merge_into_dense(lower, upper, n, &out.values);
  out.dense = true;
  return out;
}

// Offsets splitting a sorted stream by index boundaries: slice q is
// entries[offsets[q], offsets[q + 1]), the entries with bounds[q] <= index <
// bounds[q + 1]. bounds has P + 1 entries; the last slice ends at the end.
inline std::vector<int64_t> slice_offsets(const std::vector<SparseEntry>& entries,
                                          const std::vector<int64_t>& bounds) {
  const size_t P = bounds.size() - 1;
  std::vector<int64_t> offsets(P + 1);
  for (size_t q = 0; q < P; ++q) {
    offsets[q] = std::lower_bound(entries.begin(), entries.end(), bounds[q],
                                  [](const SparseEntry& e, int64_t b) { return e.index < b; }) -
                 entries.begin();
  }
  offsets[P] = static_cast<int64_t>(entries.size());
  return offsets;
}

// Builds a stream from COO input: drops padding (index < 0), sums duplicate
// indices in input order, sorts by index. Indices must be < n (checked by caller).
inline void stream_from_coo(const float* values, const int32_t* indices, int64_t cap,
                            SparseStream* out) {
  out->dense = false;
  out->values.clear();
  // Written through a pointer into the sized vector, not push_back: push_back's
  // by-reference argument made the compiler build each entry on the stack and
  // load it back as 8 bytes after two 4-byte stores (a store-forwarding stall per
  // entry: the loop was the hottest spot of the 25 % ramp stage's call, P = 2).
  out->entries.resize(static_cast<size_t>(cap));
  SparseEntry* put = out->entries.data();
  bool sorted_unique = true;
  int32_t last = -1;
  for (int64_t i = 0; i < cap; ++i) {
    const int32_t index = indices[i];
    if (index < 0) continue;
    sorted_unique &= index > last;
    last = index;
    put->index = index;
    put->value = values[i];
    ++put;
  }
  out->entries.resize(static_cast<size_t>(put - out->entries.data()));
  if (sorted_unique) return;
  std::stable_sort(out->entries.begin(), out->entries.end(),
                   [](const SparseEntry& a, const SparseEntry& b) { return a.index < b.index; });
  size_t w = 0;
  for (size_t r = 0; r < out->entries.size(); ++r) {
    if (w > 0 && out->entries[w - 1].index == out->entries[r].index) {
      out->entries[w - 1].value += out->entries[r].value;
    } else {
      out->entries[w++] = out->entries[r];
    }
  }
  out->entries.resize(w);
}

}  // namespace jss
