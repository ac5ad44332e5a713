// See fake_mpi.h. Only the MPI calls the library's host collectives make are
// defined; a call outside that set fails to link, so a new one is noticed.
#include "fuzz/fake_mpi.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <type_traits>
#include <vector>

#include "ffi/runtime/watchdog.h"

namespace fake_mpi {
namespace {

int g_rank = 0;
int g_size = 1;
// Requests posted (MPI_Isend, MPI_Irecv) and not yet completed, cancelled or
// freed, by handle: a collective must leave none when it returns, an early error
// return included (jss::cancel_pending). Each posted request gets a handle of its
// own (never MPI_REQUEST_NULL), so completing one twice (a double free, a copy of
// a handle waited for after the original) or one that was never posted aborts.
// A call that fails leaves kFailedRequest, which is never posted: a library that
// went on to wait for, cancel or free a failed call's handle (undefined in MPI)
// is caught the same way. A send is never cancelled (jss::cancel_pending takes
// the kinds from the library's RequestPeer records): MPI_Cancel of one aborts.
struct Posted {
  bool fails_at_wait;  // its wait or test reports an error
  bool send;           // MPI_Isend / MPI_Isend_c
  bool kept_on_error;  // that failed wait or test leaves it allocated (0xfc)
};
std::map<MPI_Request, Posted> g_live;
uint32_t g_next_handle = 0;
constexpr uint32_t kRequestBase = 0x2c000000u;  // MPICH's request handles' kind bits
constexpr MPI_Request kFailedRequest = static_cast<MPI_Request>(0x2cffffffu);

MPI_Request post(bool fails_at_wait, bool send, bool kept_on_error = false) {
  // serials 1 .. 0xfffffd: never MPI_REQUEST_NULL (MPICH's 0x2c000000) nor kFailedRequest
  g_next_handle = g_next_handle % 0xfffffdu + 1;
  const MPI_Request r = static_cast<MPI_Request>(kRequestBase | g_next_handle);
  g_live[r] = Posted{fails_at_wait, send, kept_on_error};
  return r;
}
const uint8_t* g_data = nullptr;
size_t g_left = 0;
size_t g_used = 0;

// Derived datatypes (MPI_Type_contiguous): their byte sizes.
std::vector<size_t> g_derived;
constexpr uint32_t kDerivedBase = 0x8c000000u;

size_t type_size(MPI_Datatype t) {
  const uint32_t h = static_cast<uint32_t>(t);
  if ((h & 0xff000000u) == kDerivedBase) return g_derived.at(h & 0xffffffu);
  // MPICH builtin handles carry their size in bits 8-15.
  const size_t s = (h >> 8) & 0xff;
  if (s == 0) {
    std::fprintf(stderr, "fake_mpi: unknown datatype 0x%x\n", h);
    std::abort();
  }
  return s;
}

size_t bytes_of(MPI_Count count, MPI_Datatype t) {
  if (count < 0) {
    std::fprintf(stderr, "fake_mpi: negative count %lld passed to MPI\n",
                 static_cast<long long>(count));
    std::abort();  // real MPI returns MPI_ERR_COUNT; the library must never pass one
  }
  return static_cast<size_t>(count) * type_size(t);
}

uint8_t take_byte() {
  if (g_left == 0) return 0;
  --g_left;
  ++g_used;
  return *g_data++;
}

// Fills dst[0, bytes) with peer data (zeros once the input is used up).
void take(void* dst, size_t bytes) {
  const size_t n = bytes < g_left ? bytes : g_left;
  if (n > 0) std::memcpy(dst, g_data, n);
  if (bytes > n) std::memset(static_cast<uint8_t*>(dst) + n, 0, bytes - n);
  g_data += n;
  g_left -= n;
  g_used += n;
}

// Reads a buffer this rank sends: an out-of-bounds send is an ASan report.
void touch(const void* src, size_t bytes) {
  if (bytes == 0 || src == MPI_IN_PLACE) return;
  static std::vector<uint8_t> sink;
  sink.resize(bytes);
  std::memcpy(sink.data(), src, bytes);
}

// A point-to-point message from a peer into buf (capacity `bytes`): one control
// byte picks a full message (most values), a truncated one (fewer bytes than
// expected; the rest of buf keeps its contents), or one longer than the buffer
// (MPI_ERR_TRUNCATE, as MPI reports it): at once (0xfe), or, for a non-blocking
// receive, by the wait or test that completes it (0xfd, 0xfc: *fails_at_wait set,
// the call succeeds; a blocking receive fails at once). That failed wait or test
// frees the request and sets its handle to MPI_REQUEST_NULL (0xfd: MPICH's way), or
// leaves it allocated, its handle unchanged, for the caller to free (0xfc:
// *kept_on_error set; MPI leaves its state after an error to the implementation, and
// jss::cancel_pending frees what a failed MPI_Test left).
int receive_message(void* buf, size_t bytes, bool* fails_at_wait = nullptr,
                    bool* kept_on_error = nullptr) {
  const uint8_t control = take_byte();
  if (control == 0xfe) return MPI_ERR_TRUNCATE;
  if (control == 0xfd || control == 0xfc) {
    if (fails_at_wait == nullptr) return MPI_ERR_TRUNCATE;
    *fails_at_wait = true;
    *kept_on_error = control == 0xfc;
    return MPI_SUCCESS;
  }
  if (control == 0xff) {
    const size_t keep = bytes == 0 ? 0 : take_byte() % bytes;
    take(buf, keep);
    return MPI_SUCCESS;
  }
  take(buf, bytes);
  return MPI_SUCCESS;
}

template <typename T>
void sum_into(void* acc, const void* add, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, static_cast<char*>(acc) + i * sizeof(T), sizeof(T));
    std::memcpy(&b, static_cast<const char*>(add) + i * sizeof(T), sizeof(T));
    if constexpr (std::is_integral_v<T>) {
      // MPI's integer sum wraps; computed unsigned so UBSan does not flag the fake.
      using U = std::make_unsigned_t<T>;
      a = static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      a = a + b;
    }
    std::memcpy(static_cast<char*>(acc) + i * sizeof(T), &a, sizeof(T));
  }
}

