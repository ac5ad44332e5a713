"""The wire of :func:`jss.sharded_sync`'s step, and the choice of how the change travels.

A step is two exchanges (counting conventions of :mod:`jax_sparse_sync.stats`;
P ranks, N entries, rank r owns the region ``[r N / P, (r + 1) N / P)`` of
``len_r`` entries):

1. **region reduce** (``ffi/collectives/region_reduce.cc``): the 56-byte
   argument check to P-1 peers, the slice sizes (8 bytes to each peer), one
   message of 8 bytes an entry to each owner that gets entries from this rank,
   and the owners' merged counts (8 bytes to each peer);
2. **the change gathered**, by :func:`jss.sparse_allreduce` on this owner's
   own entries only (so split-allgather's first phase moves no entry):
   ``"topk"`` and ``"lazy"`` run ``split_allgather`` (the check, the slice
   sizes, the block sizes (8 bytes to each peer), then this owner's block to
   P-1 peers: 8 bytes an entry, or ``4 len_r`` when that is smaller);
   ``"dense"`` runs ``dsar_split_allgather`` (the check, the slice sizes, then
   ``4 ceil(N/P)`` bytes to P-1 peers).

With ``max_grad_norm``, a third: every owner's sum of squares in a dense gather of P
floats (:func:`clip_bytes`). The ``*_bytes`` functions give the exact count of one rank from its counts (the
tests compare them with the handlers' statistics); :func:`sharded_sync_volume`
bounds a step from (P, N, k) for :func:`choose_change`, which ranks the three
ways of sending the change by the cost model's predicted time.
"""

from __future__ import annotations

import math

from typing import Sequence

from jax_sparse_sync.model import cost_model
from jax_sparse_sync.model.cost_model import (COUNT_BYTES, ENTRY_BYTES, HEADER_BYTES,
                                              VALUE_BYTES, WireVolume)

__all__ = ["CHANGES", "region_reduce_bytes", "change_bytes", "region_reduce_messages",
           "change_messages", "clip_bytes", "sharded_sync_volume", "choose_change",
           "change_entries"]

#: How the owner's change to its region travels (``sharded_sync``'s ``change``).
CHANGES = ("topk", "lazy", "dense")
#: the order ``choose_change`` breaks ties in (see there)
TIE_ORDER = ("lazy", "topk", "dense")


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length() if p > 1 else 0


def _region_length(size: int, nranks: int, rank: int) -> int:
    return size * (rank + 1) // nranks - size * rank // nranks


def region_reduce_bytes(*, nranks: int, rank: int, sent_entries: Sequence[int]) -> int:
    """Bytes ``rank`` sends in one region reduce: ``sent_entries[q]`` of its (unique)
    entries fall in owner q's region (its own count is not sent)."""
    p = nranks
    if p == 1:
        return 0
    slices = sum(ENTRY_BYTES * int(m) for q, m in enumerate(sent_entries) if q != rank)
    return HEADER_BYTES * (p - 1) + 2 * COUNT_BYTES * (p - 1) + slices


def region_reduce_messages(*, nranks: int, rank: int, sent_entries: Sequence[int]) -> int:
    """Messages ``rank`` starts in one region reduce (one per nonempty slice)."""
    p = nranks
    if p == 1:
        return 0
    slices = sum(1 for q, m in enumerate(sent_entries) if q != rank and int(m) > 0)
    return 2 * _log2_ceil(p) + (p - 1) + slices


