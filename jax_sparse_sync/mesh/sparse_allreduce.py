"""The JAX-collective transport: the sparse allreduce over a named mesh axis.

``comm=jss.axis("data")`` runs the same algorithms as the MPI transport, but
with JAX's own collectives over the mesh axis ``"data"`` of an enclosing
``jax.shard_map`` (or ``jax.pmap(..., axis_name="data")``): XLA's in-process
collectives on CPU devices, NCCL on GPUs, across hosts with
``jax.distributed``. Each device is a rank. Outside a mapped context the MPI
communicator stays the default. Selection (``jss.topk``) and QSGD are the
same FFI calls as on MPI.

=====================  ==================================================================
algorithm              collectives of one call
=====================  ==================================================================
(every call)           ``all_gather`` of the argument-check header (as many bytes as MPI's)
dense                  ``psum`` of the densified vector
allgather (TopkA)      ``all_gather`` of the (index, value) slots, summed in rank order
recursive_doubling     per round a ``ppermute`` with partner ``rank ^ mask``, preceded (while
                       the streams are sparse) by an ``all_gather`` of their counts; P not a
                       power of two: one ``ppermute`` folds ranks p2..P-1 into 0..P-p2-1
                       first, one more hands them the result
split_allgather        ``all_to_all`` of the per-owner slices; ``all_gather`` of the owners'
                       merged counts; ``all_gather`` of the owners' sparse (or dense) ranges
dsar_split_allgather   ``all_to_all`` as above; ``all_gather`` of the owners' dense ranges
                       (QSGD codes and scales with ``quantize_bits``)
hash_partition         ``all_to_all`` of the per-owner slices, owner = a fixed hash of the
                       index (ZEN); ``all_gather`` of the owners' merged counts;
                       ``all_gather`` of the owners' merged streams (always sparse)
=====================  ==================================================================

Ok-Topk (``jss.oktopk_allreduce`` / ``oktopk_sync``) and the block-sparse
allreduce (``jss.block_allreduce`` / ``block_sync``) run on this transport too,
with the same header check and ladders: see :mod:`jax_sparse_sync.mesh.oktopk`
and :mod:`jax_sparse_sync.mesh.block`.

Static shapes. XLA needs every exchanged buffer's shape at compile time, but
how many entries travel depends on the data (how much the devices' indices
overlap). Each exchange therefore has a ladder of static capacities, from
the algorithm's bound halving down (``capacity_ladder``), and one ``lax.switch``
branch per capacity; the counts that decide it are known to every device
before the exchange (the header carries each device's nnz and largest
per-owner slice; recursive doubling and phase 2 of split_allgather gather the
counts first, as MPI sends its counts first), so all devices take the same
branch and the smallest capacity that holds everything: nothing is ever
dropped, and at most 2x the entries' bytes travel (padding included in the
counts). The bounds and fallbacks:

* ``allgather``: capacity at most ``cap`` (the input's), so it always fits.
* ``recursive_doubling``: a stream that merged 2^r streams has at most
  ``min(2^r * cap, N)`` entries, the size of the buffer that holds it. When
  the largest stream about to travel passes delta = N/2, every device sends
  dense vectors from then on (4N bytes instead of more than 8 * N/2), as the
  MPI code switches a stream to dense (there per pair, here for all).
* ``split_allgather`` / ``dsar_split_allgather``, phase 1: a slice is at most
  ``cap`` entries, so the largest capacity always fits.
* ``split_allgather``, phase 2: a merged range is at most
  ``min(P * cap, len)``; past ``Lmax // 2`` entries every owner sends its
  range dense (``switched_to_dense = 1``), like MPI's "a range past len/2
  travels dense".

Results are bitwise identical on every device: TopkA sums the gathered slots
in rank order (one scatter per rank, unique indices, so no atomics decide
the order on GPUs); recursive-doubling partners both compute
``merge(lower group, upper group)`` and folded ranks receive a copy; in the
split algorithms only the owner sums its range, in rank order, and everyone
receives its bits. For the same inputs the results equal the MPI transport's
bit for bit, except ``dense`` (XLA's and MPI's reduction orders may differ),
QSGD (the seeds are mixed differently: same error bound, other rounding), and
the sign of zero sums.

Statistics (``return_stats``): the six fields of
:data:`jax_sparse_sync.stats.STATS_FIELDS`, counted from the static shapes actually
exchanged, with the conventions of :mod:`jax_sparse_sync.stats`: a
collective counts as its bandwidth-optimal schedule (an ``all_gather`` of B
bytes sends B to each of P-1 peers, ``psum`` of N floats 2 (P-1)/P * 4N, an
``all_to_all`` of blocks of B bytes sends B to each of P-1 peers in P-1
messages), a ``ppermute`` counts its block once per sending device, and the
argument check (``cost_model.HEADER_BYTES`` to each of P-1 peers) is
included. What differs from the MPI counts: padding up to the chosen
capacity travels and is counted (up to twice the entries' bytes, which can
take the split algorithms' phase 1 past ``cost_model.wire_volume``'s upper
bound; with ``jss.topk`` inputs ``allgather`` still equals it exactly, as does
``dense``); counts travel as 4-byte int32 in an ``all_gather`` to every device
(MPI: 8-byte counts to the partner; the split algorithms need no separate
slice-size exchange, the header carries it); recursive doubling's dense
switch is decided for all devices at once, and dense streams need no counts;
dense ranges are ``Lmax = ceil(N/P)`` floats long.

Under ``shard_map(..., check_vma=True)`` the results of ``dense``,
``allgather`` and the split algorithms are typed invariant over the axis (they
come from ``psum`` / invariant ``all_gather``), so ``out_specs=P()`` accepts
them; recursive doubling ends in ``ppermute``, so JAX types its (identical)
result as varying: use ``check_vma=False`` with it, or ``out_specs=P(axis)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.allgather import allgather_sum
from jax_sparse_sync.mesh.checks import checked_headers, local_checks, one_slot_if_empty
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.mesh.common import HEADER_BYTES, SENT, Counters, log2_ceil, round_to_wire, vary
from jax_sparse_sync.mesh.dense import dense_sum, sum_on_16bit_wire
from jax_sparse_sync.mesh.hash_partition import hash_owner, hash_partition_sum
from jax_sparse_sync.mesh.recursive_doubling import recursive_doubling_sum
from jax_sparse_sync.mesh.split_allgather import dsar_sum, split_allgather_sum
from jax_sparse_sync.mesh.streams import canonical_stream
from jax_sparse_sync.base.arguments import check_coo_arguments, check_quantization, wire_word
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["AXIS_ALGORITHMS", "resolve_axis_algorithm", "axis_sparse_allreduce"]

#: Algorithms the axis transport implements (``"auto"`` picks among these).
AXIS_ALGORITHMS = ("allgather", "recursive_doubling", "split_allgather", "dsar_split_allgather",
                   "dense", "hash_partition")


def resolve_axis_algorithm(algorithm: str, *, nranks: int, size: int, k: int) -> str:
    """Checks ``algorithm``; ``"auto"`` -> the cheapest of :data:`AXIS_ALGORITHMS` by the
    cost model (worst case, which is what static shapes send)."""
    if algorithm == "auto":
        return min(AXIS_ALGORITHMS, key=lambda a: cost_model.predict_time(
            a, nranks=nranks, size=size, k=k))
    algorithm = resolve_algorithm(algorithm, nranks=nranks, size=size, k=k)
    if algorithm not in AXIS_ALGORITHMS:
        raise NotImplementedError(
            f"jax_sparse_sync: algorithm {algorithm!r} has no JAX-collective (mesh axis) "
            f"implementation yet; choose one of {AXIS_ALGORITHMS} or 'auto', or use MPI "
            "(comm=None) outside shard_map/pmap.")
    return algorithm


def axis_sparse_allreduce(values, indices, *, size: int, algorithm: str, comm: AxisComm,
                          nan_policy: str = "raise", quantize_bits: int = 0,
                          qsgd_bucket: int = 1024, seed=0, op: str = "sparse_allreduce",
                          wire_dtype=None, index_encoding: str = "int32"):
    """The sparse allreduce over ``comm``'s mesh axis: ``(sum f32[size], stats vector)``.

    Same arguments and semantics as :func:`jax_sparse_sync.sparse_allreduce`
    (which calls this for ``comm=jss.axis(...)``); the stats vector has the
    layout of :data:`jax_sparse_sync.stats.STATS_FIELDS`. Errors found at run time
    (out-of-range indices, NaN with ``nan_policy="raise"``) are detected on
    all devices at once from the gathered headers, and every device raises the
    MPI transport's message (as a ``JaxRuntimeError`` from a host callback),
    so no device is left waiting in a collective.

    ``wire_dtype`` (bfloat16 / float16): the values travel as 16 bits, two to
    an int32 word beside the int32 indices (6 bytes an entry), rounded at the
    points where the MPI transport rounds them. ``index_encoding`` must be
    ``"int32"`` here: every exchange has a static shape, so a message cannot
    shrink to its encoding (use MPI for ``"auto"``).
    """
    values = jnp.asarray(values)
    indices = jnp.asarray(indices)
    size = check_coo_arguments(values, indices, size, nan_policy, op)
    p = comm.size(op)
    algo = resolve_axis_algorithm(algorithm, nranks=p, size=size, k=values.shape[0])
    check_quantization(quantize_bits, qsgd_bucket, algo, op)
    wire = wire_word(wire_dtype, index_encoding, op) & 0xF  # both checked
    if index_encoding != "int32":
        raise ValueError(
            f"jax_sparse_sync.{op}: index_encoding={index_encoding!r} runs on MPI only; on a "
            "mesh axis (comm=jss.axis(...)) every exchange has a static shape, so pass "
            "index_encoding='int32'")
    if wire and quantize_bits:
        raise ValueError(f"jax_sparse_sync.{op}: `quantize_bits` (QSGD codes for DSAR's dense "
                         "phase) and `wire_dtype` cannot be combined; choose one")
    n, name = size, comm.name

    values, indices = one_slot_if_empty(values.astype(jnp.float32), indices)
    cap = values.shape[0]
    rank = jax.lax.axis_index(name)

    # Local checks; the header carries them (and what must agree) to every device.
    valid, first_bad, flags = local_checks(values, indices, n, nan_policy)

    keys = jnp.where(valid, indices, SENT)
    vals = jnp.where(valid, values, 0.0)
    nnz = max_slice = jnp.int32(0)
    if algo != "dense":
        keys, vals = canonical_stream(keys, vals)  # drops padding, sums duplicates, sorts
        vals = round_to_wire(vals, wire)  # what this device sends, and keeps for its own part
        nnz = jnp.sum(keys != SENT).astype(jnp.int32)
        if algo in ("split_allgather", "dsar_split_allgather"):
            bounds = jnp.asarray([n * q // p for q in range(p + 1)], jnp.int32)
            starts = jnp.searchsorted(keys, bounds, side="left")
            max_slice = (starts[1:] - starts[:-1]).max().astype(jnp.int32)
        elif algo == "hash_partition":
            owners = jnp.where(keys == SENT, p, hash_owner(keys, p))
            max_slice = jnp.bincount(owners, length=p + 1)[:p].max().astype(jnp.int32)
    word = _ext.ALGORITHM_IDS[algo] | (int(quantize_bits) << 16) | (wire << 24)
    headers, zero = checked_headers(
        name, flags=flags, first_bad=first_bad, bad_index=indices[first_bad], size=n, word=word,
        cap=cap, slots=(max_slice, nnz), op=op)
    ctr = Counters()
    ctr.collective(HEADER_BYTES * (p - 1), log2_ceil(p))
    keys, vals = vary(keys + zero, name), vary(vals, name)
    if algo == "dense" and wire:
        dense = jnp.zeros((n,), jnp.float32).at[jnp.where(keys == SENT, n, keys)].add(
            vals, mode="drop")
        out, block = sum_on_16bit_wire(dense, name, p, (None, jnp.bfloat16, jnp.float16)[wire])
        ctr.collective(2 * (p - 1) * block * 2, (p - 1) + log2_ceil(p))
        switched = 0
    elif algo == "dense":
        out, switched = dense_sum(vals, jnp.where(keys == SENT, -1, keys), n, name, p, ctr)
    elif algo == "allgather":
        out, switched = allgather_sum(keys, vals, n, name, p, headers[:, 7].max(), ctr, wire)
    elif algo == "recursive_doubling":
        out, switched = recursive_doubling_sum(keys, vals, n, name, p, rank, ctr, wire)
    elif algo == "split_allgather":
        out, switched = split_allgather_sum(keys, vals, n, name, p, rank, headers[:, 6].max(), ctr,
                                            wire)
    elif algo == "hash_partition":
        out, switched = hash_partition_sum(keys, vals, n, name, p, headers[:, 6].max(), ctr, wire)
    else:
        out, switched = dsar_sum(keys, vals, n, name, p, rank, headers[:, 6].max(), ctr,
                                 quantize_bits=int(quantize_bits), qsgd_bucket=int(qsgd_bucket),
                                 seed=seed, wire=wire)
    dt = ctr.dt
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, jnp.count_nonzero(out).astype(dt),
                       jnp.asarray(switched).astype(dt), ctr.value(_ext.ALGORITHM_IDS[algo])])
    assert stats.shape == (len(STATS_FIELDS),)
    return out, stats