// One request completed (waited for, cancelled and waited for, or freed);
// returns whether its wait reports an error. Aborts on a handle not posted.
bool complete(MPI_Request* req) {
  const auto it = g_live.find(*req);
  if (it == g_live.end()) {
    std::fprintf(stderr, "fake_mpi: request handle 0x%x completed, waited for, cancelled or "
                         "freed, but not pending (%s)\n", static_cast<unsigned>(*req),
                 *req == kFailedRequest ? "a failed call's handle, undefined in MPI"
                                        : "completed before, or never posted");
    std::abort();
  }
  const bool fails = it->second.fails_at_wait;
  g_live.erase(it);
  *req = MPI_REQUEST_NULL;
  return fails;
}

// The error of a request whose message was too long (fails_at_wait), where it is
// waited for or tested: completes it unless it is kept on error (0xfc above).
int fail_request(MPI_Request* req) {
  if (!g_live.at(*req).kept_on_error) complete(req);
  return MPI_ERR_TRUNCATE;
}

// Aborts on a handle that is neither pending nor MPI_REQUEST_NULL.
void expect_known(const MPI_Request* req, const char* call) {
  if (*req == MPI_REQUEST_NULL || g_live.count(*req) != 0) return;
  std::fprintf(stderr, "fake_mpi: %s of request handle 0x%x, which is not pending (%s)\n", call,
               static_cast<unsigned>(*req),
               *req == kFailedRequest ? "a failed call's handle" : "completed or never posted");
  std::abort();
}

}  // namespace

void expect_no_request_pending() {
  if (!g_live.empty()) {
    std::fprintf(stderr, "fake_mpi: the call returned with %zu request(s) still pending (posted, "
                         "never completed nor cancelled)\n", g_live.size());
    std::abort();
  }
}

void reset(int rank, int size, const uint8_t* peer_bytes, size_t length) {
  expect_no_request_pending();  // the previous call's
  static_assert(MPI_REQUEST_NULL == static_cast<MPI_Request>(kRequestBase), "MPICH's handles");
  g_rank = rank;
  g_size = size;
  g_data = peer_bytes;
  g_left = length;
  g_used = 0;
}