def change_bytes(change: str, *, nranks: int, size: int, rank: int, entries: int) -> int:
    """Bytes ``rank`` sends when its change travels as ``change`` (one of
    :data:`CHANGES`): ``entries`` is how many (unique) entries of its region it
    sends (``"topk"``, ``"lazy"``; unused by ``"dense"``)."""
    p = nranks
    if p == 1:
        return 0
    base = HEADER_BYTES * (p - 1) + COUNT_BYTES * (p - 1)
    if change == "dense":
        return base + (p - 1) * VALUE_BYTES * -(-size // p)
    length = _region_length(size, p, rank)
    block = min(ENTRY_BYTES * int(entries), VALUE_BYTES * length)
    return base + COUNT_BYTES * (p - 1) + (p - 1) * block


def change_messages(change: str, *, nranks: int) -> int:
    """Messages a rank starts when its change travels as ``change``."""
    p = nranks
    if p == 1:
        return 0
    lg = _log2_ceil(p)
    return lg + (p - 1) + (lg if change == "dense" else 2 * lg)


def clip_bytes(*, nranks: int) -> int:
    """Bytes a rank sends for ``max_grad_norm``: its sum of squares in a dense gather of P
    floats (the check, the slice sizes, 4 bytes to each peer)."""
    return change_bytes("dense", nranks=nranks, size=nranks, rank=0, entries=0)


def change_entries(*, size: int, nranks: int, k: int, change_density: float | None) -> int:
    """Entries of its region (``ceil(N / P)``) an owner sends with ``change="topk"``: the
    ``change_density`` fraction of the region, rounded up, or by default k, about the
    entries the region's reduced gradient holds (P ranks' k / P each, where they do not
    overlap), so that the sparse change costs ``"lazy"``'s bytes."""
    slot = -(-size // nranks)
    if change_density is None:
        return min(slot, k)
    return min(slot, max(1, math.ceil(change_density * slot)))


def sharded_sync_volume(*, nranks: int, size: int, k: int, change: str, change_k: int,
                        rank: int = 0, max_grad_norm: bool = False) -> WireVolume:
    """Bytes ``rank`` sends in one step of ``sharded_sync`` (both exchanges).

    ``k``: the gradient entries each rank selects; ``change_k``: the change's
    entries an owner sends with ``"topk"``; ``max_grad_norm``: the norm's gather too
    (:func:`clip_bytes`). ``bytes_min``: every rank's entries in
    its own region (nothing reduced travels) and, for ``"lazy"``, nothing moved;
    ``bytes_max``: every entry to other owners and, for ``"lazy"``, the region's
    union at its largest (``min(P k, len)``); ``bytes_typical``: the ranks'
    entries disjoint and spread evenly over the regions ((P-1)/P of them
    travel; a region's union holds about k), as :func:`cost_model.wire_volume`'s.
    """
    if change not in CHANGES:
        raise ValueError(f"sharded_sync_volume: `change` must be one of {CHANGES}; "
                         f"got {change!r}")
    p = nranks
    length = _region_length(size, p, rank)
    own_share = k * length // size
    spread = [own_share if q == rank else (k - own_share) // max(p - 1, 1) for q in range(p)]
    spread[(rank + 1) % p] += (k - own_share) - sum(spread[q] for q in range(p) if q != rank)
    reduce_lo = region_reduce_bytes(nranks=p, rank=rank, sent_entries=[0] * p)
    reduce_hi = reduce_lo + (ENTRY_BYTES * k if p > 1 else 0)
    reduce_typ = region_reduce_bytes(nranks=p, rank=rank, sent_entries=spread)
    counts = {"topk": (change_k, change_k, change_k),
              "lazy": (0, min(k, length), min(p * k, length)),
              "dense": (0, 0, 0)}[change]
    lo, typ, hi = (change_bytes(change, nranks=p, size=size, rank=rank, entries=m)
                   for m in counts)
    messages = (region_reduce_messages(nranks=p, rank=rank, sent_entries=[1] * p)
                + change_messages(change, nranks=p))
    clip = clip_bytes(nranks=p) if max_grad_norm else 0
    messages += change_messages("dense", nranks=p) if max_grad_norm else 0
    return WireVolume(reduce_lo + lo + clip, reduce_hi + hi + clip, messages,
                      reduce_typ + typ + clip)


def choose_change(*, nranks: int, size: int, k: int, change_k: int,
                  params: cost_model.AlphaBeta | None = None) -> str:
    """``change="auto"``: the way of sending the change with the lowest predicted
    step time (``messages * alpha + bytes_typical * beta``, rank 0's view); the same on
    every rank for the same arguments. Ties go to ``"lazy"``, then ``"topk"``: at the
    default budget (k entries an owner) the two cost the same, and lazy ended the
    examples' LM 4 % (P = 2) and 7 % (P = 4) lower than the owner's top-k
    (``benchmarks/results/sharded_state_p{2,4}.json``).

    Example:
      >>> from jax_sparse_sync.model.sharded import choose_change
      >>> choose_change(nranks=4, size=1_000_000, k=10_000, change_k=10_000)
      'lazy'
      >>> choose_change(nranks=4, size=1_000_000, k=10_000, change_k=2_500)
      'topk'
      >>> choose_change(nranks=4, size=1_000, k=200, change_k=200)
      'dense'
    """
    params = params or cost_model.current_alpha_beta()

    def predicted(change):
        v = sharded_sync_volume(nranks=nranks, size=size, k=k, change=change, change_k=change_k)
        return v.messages * params.alpha + v.bytes("typical") * params.beta
    return min(TIE_ORDER, key=predicted)  # min keeps the first of equal keys
