"""``split_allgather`` and ``dsar_split_allgather`` (SparCML) on the axis transport.

Phase 1 (both): one ``all_to_all`` sends each owner its slice of the index
space; the owner sums its range in rank order. Phase 2: ``split_allgather``
gathers the owners' merged ranges sparse (dense past half a range), DSAR
gathers them dense, optionally as QSGD codes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.base.jax_compat import varying_like
from jax_sparse_sync.mesh.common import (WIRE16, log2_ceil, pack_entries, uniform_max,
                                         unpack_entries, vary, wire_words)
from jax_sparse_sync.mesh.ladder import capacity_ladder, ladder_index
from jax_sparse_sync.mesh.streams import exchange_slice_entries
from jax_sparse_sync.bindings.compression import qsgd_dequantize, qsgd_quantize

__all__ = ["split_allgather_sum", "dsar_sum"]


def gather_ranges(acc, name, wire):
    """all_gather of every owner's dense range, float32 or rounded to the 16-bit wire
    dtype (every device, the owner included, widens the same bits)."""
    if wire == 0:
        return jax.lax.all_gather(acc, name, to="invarying")
    rows = jax.lax.all_gather(acc.astype(WIRE16[wire]), name, to="invarying")
    return rows.astype(jnp.float32)


def split_phase1(keys, vals, n, name, p, rank, max_slice, ctr, wire=0):
    """Owner q receives every rank's entries in [bounds[q], bounds[q+1]) (one all_to_all,
    slices of a capacity that fits the largest slice anywhere) and sums them into its
    dense range in rank order. Returns (acc[lmax], present[lmax], bounds)."""
    cap = keys.shape[0]
    bounds = [n * q // p for q in range(p + 1)]
    lmax = max(bounds[q + 1] - bounds[q] for q in range(p))
    starts = jnp.searchsorted(keys, jnp.asarray(bounds, jnp.int32), side="left").astype(jnp.int32)
    lo = jnp.asarray(bounds, jnp.int32)[rank]
    buckets = capacity_ladder(cap, -(-cap // p))

    def exchange(width):
        gk, gv = exchange_slice_entries(keys, vals, starts, width, name, wire)

        def add_sender(s, carry):  # rank order; a sender's indices are unique
            acc, present = carry
            at = jnp.where(gk[s] < 0, lmax, gk[s] - lo)
            return (acc.at[at].add(gv[s], mode="drop", unique_indices=True),
                    present.at[at].set(True, mode="drop", unique_indices=True))

        # varying over the axis, and over every other axis the entries vary over (a
        # shard_map over two axes: the parameters sharded over the other, FSDP-style)
        init = (varying_like(vary(jnp.zeros((lmax,), jnp.float32), name), gv),
                varying_like(vary(jnp.zeros((lmax,), bool), name), gv))
        return jax.lax.fori_loop(0, p, add_sender, init)

    index = ladder_index(max_slice, buckets)
    acc, present = jax.lax.switch(index, [functools.partial(exchange, w) for w in buckets])
    ctr.collective(ctr.table([4 * wire_words(w, wire) * (p - 1) for w in buckets], index), p - 1)
    return acc, present, bounds


def assemble(rows, bounds):
    """[P, lmax] owner ranges -> the dense vector."""
    p = rows.shape[0]
    n = bounds[-1]
    if n % p == 0:
        return rows.reshape(n)
    return jnp.concatenate([rows[q, :bounds[q + 1] - bounds[q]] for q in range(p)])


def split_allgather_sum(keys, vals, n, name, p, rank, max_slice, ctr, wire=0):
    acc, present, bounds = split_phase1(keys, vals, n, name, p, rank, max_slice, ctr, wire)
    cap = keys.shape[0]
    lmax = acc.shape[0]
    lo = jnp.asarray(bounds, jnp.int32)[rank]
    lg = log2_ceil(p)
    # The owners' merged counts (MPI: block descriptors), then every owner's range:
    # sparse, in blocks that fit the largest; dense past lmax/2 (where dense is smaller;
    # lmax/3 with 16-bit values: 6 bytes an entry against 2 a position).
    need = uniform_max(jnp.sum(present), name)
    ctr.collective(4 * (p - 1), lg)
    value_bytes = 4 if wire == 0 else 2
    hi = min(p * cap, lmax * value_bytes // (4 + value_bytes))
    buckets = capacity_ladder(hi, -(-cap // p)) if hi >= 1 else []

    # this owner's merged range, compacted once (entries first, then padding)
    width_max = max(buckets) if buckets else 1
    slot = jnp.where(present, jnp.cumsum(present.astype(jnp.int32)) - 1, width_max)
    mk = jnp.full((width_max,), -1, jnp.int32).at[slot].set(
        jnp.arange(lmax, dtype=jnp.int32) + lo, mode="drop", unique_indices=True)
    mv = jnp.zeros((width_max,), jnp.float32).at[slot].set(acc, mode="drop", unique_indices=True)

    def sparse(width):
        rows = jax.lax.all_gather(pack_entries(mk[:width], mv[:width], wire), name,
                                  to="invarying")  # [P, wire_words(width)]
        ks, vs = unpack_entries(rows, width, wire)
        ks, vs = ks.reshape(-1), vs.reshape(-1)
        return jnp.zeros((n,), jnp.float32).at[jnp.where(ks < 0, n, ks)].set(
            vs, mode="drop", unique_indices=True)

    def dense_branch():
        return assemble(gather_ranges(acc, name, wire), bounds)

    index = jnp.where(need > hi, len(buckets), ladder_index(need, buckets)) if buckets \
        else jnp.int32(0)
    out = jax.lax.switch(index, [functools.partial(sparse, w) for w in buckets] + [dense_branch])
    ctr.collective(ctr.table([4 * wire_words(w, wire) * (p - 1) for w in buckets]
                             + [value_bytes * lmax * (p - 1)], index), lg)
    return out, index == len(buckets)


def dsar_sum(keys, vals, n, name, p, rank, max_slice, ctr, *, quantize_bits, qsgd_bucket, seed,
             wire=0):
    acc, _, bounds = split_phase1(keys, vals, n, name, p, rank, max_slice, ctr, wire)
    lmax = acc.shape[0]
    lg = log2_ceil(p)
    if not quantize_bits:
        rows = gather_ranges(acc, name, wire)
        ctr.collective((4 if wire == 0 else 2) * lmax * (p - 1), lg)
        return assemble(rows, bounds), 1
    # Each owner quantizes its range once, with the step's seed mixed with its rank;
    # every device dequantizes the same bytes.
    mixed = (jnp.asarray(seed, jnp.int32).astype(jnp.uint32) * np.uint32(0x9E3779B1)
             + (rank.astype(jnp.uint32) + np.uint32(1)) * np.uint32(0x85EBCA6B))
    packed, scales = qsgd_quantize(acc, bits=quantize_bits, bucket=qsgd_bucket,
                                   seed=jax.lax.bitcast_convert_type(mixed, jnp.int32))
    all_packed = jax.lax.all_gather(packed, name, to="invarying")
    all_scales = jax.lax.all_gather(scales, name, to="invarying")
    rows = jax.vmap(lambda a, b: qsgd_dequantize(a, b, size=lmax, bits=quantize_bits,
                                                 bucket=qsgd_bucket))(all_packed, all_scales)
    ctr.collective((packed.shape[0] + 4 * scales.shape[0]) * (p - 1), 2 * lg)
    return assemble(rows, bounds), 1
