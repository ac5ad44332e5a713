"""Ok-Topk's O(k) sparse allreduce over a mesh axis (``comm=jss.axis(name)``).

The same algorithm and results as the MPI handler (ffi/collectives/oktopk.cc), with JAX
collectives inside ``shard_map`` / ``pmap``; :func:`jss.oktopk_allreduce`
calls :func:`axis_oktopk_allreduce` when given a mesh axis.

=========================  ===============================================================
step                       collectives (every device takes the same branches)
=========================  ===============================================================
argument check             ``all_gather`` of the header (size, k, capacity, flags)
regions (every tau')       ``all_gather`` of each device's P-1 proposed boundaries; the
                           average is exact in int32 (sum of quotients and remainders)
split and reduce           ``all_gather`` of the largest slice, then ``all_to_all`` of the
                           slices at the smallest capacity of a halving ladder that holds
                           it (at most ``cap``: always fits); each owner adds them in MPI's
                           order (own slice, then ranks r-1, r-2, ...)
global threshold (every    four ``psum`` of 256/256/256/128 int32 histogram counts (the
tau)                       radix select of the k-th largest magnitude over all regions)
selection + allgatherv     (with a reused threshold and ``region_counts``: each owner's
                           count clipped to [lo, hi], its top candidates by magnitude,
                           ties to the lower index, as MPI) ``all_gather`` of the
                           selected counts; if the largest is above
                           4x the mean (MPI's balancing rule), an ``all_to_all`` first
                           moves the entries so each device holds an equal share of the
                           concatenation; then one ``all_gather`` of the (shares of the)
                           selected entries at a ladder capacity
=========================  ===============================================================

Static capacities: the split exchange's ladder tops at ``cap`` (a slice never
holds more than a device's entries) and the gather's at ``min(P cap, N)`` (an
owner's reduced region never holds more); each exchange first gathers the
counts that pick the branch, so nothing is ever dropped. The rungs halve from
the bound, with quarter steps around k/P (where balanced regions put a slice
or a region's selection): a typical call pads the largest slice by at most
25 %, any call by at most 100 %. Every device sends at the largest count of
any device (all_to_all / all_gather blocks are uniform), which MPI's
variable-size messages do not pay. Bits: owners add in
the MPI transport's order, the threshold is the same radix select, and the
result is scattered from identical gathered entries, so ``sum``,
``boundaries``, ``threshold`` and ``contributed`` equal the MPI transport's
bit for bit (a zero sum's sign aside, which no selection sees) and every
device holds the same bits. The owner accumulates its region in an N-float
buffer (local memory; what travels stays O(k)), but the threshold and the
selection run on the O(P k) indices that arrived.

Stats follow :mod:`jax_sparse_sync.mesh.sparse_allreduce`: what the static shapes carry,
padding included; ``result_nnz`` is the global count, ``switched_to_dense``
whether the balancing step ran.

``partition="hash"``: the owners are the hash owners (``owner_sorted`` of
:mod:`jax_sparse_sync.mesh.hash_partition` groups each device's stream by owner
before the same ``all_to_all``) and each owner adds the slices in rank order
0, 1, ..., P-1 (as MPI does for hash owners); no boundaries travel, and the
rest is as above (the result is scattered, so the owners' order does not matter).

``wire_dtype`` (bfloat16 / float16): the slices, the balancing pieces and the
gathered selection carry 16-bit values two to an int32 word beside the int32
indices (:func:`~jax_sparse_sync.mesh.common.pack_entries`, 6 bytes an entry),
rounded where MPI rounds them: each device's stream before the split, each
owner's selected sums before the gather. The results equal the MPI transport's
bit for bit here too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.checks import checked_headers, local_checks, one_slot_if_empty
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.mesh.hash_partition import owner_sorted
from jax_sparse_sync.mesh.common import (F_BAD_BOUNDARIES, HEADER_BYTES, SENT, Counters, f2i,
                                         i2f, log2_ceil, pack_entries, round_to_wire,
                                         uniform_max, unpack_entries, vary, wire_words)
from jax_sparse_sync.mesh.ladder import capacity_ladder, ladder_index
from jax_sparse_sync.mesh.streams import canonical_stream, exchange_slice_entries
from jax_sparse_sync.base.arguments import wire_dtype_id
from jax_sparse_sync.model import cost_model

__all__ = ["axis_oktopk_allreduce"]

_MAG = np.int32(0x7FFFFFFF)
# (shift, bits) of the four radix rounds over the 31-bit magnitude key, as in ffi/collectives/oktopk.cc
_ROUNDS = tuple(zip((23, 15, 7, 0), (8, 8, 8, 7)))
assert tuple(1 << b for _, b in _ROUNDS) == cost_model.THRESHOLD_HISTOGRAM_BINS


def _ladder(hi: int, typical: int) -> list[int]:
    """Static capacities: the halving ladder from ``hi`` (the bound) down past
    ``typical / 2``, with quarter steps added between ``typical`` and twice it
    (where a balanced exchange's largest count lands: at least the mean, k/P per
    slice or region), so a typical call pads by at most 25 % instead of 100 %."""
    rungs = set(capacity_ladder(hi, -(-typical // 2)))
    # the largest slice / selection is at least the mean (k/P): refine [k/P, 2k/P] only
    rungs |= {c for r in rungs if typical // 2 <= r <= 2 * typical for j in (1, 2, 3)
              if typical <= (c := min(hi, -(-r * (4 + j) // 4))) <= 2 * typical}
    return sorted(rungs)


def _floor_mul_div(a, q, p: int):
    """floor(a * q / p) for int32 a, q >= 0 without overflowing int32."""
    return (a // p) * q + ((a % p) * q) // p


def _magnitude_key(v):
    return f2i(v) & _MAG


def _balanced_boundaries(keys, nnz, n, name, p):
    """Each device proposes the boundaries that split its own entries evenly; the
    average (floor) of the proposals, as MPI's int64 allreduce computes it."""
    q = jnp.arange(1, p, dtype=jnp.int32)
    pos = _floor_mul_div(nnz, q, p)
    mine = jnp.where(nnz == 0, _floor_mul_div(jnp.int32(n), q, p),
                     keys[jnp.clip(pos, 0, keys.shape[0] - 1)])
    every = jax.lax.all_gather(vary(mine, name), name, to="invarying")  # [P, P-1]
    avg = jnp.sum(every // p, axis=0) + jnp.sum(every % p, axis=0) // p
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), avg.astype(jnp.int32),
                            jnp.full((1,), n, jnp.int32)])


