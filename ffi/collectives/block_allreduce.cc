// Block-sparse allreduce (OmniReduce style), lossless.
//
// The vector is cut into blocks of `block_size` entries; only blocks holding a
// nonzero travel. Rank q owns blocks [q B / P, (q+1) B / P). Each rank sends
// every owner a bitmap of its nonzero blocks in the owner's range followed by
// those blocks (non-blocking, rotated destinations); the owner adds them in
// rank order, so each entry is summed as ((x_0 + x_1) + x_2) + ..., exactly the
// dense sum in rank order; absent blocks add nothing. The owners' nonzero
// result blocks are then gathered to every rank (bitmap + blocks again).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ffi/collectives/algorithms.h"
#include "ffi/collectives/allreduce_call.h"
#include "ffi/handlers/argument_checks.h"
#include "ffi/collectives/collectives_host.h"
#include "ffi/handlers/cpu_dispatch.h"
#include "ffi/runtime/mpi_comm.h"
#include "ffi/collectives/peer_checks.h"
#include "ffi/handlers/signatures.h"
#include "ffi/collectives/sparse_allreduce.h"
#include "ffi/runtime/watchdog.h"
#include "kernels/block_scan.h"
#include "kernels/float_bits.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

struct BlockRange {
  int64_t first, count;  // blocks
};

BlockRange owner_range(int64_t nb, int P, int q) {
  const int64_t a = nb * q / P, b = nb * (q + 1) / P;
  return {a, b - a};
}

// A message: bitmap over `range` (1 bit per block) then the listed blocks'
// entries (the last block of the vector may be short). x holds the vector's
// entries from index `base` on.
std::vector<char> pack(const float* x, int64_t base, int64_t n, int64_t block, BlockRange range,
                       const std::vector<int64_t>& ids) {
  const int64_t bitmap_bytes = (range.count + 7) / 8;
  int64_t floats = 0;
  for (int64_t b : ids) floats += std::min(block, n - b * block);
  std::vector<char> msg(static_cast<size_t>(bitmap_bytes + floats * 4), 0);
  char* data = msg.data() + bitmap_bytes;
  for (int64_t b : ids) {
    const int64_t rel = b - range.first;
    msg[rel / 8] = static_cast<char>(msg[rel / 8] | (1 << (rel % 8)));
    const int64_t len = std::min(block, n - b * block);
    std::memcpy(data, x + (b * block - base), static_cast<size_t>(len) * 4);
    data += len * 4;
  }
  return msg;
}

// Calls f(block id, pointer to its entries, length) for each block in msg.
template <typename F>
void unpack(const char* msg, int64_t n, int64_t block, BlockRange range, F f) {
  const int64_t bitmap_bytes = (range.count + 7) / 8;
  const char* data = msg + bitmap_bytes;
  for (int64_t rel = 0; rel < range.count; ++rel) {
    if (!(msg[rel / 8] & (1 << (rel % 8)))) continue;
    const int64_t b = range.first + rel;
    const int64_t len = std::min(block, n - b * block);
    f(b, data, len);
    data += len * 4;
  }
}

// Whether `bytes` bytes of msg are one whole message over `range` (its bitmap,
// then exactly the blocks it lists): checked before unpack reads a peer's.
bool message_fits(const char* msg, int64_t bytes, int64_t n, int64_t block, BlockRange range) {
  const int64_t bitmap_bytes = (range.count + 7) / 8;
  if (bytes < bitmap_bytes) return false;
  int64_t need = bitmap_bytes;
  for (int64_t rel = 0; rel < range.count; ++rel) {
    if (msg[rel / 8] & (1 << (rel % 8))) need += std::min(block, n - (range.first + rel) * block) * 4;
  }
  return need == bytes;
}

// The longest message over `range`: its bitmap and every block.
int64_t max_message_bytes(int64_t n, int64_t block, BlockRange range) {
  const int64_t floats = std::max<int64_t>(
      std::min(n, (range.first + range.count) * block) - range.first * block, 0);
  return (range.count + 7) / 8 + floats * 4;
}

void ids_in(const std::vector<int64_t>& ids, BlockRange r, std::vector<int64_t>* out) {
  out->clear();
  for (int64_t b : ids) {
    if (b >= r.first && b < r.first + r.count) out->push_back(b);
  }
}

}  // namespace

