// SSAR_Split_allgather and DSAR_Split_allgather (SparCML, section 5).
//
// Phase 1 (both): the index space is split into P contiguous ranges; rank q
// owns [q N / P, (q + 1) N / P). Every rank sends each owner the slice of its
// sorted stream that falls in the owner's range, with non-blocking
// point-to-point calls in rotated order ((rank + j) mod P, so no owner is hit
// by everyone at once). Empty slices are not sent at all: the slice sizes are
// exchanged first (one MPI_Alltoall of int64 counts).
//
// The owner merges the P slices of its range in rank order. Only the owner
// sums a range, so every rank later receives the same bits.
//
// Phase 2, SSAR: a sparse allgather of the merged ranges; a range whose merged
// stream passed delta = len/2 travels dense instead. DSAR: every owner
// densifies its range and phase 2 is a dense allgather straight into the
// output buffer.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ffi/algorithms.h"
#include "ffi/peer_checks.h"
#include "kernels/qsgd.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

inline int64_t range_begin(int64_t n, int nranks, int q) { return n * q / nranks; }

// Block descriptor of phase 2 (SSAR): entries >= 0 for a sparse block, -1 for
// a dense one (then it carries the range length in floats).
constexpr int64_t kDenseBlock = -1;

// DSAR's second phase with QSGD: each owner quantizes its (already summed)
// range once; every rank, the owner included, dequantizes every range from
// the same bytes, so all ranks hold the same result. A block is the range's
// float32 scales followed by its packed codes.
ffi::Error quantized_dense_allgather(int64_t n, MPI_Comm comm, int rank, int P,
                                     const DensePhaseQuantization& q, float* out,
                                     WireStats* stats) {
  auto layout_of = [&](int owner) {
    return QsgdLayout{range_begin(n, P, owner + 1) - range_begin(n, P, owner), q.bits, q.bucket};
  };
  auto block_bytes = [](const QsgdLayout& l) {
    return l.num_buckets() * static_cast<int64_t>(sizeof(float)) + l.packed_bytes();
  };
  // Every block padded to the largest, so the gather is a plain MPI_Allgather
  // (see allgather_blocks); the padding is counted in the bytes.
  int64_t slot = 0;
  for (int o = 0; o < P; ++o) slot = std::max(slot, block_bytes(layout_of(o)));
  const QsgdLayout mine = layout_of(rank);
  std::vector<char> my_block(static_cast<size_t>(slot), 0), all(static_cast<size_t>(slot) * P);
  std::vector<float> scales(static_cast<size_t>(mine.num_buckets()));
  qsgd_quantize(out + range_begin(n, P, rank), mine,
                splitmix64(q.seed ^ splitmix64(static_cast<uint64_t>(rank) + 1)),
                reinterpret_cast<uint8_t*>(my_block.data()) + scales.size() * sizeof(float),
                scales.data());
  std::memcpy(my_block.data(), scales.data(), scales.size() * sizeof(float));
  if (P > 1) {
    JSS_MPI_CHECK(MPI_Allgather_c(my_block.data(), slot, MPI_BYTE, all.data(), slot, MPI_BYTE, comm),
                  "MPI_Allgather (QSGD blocks)", rank);
    stats->bytes_sent += slot * (P - 1);
    stats->bytes_received += slot * (P - 1);
    stats->messages += ceil_log2(P);
  } else {
    all = my_block;
  }
  for (int o = 0; o < P; ++o) {
    const QsgdLayout l = layout_of(o);
    const char* block = all.data() + static_cast<size_t>(slot) * o;
    std::vector<float> s(static_cast<size_t>(l.num_buckets()));
    std::memcpy(s.data(), block, s.size() * sizeof(float));
    qsgd_dequantize(reinterpret_cast<const uint8_t*>(block) + s.size() * sizeof(float), s.data(), l,
                    out + range_begin(n, P, o));
  }
  stats->switched_to_dense = 1;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error split_allgather_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                     int nranks, bool dense_phase,
                                     const DensePhaseQuantization& quantization, float* out,
                                     WireStats* stats, SparseResult* sparse) {
  const int P = nranks;
  // Slices of the local (sorted) stream per owner.
  std::vector<int64_t> bounds(P + 1);
  for (int q = 0; q <= P; ++q) bounds[q] = range_begin(n, P, q);
  const std::vector<int64_t> slice_begin = slice_offsets(local.entries, bounds);
  std::vector<int64_t> send_counts(P), recv_counts(P);
  for (int q = 0; q < P; ++q) send_counts[q] = slice_begin[q + 1] - slice_begin[q];

  std::vector<std::vector<SparseEntry>> received(P);
  if (P > 1) {
    if (auto e = exchange_counts(send_counts, &recv_counts, comm, rank, P,
                                 "MPI_Alltoall (slice sizes)", stats);
        e.failure()) {
      return e;
    }

    const int64_t my_len = range_begin(n, P, rank + 1) - range_begin(n, P, rank);
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (auto e = check_peer_count(recv_counts[q], my_len, rank, q, "slice size (split allgather)");
          e.failure()) {
        return e;
      }
    }
    std::vector<MPI_Request> requests;
    requests.reserve(2 * P);
    for (int j = 1; j < P; ++j) {
      const int src = (rank - j + P) % P;
      if (recv_counts[src] == 0) continue;
      received[src].resize(static_cast<size_t>(recv_counts[src]));
      requests.emplace_back();
      JSS_MPI_CHECK(MPI_Irecv_c(received[src].data(), recv_counts[src], entry_type(), src,
                                kTagData, comm, &requests.back()),
                    "MPI_Irecv", rank);
      stats->bytes_received += recv_counts[src] * static_cast<int64_t>(sizeof(SparseEntry));
    }
    for (int j = 1; j < P; ++j) {
      const int dst = (rank + j) % P;  // destination rotation
      if (send_counts[dst] == 0) continue;
      requests.emplace_back();
      JSS_MPI_CHECK(MPI_Isend_c(local.entries.data() + slice_begin[dst], send_counts[dst],
                                entry_type(), dst, kTagData, comm, &requests.back()),
                    "MPI_Isend", rank);
      stats->bytes_sent += send_counts[dst] * static_cast<int64_t>(sizeof(SparseEntry));
      stats->messages += 1;
    }
    JSS_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                              MPI_STATUSES_IGNORE),
                  "MPI_Waitall", rank);
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (auto e = check_peer_entries(received[q].data(), static_cast<int64_t>(received[q].size()),
                                      range_begin(n, P, rank), range_begin(n, P, rank + 1), rank,
                                      q, "slice (split allgather)");
          e.failure()) {
        return e;
      }
    }
  }
  received[rank].assign(local.entries.begin() + slice_begin[rank],
                        local.entries.begin() + slice_begin[rank + 1]);

  // The owner's sum of its range, merged in rank order.
  std::vector<SparseEntry> mine, scratch;
  for (int q = 0; q < P; ++q) {
    merge_sparse(mine, received[q], &scratch);
    mine.swap(scratch);
  }
  const int64_t lo = range_begin(n, P, rank);
  const int64_t len = range_begin(n, P, rank + 1) - lo;

  if (dense_phase) {  // DSAR: dense allgather of the owners' ranges, in place
    std::fill(out + lo, out + lo + len, 0.0f);
    for (const SparseEntry& e : mine) out[e.index] = e.value;
    if (quantization.bits > 0) {
      return quantized_dense_allgather(n, comm, rank, P, quantization, out, stats);
    }
    if (P > 1) {
      // Ranges padded to ceil(N / P) so the gather is a plain MPI_Allgather
      // (see allgather_blocks); the padding is counted in the bytes.
      const int64_t slot = (n + P - 1) / P;
      std::vector<float> mine_padded(static_cast<size_t>(slot), 0.0f), all(static_cast<size_t>(slot) * P);
      std::memcpy(mine_padded.data(), out + lo, static_cast<size_t>(len) * sizeof(float));
      JSS_MPI_CHECK(MPI_Allgather_c(mine_padded.data(), slot, MPI_FLOAT, all.data(), slot, MPI_FLOAT,
                                    comm),
                    "MPI_Allgather (ranges)", rank);
      for (int q = 0; q < P; ++q) {
        std::memcpy(out + range_begin(n, P, q), all.data() + static_cast<size_t>(slot) * q,
                    static_cast<size_t>(range_begin(n, P, q + 1) - range_begin(n, P, q)) *
                        sizeof(float));
      }
      stats->bytes_sent += slot * static_cast<int64_t>(sizeof(float)) * (P - 1);
      stats->bytes_received += slot * static_cast<int64_t>(sizeof(float)) * (P - 1);
      stats->messages += ceil_log2(P);
    }
    stats->switched_to_dense = 1;  // the second phase is dense by design
    return ffi::Error::Success();
  }

  // SSAR: sparse allgather of the merged ranges; a range past len/2 goes dense.
  const bool my_dense = static_cast<int64_t>(mine.size()) > len / 2;
  std::vector<char> block;
  if (my_dense) {
    std::vector<float> dense(static_cast<size_t>(len), 0.0f);
    for (const SparseEntry& e : mine) dense[e.index - lo] = e.value;
    block.resize(dense.size() * sizeof(float));
    std::memcpy(block.data(), dense.data(), block.size());
  } else {
    block.resize(mine.size() * sizeof(SparseEntry));
    if (!mine.empty()) std::memcpy(block.data(), mine.data(), block.size());
  }
  std::vector<int64_t> descriptors(P);
  const int64_t my_descriptor = my_dense ? kDenseBlock : static_cast<int64_t>(mine.size());
  std::vector<MPI_Count> byte_counts(P);
  std::vector<MPI_Aint> byte_displs(P);
  MPI_Aint total = 0;
  if (P > 1) {
    JSS_MPI_CHECK(MPI_Allgather(&my_descriptor, 1, MPI_INT64_T, descriptors.data(), 1, MPI_INT64_T,
                                comm),
                  "MPI_Allgather (block sizes)", rank);
    stats->bytes_sent += static_cast<int64_t>(sizeof(int64_t)) * (P - 1);
    stats->bytes_received += static_cast<int64_t>(sizeof(int64_t)) * (P - 1);
    stats->messages += ceil_log2(P);
  } else {
    descriptors[0] = my_descriptor;
  }
  for (int q = 0; q < P; ++q) {
    const int64_t qlen = range_begin(n, P, q + 1) - range_begin(n, P, q);
    if (descriptors[q] != kDenseBlock) {
      if (auto e = check_peer_count(descriptors[q], qlen, rank, q, "block size (split allgather)");
          e.failure()) {
        return e;
      }
    }
    byte_counts[q] = descriptors[q] == kDenseBlock
                         ? static_cast<MPI_Count>(qlen * sizeof(float))
                         : static_cast<MPI_Count>(descriptors[q] * sizeof(SparseEntry));
    byte_displs[q] = total;
    total += static_cast<MPI_Aint>(byte_counts[q]);
  }
  std::vector<char> all(static_cast<size_t>(total));
  if (P > 1) {
    if (auto e = allgather_blocks(block.data(), all.data(), byte_counts, byte_displs, MPI_BYTE, comm,
                                  rank, "MPI_Allgatherv (ranges)");
        e.failure()) {
      return e;
    }
    stats->bytes_sent += static_cast<int64_t>(block.size()) * (P - 1);
    stats->bytes_received += static_cast<int64_t>(total) - static_cast<int64_t>(block.size());
    stats->messages += ceil_log2(P);
  } else {
    all = block;
  }
  for (int q = 0; q < P; ++q) {
    if (q == rank || descriptors[q] == kDenseBlock) continue;
    if (auto e = check_peer_entries(all.data() + byte_displs[q], descriptors[q],
                                    range_begin(n, P, q), range_begin(n, P, q + 1), rank, q,
                                    "block (split allgather)");
        e.failure()) {
      return e;
    }
  }
  bool any_dense = false;
  for (int q = 0; q < P; ++q) any_dense = any_dense || descriptors[q] == kDenseBlock;
  if (sparse != nullptr && !any_dense) {
    // The owners' ranges in order, each sorted: the entries are sorted and unique.
    sparse->entries.resize(static_cast<size_t>(total) / sizeof(SparseEntry));
    if (total > 0) std::memcpy(sparse->entries.data(), all.data(), static_cast<size_t>(total));
    sparse->used = true;
    stats->result_nnz = count_nonzero_values(sparse->entries);
    stats->switched_to_dense = 0;
    return ffi::Error::Success();
  }
  std::fill(out, out + n, 0.0f);
  int64_t nnz = 0;  // the ranges are disjoint and each owner's entries unique
  for (int q = 0; q < P; ++q) {
    const char* src = all.data() + byte_displs[q];
    if (descriptors[q] == kDenseBlock) {
      const int64_t lo = range_begin(n, P, q);
      std::memcpy(out + lo, src, static_cast<size_t>(byte_counts[q]));
      nnz += count_nonzero(out + lo, range_begin(n, P, q + 1) - lo);
    } else {
      // Blocks after a dense one may sit at 4-byte offsets: copy, don't cast.
      for (int64_t i = 0; i < descriptors[q]; ++i) {
        SparseEntry e;
        std::memcpy(&e, src + i * sizeof(SparseEntry), sizeof(SparseEntry));
        out[e.index] = e.value;
        nnz += (e.value != 0.0f);
      }
    }
  }
  stats->result_nnz = nnz;
  stats->switched_to_dense = any_dense ? 1 : 0;
  return ffi::Error::Success();
}

}  // namespace jss
