"""Non-blocking sparse allreduce: ``sparse_allreduce_start`` / ``sparse_allreduce_done``.

``start`` checks the arguments on every rank and hands the collective to a
worker thread; ``done`` waits for it. Work placed between the two overlaps the
communication, and several allreduces can be in flight at once. Both calls
carry the MPI ordered effect, so every rank issues the same sequence.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_sparse_sync.mpi.nonblocking import done_p, start_p
from jax_sparse_sync.mpi.sparse_allreduce import call_arguments
from jax_sparse_sync.ops import transport
from jax_sparse_sync.stats import SyncStats

__all__ = ["PendingAllreduce", "sparse_allreduce_start", "sparse_allreduce_done"]

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PendingAllreduce:
    """A started sparse allreduce: pass it to :func:`sparse_allreduce_done` once.

    ``handle`` is an int32 scalar array (it may cross ``jit`` boundaries);
    ``size`` and ``dtype`` are static.
    """

    handle: jax.Array
    size: int = dataclasses.field(metadata=dict(static=True))
    dtype: str = dataclasses.field(metadata=dict(static=True))


def sparse_allreduce_start(values: jax.Array, indices: jax.Array, *, size: int,
                           algorithm: str = "auto", comm=None, nan_policy: str = "raise",
                           quantize_bits: int = 0, qsgd_bucket: int = 1024,
                           seed: int | jax.Array = 0) -> PendingAllreduce:
    """Starts a sparse allreduce; arguments as :func:`sparse_allreduce`.

    Bad arguments fail here, on every rank. Up to 8 allreduces per
    communicator run concurrently; a ninth waits for the oldest to finish
    (its result stays available). Call :func:`sparse_allreduce_done` on every
    handle, on every rank, in the same order as the other ranks.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> i = jnp.array([0, 2], jnp.int32)
      >>> a = jss.sparse_allreduce_start(jnp.array([1., 2.]), i, size=3, algorithm="allgather")
      >>> b = jss.sparse_allreduce_start(jnp.array([5., 6.]), i, size=3, algorithm="recursive_doubling")
      >>> jss.sparse_allreduce_done(b).tolist(), jss.sparse_allreduce_done(a).tolist()
      ([5.0, 0.0, 6.0], [1.0, 0.0, 2.0])
    """
    values = jnp.asarray(values)
    comm = transport.resolve_mpi_comm(comm, "sparse_allreduce_start")
    operands, params = call_arguments(
        values, indices, size=size, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
        quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, seed=seed,
        op="sparse_allreduce_start")
    (handle,) = start_p.bind(*operands, **params)
    return PendingAllreduce(handle=handle, size=params["size"], dtype=str(values.dtype))


def sparse_allreduce_done(pending: PendingAllreduce, *, return_stats: bool = False):
    """Waits for a started allreduce; returns what :func:`sparse_allreduce` would."""
    if not isinstance(pending, PendingAllreduce):
        raise TypeError("jax_sparse_sync.sparse_allreduce_done: pass the PendingAllreduce that "
                        f"sparse_allreduce_start returned; got {type(pending).__name__}")
    out, stats = done_p.bind(pending.handle, size=pending.size)
    if pending.dtype != "float32":
        out = out.astype(pending.dtype)
    return (out, SyncStats.from_vector(stats)) if return_stats else out