size_t consumed() { return g_used; }

}  // namespace fake_mpi

using namespace fake_mpi;

// The watchdog is not under test here (it needs the real MPI and a thread).
namespace jss {
WatchdogScope::WatchdogScope(const char*, MPI_Comm) {}
void watchdog_exit(const WatchdogTicket&) {}
void watchdog_note_duplicate(int64_t, int64_t, MPI_Comm) {}
namespace blocked_detail {  // its test hook (ffi/runtime/blocked_on.h) lives in the watchdog
std::atomic<bool> freeze_armed{false};
void freeze_point(const BlockedSlot*) {}
}  // namespace blocked_detail
}  // namespace jss

extern "C" {

int MPI_Comm_rank(MPI_Comm, int* rank) { *rank = g_rank; return MPI_SUCCESS; }
int MPI_Comm_size(MPI_Comm, int* size) { *size = g_size; return MPI_SUCCESS; }

int MPI_Error_string(int code, char* text, int* len) {
  *len = std::snprintf(text, MPI_MAX_ERROR_STRING, "fake MPI error %d", code);
  return MPI_SUCCESS;
}

int MPI_Abort(MPI_Comm, int code) {
  std::fprintf(stderr, "fake_mpi: MPI_Abort(%d)\n", code);
  std::abort();
}

int MPI_Type_contiguous(int count, MPI_Datatype old, MPI_Datatype* out) {
  g_derived.push_back(static_cast<size_t>(count) * type_size(old));
  *out = static_cast<MPI_Datatype>(kDerivedBase | static_cast<uint32_t>(g_derived.size() - 1));
  return MPI_SUCCESS;
}
int MPI_Type_commit(MPI_Datatype*) { return MPI_SUCCESS; }

// ---- point to point ---------------------------------------------------------
int MPI_Send_c(const void* buf, MPI_Count count, MPI_Datatype t, int, int, MPI_Comm) {
  touch(buf, bytes_of(count, t));
  return MPI_SUCCESS;
}
int MPI_Send(const void* buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  return MPI_Send_c(buf, count, t, dest, tag, comm);
}
int MPI_Isend_c(const void* buf, MPI_Count count, MPI_Datatype t, int, int, MPI_Comm,
                MPI_Request* req) {
  touch(buf, bytes_of(count, t));
  *req = post(false, /*send=*/true);
  return MPI_SUCCESS;
}
int MPI_Isend(const void* buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm comm,
              MPI_Request* req) {
  return MPI_Isend_c(buf, count, t, dest, tag, comm, req);
}
int MPI_Recv_c(void* buf, MPI_Count count, MPI_Datatype t, int, int, MPI_Comm, MPI_Status*) {
  return receive_message(buf, bytes_of(count, t));
}
int MPI_Recv(void* buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm comm,
             MPI_Status* status) {
  return MPI_Recv_c(buf, count, t, src, tag, comm, status);
}
// The message arrives at once (its bytes read now); the request stays posted
// until it is waited for (where a message too long for it reports its error).
// A failed call posts nothing.
int MPI_Irecv_c(void* buf, MPI_Count count, MPI_Datatype t, int, int, MPI_Comm,
                MPI_Request* req) {
  bool fails_at_wait = false, kept_on_error = false;
  const int rc = receive_message(buf, bytes_of(count, t), &fails_at_wait, &kept_on_error);
  *req = rc == MPI_SUCCESS ? post(fails_at_wait, /*send=*/false, kept_on_error) : kFailedRequest;
  return rc;
}
int MPI_Irecv(void* buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm comm,
              MPI_Request* req) {
  return MPI_Irecv_c(buf, count, t, src, tag, comm, req);
}
int MPI_Sendrecv_c(const void* sbuf, MPI_Count scount, MPI_Datatype stype, int, int, void* rbuf,
                   MPI_Count rcount, MPI_Datatype rtype, int, int, MPI_Comm, MPI_Status*) {
  touch(sbuf, bytes_of(scount, stype));
  return receive_message(rbuf, bytes_of(rcount, rtype));
}
int MPI_Sendrecv(const void* sbuf, int scount, MPI_Datatype stype, int dest, int stag, void* rbuf,
                 int rcount, MPI_Datatype rtype, int src, int rtag, MPI_Comm comm,
                 MPI_Status* status) {
  return MPI_Sendrecv_c(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm,
                        status);
}
// A receive whose message was too long (0xfd, 0xfc) fails its wait: that request
// is completed (0xfd, as MPICH frees a request that completed in error) or left
// allocated (0xfc), the error returned, and the others of the call are left
// pending, as an MPI that stopped at the error leaves them (the caller must cancel
// them: jss::wait_all_tracked).
int MPI_Waitall(int count, MPI_Request requests[], MPI_Status*) {
  for (int i = 0; i < count; ++i) expect_known(&requests[i], "MPI_Waitall");
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL && g_live.at(requests[i]).fails_at_wait) {
      return fail_request(&requests[i]);
    }
  }
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) complete(&requests[i]);
  }
  return MPI_SUCCESS;
}
// Every request completes at once (jss::wait_all_tracked's loop), unless one
// fails (as in MPI_Waitall).
int MPI_Waitsome(int count, MPI_Request requests[], int* outcount, int indices[], MPI_Status*) {
  for (int i = 0; i < count; ++i) expect_known(&requests[i], "MPI_Waitsome");
  *outcount = 0;
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL && g_live.at(requests[i]).fails_at_wait) {
      return fail_request(&requests[i]);
    }
  }
  for (int i = 0; i < count; ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    complete(&requests[i]);
    indices[(*outcount)++] = i;
  }
  if (*outcount == 0) *outcount = MPI_UNDEFINED;
  return MPI_SUCCESS;
}
// A test completes the request (a cancelled one included: jss::cancel_pending),
// or fails as its wait would (a receive whose message was too long arrived at
// once, so its cancel comes too late): completed in error (0xfd) or left
// allocated for the caller to free (0xfc), which cancel_pending must do.
int MPI_Test(MPI_Request* req, int* flag, MPI_Status*) {
  expect_known(req, "MPI_Test");
  *flag = 1;
  if (*req == MPI_REQUEST_NULL) return MPI_SUCCESS;
  if (g_live.at(*req).fails_at_wait) return fail_request(req);
  complete(req);
  return MPI_SUCCESS;
}
int MPI_Wait(MPI_Request* req, MPI_Status*) {
  expect_known(req, "MPI_Wait");
  if (*req == MPI_REQUEST_NULL) return MPI_SUCCESS;
  if (g_live.at(*req).fails_at_wait) return fail_request(req);
  complete(req);
  return MPI_SUCCESS;
}
// Marks a receive for cancellation: the MPI_Test or MPI_Wait that must follow
// completes it. A send aborts (a finding): the library never cancels one (MPICH's
// ch4 cannot, and MPI_Cancel of a just-completed send crashed in UCX), so a
// request recorded with the wrong kind shows here.
int MPI_Cancel(MPI_Request* req) {
  if (*req == MPI_REQUEST_NULL) return MPI_ERR_REQUEST;
  expect_known(req, "MPI_Cancel");
  if (g_live.at(*req).send) {
    std::fprintf(stderr, "fake_mpi: MPI_Cancel of request handle 0x%x, a send (MPI_Isend): "
                         "only receives may be cancelled (jss::cancel_pending)\n",
                 static_cast<unsigned>(*req));
    std::abort();
  }
  return MPI_SUCCESS;
}
int MPI_Request_free(MPI_Request* req) {
  expect_known(req, "MPI_Request_free");
  if (*req != MPI_REQUEST_NULL) complete(req);
  return MPI_SUCCESS;
}

