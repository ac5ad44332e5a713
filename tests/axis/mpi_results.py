"""Runs every algorithm on every pattern over MPI and saves rank 0's view.

Run under ``mpiexec -n P python tests/axis/mpi_results.py OUT.npz``;
tests/test_axis_transport.py compares the shard_map transport against it.
Every rank checks that its result is bitwise equal to rank 0's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(path: str) -> None:
    import jax
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from common import ALGORITHMS, N, PATTERNS, make_pattern

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    saved = {}
    for algorithm in ALGORITHMS:
        fn = jax.jit(lambda v, i, a=algorithm: jss.sparse_allreduce(
            v, i, size=N, algorithm=a, return_stats="vector"))
        for pattern in PATTERNS:
            values, indices = make_pattern(pattern, rank, p)
            out, stats = (np.asarray(x) for x in fn(values, indices))
            first = world.bcast(out, root=0)
            if out.view(np.uint32).tolist() != first.view(np.uint32).tolist():
                raise SystemExit(f"rank {rank}: {algorithm}/{pattern} differs from rank 0")
            all_stats = world.gather(stats.astype(np.int64), root=0)
            if rank == 0:
                saved[f"{algorithm}/{pattern}/out"] = out
                saved[f"{algorithm}/{pattern}/stats"] = np.stack(all_stats)
    if rank == 0:
        np.savez(path, **saved)


if __name__ == "__main__":
    main(sys.argv[1])
