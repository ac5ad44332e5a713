// A one-process stand-in for MPI in which every other rank is the fuzzer.
//
// The fuzz targets link the library's real collective code (ffi/collectives/,
// ffi/runtime/; built against the real MPICH mpi.h) with fake_mpi.cc instead of
// libmpi. This process plays rank `rank` of a world of `size` ranks; whatever a
// peer would have sent (point-to-point messages, its part of an allgather / alltoall /
// allreduce) is read from the fuzzer's bytes, so a peer can send any count,
// any index, any float, a truncated message or one too long for the buffer
// (MPI_ERR_TRUNCATE). What this rank sends is read back in full (so ASan sees
// an out-of-bounds send) and dropped.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fake_mpi {

// Starts a new simulated call: this process is `rank` of `size`, and the
// peers' bytes are peer_bytes[0, length) (read in call order; zeros once used up).
void reset(int rank, int size, const uint8_t* peer_bytes, size_t length);

// Bytes of peer data consumed so far (for the targets' own checks).
size_t consumed();

// Aborts (a finding) when a request posted since reset() is still pending:
// every collective, an error return included, must complete or cancel each
// request it posted (jss::cancel_pending: receives cancelled, sends tested; an
// MPI_Cancel of a send aborts at once). The targets call it after the library's
// call; reset() calls it too.
void expect_no_request_pending();

}  // namespace fake_mpi
