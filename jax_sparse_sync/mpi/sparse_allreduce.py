"""The MPI sparse allreduce as a JAX primitive.

The primitive lowers to the ``jss_sparse_allreduce`` XLA FFI custom call. It
carries an ordered effect, so JAX threads a token through every MPI call in
program order and no rank can see its collectives reordered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.mpi.comm import check_mpi_comm, comm_attribute
from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.base.arguments import (NAN_POLICIES, check_coo_arguments, check_quantization,
                                            wire_word)
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["sparse_allreduce_p", "call_arguments", "mpi_sparse_allreduce"]


def _abstract_eval(values, indices, seed, *, size, **_):
    return (jax.core.ShapedArray((size,), jnp.float32),
            jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype()))


sparse_allreduce_p = ordered_ffi_primitive("jss_sparse_allreduce", "jss_sparse_allreduce",
                                           _abstract_eval)


def call_arguments(values, indices, *, size, algorithm, comm, nan_policy, quantize_bits,
                   qsgd_bucket, seed, op, wire_dtype=None, index_encoding="int32"):
    """Checks a sparse allreduce call; returns (operands, params) for the primitives."""
    values = jnp.asarray(values)
    indices = jnp.asarray(indices)
    size = check_coo_arguments(values, indices, size, nan_policy, op)
    comm = check_mpi_comm(comm)
    algo = resolve_algorithm(algorithm, nranks=comm.Get_size(), size=size, k=values.shape[0])
    check_quantization(quantize_bits, qsgd_bucket, algo, op)
    wire = wire_word(wire_dtype, index_encoding, op)
    if wire and quantize_bits:
        raise ValueError(f"jax_sparse_sync.{op}: `quantize_bits` (QSGD codes for DSAR's dense "
                         "phase) and `wire_dtype` / `index_encoding='auto'` cannot be combined; "
                         "choose one")
    operands = (values.astype(jnp.float32), indices, jnp.asarray(seed, jnp.int32).reshape(()))
    params = dict(size=size, algorithm=_ext.ALGORITHM_IDS[algo], comm=comm_attribute(comm),
                  nan_policy=NAN_POLICIES[nan_policy], quantize_bits=int(quantize_bits),
                  qsgd_bucket=int(qsgd_bucket), wire=int(wire))
    return operands, params



def mpi_sparse_allreduce(values, indices, *, size: int, algorithm: str, comm,
                         nan_policy: str = "raise", quantize_bits: int = 0,
                         qsgd_bucket: int = 1024, seed=0, op: str = "sparse_allreduce",
                         wire_dtype=None, index_encoding: str = "int32"):
    """The sparse allreduce over an MPI communicator: ``(sum f32[size], stats vector)``.

    Same arguments as :func:`jax_sparse_sync.sparse_allreduce`; the mesh-axis
    transport's :func:`~jax_sparse_sync.mesh.sparse_allreduce.axis_sparse_allreduce`
    takes the same ones.
    """
    operands, params = call_arguments(
        values, indices, size=size, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
        quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, seed=seed, op=op,
        wire_dtype=wire_dtype, index_encoding=index_encoding)
    return sparse_allreduce_p.bind(*operands, **params)
