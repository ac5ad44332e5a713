#include "ffi/runtime/mpi_comm.h"

#include "ffi/collectives/sparse_allreduce.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

namespace jss {

namespace ffi = xla::ffi;

namespace {

// Error texts are built without iostreams: on a GPU machine's toolchain the
// module got libstdc++ linked statically, without the locale that ostream's
// number formatting needs, and `msg << int` crashed there.
void append(std::string& s, const std::string& v) { s += v; }
void append(std::string& s, const char* v) { s += v; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& s, T v) { s += std::to_string(v); }

template <typename... Args>
std::string concat(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

}  // namespace

namespace {

// Registered communicators: entry n holds the Fortran handle of id kCommIdBase + n
// (kNoComm while unregistered). Written from Python before the programs that name
// the id are traced, read by the handlers on XLA's threads: atomics, no lock.
constexpr int64_t kNoComm = -1;
std::atomic<int64_t> g_comm_handles[kCommIdCapacity];
std::once_flag g_comm_handles_init;

void init_comm_handles() {
  for (auto& h : g_comm_handles) h.store(kNoComm, std::memory_order_relaxed);
}

}  // namespace

void register_comm_id(int64_t index, int64_t fortran_handle) {
  std::call_once(g_comm_handles_init, init_comm_handles);
  if (index < 0 || index >= kCommIdCapacity) return;  // Python checks the capacity first
  g_comm_handles[index].store(fortran_handle, std::memory_order_release);
}

int64_t fortran_handle(int64_t comm) {
  if (comm < kCommIdBase) return comm;  // a Fortran handle itself (MPI_Fint: below 2^32)
  std::call_once(g_comm_handles_init, init_comm_handles);
  const int64_t index = comm - kCommIdBase;
  const int64_t h = index < kCommIdCapacity
                        ? g_comm_handles[index].load(std::memory_order_acquire) : kNoComm;
  // an id never registered in this process: MPI_COMM_NULL, so the MPI call fails with
  // the usual "is `comm` a valid, un-freed communicator?" error
  return h == kNoComm ? static_cast<int64_t>(MPI_Comm_c2f(MPI_COMM_NULL)) : h;
}

MPI_Comm comm_from_handle(int64_t comm) {
  return MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle(comm)));
}

namespace {
std::atomic<bool> g_mpi_error_seen{false};
}  // namespace

bool take_mpi_error_seen() { return g_mpi_error_seen.exchange(false, std::memory_order_acq_rel); }

ffi::Error mpi_error(int rc, const char* call, int rank) {
  g_mpi_error_seen.store(true, std::memory_order_release);
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::string msg = concat("jax_sparse_sync: ", call, " failed on rank ");
  if (rank >= 0) {
    msg += std::to_string(rank);
  } else {  // the communicator itself is unusable: name the process by its world rank
    int world_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    msg += concat("? (COMM_WORLD rank ", world_rank,
                  "; is `comm` a valid, un-freed communicator?)");
  }
  msg += concat(": ", std::string(text, static_cast<size_t>(len)));
  return ffi::Error(ffi::ErrorCode::kInternal, msg);
}

