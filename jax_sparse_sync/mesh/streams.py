"""Sorted unique COO streams: sort, merge, deduplicate, densify, exchange.

A stream is ``(keys int32[c], vals float32[c])`` sorted by key, each key once,
entries packed at the front and padding key :data:`~jax_sparse_sync.mesh.common.SENT`
after the last one, as the C++ handlers' streams.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.mesh.common import SENT, f2i, pack_entries, unpack_entries

__all__ = ["dedup_sorted", "sort_stream", "merge_streams", "canonical_stream", "densify",
           "exchange_slices", "exchange_slice_entries"]


def dedup_sorted(keys, vals):
    """Sorted keys (padding ``SENT`` last, equal keys adjacent) -> unique sorted
    keys packed at the front, values of equal keys summed in input order (the
    first is taken as is: ``a``, ``a + b``, ``(a + b) + c``, as the C++ streams do)."""
    n = keys.shape[0]
    real = keys != SENT
    prev_same = jnp.concatenate([jnp.zeros((1,), bool), keys[1:] == keys[:-1]])
    first = real & ~prev_same
    seg = jnp.cumsum(first.astype(jnp.int32)) - 1
    at_first = jnp.where(first, seg, n)
    out_k = jnp.full((n,), SENT, jnp.int32).at[at_first].set(keys, mode="drop",
                                                               unique_indices=True)
    out_v = jnp.zeros((n,), jnp.float32).at[at_first].set(vals, mode="drop", unique_indices=True)
    dup = real & prev_same
    out_v = out_v.at[jnp.where(dup, seg, n)].add(vals, mode="drop")
    return out_k, out_v


def sort_stream(keys, vals):
    return jax.lax.sort((keys, vals), num_keys=1, is_stable=True)


def merge_streams(lower, upper):
    """Sorted unique streams -> their sum as one sorted unique stream (lower + upper).

    A merge by rank, not a sort: an entry's place is its index plus the number
    of the other stream's entries before it; an index present in both lands
    lower first, upper right after, and is summed ``lower + upper``.
    """
    (ak, av), (bk, bv) = lower, upper
    at_a = jnp.arange(ak.shape[0], dtype=jnp.int32) + jnp.searchsorted(bk, ak, side="left")
    at_b = jnp.arange(bk.shape[0], dtype=jnp.int32) + jnp.searchsorted(ak, bk, side="right")
    size = ak.shape[0] + bk.shape[0]
    keys = jnp.zeros((size,), jnp.int32).at[at_a].set(ak, unique_indices=True).at[at_b].set(
        bk, unique_indices=True)
    vals = jnp.zeros((size,), jnp.float32).at[at_a].set(av, unique_indices=True).at[at_b].set(
        bv, unique_indices=True)
    return dedup_sorted(keys, vals)


def canonical_stream(keys, vals):
    """COO with padding ``SENT`` -> sorted unique stream; skips the sort when the
    input is one already (``jss.topk``'s output is)."""
    ordered = jnp.all((keys[1:] > keys[:-1]) | (keys[1:] == SENT))
    return jax.lax.cond(ordered, lambda: (keys, vals), lambda: dedup_sorted(*sort_stream(keys, vals)))


def densify(keys, vals, n):
    return jnp.zeros((n,), jnp.float32).at[jnp.where(keys == SENT, n, keys)].set(
        vals, mode="drop", unique_indices=True)


def exchange_slices(keys, vals, starts, width: int, name):
    """all_to_all of sorted COO slices: owner q gets ``keys[starts[q]:starts[q+1]]``
    and their values (as int32 bits), at most ``width`` of them, padded with
    (-1, 0). Returns what every sender sent here, ``[P senders, 2, width]``."""
    cap = keys.shape[0]
    pos = starts[:-1, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
    ok = pos < starts[1:, None]
    safe = jnp.clip(pos, 0, cap - 1)
    send = jnp.stack([jnp.where(ok, keys[safe], -1), jnp.where(ok, f2i(vals[safe]), 0)],
                     axis=1)  # [P owners, 2, width]
    return jax.lax.all_to_all(send, name, 0, 0)


def exchange_slice_entries(keys, vals, starts, width: int, name, wire: int = 0):
    """:func:`exchange_slices` in the wire format of :func:`~jax_sparse_sync.mesh.common.pack_entries`
    (``wire``: 0 float32 values, 1 bfloat16, 2 float16): owner q gets
    ``keys[starts[q]:starts[q+1]]`` and their values, at most ``width``, padded with
    (-1, 0). Returns ``(keys [P senders, width], vals float32 [P senders, width])``;
    ``4 * wire_words(width, wire)`` bytes go to each other device."""
    cap = keys.shape[0]
    pos = starts[:-1, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
    ok = pos < starts[1:, None]
    safe = jnp.clip(pos, 0, cap - 1)
    send = pack_entries(jnp.where(ok, keys[safe], -1), jnp.where(ok, vals[safe], 0.0), wire)
    return unpack_entries(jax.lax.all_to_all(send, name, 0, 0), width, wire)
