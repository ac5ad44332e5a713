"""``dense_sync``: the dense baseline, gradients averaged with MPI_Allreduce."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.ops.dense_allreduce import dense_allreduce, wire_dtype_id
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.flat import ravel_leaves, split_like

__all__ = ["DenseSyncState", "dense_sync", "dense_mean"]


class DenseSyncState(NamedTuple):
    """State of :func:`dense_sync`: the last step's wire statistics (see ``TopkSyncState``)."""

    last_stats: jax.Array


def dense_sync(*, comm=None, nan_policy: str = "propagate",
               wire_dtype=None) -> optax.GradientTransformation:
    """Averages gradients over MPI ranks with a dense ``MPI_Allreduce``.

    The baseline that :func:`topk_sync` is measured against: same transport,
    same statistics, no compression. All leaves are flattened into one float32
    buffer and reduced in one call (one latency, fused like Horovod's buckets):
    :func:`jss.dense_allreduce`, one ``MPI_Allreduce`` written over that
    buffer (no index array, no scatter), then the division by P, fused into
    the pass that cuts the sum into leaves (and, in a training step, into the
    optimizer's own pass). Cost: one allreduce of N floats (4 N bytes, 2 N
    with a 16-bit ``wire_dtype``) and one pass over N entries.

    Inside a training step the flat buffer is a temporary, so nothing is
    copied. Called on a gradient that is an argument of the jitted function
    and not donated, XLA copies it first. Measurements against mpi4py's
    ``Allreduce`` and ``mpi4jax.allreduce``: docs/topics/dense_sync.md.

    Host memory: on the CPU, ``import jax_sparse_sync`` has already tuned glibc's
    allocator so that the N-float buffers of every step are reused instead of
    page-faulted anew each call (2-4x the call's time otherwise); there is nothing
    to call. ``JSS_TUNE_HOST_ALLOCATOR=0`` in the environment opts out
    (``jss.mpi.tune_host_allocator()``, docs/performance.md).

    Args:
      comm: mpi4py communicator; ``None`` is the library's clone of COMM_WORLD.
      nan_policy: ``"propagate"`` (default, as a plain allreduce) or ``"raise"``.
      wire_dtype: ``None`` (float32) or ``jnp.bfloat16`` / ``jnp.float16``: half
        the bytes on the wire, each rank's gradient rounded to that dtype and
        the sum taken in float32 and rounded once (see :func:`jss.dense_allreduce`);
        the statistics count the bytes that travel.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(jss.dense_sync(), optax.sgd(1.0))
      >>> params = {"w": jnp.ones(3)}
      >>> updates, _ = tx.update({"w": jnp.array([1., 2., 3.])}, tx.init(params), params)
      >>> updates["w"].tolist()  # one rank: the mean is the gradient itself
      [-1.0, -2.0, -3.0]
    """
    check_nan_policy(nan_policy, "dense_sync")
    wire_dtype_id(wire_dtype, "dense_sync")  # checked here, where the user passed it
    comm = transport.resolve_comm(comm)  # P is read at trace time: comm_size_in_trace

    def init_fn(params):
        del params
        return DenseSyncState(last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()))

    def update_fn(updates, state, params=None):
        del params, state
        new_updates, stats = dense_mean(ravel_leaves(updates, jnp.float32), updates, comm=comm,
                                        nan_policy=nan_policy, wire_dtype=wire_dtype)
        return new_updates, DenseSyncState(last_stats=stats)

    return optax.GradientTransformation(init_fn, update_fn)


def dense_mean(flat: jax.Array, like, *, comm, nan_policy: str, wire_dtype=None):
    """The mean over ranks of ``flat`` (float32, all N entries) cut into ``like``'s leaves.

    The dense allreduce of :func:`dense_sync`, also the dense phases (warm-up
    steps, flushes) of the sparse transforms: one :func:`jss.dense_allreduce`
    written over ``flat``'s buffer, then the division by P fused into the pass
    that cuts the sum into leaves. Returns ``(tree like like, stats vector)``.
    """
    summed, stats = dense_allreduce(flat, comm=comm, nan_policy=nan_policy,
                                    wire_dtype=wire_dtype, return_stats="vector")
    return split_like(summed, like, scale=transport.comm_size_in_trace(comm)), stats
