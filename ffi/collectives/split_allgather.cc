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

#include "ffi/collectives/algorithms.h"
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

// DSAR's dense phase on a 16-bit wire: each owner's range rounded to the wire
// dtype, padded to ceil(N / P) and gathered with MPI_Allgather; every rank, the
// owner included, widens the same bits.
ffi::Error dense_allgather_16bit(int64_t n, MPI_Comm comm, int rank, int P, int64_t dtype,
                                 float* out, WireStats* stats) {
  const int64_t slot = (n + P - 1) / P;
  const int64_t lo = range_begin(n, P, rank), len = range_begin(n, P, rank + 1) - lo;
  std::vector<uint16_t> mine(static_cast<size_t>(slot), 0), all(static_cast<size_t>(slot) * P);
  for (int64_t i = 0; i < len; ++i) mine[i] = wire_bits16(out[lo + i], dtype);
  if (P > 1) {
    JSS_MPI_CHECK(MPI_Allgather_c(mine.data(), slot, MPI_UINT16_T, all.data(), slot, MPI_UINT16_T,
                                  comm),
                  "MPI_Allgather (ranges, 16-bit wire)", rank);
    stats->bytes_sent += slot * 2 * (P - 1);
    stats->bytes_received += slot * 2 * (P - 1);
    stats->messages += ceil_log2(P);
  } else {
    all = mine;
  }
  for (int q = 0; q < P; ++q) {
    const int64_t qlo = range_begin(n, P, q), qlen = range_begin(n, P, q + 1) - qlo;
    for (int64_t i = 0; i < qlen; ++i) {
      out[qlo + i] = from_wire_bits16(all[static_cast<size_t>(slot * q + i)], dtype);
    }
  }
  stats->switched_to_dense = 1;
  return ffi::Error::Success();
}

