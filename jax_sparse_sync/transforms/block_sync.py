"""``block_sync``: gradients averaged with the block-sparse allreduce, as an Optax transform.

Lossless (no error feedback needed): the update is the dense mean, while the
bytes scale with the gradient's nonzero blocks (see :mod:`jax_sparse_sync.ops.block`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.ops.block import block_allreduce
from jax_sparse_sync.bindings.block_scan import check_block_size
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.flat import ravel_leaves, split_like
from jax_sparse_sync.base.transform_arguments import check_float_leaves

__all__ = ["BlockSyncState", "block_sync"]


class BlockSyncState(NamedTuple):
    """State of :func:`block_sync`: the last step's wire statistics."""

    last_stats: jax.Array


def block_sync(*, block_size: int = 256, comm=None,
               nan_policy: str = "propagate") -> optax.GradientTransformation:
    """Averages gradients over MPI ranks, sending only their nonzero blocks.

    With ``comm=jss.axis(name)`` it runs inside shard_map/pmap over that mesh
    axis instead (JAX collectives; same bits; the state holds only stats).

    For naturally sparse gradients (an embedding table of which a batch
    touches few rows): lossless, so training is the same as with a dense
    allreduce, while the bytes scale with the touched blocks. Align
    ``block_size`` with the embedding width (or a multiple) so a row is a block.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(jss.block_sync(block_size=4), optax.sgd(1.0))
      >>> params = {"emb": jnp.zeros((3, 4))}
      >>> g = {"emb": jnp.zeros((3, 4)).at[1].set(1.0)}
      >>> updates, _ = tx.update(g, tx.init(params))
      >>> updates["emb"][1].tolist(), updates["emb"][0].tolist()
      ([-1.0, -1.0, -1.0, -1.0], [-0.0, -0.0, -0.0, -0.0])
    """
    check_block_size(block_size, "block_sync")
    check_nan_policy(nan_policy, "block_sync")
    comm = transport.resolve_comm(comm)

    def init_fn(params):
        check_float_leaves(params, "parameter", "block_sync")
        return BlockSyncState(last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()))

    def update_fn(updates, state, params=None):
        del params, state
        check_float_leaves(updates, "gradient", "block_sync")
        nranks = transport.comm_size_in_trace(comm, "block_sync")
        flat = ravel_leaves(updates, jnp.float32)
        summed, stats = block_allreduce(flat, block_size=block_size, comm=comm,
                                        nan_policy=nan_policy, return_stats="vector")
        new_updates = split_like(summed, updates, scale=nranks)
        return new_updates, BlockSyncState(last_stats=stats)

    return optax.GradientTransformation(init_fn, update_fn)
