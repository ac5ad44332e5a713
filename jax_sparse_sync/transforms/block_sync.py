"""Block-sparse (OmniReduce-style) allreduce and the ``block_sync`` transform.

For naturally sparse gradients (embedding tables, sparse features): the
gradient is cut into blocks of ``block_size`` entries and only blocks holding a
nonzero travel, with a bitmap of which. Lossless: the result is the dense sum,
in rank order, bit for bit; no error feedback is needed.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)
from jax_sparse_sync import comm as _comm
from jax_sparse_sync._ordered_call import ordered_ffi_primitive
from jax_sparse_sync.axis import AxisComm
from jax_sparse_sync.axis_block import axis_block_allreduce
from jax_sparse_sync.sparse_allreduce import NAN_POLICIES, stats_dtype
from jax_sparse_sync.stats import STATS_FIELDS, SyncStats
from jax_sparse_sync.topk_sync import check_float_leaves

__all__ = ["BlockSyncState", "block_allreduce", "block_scan", "block_sync"]

block_allreduce_p = ordered_ffi_primitive(
    "jss_block_allreduce", "jss_block_allreduce",
    lambda x, **_: (jax.core.ShapedArray(x.shape, jnp.float32),
                    jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype())))


def _check_block_size(block_size, op):
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `block_size` must be a positive int; "
                         f"got {block_size!r}")


def block_scan(x: jax.Array, block_size: int = 256) -> jax.Array:
    """bool mask over the blocks of ``x.ravel()``: True where a block holds a nonzero.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> jss.block_scan(jnp.array([0., 0., 1., 0., 0., 0., 0.]), 2).tolist()
      [False, True, False, False]
    """
    _check_block_size(block_size, "block_scan")
    x = jnp.asarray(x)  # float32, bfloat16 and float16 are scanned as they are
    x = (x if x.dtype in (jnp.float32, jnp.bfloat16, jnp.float16) else x.astype(jnp.float32)).reshape(-1)
    nb = -(-x.shape[0] // block_size)
    mask = jax.ffi.ffi_call("jss_block_scan", jax.ShapeDtypeStruct((nb,), jnp.uint8),
                            vmap_method="sequential")(x, block_size=np.int64(block_size))
    return mask.astype(bool)


def block_allreduce(x: jax.Array, *, block_size: int = 256, comm=None,
                    nan_policy: str = "propagate", return_stats: bool = False):
    """Sums a dense vector over MPI ranks (or mesh devices), sending only its nonzero blocks.

    Rank q owns blocks ``[q B / P, (q+1) B / P)``; every rank sends each owner
    a bitmap and the nonzero blocks of its range; owners add them in rank
    order; the nonzero result blocks (bitmap + data) are gathered to all.

    Args:
      x: float array (summed as float32; result in float32), same size on all ranks.
      block_size: entries per block (256 by default; equal on all ranks).
      comm: mpi4py communicator (default: the library's clone of COMM_WORLD),
        or ``jss.axis(name)`` inside shard_map/pmap: JAX collectives over that
        mesh axis, the same bits (see :mod:`jax_sparse_sync.axis_block`).
      nan_policy: ``"propagate"`` (default) or ``"raise"``.
      return_stats: also return :class:`SyncStats` (``result_nnz`` counts the
        nonzero blocks of the result).

    Returns:
      The sum, shape ``x.shape``, equal bit for bit to ``((x_0 + x_1) + ...) +
      x_{P-1}`` and identical on every rank.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> jss.block_allreduce(jnp.array([0., 0., 3., 0.]), block_size=2).tolist()
      [0.0, 0.0, 3.0, 0.0]
    """
    _check_block_size(block_size, "block_allreduce")
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"jax_sparse_sync.block_allreduce: `nan_policy` must be one of "
                         f"{sorted(NAN_POLICIES)}; got {nan_policy!r}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.block_allreduce: `x` has dtype {x.dtype}; pass floats")
    comm = _comm.resolve_comm(comm)
    if isinstance(comm, AxisComm):  # JAX collectives over a mesh axis: axis_block.py
        out, stats = axis_block_allreduce(x.reshape(-1), block_size=block_size, comm=comm,
                                          nan_policy=nan_policy)
    else:
        out, stats = block_allreduce_p.bind(x.reshape(-1).astype(jnp.float32),
                                            block_size=block_size, comm=int(comm.py2f()),
                                            nan_policy=NAN_POLICIES[nan_policy])
    out = out.reshape(x.shape)
    if return_stats == "vector":
        return out, stats
    return (out, SyncStats.from_vector(stats)) if return_stats else out


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
    _check_block_size(block_size, "block_sync")
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"jax_sparse_sync.block_sync: `nan_policy` must be one of "
                         f"{sorted(NAN_POLICIES)}; got {nan_policy!r}")
    comm = _comm.resolve_comm(comm)

    def init_fn(params):
        check_float_leaves(params, "parameter", "block_sync")
        return BlockSyncState(last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()))

    def update_fn(updates, state, params=None):
        del params, state
        check_float_leaves(updates, "gradient", "block_sync")
        nranks = _comm.comm_size_in_trace(comm, "block_sync")
        flat, unravel = ravel_pytree(
            jax.tree_util.tree_map(lambda g: jnp.asarray(g).astype(jnp.float32), updates))
        summed, stats = block_allreduce(flat, block_size=block_size, comm=comm,
                                        nan_policy=nan_policy, return_stats="vector")
        mean = unravel(summed / nranks)
        new_updates = jax.tree_util.tree_map(lambda m, g: m.astype(jnp.result_type(g)), mean, updates)
        return new_updates, BlockSyncState(last_stats=stats)

    return optax.GradientTransformation(init_fn, update_fn)
