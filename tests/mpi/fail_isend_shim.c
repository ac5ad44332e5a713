/* Fault injection for tests/mpi/pending_request_case.py (loaded with LD_PRELOAD).
 *
 * jss_test_fail_isend(tag, skip, delay_ms), called from Python through ctypes,
 * arms one failure: of this process's next MPI_Isend or MPI_Isend_c (the
 * library's large-count form) calls with that tag, on any thread (the
 * non-blocking operations send from a worker thread), the first `skip` go
 * through (each after sleeping `delay_ms` milliseconds first, so that a peer can
 * fail and cancel its receives before the message arrives) and the (skip+1)-th
 * returns MPI_ERR_OTHER without sending anything. skip = 0 fails the next one:
 * a failure before any send of the exchange was posted; skip > 0 one after some
 * were. Every other call goes to PMPI_Isend / PMPI_Isend_c.
 *
 * It also watches what the library's error path cancels: it records which
 * request handles this process posted as sends (MPI_Isend, MPI_Isend_c) and as
 * receives (MPI_Irecv, MPI_Irecv_c), a handle's latest post deciding (MPI reuses
 * the handles of completed requests), and MPI_Cancel counts the sends, receives
 * and handles of neither it is given before passing the call on.
 * jss_test_take_cancels(&sends, &receives, &unknown) returns the counts since its
 * last call: the library must cancel receives only (jss::cancel_pending).
 *
 * And what became of each receive it cancelled: the MPI_Test that completes it
 * (jss::cancel_pending tests every request after cancelling) reports, through
 * MPI_Test_cancelled, whether the cancel took effect or came too late (the
 * receive had matched a message already: a peer's message then went to the
 * failed call, not to a later one). jss_test_take_cancel_outcomes(&cancelled,
 * &matched, &unresolved) returns, since its last call, the receives cancelled,
 * those that had matched a message, and those not completed by any MPI_Test
 * (cancel_pending gives up after 100 ms: a matched receive whose data was still
 * on its way). */
#include <mpi.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int armed_tag = -1; /* -1: nothing armed */
static int armed_skip = 0;  /* matching sends still to let through */
static int armed_delay_ms = 0;

int jss_test_fail_isend(int tag, int skip, int delay_ms) {
  pthread_mutex_lock(&mu);
  armed_tag = tag;
  armed_skip = skip;
  armed_delay_ms = delay_ms;
  pthread_mutex_unlock(&mu);
  return 0;
}

/* Whether this call is the armed failure (then it disarms: one failure per
 * arming); a matching call let through first sleeps the armed delay. */
static int take_failure(int tag) {
  int fail = 0, delay_ms = 0;
  pthread_mutex_lock(&mu);
  if (armed_tag >= 0 && tag == armed_tag) {
    if (armed_skip == 0) {
      fail = 1;
      armed_tag = -1;
    } else {
      --armed_skip;
      delay_ms = armed_delay_ms;
    }
  }
  pthread_mutex_unlock(&mu);
  if (delay_ms > 0) {
    struct timespec pause = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
  }
  return fail;
}

/* The handles posted (each once, by its latest post) and their kind; under `mu`.
 * MPI reuses handles, so the table holds at most the requests live at once. */
#define KNOWN_CAPACITY 65536
static MPI_Request known_handle[KNOWN_CAPACITY];
static int known_send[KNOWN_CAPACITY];
static int known_count = 0;
static int cancelled_sends = 0, cancelled_receives = 0, cancelled_unknown = 0;
/* Receives passed to MPI_Cancel and not yet completed by an MPI_Test; under `mu`. */
static MPI_Request cancelling[KNOWN_CAPACITY];
static int cancelling_count = 0;
static int cancel_took_effect = 0, cancel_too_late = 0;

static int cancelling_index(MPI_Request r) { /* under mu */
  for (int i = 0; i < cancelling_count; ++i) {
    if (cancelling[i] == r) return i;
  }
  return -1;
}

static void forget_cancelling(int i) { /* under mu */
  cancelling[i] = cancelling[--cancelling_count];
}

static int known_index(MPI_Request r) { /* under mu */
  for (int i = 0; i < known_count; ++i) {
    if (known_handle[i] == r) return i;
  }
  return -1;
}

