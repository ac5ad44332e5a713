/* Fault injection for tests/mpi/pending_request_case.py (loaded with LD_PRELOAD).
 *
 * jss_test_fail_isend(tag), called from Python through ctypes, arms one failure:
 * the next MPI_Isend or MPI_Isend_c (the library's large-count form) of this
 * process with that tag, on any thread (the non-blocking operations send from
 * a worker thread), returns MPI_ERR_OTHER without sending anything. Every other
 * call goes to PMPI_Isend / PMPI_Isend_c. */
#include <mpi.h>

static int armed_tag = -1; /* -1: nothing armed */

int jss_test_fail_isend(int tag) {
  __atomic_store_n(&armed_tag, tag, __ATOMIC_SEQ_CST);
  return 0;
}

/* Whether this call is the armed one (then it disarms: one failure per arming). */
static int take_failure(int tag) {
  int expected = tag;
  return tag >= 0 && __atomic_compare_exchange_n(&armed_tag, &expected, -1, 0, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST);
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
