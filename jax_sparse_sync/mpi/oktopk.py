"""Ok-Topk's O(k) allreduce over MPI as a JAX primitive (``ffi/collectives/oktopk.cc``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.mpi.comm import comm_attribute
from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.base.arguments import NAN_POLICIES, OKTOPK_PARTITIONS, wire_dtype_id
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["oktopk_p", "mpi_oktopk_allreduce"]

_NO_LIMIT = 2**63 - 1  # region_max without a limit


def _abstract_eval(values, indices, boundaries, threshold, recompute, *, size, _nranks, **_):
    return (jax.core.ShapedArray((size,), jnp.float32),
            jax.core.ShapedArray(values.shape, jnp.uint8),
            jax.core.ShapedArray((_nranks + 1,), jnp.int32),
            jax.core.ShapedArray((), jnp.float32),
            jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype()))


oktopk_p = ordered_ffi_primitive("jss_oktopk_allreduce", "jss_oktopk_allreduce", _abstract_eval)


def mpi_oktopk_allreduce(values, indices, *, size: int, k: int, boundaries, threshold,
                         recompute_boundaries, recompute_threshold, comm,
                         nan_policy: str = "raise", region_counts: tuple[int, int] | None = None,
                         wire_dtype=None, partition: str = "regions"):
    """Ok-Topk over an MPI communicator; arguments as :func:`jss.oktopk_allreduce`
    (checked there). Returns ``(sum, contributed, boundaries, threshold, stats vector)``,
    as :func:`~jax_sparse_sync.mesh.oktopk.axis_oktopk_allreduce` does."""
    lo, hi = (0, _NO_LIMIT) if region_counts is None else region_counts
    recompute = jnp.stack([jnp.asarray(recompute_boundaries, jnp.int32).reshape(()),
                           jnp.asarray(recompute_threshold, jnp.int32).reshape(())])
    out, contributed, bounds, used_threshold, stats = oktopk_p.bind(
        values.astype(jnp.float32), indices, boundaries,
        jnp.asarray(threshold, jnp.float32).reshape(()), recompute,
        size=size, k=int(k), comm=comm_attribute(comm), nan_policy=NAN_POLICIES[nan_policy],
        region_min=int(lo), region_max=int(hi),
        wire_dtype=wire_dtype_id(wire_dtype, "oktopk_allreduce"),
        partition=OKTOPK_PARTITIONS.index(partition), _nranks=comm.Get_size())
    return out, contributed.astype(bool), bounds, used_threshold, stats
