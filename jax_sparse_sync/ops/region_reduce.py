"""``region_reduce``: the sparse reduce-scatter of :func:`jss.sharded_sync`.

Rank q owns the fixed region ``[q N / P, (q + 1) N / P)`` of the index space
(split-allgather's ranges: balanced by size, the same every step). Each rank
sends every owner the entries that fall in its region and the owner sums the
P slices in rank order; nothing is gathered after it, so each rank ends with
its own region of the sum only. MPI (``ffi/collectives/region_reduce.cc``) or a
mesh axis (:mod:`jax_sparse_sync.mesh.region_reduce`), as ``comm`` selects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.arguments import check_coo_arguments
from jax_sparse_sync.ops import transport

__all__ = ["region_reduce", "region_bounds", "region_slot"]


def region_bounds(size: int, nranks: int) -> list[int]:
    """The P + 1 region boundaries ``[q * size // P for q in 0..P]``."""
    return [size * q // nranks for q in range(nranks + 1)]


def region_slot(size: int, nranks: int) -> int:
    """``ceil(size / P)``: the longest region, every rank's (padded) region buffer."""
    return -(-size // nranks)


def region_reduce(values: jax.Array, indices: jax.Array, *, size: int, comm=None,
                  nan_policy: str = "raise"):
    """This rank's region of the sum over ranks of the sparse ``(values, indices)``.

    Args:
      values, indices: fixed-capacity COO (float values, int32 indices into
        ``[0, size)``, index -1 for padding), any order, duplicates summed.
      size: the dense dimension N (equal on every rank).
      comm: mpi4py communicator (default: the library's clone of COMM_WORLD) or
        ``jss.axis(name)`` inside shard_map.
      nan_policy: ``"raise"`` or ``"propagate"``, as :func:`jss.sparse_allreduce`'s.

    Returns:
      ``(region, stats)``: ``region`` float32 of ``ceil(size / P)`` entries, entry
      ``i`` the sum over ranks at index ``q * size // P + i`` for this rank ``q``,
      zero past the region's end; ``stats`` the raw statistics vector (bytes of
      the header, the slice sizes, the slices and the merged counts;
      ``result_nnz`` the entries the owners merged, summed over owners).

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.ops.region_reduce import region_reduce
      >>> region, _ = region_reduce(jnp.array([2., -1.]), jnp.array([3, 0], jnp.int32), size=5)
      >>> region.tolist()  # one rank: it owns all five entries
      [-1.0, 0.0, 0.0, 2.0, 0.0]
    """
    values, indices = jnp.asarray(values), jnp.asarray(indices)
    size = check_coo_arguments(values, indices, size, nan_policy, "region_reduce")
    comm = transport.resolve_comm(comm)
    return transport.implementation("region_reduce", comm)(
        values, indices, size=size, comm=comm, nan_policy=nan_policy)
