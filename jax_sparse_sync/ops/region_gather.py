"""``region_gather``: every owner's entries of its own region, to every rank.

:func:`jss.sharded_sync`'s second exchange, the inverse of
:func:`~jax_sparse_sync.ops.region_reduce.region_reduce`: rank q's entries all lie
in its region ``[q N / P, (q + 1) N / P)``, so the regions are disjoint and nothing
is summed: every rank gets the same dense vector, each entry's bits as its owner
sent them. MPI (:mod:`jax_sparse_sync.mpi.region_gather`: split-allgather, or
DSAR's dense gather) or a mesh axis (:mod:`jax_sparse_sync.mesh.region_gather`: one
``all_gather``), as ``comm`` selects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.arguments import check_coo_arguments
from jax_sparse_sync.ops import transport

__all__ = ["region_gather"]


def region_gather(values: jax.Array, indices: jax.Array, *, size: int, dense: bool = False,
                  comm=None, nan_policy: str = "raise"):
    """The dense vector of every rank's ``(values, indices)``, each rank's within its region.

    Args:
      values, indices: this rank's entries (index -1: padding); every index must
        lie in this rank's region (on MPI an entry outside it is summed with its
        owner's, as :func:`jss.sparse_allreduce` sums; the mesh axis writes it).
      size: the dense dimension N.
      dense: gather every region dense (``4 ceil(N / P)`` bytes to each peer)
        instead of its entries.
      comm: mpi4py communicator (default: the library's clone of COMM_WORLD) or
        ``jss.axis(name)`` inside shard_map.
      nan_policy: ``"raise"`` or ``"propagate"``.

    Returns:
      ``(out, stats)``: ``out`` float32 (size,), the same bits on every rank;
      ``stats`` the raw statistics vector.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.ops.region_gather import region_gather
      >>> out, _ = region_gather(jnp.array([2., -1.]), jnp.array([3, 0], jnp.int32), size=5)
      >>> out.tolist()
      [-1.0, 0.0, 0.0, 2.0, 0.0]
    """
    values, indices = jnp.asarray(values), jnp.asarray(indices)
    size = check_coo_arguments(values, indices, size, nan_policy, "region_gather")
    comm = transport.resolve_comm(comm)
    return transport.implementation("region_gather", comm)(
        values, indices, size=size, dense=bool(dense), comm=comm, nan_policy=nan_policy)
