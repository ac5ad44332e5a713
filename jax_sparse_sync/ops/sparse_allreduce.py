"""``sparse_allreduce``: the MPI sparse allreduce as a JAX primitive.

The primitive lowers to the ``jss_sparse_allreduce`` XLA FFI custom call. It
carries an ordered effect, so JAX threads a token through every MPI call in
program order and no rank can see its collectives reordered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext, comm as _comm, cost_model
from jax_sparse_sync.compression import QSGD_BITS
from jax_sparse_sync._ordered_call import ordered_ffi_primitive
from jax_sparse_sync.axis import AxisComm, axis_sparse_allreduce
from jax_sparse_sync.stats import STATS_FIELDS, SyncStats

__all__ = ["sparse_allreduce", "resolve_algorithm", "NAN_POLICIES"]

#: nan_policy name -> id understood by the C++ handler.
NAN_POLICIES = {"raise": 0, "propagate": 1}


def stats_dtype():
    """int64 with ``jax_enable_x64``, else int32 (the C++ side saturates it)."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32

def _abstract_eval(values, indices, seed, *, size, **_):
    return (jax.core.ShapedArray((size,), jnp.float32),
            jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype()))


sparse_allreduce_p = ordered_ffi_primitive("jss_sparse_allreduce", "jss_sparse_allreduce",
                                           _abstract_eval)


def resolve_algorithm(algorithm: str, *, nranks: int, size: int, k: int,
                      params: cost_model.AlphaBeta | None = None) -> str:
    """Checks ``algorithm`` and resolves ``"auto"`` with the cost model."""
    if algorithm == "auto":
        return cost_model.choose_algorithm(nranks=nranks, size=size, k=k, params=params)
    if algorithm == "oktopk":
        raise ValueError(
            "jax_sparse_sync: Ok-Topk returns Top-k(sum), not the sum: use jss.oktopk_allreduce "
            "or the jss.oktopk_sync transform instead of algorithm='oktopk'.")
    if algorithm == "block":
        raise ValueError(
            "jax_sparse_sync: the block-sparse allreduce takes a dense vector: use "
            "jss.block_allreduce or the jss.block_sync transform instead of algorithm='block'.")
    if algorithm not in _ext.ALGORITHM_IDS:
        raise ValueError(
            f"jax_sparse_sync: unknown `algorithm` {algorithm!r}; choose one of "
            f"{sorted(set(_ext.ALGORITHM_IDS) - {'oktopk', 'block'})} or 'auto'."
        )
    return algorithm


def check_quantization(quantize_bits, qsgd_bucket, algorithm: str, op: str) -> None:
    """QSGD on the dense phase exists for DSAR only."""
    if quantize_bits == 0:
        return
    if quantize_bits not in QSGD_BITS:
        raise ValueError(f"jax_sparse_sync.{op}: `quantize_bits` must be 0 (off) or one of "
                         f"{QSGD_BITS}; got {quantize_bits!r}")
    if algorithm != "dsar_split_allgather":
        raise ValueError(
            f"jax_sparse_sync.{op}: `quantize_bits` quantizes DSAR's dense phase; it needs "
            f"algorithm='dsar_split_allgather', not {algorithm!r}.")
    if not isinstance(qsgd_bucket, int) or qsgd_bucket < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `qsgd_bucket` must be a positive int; "
                         f"got {qsgd_bucket!r}")


def check_coo_arguments(values, indices, size, nan_policy, op) -> int:
    """The checks every sparse allreduce call makes (MPI and mesh-axis transports
    alike); returns ``size`` as an int."""
    if values.ndim != 1 or indices.ndim != 1 or values.shape != indices.shape:
        raise ValueError(
            f"jax_sparse_sync.{op}: `values` and `indices` must be 1-D and of the same "
            f"length; got shapes {values.shape} and {indices.shape}."
        )
    if values.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise TypeError(
            f"jax_sparse_sync.{op}: `values` has dtype {values.dtype}; pass float32, "
            "bfloat16 or float16 (cast integer data with .astype(jnp.float32))."
        )
    if indices.dtype != jnp.int32:
        raise TypeError(
            f"jax_sparse_sync.{op}: `indices` has dtype {indices.dtype}; pass int32 "
            "(indices.astype(jnp.int32))."
        )
    size = int(size)
    if not 0 < size < 2**31:
        raise ValueError(f"jax_sparse_sync.{op}: `size` must be in [1, 2**31); got {size}")
    if nan_policy not in NAN_POLICIES:
        raise ValueError(
            f"jax_sparse_sync.{op}: `nan_policy` must be one of {sorted(NAN_POLICIES)}; "
            f"got {nan_policy!r}"
        )
    return size


