"""The allgather of one fixed-size byte payload per rank over MPI (``ffi/collectives/allgather_bytes.cc``).

The exchange of :func:`~jax_sparse_sync.chunked_topk_sync`: each rank's
compressed chunks are a byte payload built in JAX; one ``MPI_Allgather`` (after
the header check every collective of the library begins with) hands every rank
all P payloads, which it decodes and sums in rank order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.mpi.comm import comm_attribute
from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["allgather_bytes_p", "mpi_allgather_bytes"]

allgather_bytes_p = ordered_ffi_primitive(
    "jss_allgather_bytes", "jss_allgather_bytes",
    lambda payload, non_finite, *, _nranks, **_: (
        jax.core.ShapedArray((_nranks, payload.shape[0]), jnp.uint8),
        jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype())))


def mpi_allgather_bytes(payload, non_finite, *, comm, nan_policy: str, param: int):
    """Every rank's ``payload`` (uint8 (B,), the same B on every rank) over an MPI
    communicator: ``(gathered uint8 (P, B), row r rank r's; stats vector)``.

    ``non_finite`` (a bool scalar): this rank's payload encodes a NaN/Inf; with
    ``nan_policy="raise"`` every rank then fails the call, naming the rank(s).
    ``param`` must be the same on every rank (checked with the header).
    """
    flag = jnp.reshape(jnp.asarray(non_finite).astype(jnp.int32), (1,))
    return allgather_bytes_p.bind(jnp.asarray(payload, jnp.uint8).reshape(-1), flag,
                                  comm=comm_attribute(comm), nan_policy=NAN_POLICIES[nan_policy],
                                  param=int(param), _nranks=comm.Get_size())