// ---- collectives: this rank's part from its buffer, the others' from the fuzzer
int MPI_Alltoall_c(const void* sbuf, MPI_Count scount, MPI_Datatype stype, void* rbuf,
                   MPI_Count rcount, MPI_Datatype rtype, MPI_Comm) {
  const size_t sb = bytes_of(scount, stype), rb = bytes_of(rcount, rtype);
  touch(sbuf, sb * g_size);
  for (int q = 0; q < g_size; ++q) {
    char* dst = static_cast<char*>(rbuf) + rb * q;
    if (q == g_rank) {
      if (rb > 0) std::memmove(dst, static_cast<const char*>(sbuf) + sb * q, rb);
    } else {
      take(dst, rb);
    }
  }
  return MPI_SUCCESS;
}
int MPI_Alltoall(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount,
                 MPI_Datatype rtype, MPI_Comm comm) {
  return MPI_Alltoall_c(sbuf, scount, stype, rbuf, rcount, rtype, comm);
}

int MPI_Allgatherv_c(const void* sbuf, MPI_Count scount, MPI_Datatype stype, void* rbuf,
                     const MPI_Count rcounts[], const MPI_Aint displs[], MPI_Datatype rtype,
                     MPI_Comm) {
  const size_t unit = type_size(rtype);
  for (int q = 0; q < g_size; ++q) {
    char* dst = static_cast<char*>(rbuf) + static_cast<size_t>(displs[q]) * unit;
    const size_t bytes = bytes_of(rcounts[q], rtype);
    if (q == g_rank) {
      if (sbuf != MPI_IN_PLACE) {
        if (bytes_of(scount, stype) != bytes) std::abort();  // MPI: erroneous program
        if (bytes > 0) std::memmove(dst, sbuf, bytes);
      }
    } else {
      take(dst, bytes);
    }
  }
  return MPI_SUCCESS;
}
int MPI_Allgatherv(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf,
                   const int rcounts[], const int displs[], MPI_Datatype rtype, MPI_Comm comm) {
  std::vector<MPI_Count> c(rcounts, rcounts + g_size);
  std::vector<MPI_Aint> d(displs, displs + g_size);
  return MPI_Allgatherv_c(sbuf, scount, stype, rbuf, c.data(), d.data(), rtype, comm);
}
int MPI_Allgather_c(const void* sbuf, MPI_Count scount, MPI_Datatype stype, void* rbuf,
                    MPI_Count rcount, MPI_Datatype rtype, MPI_Comm comm) {
  std::vector<MPI_Count> c(g_size, rcount);
  std::vector<MPI_Aint> d(g_size);
  for (int q = 0; q < g_size; ++q) d[q] = static_cast<MPI_Aint>(rcount * q);
  return MPI_Allgatherv_c(sbuf, scount, stype, rbuf, c.data(), d.data(), rtype, comm);
}
int MPI_Allgather(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount,
                  MPI_Datatype rtype, MPI_Comm comm) {
  return MPI_Allgather_c(sbuf, scount, stype, rbuf, rcount, rtype, comm);
}

