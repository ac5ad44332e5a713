"""``hash_partition`` (ZEN, OSDI '25) on the axis transport.

Index ``i`` belongs to device :func:`hash_owner` ``(i, P)``: a fixed,
data-independent hash (murmur3's 32-bit finalizer, mod P), the same bits as
``hash_owner`` in ``ffi/collectives/algorithms.h``. Split-allgather's contiguous ranges
put a concentrated support (an embedding table's rows) on one owner; the hash
spreads any support evenly.

Phase 1: one ``all_to_all`` sends each owner the entries it owns (a capacity
ladder fits the largest slice anywhere, which the header carries); the owner
merges the P slices in rank order (a stable sort of their concatenation, then
``a, a + b, (a + b) + c``, as the C++ ``merge_sparse`` does). Phase 2: an
``all_gather`` of the owners' merged counts, then of their merged streams
(sparse always: an owner's indices are scattered, so there is no contiguous
range to send dense).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.mesh.common import (SENT, log2_ceil, pack_entries, uniform_max,
                                         unpack_entries, wire_words)
from jax_sparse_sync.mesh.ladder import capacity_ladder, ladder_index
from jax_sparse_sync.mesh.streams import dedup_sorted, exchange_slice_entries, sort_stream

__all__ = ["hash_owner", "hash_owner_np", "owner_sorted", "hash_partition_sum"]

_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35


def hash_owner(indices, nranks: int):
    """Owner device of each int32 index (jnp): murmur3 fmix32(index) mod ``nranks``."""
    h = jnp.asarray(indices).astype(jnp.uint32)
    h = h ^ (h >> 16)
    h = h * np.uint32(_M1)
    h = h ^ (h >> 13)
    h = h * np.uint32(_M2)
    h = h ^ (h >> 16)
    return (h % np.uint32(nranks)).astype(jnp.int32)


def hash_owner_np(indices, nranks: int) -> np.ndarray:
    """:func:`hash_owner` in NumPy (benchmarks, host-side planning)."""
    h = np.asarray(indices).astype(np.uint32)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint32(16)
        h *= np.uint32(_M1)
        h ^= h >> np.uint32(13)
        h *= np.uint32(_M2)
        h ^= h >> np.uint32(16)
    return (h % np.uint32(nranks)).astype(np.int32)


def owner_sorted(keys, vals, p):
    """A sorted unique stream -> (keys, vals) grouped by owner (each group still sorted)
    and ``starts[P+1]``; padding (``SENT``) last."""
    owner = jnp.where(keys == SENT, p, hash_owner(keys, p))
    owner, keys, vals = jax.lax.sort((owner, keys, vals), num_keys=1, is_stable=True)
    starts = jnp.searchsorted(owner, jnp.arange(p + 1, dtype=jnp.int32), side="left")
    return keys, vals, starts.astype(jnp.int32)


def hash_partition_sum(keys, vals, n, name, p, max_slice, ctr, wire=0):
    """keys/vals: this device's sorted unique stream; ``max_slice``: the largest
    per-owner slice on any device (uniform). Returns (dense sum, switched_to_dense=0)."""
    cap = keys.shape[0]
    lg = log2_ceil(p)
    keys, vals, starts = owner_sorted(keys, vals, p)
    # Phase-2 bound: an owner's merged stream holds at most P * cap entries, and at most n.
    hi = min(p * cap, n)

    def phase1(width):
        gk, gv = exchange_slice_entries(keys, vals, starts, width, name, wire)  # [P, width]
        ks, vs = gk.reshape(-1), gv.reshape(-1)  # rank order, each sender's slice sorted
        mk, mv = dedup_sorted(*sort_stream(jnp.where(ks < 0, SENT, ks), vs))
        if mk.shape[0] < hi:  # pad (entries are packed at the front; count <= hi)
            mk = jnp.concatenate([mk, jnp.full((hi - mk.shape[0],), SENT, jnp.int32)])
            mv = jnp.concatenate([mv, jnp.zeros((hi - mv.shape[0],), jnp.float32)])
        return mk[:hi], mv[:hi]

    buckets1 = capacity_ladder(cap, -(-cap // p))
    index1 = ladder_index(max_slice, buckets1)
    mk, mv = jax.lax.switch(index1, [functools.partial(phase1, w) for w in buckets1])
    ctr.collective(ctr.table([4 * wire_words(w, wire) * (p - 1) for w in buckets1], index1), p - 1)

    need = uniform_max(jnp.sum(mk != SENT), name)
    ctr.collective(4 * (p - 1), lg)
    buckets2 = capacity_ladder(hi, -(-cap // p))

    def gather(width):
        rows = jax.lax.all_gather(pack_entries(jnp.where(mk[:width] == SENT, -1, mk[:width]),
                                               mv[:width], wire), name, to="invarying")
        ks, vs = unpack_entries(rows, width, wire)
        ks, vs = ks.reshape(-1), vs.reshape(-1)
        return jnp.zeros((n,), jnp.float32).at[jnp.where(ks < 0, n, ks)].set(
            vs, mode="drop", unique_indices=True)  # owners' indices are disjoint

    index2 = ladder_index(need, buckets2)
    out = jax.lax.switch(index2, [functools.partial(gather, w) for w in buckets2])
    ctr.collective(ctr.table([4 * wire_words(w, wire) * (p - 1) for w in buckets2], index2), lg)
    return out, 0
