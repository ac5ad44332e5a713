"""The block-sparse allreduce over MPI as a JAX primitive (``ffi/collectives/block_allreduce.cc``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.mpi.comm import comm_attribute
from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["block_allreduce_p", "mpi_block_allreduce"]

block_allreduce_p = ordered_ffi_primitive(
    "jss_block_allreduce", "jss_block_allreduce",
    lambda x, **_: (jax.core.ShapedArray(x.shape, jnp.float32),
                    jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype())))


def mpi_block_allreduce(x, *, block_size: int, comm, nan_policy: str = "propagate"):
    """The block-sparse sum of the float vector ``x`` over an MPI communicator:
    ``(sum f32[x.size], stats vector)``; arguments checked by :func:`jss.block_allreduce`,
    as for :func:`~jax_sparse_sync.mesh.block.axis_block_allreduce`."""
    return block_allreduce_p.bind(x.astype(jnp.float32), block_size=block_size,
                                  comm=comm_attribute(comm), nan_policy=NAN_POLICIES[nan_policy])
