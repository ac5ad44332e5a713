"""The region gather over MPI: every owner's entries of its own region to every rank.

:func:`jss.sharded_sync`'s second exchange. Each rank's entries lie in its own
region (``[q N / P, (q + 1) N / P)`` for rank q), so split-allgather's first phase
moves no entry (only the slice sizes travel) and its second phase gathers each
owner's block: sparse, or dense past half the region; ``dense=True`` runs DSAR,
whose second phase gathers every region dense. One FFI call
(``ffi/collectives/split_allgather.cc``).
"""

from __future__ import annotations

from jax_sparse_sync.mpi.sparse_allreduce import mpi_sparse_allreduce

__all__ = ["mpi_region_gather"]


def mpi_region_gather(values, indices, *, size: int, dense: bool, comm,
                      nan_policy: str = "raise"):
    """``(the dense (size,) vector of every rank's entries, stats vector)``; arguments as
    :func:`jax_sparse_sync.ops.region_gather.region_gather` (checked there)."""
    return mpi_sparse_allreduce(
        values, indices, size=size, comm=comm, nan_policy=nan_policy, op="region_gather",
        algorithm="dsar_split_allgather" if dense else "split_allgather")
