"""``dense_sync``: the dense baseline, gradients averaged with MPI_Allreduce."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.ops.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.flat import ravel_leaves, split_like

__all__ = ["DenseSyncState", "dense_sync", "dense_mean"]


class DenseSyncState(NamedTuple):
    """State of :func:`dense_sync`: the last step's wire statistics (see ``TopkSyncState``)."""

    last_stats: jax.Array


def dense_sync(*, comm=None, nan_policy: str = "propagate") -> optax.GradientTransformation:
    """Averages gradients over MPI ranks with a dense ``MPI_Allreduce``.

    The baseline that :func:`topk_sync` is measured against: same transport,
    same statistics, no compression. All leaves are flattened into one float32
    buffer and reduced in one call (one latency, fused like Horovod's buckets).

    Args:
      comm: mpi4py communicator; ``None`` is the library's clone of COMM_WORLD.
      nan_policy: ``"propagate"`` (default, as a plain allreduce) or ``"raise"``.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(jss.dense_sync(), optax.sgd(1.0))
      >>> params = {"w": jnp.ones(3)}
      >>> updates, _ = tx.update({"w": jnp.array([1., 2., 3.])}, tx.init(params), params)
      >>> updates["w"].tolist()  # one rank: the mean is the gradient itself
      [-1.0, -2.0, -3.0]
    """
    check_nan_policy(nan_policy, "dense_sync")
    comm = transport.resolve_comm(comm)  # P is read at trace time: comm_size_in_trace

    def init_fn(params):
        del params
        return DenseSyncState(last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()))

    def update_fn(updates, state, params=None):
        del params, state
        new_updates, stats = dense_mean(ravel_leaves(updates, jnp.float32), updates, comm=comm,
                                        nan_policy=nan_policy)
        return new_updates, DenseSyncState(last_stats=stats)

    return optax.GradientTransformation(init_fn, update_fn)


def dense_mean(flat: jax.Array, like, *, comm, nan_policy: str):
    """The mean over ranks of ``flat`` (float32, all N entries) cut into ``like``'s leaves.

    The dense allreduce of :func:`dense_sync`, also the dense warm-up phase of
    the sparse transforms. Returns ``(tree like like, stats vector)``.
    """
    summed, stats = sparse_allreduce(
        flat, jnp.arange(flat.shape[0], dtype=jnp.int32), size=flat.shape[0],
        algorithm="dense", comm=comm, nan_policy=nan_policy, return_stats="vector")
    return split_like(summed, like, scale=transport.comm_size_in_trace(comm)), stats
