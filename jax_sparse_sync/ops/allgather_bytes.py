"""The allgather of one fixed-size byte payload per rank, on MPI or on a mesh axis.

The exchange of :func:`~jax_sparse_sync.chunked_topk_sync`, whose payload
(chunk offsets, packed value codes, per-chunk scales) no sparse allreduce of
the library carries: their wire holds (index, value) pairs and is summed in
C++, while these codes must be decoded before they are summed. The payload
is built in JAX, so both transports move the same bytes: MPI
(:mod:`jax_sparse_sync.mpi.allgather_bytes`: one ``MPI_Allgather``) or a mesh
axis (:mod:`jax_sparse_sync.mesh.allgather_bytes`: one ``all_gather``), each
after the library's header check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.ops import transport

__all__ = ["allgather_bytes"]


def allgather_bytes(payload: jax.Array, *, comm=None, non_finite=False,
                    nan_policy: str = "propagate", param: int = 0):
    """Every rank's byte payload, in rank order, and this rank's wire statistics.

    Args:
      payload: uint8 (B,), the same B on every rank (checked).
      comm: mpi4py communicator (``None``: the library's clone of COMM_WORLD),
        or ``jss.axis(name)`` inside shard_map.
      non_finite: a bool scalar: this rank's payload encodes a NaN or Inf.
      nan_policy: ``"raise"``: every rank raises when a rank flags
        ``non_finite``, naming the rank(s); ``"propagate"``: no check.
      param: an int that must agree across ranks (checked with the header).

    Returns:
      ``(gathered uint8 (P, B), stats vector)``: row r is rank r's payload, the
      same bytes on every rank; the statistics count the 56-byte header and the
      allgather's ``(P - 1) B`` bytes each way (``jss.SyncStats`` layout).

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.ops.allgather_bytes import allgather_bytes
      >>> gathered, _ = allgather_bytes(jnp.arange(3, dtype=jnp.uint8))  # one rank
      >>> gathered.tolist()
      [[0, 1, 2]]
    """
    check_nan_policy(nan_policy, "allgather_bytes")
    payload = jnp.asarray(payload)
    if payload.dtype != jnp.uint8 or payload.ndim != 1:
        raise TypeError(f"jax_sparse_sync.allgather_bytes: `payload` must be a uint8 vector; "
                        f"got {payload.dtype}{list(payload.shape)}")
    comm = transport.resolve_comm(comm)
    return transport.implementation("allgather_bytes", comm)(
        payload, jnp.asarray(non_finite, bool), comm=comm, nan_policy=nan_policy,
        param=int(param))