def _split_and_reduce(keys, vals, bounds, n, k, name, p, rank, ctr, wire=0, hashed=False):
    """Owner r gets every device's entries in [bounds[r], bounds[r+1]) (``hashed``:
    those whose :func:`~jax_sparse_sync.mesh.hash_partition.hash_owner` is r) and adds
    them into an N-float buffer: its own slice first, then ranks r-1, r-2, ... (mod P),
    the order in which ffi/collectives/oktopk.cc merges them (hash owners: ranks 0, 1, ..., P-1).

    Returns ``(candidates i32[P cap], values f32[P cap])``: the reduced region as
    the indices that arrived (each index once; -1 elsewhere) and their sums, so
    the threshold and the selection work on O(P k) slots, not on N."""
    cap = keys.shape[0]
    if hashed:  # grouped by owner, each group still sorted (padding last)
        keys, vals, starts = owner_sorted(keys, vals, p)
    else:
        starts = jnp.searchsorted(keys, bounds, side="left").astype(jnp.int32)
    need = uniform_max((starts[1:] - starts[:-1]).max(), name)  # MPI: the slice-size alltoall
    ctr.collective(4 * (p - 1), log2_ceil(p))
    ladder = _ladder(cap, -(-k // p))

    def exchange(width):
        gk, gv = exchange_slice_entries(keys, vals, starts, width, name, wire)  # [P, width]

        def add(j, acc):  # a sender's indices are unique: no order inside one scatter
            # hash owners add in rank order 0, 1, ..., P-1, as ffi/collectives/oktopk.cc does for them
            src = j if hashed else (rank - j) % p
            row_k, row_v = gk[src], gv[src]
            return acc.at[jnp.where(row_k < 0, n, row_k)].add(row_v, mode="drop",
                                                              unique_indices=True)

        acc = jax.lax.fori_loop(0, p, add, vary(jnp.zeros((n,), jnp.float32), name))
        idx = jnp.pad(gk, ((0, 0), (0, cap - width)), constant_values=-1).reshape(-1)
        return acc, idx

    index = ladder_index(need, ladder)
    acc, idx = jax.lax.switch(index, [functools.partial(exchange, w) for w in ladder])
    ctr.collective(ctr.table([4 * wire_words(w, wire) * (p - 1) for w in ladder], index), p - 1)
    # an index sent by several devices counts once: keep its first slot
    slots = jnp.arange(idx.shape[0], dtype=jnp.int32)
    at = jnp.where(idx < 0, n, idx)
    first_slot = jnp.full((n + 1,), idx.shape[0], jnp.int32).at[at].min(slots)
    idx = jnp.where((idx >= 0) & (first_slot[at] == slots), idx, -1)
    return idx, jnp.where(idx >= 0, acc[jnp.clip(idx, 0, n - 1)], 0.0)


def _kth_key(values, k, name):
    """The k-th largest magnitude key over every owner's reduced region (``values``: its
    candidates' sums, 0 elsewhere; a radix select with one ``psum`` of a histogram per
    round); 0 when fewer than k nonzero entries exist."""
    keys = _magnitude_key(values)
    nonzero = keys != 0
    prefix = jnp.int32(0)
    remaining = jnp.int32(k)
    none = jnp.asarray(False)
    for shift, bits in _ROUNDS:
        high = shift + bits
        match = nonzero if high >= 31 else nonzero & ((keys >> high) == (prefix >> high))
        digit = (keys >> shift) & ((1 << bits) - 1)
        hist = jnp.zeros((1 << bits,), jnp.int32).at[digit].add(match.astype(jnp.int32))
        total = jax.lax.psum(hist, name)
        above = jnp.cumsum(total[::-1])[::-1]  # above[d] = entries with digit >= d
        ok = above >= remaining
        d = jnp.max(jnp.where(ok, jnp.arange(1 << bits, dtype=jnp.int32), -1))
        none = none | (d < 0)  # fewer than k nonzero entries in all regions: keep them all
        d = jnp.maximum(d, 0)
        remaining = remaining - jnp.where(d + 1 < (1 << bits),
                                          above[jnp.minimum(d + 1, (1 << bits) - 1)], 0)
        prefix = prefix | (d << shift)
    return jnp.where(none, 0, prefix)


def _limit_region(cand, mags, selected, lo: int, hi: int):
    """MPI's per-region count limits (``region_counts``): keep ``clip(count,
    min(lo, nonzero), hi)`` candidates, the region's top ones by magnitude (ties:
    the lower index) when that differs from the threshold's count."""
    valid = (cand >= 0) & (mags != 0)
    above = jnp.sum(selected).astype(jnp.int32)
    nonzero = jnp.sum(valid).astype(jnp.int32)
    big = np.iinfo(np.int32).max
    want = jnp.minimum(jnp.maximum(above, jnp.minimum(jnp.int32(min(lo, big)), nonzero)),
                       jnp.int32(min(hi, big)))

    def top():
        slots = jnp.arange(cand.shape[0], dtype=jnp.int32)
        # sort by (-magnitude, index); invalid slots last
        neg = jnp.where(valid, -mags, jnp.int32(1))
        _, _, order = jax.lax.sort((neg, jnp.where(valid, cand, big), slots), num_keys=2)
        rank = jnp.zeros_like(slots).at[order].set(slots, unique_indices=True)
        return valid & (rank < want)

    return jax.lax.cond(want != above, top, lambda: selected)


def _gather_selected(cand, cand_vals, selected, n, k, name, p, rank, top, ctr, wire=0):
    """Every device gets every owner's selected candidates (balanced first when skewed).
    Returns (dense result, kept mask, total count, balanced)."""
    count = jnp.sum(selected).astype(jnp.int32)
    sizes = jax.lax.all_gather(vary(count, name), name, to="invarying")  # [P]
    ctr.collective(4 * (p - 1), log2_ceil(p))
    total = jnp.sum(sizes)
    largest = jnp.max(sizes)
    # MPI's rule: balance when the largest share is above 4x the mean (largest P > 4 T)
    balanced = (total > 0) & (largest > (total // p) * 4 + ((total % p) * 4) // p)
    offset = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes)]).astype(jnp.int32)
    qs = jnp.arange(p + 1, dtype=jnp.int32)
    share = _floor_mul_div(total, qs, p)  # device q holds [share[q], share[q+1]) when balanced

    # this owner's selection, compacted once (any order: the result is scattered)
    slot = jnp.where(selected, jnp.cumsum(selected.astype(jnp.int32)) - 1, top)
    mine_k = jnp.full((top,), -1, jnp.int32).at[slot].set(cand, mode="drop", unique_indices=True)
    # what the owner gathers to every device, itself included: its sums on the wire
    mine_v = jnp.zeros((top,), jnp.float32).at[slot].set(round_to_wire(cand_vals, wire),
                                                         mode="drop", unique_indices=True)

    def scatter(rows, width):  # [P, wire_words(width)] gathered messages; index -1 = padding
        ks, vs = unpack_entries(rows, width, wire)
        ks, vs = ks.reshape(-1), vs.reshape(-1)
        at = jnp.where(ks < 0, n, ks)
        out = jnp.zeros((n,), jnp.float32).at[at].set(vs, mode="drop", unique_indices=True)
        kept = jnp.zeros((n,), bool).at[at].set(True, mode="drop", unique_indices=True)
        return out, kept

    def gather(width):
        return scatter(jax.lax.all_gather(pack_entries(mine_k[:width], mine_v[:width], wire),
                                          name, to="invarying"), width)

    def balance_then_gather(width):
        # pieces: what this owner holds of target q's share
        c = jnp.maximum(offset[rank], share[:-1])
        d = jnp.minimum(offset[rank + 1], share[1:])
        j = jnp.arange(width, dtype=jnp.int32)[None, :]
        pos = (c - offset[rank])[:, None] + j
        ok = j < (d - c)[:, None]
        safe = jnp.clip(pos, 0, top - 1)
        send = pack_entries(jnp.where(ok, mine_k[safe], -1), jnp.where(ok, mine_v[safe], 0.0),
                            wire)  # [P targets, wire_words(width)]
        gk, gv = unpack_entries(jax.lax.all_to_all(send, name, 0, 0), width, wire)  # [P senders, width]
        # sender s's piece lands at max(offset[s], share[rank]) - share[rank] in this share
        first = jnp.maximum(offset[:-1], share[rank]) - share[rank]
        at = jnp.where(gk < 0, width, first[:, None] + j).reshape(-1)
        mine_k2 = jnp.full((width,), -1, jnp.int32).at[at].set(
            gk.reshape(-1), mode="drop", unique_indices=True)
        mine_v2 = jnp.zeros((width,), jnp.float32).at[at].set(
            gv.reshape(-1), mode="drop", unique_indices=True)
        return scatter(jax.lax.all_gather(pack_entries(mine_k2, mine_v2, wire), name,
                                          to="invarying"), width)

    ladder = _ladder(top, -(-k // p))
    index = jnp.where(balanced, len(ladder) + ladder_index(-(-total // p), ladder),
                      ladder_index(largest, ladder))
    out, kept = jax.lax.switch(
        index, [functools.partial(gather, w) for w in ladder]
        + [functools.partial(balance_then_gather, w) for w in ladder])
    lg = log2_ceil(p)
    # the gather (and, balanced, the all_to_all before it: as many bytes again)
    ctr.collective(ctr.table([4 * wire_words(w, wire) * (p - 1) for w in ladder]
                             + [2 * 4 * wire_words(w, wire) * (p - 1) for w in ladder], index),
                   ctr.table([lg] * len(ladder) + [lg + p - 1] * len(ladder), index))
    return out, kept, total, balanced


def axis_oktopk_allreduce(values, indices, *, size: int, k: int, boundaries, threshold,
                          recompute_boundaries, recompute_threshold, comm: AxisComm,
                          nan_policy: str = "raise", region_counts=None,
                          op: str = "oktopk_allreduce", wire_dtype=None,
                          partition: str = "regions"):
    """Ok-Topk over ``comm``'s mesh axis; arguments as :func:`jss.oktopk_allreduce`
    (checked there; it calls this for ``comm=jss.axis(...)``). Returns ``(sum
    f32[size], contributed bool[cap], boundaries i32[P+1], threshold f32[], stats
    vector)``.

    Example:
      >>> import jax, jax.numpy as jnp, jax_sparse_sync as jss
      >>> from jax.sharding import PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
      >>> f = jax.jit(jax.shard_map(lambda v, i: jss.oktopk_allreduce(
      ...     v, i, size=8, k=2, comm=jss.axis("data")).sum, mesh=mesh,
      ...     in_specs=(P(), P()), out_specs=P(), check_vma=False))
      >>> f(jnp.array([3., -1., 2.]), jnp.array([0, 5, 7], jnp.int32)).tolist()
      [3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    """
    n, name = int(size), comm.name
    p = comm.size(op)
    wire = wire_dtype_id(wire_dtype, op)
    values = jnp.asarray(values, jnp.float32)
    indices = jnp.asarray(indices, jnp.int32)
    given = jnp.asarray(boundaries, jnp.int32)
    recompute_b = jnp.asarray(recompute_boundaries).astype(bool).reshape(())
    recompute_t = jnp.asarray(recompute_threshold).astype(bool).reshape(())
    threshold = jnp.asarray(threshold, jnp.float32).reshape(())
    in_indices = indices
    values, indices = one_slot_if_empty(values, indices)
    cap = values.shape[0]
    rank = jax.lax.axis_index(name)

    valid, first_bad, flags = local_checks(values, indices, n, nan_policy)
    # MPI checks given boundaries when it does not recompute them (always with P = 1),
    # and never with hash owners (they pass through unused)
    hashed = partition == "hash"
    use_given = ~recompute_b if p > 1 else jnp.asarray(True)
    use_given = use_given & (not hashed)
    given_ok = (given[0] == 0) & (given[p] == n) & jnp.all(given[1:] >= given[:-1])
    flags = flags | jnp.where(use_given & ~given_ok, F_BAD_BOUNDARIES, 0)

    keys, vals = canonical_stream(jnp.where(valid, indices, SENT), jnp.where(valid, values, 0.0))
    vals = round_to_wire(vals, wire)  # what this device sends, and keeps for its own region
    nnz = jnp.sum(keys != SENT).astype(jnp.int32)
    _, zero = checked_headers(name, flags=flags, first_bad=first_bad,
                              bad_index=indices[first_bad], size=n,
                              word=_ext.ALGORITHM_IDS["oktopk"] | (wire << 24), cap=cap,
                              param=int(k),
                              slots=(0, nnz), op=op)
    ctr = Counters()
    ctr.collective(HEADER_BYTES * (p - 1), log2_ceil(p))
    keys, vals = vary(keys + zero, name), vary(vals, name)

    if p > 1 and not hashed:
        bounds = jax.lax.cond(recompute_b,
                              lambda: vary(_balanced_boundaries(keys, nnz, n, name, p), name),
                              lambda: vary(given, name))
        ctr.add(4 * (p - 1) * (p - 1), 4 * (p - 1) * (p - 1), log2_ceil(p),
                send=recompute_b, recv=recompute_b)
    else:
        bounds = vary(given, name)
    cand, cand_vals = _split_and_reduce(keys, vals, bounds, n, int(k), name, p, rank, ctr, wire,
                                        hashed)

    # the histograms travel only when the threshold is recomputed (allreduce-counted)
    threshold = jax.lax.cond(recompute_t,
                             lambda: vary(i2f(_kth_key(cand_vals, int(k), name)), name),
                             lambda: vary(threshold, name))
    hist_bytes = sum(2 * (p - 1) * 4 * bins // p for bins in cost_model.THRESHOLD_HISTOGRAM_BINS)
    ctr.add(hist_bytes, hist_bytes, 2 * len(_ROUNDS) * log2_ceil(p),
            send=recompute_t, recv=recompute_t)
    tkey = _magnitude_key(jnp.where(threshold < 0, jnp.float32(0), threshold))
    mags = _magnitude_key(cand_vals)
    selected = (cand >= 0) & (mags != 0) & (mags >= tkey)
    if region_counts is not None:  # with a reused threshold only, as MPI
        selected = jax.lax.cond(recompute_t, lambda: selected,
                                lambda: _limit_region(cand, mags, selected, *region_counts))
    out, kept, total, balanced = _gather_selected(cand, cand_vals, selected, n, int(k), name, p,
                                                  rank, min(p * cap, n), ctr, wire)
    contributed = (in_indices >= 0) & kept[jnp.clip(in_indices, 0, n - 1)]
    dt = ctr.dt
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, total.astype(dt),
                       balanced.astype(dt), ctr.value(_ext.ALGORITHM_IDS["oktopk"])])
    return out, contributed, bounds, threshold, stats
