// SSAR_Recursive_double: log P rounds of exchanging and merging sorted sparse
// streams, dense past delta = N/2; non-power-of-two P folds the extra ranks in.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ffi/collectives/algorithms.h"

namespace ffi = xla::ffi;

namespace jss {
namespace {

// ---- recursive doubling (SSAR_Recursive_double) ---------------------------
// A stream on the wire: an int64 byte count (-1: dense), then the message: the
// sparse entries in the wire format (ffi/collectives/wire_codec.h), or the n dense values
// as float32 or 16-bit. The sender first rounds its own stream to the wire
// dtype (wire_ready), so the copy it keeps is what its partner receives.

void wire_ready(SparseStream* s, int64_t dtype) {
  if (s->dense) {
    round_floats(s->values.data(), static_cast<int64_t>(s->values.size()), dtype);
  } else {
    round_entries(&s->entries, dtype);
  }
}

// The message of stream s and its byte count (-1 when dense).
int64_t stream_message(const SparseStream& s, int64_t n, WireFormat wire, std::vector<char>* out) {
  if (!s.dense) {
    pack_entries(s.entries.data(), static_cast<int64_t>(s.entries.size()), wire, out);
    return static_cast<int64_t>(out->size());
  }
  out->resize(static_cast<size_t>(n * wire.value_bytes()));
  if (wire.value_dtype == 0) {
    if (n > 0) std::memcpy(out->data(), s.values.data(), out->size());
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = wire_bits16(s.values[i], wire.value_dtype);
      std::memcpy(out->data() + 2 * i, &b, 2);
    }
  }
  return -1;
}

// A received message (byte count `count`, -1 for a dense one) as a stream.
ffi::Error stream_from_message(const std::vector<char>& message, int64_t count, int64_t n,
                               WireFormat wire, int rank, int from, SparseStream* s) {
  s->dense = count < 0;
  if (!s->dense) {
    s->values.clear();
    return unpack_message(message.data(), count, n, wire, rank, from, "recursive doubling",
                          &s->entries);
  }
  s->entries.clear();
  s->values.resize(static_cast<size_t>(n));
  if (wire.value_dtype == 0) {
    if (n > 0) std::memcpy(s->values.data(), message.data(), static_cast<size_t>(n) * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, message.data() + 2 * i, 2);
      s->values[i] = from_wire_bits16(b, wire.value_dtype);
    }
  }
  return ffi::Error::Success();
}

int64_t message_bytes(int64_t count, int64_t n, WireFormat wire) {
  return count < 0 ? n * wire.value_bytes() : count;
}

ffi::Error send_stream(SparseStream* s, int64_t n, WireFormat wire, int dest, MPI_Comm comm,
                       int rank, WireStats* stats) {
  wire_ready(s, wire.value_dtype);
  std::vector<char> message;
  const int64_t count = stream_message(*s, n, wire, &message);
  const int64_t message_size = static_cast<int64_t>(message.size());
  JSS_MPI_CHECK_BLOCKED(MPI_Send(&count, 1, MPI_INT64_T, dest, kTagCount, comm), "MPI_Send", rank,
                        ("MPI_Send (message length)", comm, WaitKind::kSend, dest, -1, 8));
  JSS_MPI_CHECK_BLOCKED(MPI_Send_c(message.data(), static_cast<MPI_Count>(message.size()), MPI_BYTE,
                                   dest, kTagData, comm),
                        "MPI_Send", rank,
                        ("MPI_Send (message)", comm, WaitKind::kSend, dest, -1, message_size));
  stats->bytes_sent += sizeof(int64_t) + static_cast<int64_t>(message.size());
  stats->messages += 2;
  return ffi::Error::Success();
}

ffi::Error recv_stream(SparseStream* s, int64_t n, WireFormat wire, int src, MPI_Comm comm,
                       int rank, WireStats* stats) {
  int64_t count = 0;
  JSS_MPI_CHECK_BLOCKED(MPI_Recv(&count, 1, MPI_INT64_T, src, kTagCount, comm, MPI_STATUS_IGNORE),
                        "MPI_Recv", rank,
                        ("MPI_Recv (message length)", comm, WaitKind::kRecv, src, 8));
  if (count < -1 || count > max_message_bytes(n, wire)) {  // -1: a dense stream
    return check_peer_count(count, max_message_bytes(n, wire), rank, src,
                            "message length (recursive doubling)");
  }
  std::vector<char> message(static_cast<size_t>(message_bytes(count, n, wire)));
  const int64_t expected = static_cast<int64_t>(message.size());
  JSS_MPI_CHECK_BLOCKED(MPI_Recv_c(message.data(), static_cast<MPI_Count>(message.size()), MPI_BYTE,
                                   src, kTagData, comm, MPI_STATUS_IGNORE),
                        "MPI_Recv", rank,
                        ("MPI_Recv (message)", comm, WaitKind::kRecv, src, expected));
  stats->bytes_received += sizeof(int64_t) + static_cast<int64_t>(message.size());
  return stream_from_message(message, count, n, wire, rank, src, s);
}