// A phase-2 block's entries must lie in its owner's range (the owners' ranges
// are disjoint, which the result's construction relies on).
ffi::Error check_in_range(const std::vector<SparseEntry>& entries, int64_t n, int P, int owner,
                          int rank) {
  const int64_t lo = range_begin(n, P, owner), hi = range_begin(n, P, owner + 1);
  if (!entries.empty() && (entries.front().index < lo || entries.back().index >= hi)) {
    return ffi::Error::Internal(
        "jax_sparse_sync.sparse_allreduce: rank " + std::to_string(rank) + " received from rank " +
        std::to_string(owner) + " a range holding indices outside its [" + std::to_string(lo) +
        ", " + std::to_string(hi) + ")");
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error exchange_slices(const std::vector<SparseEntry>& entries,
                           const std::vector<int64_t>& slice_begin, int64_t n, WireFormat wire,
                           MPI_Comm comm, int rank, int P, const char* what_counts,
                           const char* phase, WireStats* stats,
                           std::vector<std::vector<SparseEntry>>* received,
                           xla::ffi::Error* malformed) {
  if (P == 1) return ffi::Error::Success();
  // Each destination's slice as its message; an empty slice is no message.
  std::vector<std::vector<char>> messages(P);
  std::vector<int64_t> send_bytes(P, 0), recv_bytes(P, 0);
  for (int q = 0; q < P; ++q) {
    const int64_t count = slice_begin[q + 1] - slice_begin[q];
    if (q == rank || count == 0) continue;
    pack_entries(entries.data() + slice_begin[q], count, wire, &messages[q]);
    send_bytes[q] = static_cast<int64_t>(messages[q].size());
  }
  if (auto e = exchange_counts(send_bytes, &recv_bytes, comm, rank, P, what_counts, stats);
      e.failure()) {
    return e;
  }
  for (int q = 0; q < P; ++q) {
    if (q == rank) continue;
    if (auto e = check_peer_count(recv_bytes[q], max_message_bytes(n, wire), rank, q, phase);
        e.failure()) {
      return e;
    }
  }
  std::vector<std::vector<char>> inbox(P);
  // On an MPI error, the receives posted are cancelled (cancel_pending): none is
  // left pending (a receive into `inbox`, which goes away, matching the next
  // call's slices).
  std::vector<MPI_Request> requests;
  std::vector<RequestPeer> request_peers;  // the watchdog's report; which are sends
  requests.reserve(2 * P);
  request_peers.reserve(2 * P);
  for (int j = 1; j < P; ++j) {
    const int src = (rank - j + P) % P;
    if (recv_bytes[src] <= 0) continue;
    inbox[src].resize(static_cast<size_t>(recv_bytes[src]));
    requests.push_back(MPI_REQUEST_NULL);
    request_peers.push_back(RequestPeer{src, 0, recv_bytes[src]});
    JSS_MPI_CHECK_POSTED(MPI_Irecv_c(inbox[src].data(), recv_bytes[src], MPI_BYTE, src, kTagData,
                                     comm, &requests.back()),
                         "MPI_Irecv (slice)", rank, &requests, request_peers);
    stats->bytes_received += recv_bytes[src];
  }
  for (int j = 1; j < P; ++j) {
    const int dst = (rank + j) % P;  // destination rotation
    if (send_bytes[dst] == 0) continue;
    requests.push_back(MPI_REQUEST_NULL);
    request_peers.push_back(RequestPeer{dst, 1, send_bytes[dst]});
    JSS_MPI_CHECK_POSTED(MPI_Isend_c(messages[dst].data(), send_bytes[dst], MPI_BYTE, dst,
                                     kTagData, comm, &requests.back()),
                         "MPI_Isend (slice)", rank, &requests, request_peers);
    stats->bytes_sent += send_bytes[dst];
    stats->messages += 1;
  }
  {
    BlockedLabel label(phase);
    if (int rc = wait_all_tracked(&requests, request_peers, "MPI_Waitall (slices)", comm);
        rc != MPI_SUCCESS) {
      return mpi_error(rc, "MPI_Waitall (slices)", rank);
    }
  }
  for (int src = 0; src < P; ++src) {
    if (src == rank || recv_bytes[src] == 0) continue;  // no message: no entries
    if (auto e = unpack_message(inbox[src].data(), static_cast<int64_t>(inbox[src].size()), n, wire,
                                rank, src, phase, &(*received)[src]);
        e.failure()) {
      (*received)[src].clear();  // reported in phase 2, on every rank (see algorithms.h)
      if (!malformed->failure()) *malformed = std::move(e);
    }
  }
  return ffi::Error::Success();
}

ffi::Error split_allgather_allreduce(const SparseStream& local, int64_t n, MPI_Comm comm, int rank,
                                     int nranks, bool dense_phase,
                                     const DensePhaseQuantization& quantization, WireFormat wire,
                                     float* out, WireStats* stats, SparseResult* sparse) {
  const int P = nranks;
  // Slices of the local (sorted) stream per owner.
  std::vector<int64_t> bounds(P + 1);
  for (int q = 0; q <= P; ++q) bounds[q] = range_begin(n, P, q);
  const std::vector<int64_t> slice_begin = slice_offsets(local.entries, bounds);
  std::vector<std::vector<SparseEntry>> received(P);
  ffi::Error malformed = ffi::Error::Success();
  if (auto e = exchange_slices(local.entries, slice_begin, n, wire, comm, rank, P,
                               "MPI_Waitall (slice sizes)", "split-allgather phase 1", stats,
                               &received, &malformed);
      e.failure()) {
    return e;
  }
  for (int q = 0; q < P; ++q) {  // a slice outside this owner's range would be written past it
    if (auto e = check_in_range(received[q], n, P, rank, rank); e.failure()) {
      received[q].clear();
      if (!malformed.failure()) malformed = std::move(e);
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
      auto e = quantized_dense_allgather(n, comm, rank, P, quantization, out, stats);
      return malformed.failure() ? std::move(malformed) : std::move(e);
    }
    if (wire.value_dtype != 0) {
      auto e = dense_allgather_16bit(n, comm, rank, P, wire.value_dtype, out, stats);
      return malformed.failure() ? std::move(malformed) : std::move(e);
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
    return malformed;  // this rank's phase-1 error, after the collectives (no one waits)
  }

  // SSAR: sparse allgather of the merged ranges, each in the wire format
  // (ffi/collectives/wire_codec.h); a range whose message would be larger than its dense
  // values (past len/2 entries with float32 values and int32 indices) goes dense.
  std::vector<char> block;
  pack_entries(mine.data(), static_cast<int64_t>(mine.size()), wire, &block);
  const bool my_dense = static_cast<int64_t>(block.size()) > len * wire.value_bytes();
  if (my_dense) {
    std::vector<float> dense(static_cast<size_t>(len), 0.0f);
    for (const SparseEntry& e : mine) dense[e.index - lo] = e.value;
    block.resize(static_cast<size_t>(len * wire.value_bytes()));
    for (int64_t i = 0; i < len; ++i) {
      if (wire.value_dtype == 0) {
        std::memcpy(block.data() + 4 * i, &dense[i], 4);
      } else {
        const uint16_t b = wire_bits16(dense[i], wire.value_dtype);
        std::memcpy(block.data() + 2 * i, &b, 2);
      }
    }
  }
  // Block descriptors: the message's bytes, or kDenseBlock.
  std::vector<int64_t> descriptors(P);
  // A malformed phase-1 message becomes kMalformedBlock, so every rank fails alike.
  if (malformed.failure()) block.clear();
  const int64_t my_descriptor = malformed.failure() ? kMalformedBlock
                                : my_dense        ? kDenseBlock
                                                  : static_cast<int64_t>(block.size());
  std::vector<MPI_Count> byte_counts(P);
  std::vector<MPI_Aint> byte_displs(P);
  MPI_Aint total = 0;
  if (auto e = allgather_lengths(my_descriptor, descriptors.data(), comm, rank, P,
                                 "MPI_Allgather (block sizes)", stats);
      e.failure()) {
    return e;
  }
  if (malformed.failure()) return malformed;
  for (int q = 0; q < P; ++q) {
    if (descriptors[q] == kMalformedBlock) return malformed_phase1(rank, q);
    const int64_t qlen = range_begin(n, P, q + 1) - range_begin(n, P, q);
    if (q != rank && descriptors[q] != kDenseBlock) {
      if (auto e = check_peer_count(descriptors[q], max_message_bytes(qlen, wire), rank, q,
                                    "block length (split-allgather phase 2)");
          e.failure()) {
        return e;
      }
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t qlen = range_begin(n, P, q + 1) - range_begin(n, P, q);
    byte_counts[q] = descriptors[q] == kDenseBlock
                         ? static_cast<MPI_Count>(qlen * wire.value_bytes())
                         : static_cast<MPI_Count>(descriptors[q]);
    byte_displs[q] = total;
    total += static_cast<MPI_Aint>(byte_counts[q]);
  }
  std::vector<char> all(static_cast<size_t>(total));
  if (auto e = allgather_messages(block, &all, byte_counts, byte_displs, comm, rank, P,
                                  "MPI_Allgatherv (ranges)", stats);
      e.failure()) {
    return e;
  }
  bool any_dense = false;
  for (int q = 0; q < P; ++q) any_dense = any_dense || descriptors[q] == kDenseBlock;
  // Every rank decodes every block, its own included: all hold the same values.
  std::vector<SparseEntry> entries;
  if (sparse != nullptr && !any_dense) {
    // The owners' ranges in order, each sorted: the entries are sorted and unique.
    sparse->entries.clear();
    for (int q = 0; q < P; ++q) {
      if (auto e = unpack_message(all.data() + byte_displs[q], byte_counts[q], n, wire, rank, q,
                                  "split-allgather phase 2", &entries);
          e.failure()) {
        return e;
      }
      if (auto e = check_in_range(entries, n, P, q, rank); e.failure()) return e;
      sparse->entries.insert(sparse->entries.end(), entries.begin(), entries.end());
    }
    sparse->used = true;
    stats->result_nnz = count_nonzero_values(sparse->entries);
    stats->switched_to_dense = 0;
    return ffi::Error::Success();
  }
  if (out == nullptr) {  // the device protocol's call: the dense result in `sparse`
    sparse->dense.resize(static_cast<size_t>(n));
    out = sparse->dense.data();
  }
  std::fill(out, out + n, 0.0f);
  int64_t nnz = 0;  // the ranges are disjoint and each owner's entries unique
  for (int q = 0; q < P; ++q) {
    const char* src = all.data() + byte_displs[q];
    if (descriptors[q] == kDenseBlock) {
      const int64_t qlo = range_begin(n, P, q), qlen = range_begin(n, P, q + 1) - qlo;
      for (int64_t i = 0; i < qlen; ++i) {
        if (wire.value_dtype == 0) {
          std::memcpy(out + qlo + i, src + 4 * i, 4);
        } else {
          uint16_t b;
          std::memcpy(&b, src + 2 * i, 2);
          out[qlo + i] = from_wire_bits16(b, wire.value_dtype);
        }
      }
      nnz += count_nonzero(out + qlo, qlen);
    } else {
      if (auto e = unpack_message(src, byte_counts[q], n, wire, rank, q, "split-allgather phase 2",
                                  &entries);
          e.failure()) {
        return e;
      }
      if (auto e = check_in_range(entries, n, P, q, rank); e.failure()) return e;
      for (const SparseEntry& e : entries) {
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
