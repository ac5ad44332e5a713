"""An MPI error in the middle of an exchange leaves no request pending: run by
tests/test_multirank.py under ``mpiexec -n 2`` with ``tests/mpi/fail_isend_shim.c``
preloaded (``LD_PRELOAD``). Before each case, every rank arms the shim
(``jss_test_fail_isend(tag)``, through ctypes) to fail its next ``MPI_Isend`` with
the tag of one point-to-point exchange: the argument check's headers (7104), the
counts before the data (7103), or an algorithm's data messages (7102:
split-allgather's and hash partition's slices, the block-sparse allreduce's
blocks, Ok-Topk's buckets, and split-allgather's slices on the worker thread of a
non-blocking operation).

Each failing call has already posted its receive from the peer. It must raise,
naming the MPI call, and cancel that receive: left pending, it would match the
peer's message of the next call on the communicator (receives match in the order
posted) and write it into the failed call's freed buffer, so the next call would
wait for ever. So after each failure the same call runs again and must return the
NumPy reference (a hang ends in the caller's timeout). The non-blocking operation
runs on the duplicate communicator of its slot (operation number mod 8), so after
its failure 8 more run: the last one uses the failed one's communicator again.

Usage: ``LD_PRELOAD=libfail_isend.so mpiexec -n 2 python -m mpi4py
tests/mpi/pending_request_case.py [CASE ...]`` (default: every case); prints
``PENDING OK`` on rank 0.
"""

import ctypes
import sys

import jax
import numpy as np
from mpi4py import MPI

import jax_sparse_sync as jss

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.Get_size(), WORLD.Get_rank()
N, K, BLOCK = 1024, 16, 16
NONBLOCKING_SLOTS = 8  # ffi/nonblocking_ffi.cc's kSlots
TAG_HEADERS, TAG_COUNTS, TAG_DATA = 7104, 7103, 7102  # ffi/mpi_comm.h, ffi/algorithms.h


def sparse(algorithm):
    fn = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=N, algorithm=algorithm))
    return lambda data: fn(data["values"], data["indices"])


def oktopk(data):
    # k above the nonzeros of the sum: Ok-Topk keeps every entry, the sum itself
    return jss.oktopk_allreduce(data["values"], data["indices"], size=N, k=P * K).sum


def block(data):
    return jss.block_allreduce(data["dense"], block_size=BLOCK)


def nonblocking(data):
    pending = jss.sparse_allreduce_start(data["values"], data["indices"], size=N,
                                         algorithm="split_allgather")
    return jss.sparse_allreduce_done(pending)


# name: (the call to run, the tag whose next MPI_Isend fails, what the error names,
# how many times the call runs after the failure)
CASES = {
    "argument_check": (sparse("allgather"), TAG_HEADERS, "MPI_Isend (argument check)", 1),
    "counts": (sparse("split_allgather"), TAG_COUNTS, "MPI_Isend (counts)", 1),
    "split_allgather": (sparse("split_allgather"), TAG_DATA, "MPI_Isend (slice)", 1),
    "hash_partition": (sparse("hash_partition"), TAG_DATA, "MPI_Isend (slice)", 1),
    "block_allreduce": (block, TAG_DATA, "MPI_Isend (phase 1 blocks)", 1),
    "oktopk": (oktopk, TAG_DATA, "MPI_Isend (bucket)", 1),
    "nonblocking": (nonblocking, TAG_DATA, "MPI_Isend (slice)", NONBLOCKING_SLOTS),
}


def inputs():
    """This rank's entries (in both halves of [0, N), so every rank sends to every
    other in each exchange) and their dense vector; the reference sum of all ranks."""
    rng = np.random.default_rng(RANK)
    values = rng.integers(1, 9, K).astype(np.float32)  # small integers: exact sums
    indices = np.concatenate([rng.choice(N // 2, K // 2, replace=False),
                              N // 2 + rng.choice(N // 2, K // 2, replace=False)])
    dense = np.zeros(N, np.float32)
    dense[indices] = values
    expected = np.sum(WORLD.allgather(dense), axis=0, dtype=np.float32)
    return {"values": values, "indices": indices.astype(np.int32), "dense": dense}, expected


def main(names):
    fail_next_isend = ctypes.CDLL(None).jss_test_fail_isend  # the preloaded shim's
    data, expected = inputs()
    for name in names:
        call, tag, mpi_call, reruns = CASES[name]
        fail_next_isend(tag)
        try:
            np.asarray(call(data))
        except Exception as e:  # noqa: BLE001 (XLA's runtime error type)
            assert mpi_call in str(e), (name, str(e)[:500])
        else:
            raise AssertionError(f"{name}: the injected MPI_Isend failure (tag {tag}) did not raise")
        jss.mpi.reset_after_mpi_error()
        print(f"case {name}: rank {RANK} raised naming {mpi_call!r}", flush=True)
        for _ in range(reruns):
            np.testing.assert_array_equal(np.asarray(call(data)), expected, err_msg=name)
        WORLD.Barrier()
        if RANK == 0:
            print(f"case {name}: then the reference", flush=True)
    if RANK == 0:
        print("PENDING OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(CASES))
