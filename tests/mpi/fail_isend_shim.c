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
 * were. Every other call goes to PMPI_Isend / PMPI_Isend_c. */
#include <mpi.h>
#include <pthread.h>
#include <time.h>

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

int MPI_Isend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag,
              MPI_Comm comm, MPI_Request* request) {
  if (take_failure(tag)) return MPI_ERR_OTHER;
  return PMPI_Isend(buf, count, datatype, dest, tag, comm, request);
}

int MPI_Isend_c(const void* buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                MPI_Comm comm, MPI_Request* request) {
  if (take_failure(tag)) return MPI_ERR_OTHER;
  return PMPI_Isend_c(buf, count, datatype, dest, tag, comm, request);
}
