"""The region reduce over MPI as a JAX primitive (``ffi/collectives/region_reduce.cc``).

Each rank's sparse entries are summed at the owner of their fixed region
(rank q owns ``[q N / P, (q + 1) N / P)``), and only there: split-allgather's
first phase on its own, the reduce-scatter of :func:`jss.sharded_sync`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.mpi.comm import comm_attribute
from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["region_reduce_p", "mpi_region_reduce"]


def _abstract_eval(values, indices, *, size, _nranks, **_):
    del values, indices
    return (jax.core.ShapedArray((-(-size // _nranks),), jnp.float32),
            jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype()))


region_reduce_p = ordered_ffi_primitive("jss_region_reduce", "jss_region_reduce", _abstract_eval)


def mpi_region_reduce(values, indices, *, size: int, comm, nan_policy: str = "raise"):
    """This rank's region of the sum over ranks of the sparse ``(values, indices)``
    (index -1: padding): ``(region f32[ceil(size / P)], stats vector)``, the slots past
    the region's end zero. Arguments as :func:`jax_sparse_sync.ops.region_reduce.region_reduce`
    (checked there)."""
    return region_reduce_p.bind(
        values.astype(jnp.float32), indices, size=int(size), comm=comm_attribute(comm),
        nan_policy=NAN_POLICIES[nan_policy], _nranks=comm.Get_size())