ffi::Error block_allreduce_host(const float* src, int64_t n, int64_t block, MPI_Comm comm,
                                int64_t nan_policy, float* dst, WireStats* stats_out) {
  if (block < 1) {
    return ffi::Error::InvalidArgument("jax_sparse_sync.block_allreduce: `block_size` must be >= 1");
  }
  int rank = 0, P = 1;
  JSS_MPI_CHECK(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", -1);
  JSS_MPI_CHECK(MPI_Comm_size(comm, &P), "MPI_Comm_size", rank);
  WatchdogScope watchdog("block_allreduce", comm);
  BlockedLabel label("block");
  std::vector<int64_t> ids;
  nonzero_blocks(src, n, block, &ids);

  CallHeader header;
  header.size = n;
  header.algorithm = static_cast<int64_t>(Algorithm::kBlock);
  header.param = block;
  header.nnz = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    if (!is_finite_f32(src[i])) {
      header.flags |= CallHeader::kNonFinite;
      break;
    }
  }
  WireStats stats;
  std::vector<CallHeader> headers;
  if (auto e = exchange_headers(header, comm, rank, P, static_cast<NanPolicy>(nan_policy),
                                "block_allreduce", &headers, &stats);
      e.failure()) {
    return e;
  }
  const int64_t nb = num_blocks(n, block);

  // Phase 1: every owner gets this rank's nonzero blocks of its range.
  std::vector<std::vector<char>> outbox(P), inbox(P);
  std::vector<int64_t> send_bytes(P), recv_bytes(P, 0), sub;
  for (int q = 0; q < P; ++q) {
    ids_in(ids, owner_range(nb, P, q), &sub);
    outbox[q] = pack(src, 0, n, block, owner_range(nb, P, q), sub);
    send_bytes[q] = static_cast<int64_t>(outbox[q].size());
  }
  if (P > 1) {
    if (auto e = exchange_counts(send_bytes, &recv_bytes, comm, rank, P,
                                 "MPI_Waitall (message sizes)", &stats);
        e.failure()) {
      return e;
    }
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (auto e = check_peer_count(recv_bytes[q], max_message_bytes(n, block, owner_range(nb, P, rank)),
                                    rank, q, "message size (block)");
          e.failure()) {
        return e;
      }
    }
    // On an MPI error, the receives posted are cancelled (cancel_pending): none
    // is left pending (a receive into `inbox`, which goes away, matching the
    // next call's blocks).
    std::vector<MPI_Request> requests;
    std::vector<RequestPeer> request_peers;  // the watchdog's report; which are sends
    for (int j = 1; j < P; ++j) {
      const int from = (rank - j + P) % P, to = (rank + j) % P;
      inbox[from].resize(static_cast<size_t>(recv_bytes[from]));
      requests.push_back(MPI_REQUEST_NULL);
      request_peers.push_back(RequestPeer{from, 0, recv_bytes[from]});
      JSS_MPI_CHECK_POSTED(MPI_Irecv_c(inbox[from].data(), recv_bytes[from], MPI_BYTE, from,
                                       kTagData, comm, &requests.back()),
                           "MPI_Irecv (phase 1 blocks)", rank, &requests, request_peers);
      requests.push_back(MPI_REQUEST_NULL);
      request_peers.push_back(RequestPeer{to, 1, send_bytes[to]});
      JSS_MPI_CHECK_POSTED(MPI_Isend_c(outbox[to].data(), send_bytes[to], MPI_BYTE, to, kTagData,
                                       comm, &requests.back()),
                           "MPI_Isend (phase 1 blocks)", rank, &requests, request_peers);
      stats.bytes_sent += send_bytes[to];
      stats.bytes_received += recv_bytes[from];
      stats.messages += 1;
    }
    if (int rc = wait_all_tracked(&requests, request_peers, "MPI_Waitall (phase 1 blocks)", comm);
        rc != MPI_SUCCESS) {
      return mpi_error(rc, "MPI_Waitall (phase 1 blocks)", rank);
    }
    for (int q = 0; q < P; ++q) {
      if (q == rank) continue;
      if (!message_fits(inbox[q].data(), recv_bytes[q], n, block, owner_range(nb, P, rank))) {
        return corrupt_peer_message(rank, q, "message (block)",
                                    "its bitmap does not match its length of " +
                                        std::to_string(recv_bytes[q]) + " bytes");
      }
    }
  }
  inbox[rank].swap(outbox[rank]);

  // The owner's sum, in rank order.
  const BlockRange mine = owner_range(nb, P, rank);
  const int64_t lo = mine.first * block;
  const int64_t hi = std::min(n, (mine.first + mine.count) * block);
  std::vector<float> acc(static_cast<size_t>(std::max<int64_t>(hi - lo, 0)), 0.0f);
  for (int q = 0; q < P; ++q) {
    unpack(inbox[q].data(), n, block, mine, [&](int64_t b, const char* data, int64_t len) {
      float* dst = acc.data() + (b * block - lo);
      for (int64_t i = 0; i < len; ++i) {
        float v;
        std::memcpy(&v, data + i * 4, 4);
        dst[i] += v;
      }
    });
  }

  // Phase 2: gather the nonzero result blocks (bitmap + blocks) to every rank.
  std::vector<int64_t> result_ids;
  nonzero_blocks(acc.data(), hi - lo, block, &result_ids);
  for (int64_t& b : result_ids) b += mine.first;
  const std::vector<char> block_msg = pack(acc.data(), lo, n, block, mine, result_ids);
  std::vector<int64_t> sizes(P);
  const int64_t my_size = static_cast<int64_t>(block_msg.size());
  std::vector<char> all;
  std::vector<MPI_Aint> displs(P);
  if (auto e = allgather_lengths(my_size, sizes.data(), comm, rank, P,
                                 "MPI_Allgather (block message sizes)", &stats);
      e.failure()) {
    return e;
  }
  std::vector<MPI_Count> counts(P);
  MPI_Aint total = 0;
  for (int q = 0; q < P; ++q) {
    if (q != rank) {
      if (auto e = check_peer_count(sizes[q], max_message_bytes(n, block, owner_range(nb, P, q)),
                                    rank, q, "result message size (block)");
          e.failure()) {
        return e;
      }
    }
    counts[q] = static_cast<MPI_Count>(sizes[q]);
    displs[q] = total;
    total += static_cast<MPI_Aint>(sizes[q]);
  }
  all.resize(static_cast<size_t>(total));
  if (auto e = allgather_messages(block_msg, &all, counts, displs, comm, rank, P,
                                  "MPI_Allgatherv (result blocks)", &stats);
      e.failure()) {
    return e;
  }
  for (int q = 0; q < P; ++q) {
    if (q != rank &&
        !message_fits(all.data() + displs[q], sizes[q], n, block, owner_range(nb, P, q))) {
      return corrupt_peer_message(rank, q, "result message (block)",
                                  "its bitmap does not match its length of " +
                                      std::to_string(sizes[q]) + " bytes");
    }
  }
  std::fill(dst, dst + n, 0.0f);
  int64_t result_blocks = 0;
  for (int q = 0; q < P; ++q) {
    unpack(all.data() + displs[q], n, block, owner_range(nb, P, q),
           [&](int64_t b, const char* data, int64_t len) {
             std::memcpy(dst + b * block, data, static_cast<size_t>(len) * 4);
             ++result_blocks;
           });
  }
  stats.result_nnz = result_blocks;  // nonzero blocks of the result
  stats.algorithm = static_cast<int64_t>(Algorithm::kBlock);
  *stats_out = stats;
  return ffi::Error::Success();
}

