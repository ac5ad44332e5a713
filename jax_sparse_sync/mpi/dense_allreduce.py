"""The dense allreduce over MPI as a JAX primitive (``ffi/collectives/dense_and_allgather.cc``).

One ``MPI_Allreduce`` of the float32 vector, after the argument check every
MPI collective begins with; no index array, no scatter. The sum is written
over the input's buffer (input-output aliased): inside a jitted step the
input is a temporary (the raveled gradient, the error-feedback accumulator)
and XLA hands its buffer over, so the call allocates and copies nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.mpi.comm import comm_attribute
from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["dense_allreduce_p", "mpi_dense_allreduce"]

dense_allreduce_p = ordered_ffi_primitive(
    "jss_dense_allreduce", "jss_dense_allreduce",
    lambda x, **_: (jax.core.ShapedArray(x.shape, jnp.float32),
                    jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype())),
    aliases={0: 0})


def mpi_dense_allreduce(x, *, comm, nan_policy: str = "propagate", wire_dtype: int = 0):
    """The sum of the float32 vector ``x`` over an MPI communicator: ``(sum, stats vector)``;
    arguments checked by :func:`jss.dense_allreduce` (``wire_dtype``: 0 float32, 1
    bfloat16, 2 float16, as :data:`~jax_sparse_sync.ops.dense_allreduce.WIRE_DTYPES`)."""
    return dense_allreduce_p.bind(x, comm=comm_attribute(comm), nan_policy=NAN_POLICIES[nan_policy],
                                  wire_dtype=int(wire_dtype))