// Both directions of one round at once (MPI_Sendrecv), counts first.
ffi::Error exchange_streams(SparseStream* mine, SparseStream* theirs, int64_t n, WireFormat wire,
                            int partner, MPI_Comm comm, int rank, WireStats* stats) {
  wire_ready(mine, wire.value_dtype);
  std::vector<char> sent, received;
  const int64_t my_count = stream_message(*mine, n, wire, &sent);
  int64_t their_count = 0;
  JSS_MPI_CHECK_BLOCKED(MPI_Sendrecv(&my_count, 1, MPI_INT64_T, partner, kTagCount, &their_count,
                                     1, MPI_INT64_T, partner, kTagCount, comm, MPI_STATUS_IGNORE),
                        "MPI_Sendrecv", rank,
                        ("MPI_Sendrecv (message length)", comm, WaitKind::kSendrecv, partner, 8, 8));
  if (their_count < -1 || their_count > max_message_bytes(n, wire)) {  // -1: a dense stream
    return check_peer_count(their_count, max_message_bytes(n, wire), rank, partner,
                            "message length (recursive doubling)");
  }
  received.resize(static_cast<size_t>(message_bytes(their_count, n, wire)));
  const int64_t in_bytes = static_cast<int64_t>(received.size());
  const int64_t out_bytes = static_cast<int64_t>(sent.size());
  JSS_MPI_CHECK_BLOCKED(
      MPI_Sendrecv_c(sent.data(), static_cast<MPI_Count>(sent.size()), MPI_BYTE, partner, kTagData,
                     received.data(), static_cast<MPI_Count>(received.size()), MPI_BYTE, partner,
                     kTagData, comm, MPI_STATUS_IGNORE),
      "MPI_Sendrecv", rank,
      ("MPI_Sendrecv (message)", comm, WaitKind::kSendrecv, partner, in_bytes, out_bytes));
  stats->bytes_sent += sizeof(int64_t) + static_cast<int64_t>(sent.size());
  stats->bytes_received += sizeof(int64_t) + static_cast<int64_t>(received.size());
  stats->messages += 2;
  return stream_from_message(received, their_count, n, wire, rank, partner, theirs);
}

}  // namespace

ffi::Error recursive_doubling_allreduce(SparseStream local, int64_t n, MPI_Comm comm, int rank,
                                        int nranks, WireFormat wire, float* out, WireStats* stats,
                                        SparseResult* sparse) {
  // delta = N * isize / (isize + csize) = N / 2: past it a sparse stream is
  // larger on the wire than the dense vector.
  const int64_t delta = n / 2;
  int p2 = 1;
  while (p2 * 2 <= nranks) p2 *= 2;
  const int extra = nranks - p2;
  if (!local.dense && static_cast<int64_t>(local.entries.size()) > delta) {
    densify(local.entries, n, &local.values);  // already past delta before any round
    local.entries.clear();
    local.dense = true;
  }

  // Fold: ranks p2..P-1 hand their stream to rank - p2 and wait for the result.
  BlockedLabel label("recursive_doubling fold");  // then "round r" (1-based) in the loop
  if (rank >= p2) {
    if (auto e = send_stream(&local, n, wire, rank - p2, comm, rank, stats); e.failure()) return e;
    if (auto e = recv_stream(&local, n, wire, rank - p2, comm, rank, stats); e.failure()) return e;
  } else {
    if (rank < extra) {
      SparseStream upper;
      if (auto e = recv_stream(&upper, n, wire, rank + p2, comm, rank, stats); e.failure()) return e;
      local = merge_streams(local, upper, n, delta);
    }
    for (int mask = 1, round = 1; mask < p2; mask <<= 1, ++round) {
      const int partner = rank ^ mask;
      BlockedLabel round_label("recursive_doubling round", round);
      SparseStream theirs;
      if (auto e = exchange_streams(&local, &theirs, n, wire, partner, comm, rank, stats); e.failure())
        return e;
      // f(lower group, upper group) on both partners: bitwise-identical results.
      local = rank < partner ? merge_streams(local, theirs, n, delta)
                             : merge_streams(theirs, local, n, delta);
    }
    if (rank < extra) {
      BlockedLabel unfold_label("recursive_doubling unfold");
      if (auto e = send_stream(&local, n, wire, rank + p2, comm, rank, stats); e.failure()) return e;
    }
  }
  // The last round's sums rounded to the wire dtype on every rank: the folded
  // ranks receive them rounded, so the others round theirs the same way.
  if (rank < p2) wire_ready(&local, wire.value_dtype);
  if (local.dense && out == nullptr) {  // the device protocol's call: no host vector of N
    sparse->dense = std::move(local.values);  // local.dense stays true: the stats below
  } else if (local.dense) {
    std::memcpy(out, local.values.data(), static_cast<size_t>(n) * sizeof(float));
  } else if (sparse != nullptr) {
    stats->result_nnz = count_nonzero_values(local.entries);
    sparse->entries = std::move(local.entries);
    sparse->used = true;
  } else {
    std::fill(out, out + n, 0.0f);
    for (const SparseEntry& e : local.entries) out[e.index] = e.value;
    stats->result_nnz = count_nonzero_values(local.entries);  // a dense result is scanned
  }
  // Same on every rank: all ranks end with the same stream.
  stats->switched_to_dense = local.dense ? 1 : 0;
  return ffi::Error::Success();
}

}  // namespace jss