def call_arguments(values, indices, *, size, algorithm, comm, nan_policy, quantize_bits,
                   qsgd_bucket, seed, op):
    """Checks a sparse allreduce call; returns (operands, params) for the primitives."""
    values = jnp.asarray(values)
    indices = jnp.asarray(indices)
    size = check_coo_arguments(values, indices, size, nan_policy, op)
    comm = _comm.resolve_comm(comm)
    algo = resolve_algorithm(algorithm, nranks=comm.Get_size(), size=size, k=values.shape[0])
    check_quantization(quantize_bits, qsgd_bucket, algo, op)
    operands = (values.astype(jnp.float32), indices, jnp.asarray(seed, jnp.int32).reshape(()))
    params = dict(size=size, algorithm=_ext.ALGORITHM_IDS[algo], comm=int(comm.py2f()),
                  nan_policy=NAN_POLICIES[nan_policy], quantize_bits=int(quantize_bits),
                  qsgd_bucket=int(qsgd_bucket))
    return operands, params


def sparse_allreduce(values: jax.Array, indices: jax.Array, *, size: int,
                     algorithm: str = "auto", comm=None, nan_policy: str = "raise",
                     quantize_bits: int = 0, qsgd_bucket: int = 1024,
                     seed: int | jax.Array = 0, return_stats: bool = False):
    """Sums sparse vectors over all ranks of an MPI communicator.

    Each rank passes a fixed-capacity COO vector: ``values[cap]`` and int32
    ``indices[cap]`` into a dense vector of length ``size``. Slots with index
    ``-1`` are padding and ignored; duplicate indices on one rank are summed.
    Every rank receives the dense sum, bitwise identical on all ranks.

    Args:
      values: float32, bfloat16 or float16, shape ``(cap,)``. Summed in float32.
      indices: int32, shape ``(cap,)``, each in ``[0, size)`` or ``-1``.
      size: dense dimension N; must be equal on every rank.
      algorithm: ``"allgather"`` (TopkA), ``"recursive_doubling"`` (SparCML
        SSAR_Recursive_double), ``"split_allgather"`` (SSAR_Split_allgather),
        ``"dsar_split_allgather"`` (DSAR_Split_allgather: dense second phase),
        ``"dense"`` (MPI_Allreduce baseline), or ``"auto"`` (cheapest by the
        alpha-beta cost model).
      comm: mpi4py communicator; ``None`` is the library's clone of COMM_WORLD;
        ``jss.axis(name)`` inside shard_map/pmap: JAX collectives over that
        mesh axis, each device a rank (see :mod:`jax_sparse_sync.axis`).
      nan_policy: ``"raise"`` (every rank raises if any rank sends a NaN/Inf)
        or ``"propagate"`` (non-finite values are summed like any value).
      quantize_bits: with ``"dsar_split_allgather"`` only: send the dense
        phase as QSGD codes of 2, 4 or 8 bits (0 = float32). Lossy but
        unbiased; every rank still gets the same result.
      qsgd_bucket: entries per QSGD scale.
      seed: int or int32 scalar (may be traced, e.g. the step count) for
        QSGD's stochastic rounding; pass a new one each step.
      return_stats: also return this rank's :class:`SyncStats` (bytes sent
        and received, messages, result nnz, whether the stream went dense).

    Returns:
      The dense sum, shape ``(size,)``, float32 for float32 input and
      ``values.dtype`` otherwise; with ``return_stats``, ``(sum, stats)``.

    Raises:
      TypeError / ValueError at trace time for bad dtypes, shapes or options;
      an ``XlaRuntimeError`` naming the argument and the rank when ranks
      disagree on ``size`` or an index is out of range (on every rank, no hang).

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> out = jss.sparse_allreduce(jnp.array([1.0, 2.0]), jnp.array([3, 0], jnp.int32),
      ...                            size=4, algorithm="allgather")
      >>> out.tolist()  # one rank: the sum is the densified input
      [2.0, 0.0, 0.0, 1.0]
    """
    values = jnp.asarray(values)
    if isinstance(comm, AxisComm):  # JAX collectives over a mesh axis: jax_sparse_sync/axis.py
        out, stats = axis_sparse_allreduce(
            values, indices, size=size, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
            quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, seed=seed,
            op="sparse_allreduce")
    else:
        operands, params = call_arguments(
            values, indices, size=size, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
            quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, seed=seed, op="sparse_allreduce")
        out, stats = sparse_allreduce_p.bind(*operands, **params)
    if values.dtype != jnp.float32:
        out = out.astype(values.dtype)
    if return_stats == "vector":  # internal: the raw stats vector, for Optax states
        return out, stats
    if return_stats:
        return out, SyncStats.from_vector(stats)
    return out
