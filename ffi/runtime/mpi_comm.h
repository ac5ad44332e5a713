// MPI plumbing shared by the MPI-backed FFI handlers: communicator handles,
// error conversion, wire accounting, and the collective argument check that
// every sparse collective begins with.
#pragma once

#include <mpi.h>

#include <cassert>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "ffi/runtime/blocked_on.h"
#include "xla/ffi/api/ffi.h"

namespace jss {

// Communicators travel through XLA as an int64 attribute `comm`: a communicator
// id, kCommIdBase + n, which jax_sparse_sync/mpi/comm.py assigns in the order a
// process first uses its communicators (the library's default clone of
// COMM_WORLD first) and registers here with its Fortran handle (MPI_Comm_c2f).
// The id, not the handle, is what a compiled program holds: handles differ
// between the ranks of a job and between jobs (MPICH numbers communicators in
// the order each process allocates them), ids do not, so every rank and every
// job compiles the same program and JAX's persistent compilation cache serves
// them all. A value below kCommIdBase is taken as a Fortran handle itself
// (MPI_Fint is 32-bit, so the two never meet).
constexpr int64_t kCommIdBase = int64_t{1} << 32;
constexpr int64_t kCommIdCapacity = 4096;

// Records that id kCommIdBase + index names the communicator `fortran_handle`.
void register_comm_id(int64_t index, int64_t fortran_handle);

// The Fortran handle a `comm` attribute names (an unregistered id: MPI_COMM_NULL's).
int64_t fortran_handle(int64_t comm);

// The communicator a `comm` attribute names.
MPI_Comm comm_from_handle(int64_t comm);

// Wire statistics of one collective, counted by this rank. The layout is the
// `stats` output of the sparse allreduce handlers (see jax_sparse_sync/stats.py).
struct WireStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t messages = 0;
  int64_t result_nnz = 0;
  int64_t switched_to_dense = 0;
  int64_t algorithm = -1;  // id of the algorithm that ran (after "auto" was resolved)
  static constexpr int kFields = 6;
  void write(int64_t* out) const {
    out[0] = bytes_sent; out[1] = bytes_received; out[2] = messages;
    out[3] = result_nnz; out[4] = switched_to_dense; out[5] = algorithm;
  }
  // int32 output (JAX without x64): saturates at INT32_MAX instead of wrapping.
  void write(int32_t* out) const {
    int64_t wide[kFields];
    write(wide);
    for (int i = 0; i < kFields; ++i) {
      out[i] = static_cast<int32_t>(wide[i] > INT32_MAX ? INT32_MAX : wide[i]);
    }
  }
};

// An MPI error as an XLA FFI error naming the call and the rank. Also records
// that an MPI call failed (see take_mpi_error_seen).
xla::ffi::Error mpi_error(int rc, const char* call, int rank);

// Whether an MPI call of this module failed since the last call of this
// function, which clears the record. After such a failure in the middle of an
// exchange, messages a peer had already sent can still match the next call on
// that communicator (MPI cannot cancel a send): jax_sparse_sync/mpi/comm.py
// (renew_after_mpi_error, run by jss.mpi.reset_after_mpi_error) then moves
// every communicator id to a fresh duplicate, agreed on by all ranks.
bool take_mpi_error_seen();

// Runs an MPI call, recorded for its duration as what this thread is blocked
// on (ffi/runtime/blocked_on.h: the watchdog's report names it), and returns its error
// as an FFI error. `name` is a string literal naming the call and its purpose.
#define JSS_MPI_CHECK(call_expr, name, rank) JSS_MPI_CHECK_BLOCKED(call_expr, name, rank, (name))

// The same, for a call that posts one more request of `requests` (its last
// entry, MPI_REQUEST_NULL before the call), described by the last entry of
// `peers` (a std::vector<RequestPeer>, appended before the call: the two line up,
// checked where assertions are on, the fuzzer's build). On an error, the
// receives posted before it are cancelled (jss::cancel_pending, which takes
// each request's kind from `peers`) so that none is left pending.
#define JSS_MPI_CHECK_POSTED(call_expr, name, rank, requests, peers)              \
  do {                                                                          \
    assert((requests)->size() == (peers).size());                               \
    int _jss_rc;                                                                \
    {                                                                           \
      ::jss::BlockedOn _jss_blocked(name);                                      \
      _jss_rc = (call_expr);                                                    \
    }                                                                           \
    if (_jss_rc != MPI_SUCCESS) {                                               \
      (requests)->back() = MPI_REQUEST_NULL; /* undefined after a failed call */ \
      ::jss::cancel_pending((requests), (peers));                               \
      return ::jss::mpi_error(_jss_rc, name, rank);                             \
    }                                                                           \
  } while (0)

