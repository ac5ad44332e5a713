"""``jss.sparse_allreduce``: the sum of sparse vectors over the ranks of a communicator.

The MPI transport (:mod:`jax_sparse_sync.mpi.sparse_allreduce`) or the
mesh-axis transport (:mod:`jax_sparse_sync.mesh.sparse_allreduce`), as
``comm`` selects (:mod:`jax_sparse_sync.ops.transport`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.ops import transport
from jax_sparse_sync.stats import SyncStats

__all__ = ["sparse_allreduce"]


def sparse_allreduce(values: jax.Array, indices: jax.Array, *, size: int,
                     algorithm: str = "auto", comm=None, nan_policy: str = "raise",
                     quantize_bits: int = 0, qsgd_bucket: int = 1024,
                     seed: int | jax.Array = 0, wire_dtype=None, index_encoding: str = "int32",
                     return_stats: bool = False):
    """Sums sparse vectors over all ranks of an MPI communicator.

    Each rank passes a fixed-capacity COO vector: ``values[cap]`` and int32
    ``indices[cap]`` into a dense vector of length ``size``. Slots with index
    ``-1`` are padding and ignored; duplicate indices on one rank are summed.
    Every rank receives the dense sum, bitwise identical on all ranks.

    Host memory: on the CPU, ``import jax_sparse_sync`` has already tuned glibc's
    allocator so that the ``size``-float output (and a step's other big buffers) is
    reused instead of page-faulted anew each call (2-4x the call's time otherwise);
    there is nothing to call. ``JSS_TUNE_HOST_ALLOCATOR=0`` in the environment opts out
    (``jss.mpi.tune_host_allocator()``, docs/performance.md).

    Args:
      values: float32, bfloat16 or float16, shape ``(cap,)``. Summed in float32.
      indices: int32, shape ``(cap,)``, each in ``[0, size)`` or ``-1``.
      size: dense dimension N; must be equal on every rank.
      algorithm: ``"allgather"`` (TopkA), ``"recursive_doubling"`` (SparCML
        SSAR_Recursive_double), ``"split_allgather"`` (SSAR_Split_allgather),
        ``"dsar_split_allgather"`` (DSAR_Split_allgather: dense second phase),
        ``"hash_partition"`` (ZEN: each index reduced at the rank a fixed hash
        of it names, then a sparse allgather; balanced on skewed supports),
        ``"dense"`` (MPI_Allreduce baseline), or ``"auto"`` (cheapest by the
        alpha-beta cost model).
      comm: mpi4py communicator; ``None`` is the library's clone of COMM_WORLD;
        ``jss.axis(name)`` inside shard_map/pmap: JAX collectives over that
        mesh axis, each device a rank (see :mod:`jax_sparse_sync.mesh.sparse_allreduce`).
      nan_policy: ``"raise"`` (every rank raises if any rank sends a NaN/Inf)
        or ``"propagate"`` (non-finite values are summed like any value).
      quantize_bits: with ``"dsar_split_allgather"`` only: send the dense
        phase as QSGD codes of 2, 4 or 8 bits (0 = float32). Lossy but
        unbiased; every rank still gets the same result.
      qsgd_bucket: entries per QSGD scale.
      seed: int or int32 scalar (may be traced, e.g. the step count) for
        QSGD's stochastic rounding; pass a new one each step.
      wire_dtype: ``None`` (float32 values), ``jnp.bfloat16`` or ``jnp.float16``:
        every value on the wire takes 2 bytes. Each rank rounds what it sends to
        the wire dtype (nearest even) and keeps the rounded value for its own
        part of the sum; receivers widen to float32 and sum in float32, in the
        algorithm's usual order. Where a partial sum travels on (recursive
        doubling's rounds, the split algorithms' and hash partition's owners,
        ``dense``'s reduce-scatter) it is rounded again before it is sent, so
        the result holds each entry with at most ``ceil(log2 P) + 1`` roundings
        (``allgather``: one, then a float32 sum) and is bitwise identical on
        every rank. Value bytes are exactly halved; indices and counts unchanged.
        Not with ``quantize_bits``. See docs/topics/wire_formats.md.
      index_encoding: ``"int32"`` (default: every index as 4 bytes) or
        ``"auto"`` (MPI only): each sparse message's indices as the smallest of
        a list, bit-packed gaps and a bitmap
        (:mod:`jax_sparse_sync.ops.index_encoding`'s format, header included),
        in ``allgather``, ``split_allgather`` (both phases),
        ``dsar_split_allgather`` (phase 1), ``hash_partition`` (both phases) and
        ``recursive_doubling``; ``dense`` sends no indices. Costs an extra
        allgather of 8-byte message sizes in ``allgather``.
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
    comm = transport.resolve_comm(comm)
    out, stats = transport.implementation("sparse_allreduce", comm)(
        values, indices, size=size, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
        quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, seed=seed, op="sparse_allreduce",
        wire_dtype=wire_dtype, index_encoding=index_encoding)
    if values.dtype != jnp.float32:
        out = out.astype(values.dtype)
    if return_stats == "vector":  # internal: the raw stats vector, for Optax states
        return out, stats
    if return_stats:
        return out, SyncStats.from_vector(stats)
    return out