int MPI_Allreduce_c(const void* sbuf, void* rbuf, MPI_Count count, MPI_Datatype t, MPI_Op op,
                    MPI_Comm) {
  const size_t bytes = bytes_of(count, t);
  if (sbuf != MPI_IN_PLACE && bytes > 0) std::memmove(rbuf, sbuf, bytes);
  if (op != MPI_SUM) {
    std::fprintf(stderr, "fake_mpi: only MPI_SUM is simulated\n");
    std::abort();
  }
  std::vector<char> peer(bytes);
  for (int q = 0; q < g_size; ++q) {
    if (q == g_rank) continue;
    take(peer.data(), bytes);
    if (t == MPI_INT64_T) {
      sum_into<int64_t>(rbuf, peer.data(), static_cast<size_t>(count));
    } else if (t == MPI_INT || t == MPI_INT32_T) {
      sum_into<int32_t>(rbuf, peer.data(), static_cast<size_t>(count));
    } else if (t == MPI_FLOAT) {
      sum_into<float>(rbuf, peer.data(), static_cast<size_t>(count));
    } else if (t == MPI_DOUBLE) {
      sum_into<double>(rbuf, peer.data(), static_cast<size_t>(count));
    } else {
      std::fprintf(stderr, "fake_mpi: MPI_Allreduce of datatype 0x%x not simulated\n",
                   static_cast<unsigned>(t));
      std::abort();
    }
  }
  return MPI_SUCCESS;
}
int MPI_Allreduce(const void* sbuf, void* rbuf, int count, MPI_Datatype t, MPI_Op op,
                  MPI_Comm comm) {
  return MPI_Allreduce_c(sbuf, rbuf, count, t, op, comm);
}

}  // extern "C"