namespace {

ffi::Error BlockAllreduceImpl(ffi::Token, ffi::Buffer<ffi::F32> x, ffi::Result<ffi::Token>,
                              ffi::ResultBuffer<ffi::F32> out, ffi::Result<ffi::AnyBuffer> stats_out,
                              int64_t block, int64_t comm_handle, int64_t nan_policy) {
  WireStats stats;
  if (auto e = block_allreduce_host(x.typed_data(), static_cast<int64_t>(x.element_count()), block,
                                    comm_from_handle(comm_handle), nan_policy, out->typed_data(),
                                    &stats);
      e.failure()) {
    return e;
  }
  return write_stats(stats, stats_out);
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssBlockAllreduce, jss::BlockAllreduceImpl,
                              jss::sig::bind_block_allreduce(ffi::Ffi::Bind()));

namespace jss {
namespace {

ffi::Error BlockScanImpl(ffi::AnyBuffer x, ffi::ResultBuffer<ffi::U8> mask, int64_t block_size) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (auto e = checks::check_block_scan_args(checks::Platform::kCpu, x, mask, block_size);
      e.failure()) {
    return e;
  }
  return cpu_ffi::for_float_dtype(x.element_type(), "block_scan", "x", [&](auto tag) {
    using T = decltype(tag);
    block_mask(cpu_ffi::data_as<T>(x), n, block_size, mask->typed_data(), num_threads_for(n));
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jss

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssBlockScan, jss::BlockScanImpl,
                              jss::sig::bind_block_scan(ffi::Ffi::Bind()));
