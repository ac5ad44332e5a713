"""An MPI error in the middle of an exchange leaves no request pending: run by
tests/test_multirank.py under ``mpiexec -n 2`` with ``tests/mpi/fail_isend_shim.c``
preloaded (``LD_PRELOAD``), which fails every rank's first ``MPI_Isend`` of the
argument check's headers (tag 7104) and of the counts' exchange (tag 7103).

Each failed call has already posted its receive from the peer. The call must
raise, naming the MPI call, and cancel that receive: left pending, it would match
the peer's message of the next call on the communicator (receives match in the
order posted) and write it into the failed call's freed buffer, so the next call
would wait for ever. So after each failure the same call runs again and must
return the NumPy reference's sum (a hang ends in the per-run timeout).

Usage: ``LD_PRELOAD=libfail.so JSS_TEST_FAIL_ISEND_TAGS=7104,7103 mpiexec -n 2
python -m mpi4py tests/mpi/pending_request_case.py``; prints ``PENDING OK`` on rank 0.
"""

import jax
import numpy as np
from mpi4py import MPI

import jax_sparse_sync as jss

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.Get_size(), WORLD.Get_rank()
N, K = 1024, 16


def main():
    rng = np.random.default_rng(RANK)
    values = rng.standard_normal(K).astype(np.float32)
    indices = rng.choice(N, K, replace=False).astype(np.int32)
    expected = np.zeros(N, np.float32)
    for v, i in WORLD.allgather((values, indices)):
        np.add.at(expected, i, v)
    # split_allgather exchanges its message sizes (tag 7103) after the argument check
    for algorithm, call in (("allgather", "MPI_Isend (argument check)"),
                            ("split_allgather", "MPI_Isend (counts)")):
        fn = jax.jit(lambda v, i, a=algorithm: jss.sparse_allreduce(v, i, size=N, algorithm=a))
        try:
            fn(values, indices).block_until_ready()
        except Exception as e:  # noqa: BLE001 (XLA's runtime error type)
            assert call in str(e), (algorithm, str(e)[:500])
        else:
            raise AssertionError(f"{algorithm}: the injected MPI_Isend failure did not raise")
        jss.mpi.reset_after_mpi_error()
        out = np.asarray(fn(values, indices))
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6, err_msg=algorithm)
    WORLD.Barrier()
    if RANK == 0:
        print("PENDING OK", flush=True)


if __name__ == "__main__":
    main()