static void record_post(MPI_Request r, int send) {
  pthread_mutex_lock(&mu);
  int i = known_index(r);
  if (i < 0) {
    if (known_count == KNOWN_CAPACITY) {
      fprintf(stderr, "fail_isend_shim: more than %d request handles\n", KNOWN_CAPACITY);
      abort();
    }
    i = known_count++;
    known_handle[i] = r;
  }
  known_send[i] = send;
  /* a handle MPI reused: an earlier request of it left unresolved is not this one */
  const int c = cancelling_index(r);
  if (c >= 0) forget_cancelling(c);
  pthread_mutex_unlock(&mu);
}

int jss_test_take_cancels(int* sends, int* receives, int* unknown) {
  pthread_mutex_lock(&mu);
  *sends = cancelled_sends;
  *receives = cancelled_receives;
  *unknown = cancelled_unknown;
  cancelled_sends = cancelled_receives = cancelled_unknown = 0;
  pthread_mutex_unlock(&mu);
  return 0;
}

int jss_test_take_cancel_outcomes(int* cancelled, int* matched, int* unresolved) {
  pthread_mutex_lock(&mu);
  *cancelled = cancel_took_effect;
  *matched = cancel_too_late;
  *unresolved = cancelling_count;
  cancel_took_effect = cancel_too_late = cancelling_count = 0;
  pthread_mutex_unlock(&mu);
  return 0;
}

int MPI_Cancel(MPI_Request* request) {
  pthread_mutex_lock(&mu);
  const int i = known_index(*request);
  if (i < 0) {
    ++cancelled_unknown;
  } else if (known_send[i]) {
    ++cancelled_sends;
  } else {
    ++cancelled_receives;
    if (cancelling_index(*request) < 0) {
      if (cancelling_count == KNOWN_CAPACITY) {
        fprintf(stderr, "fail_isend_shim: more than %d receives being cancelled\n",
                KNOWN_CAPACITY);
        abort();
      }
      cancelling[cancelling_count++] = *request;
    }
  }
  pthread_mutex_unlock(&mu);
  return PMPI_Cancel(request);
}

/* Completes a request as PMPI_Test does; for a cancelled receive, notes whether the
 * cancel took effect (the caller's status may be MPI_STATUS_IGNORE: a status of our
 * own is passed down and copied back). */
int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  const MPI_Request handle = *request;
  pthread_mutex_lock(&mu);
  const int watched = cancelling_index(handle) >= 0;
  pthread_mutex_unlock(&mu);
  if (!watched) return PMPI_Test(request, flag, status);
  MPI_Status own;
  const int rc = PMPI_Test(request, flag, &own);
  if (rc == MPI_SUCCESS && *flag) {
    int took_effect = 0;
    PMPI_Test_cancelled(&own, &took_effect);
    pthread_mutex_lock(&mu);
    const int c = cancelling_index(handle);
    if (c >= 0) forget_cancelling(c);
    if (took_effect) {
      ++cancel_took_effect;
    } else {
      ++cancel_too_late;
    }
    pthread_mutex_unlock(&mu);
  }
  if (status != MPI_STATUS_IGNORE) *status = own;
  return rc;
}

/* MPI_Irecv, MPI_Isend and their large-count _c forms (MPI_Count counts): each passes the
 * call on to its PMPI_ form and records the request it posted (is_send 1: a send); a send
 * first asks take_failure whether it is the armed failure. */
#define POST_WRAPPER(NAME, BUF_T, COUNT_T, IS_SEND)                                   \
  int NAME(BUF_T buf, COUNT_T count, MPI_Datatype datatype, int peer, int tag,         \
           MPI_Comm comm, MPI_Request* request) {                                      \
    if (IS_SEND && take_failure(tag)) return MPI_ERR_OTHER;                            \
    const int rc = P##NAME(buf, count, datatype, peer, tag, comm, request);            \
    if (rc == MPI_SUCCESS) record_post(*request, IS_SEND);                             \
    return rc;                                                                         \
  }

POST_WRAPPER(MPI_Irecv, void*, int, 0)
POST_WRAPPER(MPI_Irecv_c, void*, MPI_Count, 0)
POST_WRAPPER(MPI_Isend, const void*, int, 1)
POST_WRAPPER(MPI_Isend_c, const void*, MPI_Count, 1)
