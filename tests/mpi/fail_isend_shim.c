/* Fault injection for tests/mpi/pending_request_case.py (loaded with LD_PRELOAD):
 * MPI_Isend fails (MPI_ERR_OTHER, nothing sent) the first time it is called with
 * each tag listed in $JSS_TEST_FAIL_ISEND_TAGS (comma-separated), and passes
 * every other call to PMPI_Isend. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TAGS 8
static int tags[MAX_TAGS], failed[MAX_TAGS], ntags = -1;

static void read_tags(void) {
  ntags = 0;
  const char* s = getenv("JSS_TEST_FAIL_ISEND_TAGS");
  while (s && *s && ntags < MAX_TAGS) {
    char* end;
    tags[ntags] = (int)strtol(s, &end, 10);
    failed[ntags++] = 0;
    s = *end == ',' ? end + 1 : end + strlen(end);
  }
}

int MPI_Isend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag,
              MPI_Comm comm, MPI_Request* request) {
  if (ntags < 0) read_tags();
  for (int i = 0; i < ntags; ++i) {
    if (tags[i] == tag && !failed[i]) {
      failed[i] = 1;
      return MPI_ERR_OTHER;
    }
  }
  return PMPI_Isend(buf, count, datatype, dest, tag, comm, request);
}