ffi::Error exchange_headers(const CallHeader& mine, MPI_Comm comm, int rank, int nranks,
                            NanPolicy nan_policy, const char* op_name,
                            std::vector<CallHeader>* all, WireStats* stats) {
  static_assert(sizeof(CallHeader) % sizeof(int64_t) == 0, "header is int64 words");
  constexpr int kWords = sizeof(CallHeader) / sizeof(int64_t);
  all->assign(static_cast<size_t>(nranks), CallHeader{});
  // Bruck's allgather, point to point with the tracked wait: ceil(log2 P) rounds,
  // P - 1 headers sent in all (the messages and bytes MPICH's allgather sends for
  // a short message, and what the cost model counts), and a rank stuck here (a
  // peer's link down, a peer that stopped calling) is recorded as waiting for
  // that round's peer, which the watchdog names; inside MPI_Allgather it could
  // only say "every rank of its communicator". Round d (1, 2, 4, ...): send the
  // first min(d, P - d) headers held to rank - d, receive as many from rank + d,
  // appended; held[j] is then the header of rank + j.
  std::vector<CallHeader> held(static_cast<size_t>(nranks));
  held[0] = mine;
  // on an error, the receive posted is cancelled: none is left pending (a receive
  // into `held`, which goes away, matching the next call's headers)
  std::vector<MPI_Request> requests;
  std::vector<RequestPeer> peers;
  requests.reserve(2);
  peers.reserve(2);
  for (int d = 1; d < nranks; d *= 2) {
    const int blocks = std::min(d, nranks - d);
    const int src = (rank + d) % nranks, dst = (rank - d + nranks) % nranks;
    const int64_t bytes = static_cast<int64_t>(sizeof(CallHeader)) * blocks;
    requests.clear();  // the last round's: completed
    peers.clear();
    requests.push_back(MPI_REQUEST_NULL);
    peers.push_back(RequestPeer{src, 0, bytes});
    JSS_MPI_CHECK_POSTED(MPI_Irecv(held.data() + d, blocks * kWords, MPI_INT64_T, src,
                                   kTagHeaders, comm, &requests.back()),
                         "MPI_Irecv (argument check)", rank, &requests, peers);
    requests.push_back(MPI_REQUEST_NULL);
    peers.push_back(RequestPeer{dst, 1, bytes});
    JSS_MPI_CHECK_POSTED(MPI_Isend(held.data(), blocks * kWords, MPI_INT64_T, dst, kTagHeaders,
                                   comm, &requests.back()),
                         "MPI_Isend (argument check)", rank, &requests, peers);
    if (int rc = wait_all_tracked(&requests, peers, "MPI_Waitall (argument check)", comm);
        rc != MPI_SUCCESS) {
      return mpi_error(rc, "MPI_Waitall (argument check)", rank);
    }
  }
  for (int j = 0; j < nranks; ++j) (*all)[static_cast<size_t>((rank + j) % nranks)] = held[j];
  stats->bytes_sent += static_cast<int64_t>(sizeof(CallHeader)) * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(sizeof(CallHeader)) * (nranks - 1);
  stats->messages += ceil_log2(nranks);

  const CallHeader& first = (*all)[0];
  for (int r = 0; r < nranks; ++r) {
    const CallHeader& h = (*all)[r];
    const std::string msg = concat("jax_sparse_sync.", op_name, ": ");
    if (h.size != first.size) {
      return ffi::Error::InvalidArgument(concat(
          msg, "`size` differs across ranks: rank 0 passed size=", first.size, " but rank ", r,
          " passed size=", h.size, ". Every rank must pass the same dense size (the ",
          "same model, flattened the same way)."));
    }
    if (h.algorithm != first.algorithm) {
      auto describe = [](int64_t word) {
        std::string d = algorithm_name(word & 0xffff);
        const int64_t quantize_bits = (word >> 16) & 0xffff, wire = word >> 32;
        if (quantize_bits) d += " (quantize_bits=" + std::to_string(quantize_bits) + ")";
        if (wire & 0xf) {
          d += (wire & 0xf) == 1 ? " (wire_dtype=bfloat16)" : " (wire_dtype=float16)";
        }
        if (wire >> 4) d += " (index_encoding='auto')";
        return d;
      };
      return ffi::Error::InvalidArgument(concat(
          msg, "`algorithm` differs across ranks (rank 0 uses '", describe(first.algorithm),
          "', rank ", r, " uses '", describe(h.algorithm),
          "'). Pass the same algorithm on every rank; ",
          "algorithm='auto' decides from values that are equal on all ranks."));
    }
    if (h.param != first.param) {
      const int64_t algo = first.algorithm & 0xffff;
      const char* name = algo == static_cast<int64_t>(Algorithm::kBlock)   ? "block_size"
                         : algo == static_cast<int64_t>(Algorithm::kDense) ? "wire_dtype (0: float32, 1: bfloat16, 2: float16)"
                                                                            : "k";
      return ffi::Error::InvalidArgument(concat(msg, "`", name, "` differs across ranks: rank 0 passed ",
                                                name, "=", first.param, " but rank ", r, " passed ",
                                                name, "=", h.param,
                                                ". Pass the same value on every rank."));
    }
    if (h.flags & CallHeader::kBadIndex) {
      return ffi::Error::InvalidArgument(concat(
          msg, "`indices` out of range on rank ", r, ": indices[", h.bad_position, "] = ",
          h.bad_index, " is not in [0, size=", h.size,
          "). Use index -1 for padding slots (value 0)."));
    }
  }
  if (nan_policy == NanPolicy::kRaise) {
    std::string ranks;
    for (int r = 0; r < nranks; ++r) {
      if ((*all)[r].flags & CallHeader::kNonFinite) ranks += concat(ranks.empty() ? "" : ", ", r);
    }
    if (!ranks.empty()) {
      return ffi::Error::InvalidArgument(concat(
          "jax_sparse_sync.", op_name, ": non-finite (NaN or Inf) entries in `values` on ",
          "rank(s) ", ranks, ". The gradient diverged or the loss produced NaN; ",
          "fix the model, lower the learning rate, or pass nan_policy='propagate' to let ",
          "non-finite values reach the sum as a dense allreduce would."));
    }
  }
  return ffi::Error::Success();
}

