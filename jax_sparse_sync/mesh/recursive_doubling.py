"""``recursive_doubling`` (SparCML's SSAR_Recursive_double) on the axis transport."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.mesh.common import (WIRE16, SENT, log2_ceil, pack_entries, round_to_wire,
                                         uniform_max, unpack_entries, vary, wire_words)
from jax_sparse_sync.mesh.ladder import capacity_ladder, ladder_index
from jax_sparse_sync.mesh.streams import densify, merge_streams

__all__ = ["recursive_doubling_sum"]

# What a device does with a stage's exchange: keep its stream, merge, or take the partner's.
_KEEP, _MERGE, _TAKE = 0, 1, 2


def _stages(p, rank, n, cap):
    """The unrolled schedule: ``(perm, mode, mine_lower, capacity after the stage)`` per
    stage (the fold, log2(p2) rounds, the hand-back); ``mode`` and ``mine_lower`` are
    traced (they depend on ``rank``)."""
    p2 = 1 << (p.bit_length() - 1)
    extra = p - p2
    stages, c = [], cap
    if extra:  # fold: ranks p2..P-1 hand their stream to rank - p2
        c = min(2 * c, n)
        stages.append(([(p2 + i, i) for i in range(extra)], jnp.where(rank < extra, _MERGE, _KEEP),
                       jnp.asarray(True), c))
    mask = 1
    while mask < p2:
        c = min(2 * c, n)
        stages.append(([(i, i ^ mask) for i in range(p2)], jnp.where(rank < p2, _MERGE, _KEEP),
                       rank < (rank ^ mask), c))
        mask <<= 1
    if extra:  # the folded ranks get the result back
        stages.append(([(i, p2 + i) for i in range(extra)], jnp.where(rank >= p2, _TAKE, _KEEP),
                       jnp.asarray(True), c))
    return stages


def _roles(perm, p, rank):
    """Whether device ``rank`` sends, and whether it receives, in the exchange ``perm``."""
    senders, receivers = np.zeros(p, bool), np.zeros(p, bool)
    for s_, d_ in perm:
        senders[s_], receivers[d_] = True, True
    return jnp.asarray(senders)[rank], jnp.asarray(receivers)[rank]


def _pick3(mode, own, merged, theirs):
    """The stream a device keeps after a stage, by its ``mode``."""
    return jnp.where(mode == _MERGE, merged, jnp.where(mode == _TAKE, theirs, own))


def _fit(a, fill, size):
    """``a`` padded with ``fill``, or cut (only padding is cut), to ``size`` slots."""
    if a.shape[0] >= size:
        return a[:size]
    return jnp.concatenate([a, jnp.full((size - a.shape[0],), fill, a.dtype)])


def recursive_doubling_sum(keys, vals, n, name, p, rank, ctr, wire=0):
    """SSAR_Recursive_double with JAX collectives; see the module docstring.

    The stages (fold, log2(p2) rounds, hand-back) are unrolled. Before each
    sparse stage the devices learn the largest stream about to travel; if it
    passes delta = N/2, the rest of the algorithm runs dense: the dense tail is
    the other branch of a ``lax.cond``, so the N-float vector only exists on
    the path that needs it.

    ``wire`` 1 / 2 (bfloat16 / float16 values): before each stage a device
    rounds the stream it holds to the wire dtype (what it sends is what it
    keeps), and the result is rounded once more, as the MPI transport does.
    """
    delta = n // 2
    cap = keys.shape[0]
    lg = log2_ceil(p)
    dt, lim = ctr.dt, ctr.lim
    stages = _stages(p, rank, n, cap)

    def add(total, amount, when):  # saturating, in the stats dtype
        a = jnp.where(when, amount, 0).astype(dt)
        return jnp.where(total > lim - a, lim, total + a).astype(dt)

    def vary_all(*xs):
        return tuple(vary(a, name) for a in xs)

    def dense_from(i, x, counters):
        """Stages i.. with dense vectors (4N bytes per message)."""
        sent, recv, msgs = counters
        for perm, mode, mine_lower, _ in stages[i:]:
            sends, gets = _roles(perm, p, rank)
            x = round_to_wire(x, wire)
            if wire:
                theirs = jax.lax.ppermute(x.astype(WIRE16[wire]), name, perm).astype(jnp.float32)
            else:
                theirs = jax.lax.ppermute(x, name, perm)
            merged = jnp.where(mine_lower, x + theirs, theirs + x)  # lower + upper
            x = _pick3(mode, x, merged, theirs)
            nbytes = jnp.asarray(min((4 if wire == 0 else 2) * n, lim), dt)
            sent, recv, msgs = add(sent, nbytes, sends), add(recv, nbytes, gets), add(msgs, 1, sends)
        return vary_all(round_to_wire(x, wire), jnp.asarray(True), sent, recv, msgs)

    def sparse_from(i, k, v, counters):
        """Stage i on the sorted unique stream (k, v), then the rest."""
        if i == len(stages):
            # every device holds the same stream now: the same flag everywhere
            return vary_all(densify(k, round_to_wire(v, wire), n), jnp.sum(k != SENT) > delta,
                            *counters)
        perm, mode, mine_lower, c_next = stages[i]
        sent, recv, msgs = counters
        sends, gets = _roles(perm, p, rank)
        # Everyone learns the largest stream about to travel (MPI sends a count first).
        need = uniform_max(jnp.where(sends, jnp.sum(k != SENT), 0), name)
        cnt = jnp.asarray(min(4 * (p - 1), lim), dt)
        counters = (add(sent, cnt, True), add(recv, cnt, True), add(msgs, lg, True))

        def go_dense():
            return dense_from(i, densify(k, v, n), counters)

        def stay_sparse():
            v_wire = round_to_wire(v, wire)  # what this device sends, and keeps
            c = k.shape[0]
            buckets = capacity_ladder(min(c, delta), -(-cap // 2))

            def send(width):
                got = jax.lax.ppermute(pack_entries(k[:width], v_wire[:width], wire), name, perm)
                gk, gv = unpack_entries(got, width, wire)
                return vary_all(_fit(gk, SENT, c), _fit(gv, 0.0, c))

            index = ladder_index(need, buckets)
            tk, tv = jax.lax.switch(index, [functools.partial(send, w) for w in buckets])
            tk = jnp.where(gets, tk, SENT)  # devices that received nothing got zeros
            # f(lower group, upper group): the same on both partners
            lower = (jnp.where(mine_lower, k, tk), jnp.where(mine_lower, v_wire, tv))
            upper = (jnp.where(mine_lower, tk, k), jnp.where(mine_lower, tv, v_wire))
            mk, mv = merge_streams(lower, upper)
            nk = _pick3(mode, _fit(k, SENT, c_next), _fit(mk, SENT, c_next),
                        _fit(tk, SENT, c_next))
            nv = _pick3(mode, _fit(v_wire, 0.0, c_next), _fit(mv, 0.0, c_next),
                        _fit(tv, 0.0, c_next))
            nbytes = jnp.asarray([min(4 * wire_words(w, wire), lim) for w in buckets], dt)[index]
            s, r, m = counters
            return sparse_from(i + 1, nk, nv, (add(s, nbytes, sends), add(r, nbytes, gets),
                                               add(m, 1, sends)))

        return jax.lax.cond(need > delta, go_dense, stay_sparse)

    zero = jnp.zeros((), dt)
    out, switched, sent, recv, msgs = sparse_from(0, keys, vals, (zero, zero, zero))
    ctr.add(sent, recv, msgs)
    return out, switched