// The same, recording a point-to-point call's peer: `blocked_args` are the
// arguments of a jss::BlockedOn, in parentheses.
#define JSS_MPI_CHECK_BLOCKED(call_expr, name, rank, blocked_args)               \
  do {                                                                          \
    int _jss_rc;                                                                \
    {                                                                           \
      ::jss::BlockedOn _jss_blocked blocked_args;                               \
      _jss_rc = (call_expr);                                                    \
    }                                                                           \
    if (_jss_rc != MPI_SUCCESS) return ::jss::mpi_error(_jss_rc, name, rank);   \
  } while (0)

// What every rank states about its call before any data moves. Exchanged with
// one small allgather so that a mismatch becomes the same Python error on every
// rank instead of a hang or a wrong answer.
struct CallHeader {
  int64_t size = 0;        // dense dimension N
  int64_t nnz = 0;         // non-padding entries this rank contributes
  int64_t algorithm = 0;   // algorithm id
  int64_t flags = 0;       // kBadIndex | kNonFinite
  int64_t bad_index = 0;   // first offending index when kBadIndex
  int64_t bad_position = 0;
  int64_t param = 0;       // an algorithm parameter that must agree (Ok-Topk: k)
  static constexpr int64_t kBadIndex = 1;
  static constexpr int64_t kNonFinite = 2;
};

enum class NanPolicy : int64_t { kRaise = 0, kPropagate = 1 };

// Allgathers the headers (point to point, tag kTagHeaders, so the watchdog names
// the peer a stuck rank waits for) and checks them; returns the same error on
// every rank when any rank's arguments are bad. Fills `all` (one header per rank).
constexpr int kTagHeaders = 7104;
xla::ffi::Error exchange_headers(const CallHeader& mine, MPI_Comm comm, int rank, int nranks,
                                 NanPolicy nan_policy, const char* op_name,
                                 std::vector<CallHeader>* all, WireStats* stats);

// All-to-all of one int64 per peer (message sizes before point-to-point
// data), counted in `stats`: point-to-point (tag kTagCounts), so the watchdog
// names the peers a stuck rank still waits for.
constexpr int kTagCounts = 7103;
xla::ffi::Error exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>* recv,
                                MPI_Comm comm, int rank, int nranks, const char* what,
                                WireStats* stats);

// Allgather of one block per rank into recv (blocks contiguous in rank order,
// block q at displs[q] = counts[0] + ... + counts[q-1]). Uses MPI_Allgather
// when every block has the same length: MPICH's allgatherv measured 10-25x
// slower than its allgather for the same bytes (4 ranks, 64 MB). `send` must
// not alias `recv`.
xla::ffi::Error allgather_blocks(const void* send, void* recv, const std::vector<MPI_Count>& counts,
                                 const std::vector<MPI_Aint>& displs, MPI_Datatype type,
                                 MPI_Comm comm, int rank, const char* what);

// MPI_Allgather of one int64 per rank (the lengths of the messages an allgather
// of blocks brings next) into all[nranks], counted in `stats`. `what` names the
// call, as JSS_MPI_CHECK's `name`.
xla::ffi::Error allgather_int64(int64_t mine, int64_t* all, MPI_Comm comm, int rank, int nranks,
                                const char* what, WireStats* stats);

// The same, where one rank calls no MPI: all[0] = mine.
xla::ffi::Error allgather_lengths(int64_t mine, int64_t* all, MPI_Comm comm, int rank, int nranks,
                                  const char* what, WireStats* stats);

// The ranks' byte messages (`mine`, this rank's) gathered by allgather_blocks
// into `all`, sized to their total beforehand, counted in `stats`; with one rank,
// `all` becomes `mine`.
xla::ffi::Error allgather_messages(const std::vector<char>& mine, std::vector<char>* all,
                                   const std::vector<MPI_Count>& counts,
                                   const std::vector<MPI_Aint>& displs, MPI_Comm comm, int rank,
                                   int nranks, const char* what, WireStats* stats);

// ceil(log2(p)) for p >= 1: rounds of a recursive-doubling schedule.
inline int64_t ceil_log2(int64_t p) {
  int64_t r = 0;
  while ((int64_t{1} << r) < p) ++r;
  return r;
}

}  // namespace jss