ffi::Error allgather_blocks(const void* send, void* recv, const std::vector<MPI_Count>& counts,
                            const std::vector<MPI_Aint>& displs, MPI_Datatype type, MPI_Comm comm,
                            int rank, const char* what) {
  bool equal = true;
  for (size_t q = 1; q < counts.size(); ++q) equal &= counts[q] == counts[0];
  if (equal) {
    JSS_MPI_CHECK(MPI_Allgather_c(send, counts[0], type, recv, counts[0], type, comm), what, rank);
  } else {
    JSS_MPI_CHECK(MPI_Allgatherv_c(send, counts[rank], type, recv, counts.data(), displs.data(),
                                   type, comm),
                  what, rank);
  }
  return ffi::Error::Success();
}

ffi::Error allgather_int64(int64_t mine, int64_t* all, MPI_Comm comm, int rank, int nranks,
                           const char* what, WireStats* stats) {
  JSS_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT64_T, all, 1, MPI_INT64_T, comm), what, rank);
  stats->bytes_sent += static_cast<int64_t>(sizeof(int64_t)) * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(sizeof(int64_t)) * (nranks - 1);
  stats->messages += ceil_log2(nranks);
  return ffi::Error::Success();
}

ffi::Error allgather_lengths(int64_t mine, int64_t* all, MPI_Comm comm, int rank, int nranks,
                             const char* what, WireStats* stats) {
  if (nranks == 1) {
    all[0] = mine;
    return ffi::Error::Success();
  }
  return allgather_int64(mine, all, comm, rank, nranks, what, stats);
}

ffi::Error allgather_messages(const std::vector<char>& mine, std::vector<char>* all,
                              const std::vector<MPI_Count>& counts,
                              const std::vector<MPI_Aint>& displs, MPI_Comm comm, int rank,
                              int nranks, const char* what, WireStats* stats) {
  if (nranks == 1) {
    *all = mine;
    return ffi::Error::Success();
  }
  if (auto e = allgather_blocks(mine.data(), all->data(), counts, displs, MPI_BYTE, comm, rank,
                                what);
      e.failure()) {
    return e;
  }
  const int64_t my_size = static_cast<int64_t>(mine.size());
  stats->bytes_sent += my_size * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(all->size()) - my_size;
  stats->messages += ceil_log2(nranks);
  return ffi::Error::Success();
}

ffi::Error exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>* recv,
                           MPI_Comm comm, int rank, int nranks, const char* what,
                           WireStats* stats) {
  recv->assign(static_cast<size_t>(nranks), 0);
  (*recv)[static_cast<size_t>(rank)] = send[static_cast<size_t>(rank)];
  // The library's own all-to-all: one int64 to and from every peer, point to
  // point, so that a rank stuck here (a peer's link down) is recorded as waiting
  // for the peers whose counts have not come (the watchdog's report names them;
  // from inside MPI_Alltoall it could only list every other rank). The same
  // messages and bytes as the pairwise MPI_Alltoall.
  std::vector<MPI_Request> requests;
  std::vector<RequestPeer> peers;
  requests.reserve(static_cast<size_t>(2 * nranks));
  peers.reserve(static_cast<size_t>(2 * nranks));
  // On an error, the receives posted are cancelled: none is left pending (a
  // receive into the caller's `recv`, matching the next call's counts).
  for (int j = 1; j < nranks; ++j) {
    const int src = (rank - j + nranks) % nranks;
    requests.push_back(MPI_REQUEST_NULL);
    peers.push_back(RequestPeer{src, 0, static_cast<int64_t>(sizeof(int64_t))});
    JSS_MPI_CHECK_POSTED(MPI_Irecv(recv->data() + src, 1, MPI_INT64_T, src, kTagCounts, comm,
                                   &requests.back()),
                         "MPI_Irecv (counts)", rank, &requests, peers);
  }
  for (int j = 1; j < nranks; ++j) {
    const int dst = (rank + j) % nranks;
    requests.push_back(MPI_REQUEST_NULL);
    peers.push_back(RequestPeer{dst, 1, static_cast<int64_t>(sizeof(int64_t))});
    JSS_MPI_CHECK_POSTED(MPI_Isend(send.data() + dst, 1, MPI_INT64_T, dst, kTagCounts, comm,
                                   &requests.back()),
                         "MPI_Isend (counts)", rank, &requests, peers);
  }
  if (int rc = wait_all_tracked(&requests, peers, what, comm); rc != MPI_SUCCESS) {
    return mpi_error(rc, what, rank);
  }
  stats->bytes_sent += static_cast<int64_t>(sizeof(int64_t)) * (nranks - 1);
  stats->bytes_received += static_cast<int64_t>(sizeof(int64_t)) * (nranks - 1);
  stats->messages += nranks - 1;
  return ffi::Error::Success();
}

}  // namespace jss
