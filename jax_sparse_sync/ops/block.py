"""``jss.block_allreduce``: the block-sparse (OmniReduce-style) allreduce.

For naturally sparse gradients (embedding tables, sparse features): the
vector is cut into blocks of ``block_size`` entries and only blocks holding a
nonzero travel, with a bitmap of which. Lossless: the result is the dense sum,
in rank order, bit for bit. MPI (``ffi/collectives/block_allreduce.cc``) or the mesh-axis
transport (:mod:`jax_sparse_sync.mesh.block`), as ``comm`` selects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.bindings.block_scan import check_block_size
from jax_sparse_sync.stats import SyncStats

__all__ = ["block_allreduce"]


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
        mesh axis, the same bits (see :mod:`jax_sparse_sync.mesh.block`).
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
    check_block_size(block_size, "block_allreduce")
    check_nan_policy(nan_policy, "block_allreduce")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.block_allreduce: `x` has dtype {x.dtype}; pass floats")
    comm = transport.resolve_comm(comm)
    out, stats = transport.implementation("block_allreduce", comm)(
        x.reshape(-1), block_size=block_size, comm=comm, nan_policy=nan_policy)
    out = out.reshape(x.shape)
    if return_stats == "vector":
        return out, stats
    return (out, SyncStats.from_vector(stats)) if return_stats else out
