"""``jss.dense_allreduce``: the sum of a dense vector over the ranks, at the cost of one allreduce.

The dense baseline (:func:`jss.dense_sync`) and every dense phase of the
sparse transforms (warm-up steps, ``flush_every``, the cyclic and union
selections' exchanges) sum through this op. MPI
(:mod:`jax_sparse_sync.mpi.dense_allreduce`: one ``MPI_Allreduce``, in place)
or the mesh-axis transport (:func:`~jax_sparse_sync.mesh.dense.axis_dense_allreduce`:
one ``psum``), as ``comm`` selects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import WIRE_DTYPES, check_nan_policy, wire_dtype_id
from jax_sparse_sync.stats import SyncStats

__all__ = ["dense_allreduce", "WIRE_DTYPES", "wire_dtype_id"]


def dense_allreduce(x: jax.Array, *, comm=None, nan_policy: str = "propagate",
                    wire_dtype=None, return_stats: bool = False):
    """Sums a dense float vector over all ranks: one ``MPI_Allreduce`` (or ``psum``).

    No index array and no scatter: the flat float32 buffer goes to
    ``MPI_Allreduce`` as it is, after the argument check every collective of
    the library begins with (a 56-byte header allgather: the sizes agree on
    every rank; under ``nan_policy="raise"`` no rank sends a NaN/Inf). The sum
    is written over the input's buffer: inside a jitted function whose input
    here is a temporary (a raveled gradient, an accumulator) or a donated
    argument, nothing is copied; otherwise XLA copies the input first (one
    pass over N floats).

    Every rank receives the same bits: each entry's sum is computed once (by
    one rank, or identically by both partners of a pairwise exchange) and
    copied to the others (see ``ffi/collectives/dense_and_allgather.cc``); the tests
    compare the bytes across ranks. Over a mesh axis the same holds for XLA's
    ``psum``; the two transports may order the additions differently.

    Args:
      x: float array (float32, bfloat16 or float16; summed in float32), the
        same size on every rank.
      comm: mpi4py communicator (default: the library's clone of
        COMM_WORLD), or ``jss.axis(name)`` inside shard_map/pmap.
      nan_policy: ``"propagate"`` (default, as a plain allreduce) or
        ``"raise"`` (every rank raises if any rank's ``x`` holds a NaN/Inf;
        costs one read of ``x``).
      wire_dtype: ``None`` (float32: one ``MPI_Allreduce``), ``jnp.bfloat16`` or
        ``jnp.float16``: half the bytes. Each rank rounds its vector to the wire
        dtype (nearest even) and sends rank q the q-th of P blocks
        (``MPI_Alltoall``); rank q sums the P blocks in float32, in rank order,
        rounds the sum once to the wire dtype, and the blocks are gathered to
        all (``MPI_Allgather``). So each entry is rounded twice (the input, the
        sum), the result holds wire-dtype values (returned in float32), and it
        is identical on every rank by construction. float16 overflows to Inf
        past 65504. Bytes: ``2 (P-1) ceil(N/P) * 2``, half of float32's when P
        divides N.
      return_stats: also return :class:`SyncStats` (bytes: the header plus
        Rabenseifner's ``2 (P-1)/P * 4N``; ``result_nnz`` is N, not scanned).

    Returns:
      The sum, shape ``x.shape``, float32 for float32 input and ``x.dtype``
      otherwise; with ``return_stats``, ``(sum, stats)``.

    Raises:
      TypeError: ``x`` is not a float array.
      XlaRuntimeError: ranks disagree on the size, or (``nan_policy="raise"``)
        a rank holds a non-finite entry: on every rank, naming the rank(s).

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> jss.dense_allreduce(jnp.array([1.0, -2.0, 0.5])).tolist()  # one rank: x itself
      [1.0, -2.0, 0.5]
    """
    check_nan_policy(nan_policy, "dense_allreduce")
    wire = wire_dtype_id(wire_dtype, "dense_allreduce")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == jnp.float64:
        raise TypeError(f"jax_sparse_sync.dense_allreduce: `x` has dtype {x.dtype}; pass "
                        "float32, bfloat16 or float16 (float64: cast to float32 first)")
    comm = transport.resolve_comm(comm)
    out, stats = transport.implementation("dense_allreduce", comm)(
        x.reshape(-1).astype(jnp.float32), comm=comm, nan_policy=nan_policy, wire_dtype=wire)
    out = out.reshape(x.shape).astype(x.dtype)
    if return_stats == "vector":  # internal: the raw stats vector, for Optax states
        return out, stats
    return (out, SyncStats.from_vector(stats)) if return_stats else out
