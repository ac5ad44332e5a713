"""Local selection policies shared by the Optax transforms.

* ``"exact"``: the exact top-k (radix select) every step.
* ``"threshold_reuse"`` (Ok-Topk): the exact k-th magnitude every ``tau``
  steps; in between, select ``|x| >= threshold`` with the reused threshold,
  nudged whenever the selected count leaves [0.75 k, 1.25 k] (by
  ``(count / k) ** (1/32)``, at most 5% a step: :func:`nudge_threshold`).
* ``"sampled"``: the threshold is the k-th magnitude of a strided sample of
  the accumulator (every ``sample_stride(k)``-th entry, at the scaled rank,
  see :func:`jax_sparse_sync.estimate_threshold`), recomputed every step at
  about ``1/stride`` of the cost of an exact selection.
* ``"gaussian"`` (Gaussiank): the threshold is the normal percent-point of the
  accumulator's mean and standard deviation, ``|mu| + sigma * ppf(1 - d/2)``.

Threshold selection writes into a fixed capacity; when more entries qualify
(overflow) the step falls back to the exact top-k instead of dropping any.
The selection lists up to :data:`OVERFLOW_LIST_FACTOR` k entries, so an
overflow that stays within that list takes its exact top-k from the list (the
top k all qualify) instead of selecting again from the whole accumulator: the
same result bit for bit, one pass over the accumulator instead of four (Ok-Topk
in training overflows often: each rank's count alternates between k on an
exact step and a few k between them).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from jax_sparse_sync.bindings.selection import estimate_threshold, threshold_select, topk
from jax_sparse_sync.transforms.flat import HINT_CAPACITY, HINT_FACTOR

__all__ = ["SELECTION_POLICIES", "LocalSelection", "select_local", "nudge_threshold",
           "sample_stride", "top_of_list", "hinted_topk"]

SELECTION_POLICIES = ("exact", "threshold_reuse", "sampled", "gaussian")

#: "sampled": the largest sampling step, and the least expected sample rank k_s.
MAX_SAMPLE_STRIDE, MIN_SAMPLE_RANK = 64, 256


def sample_stride(k: int) -> int:
    """Sampling step of the ``"sampled"`` policy: 64, or less so that the sample's
    rank ``k / stride`` stays >= 256 (the threshold's relative spread is about
    ``1 / sqrt(k / stride)``, so small k gets a denser sample)."""
    return max(1, min(MAX_SAMPLE_STRIDE, k // MIN_SAMPLE_RANK))

#: Threshold selection lists up to this many times k entries (at least the capacity).
OVERFLOW_LIST_FACTOR = 4

#: The selected count may drift within [LOW, HIGH] * k before the threshold is
#: nudged, by (count / k) ** NUDGE_GAIN and at most NUDGE_MAX a step.
LOW, HIGH, NUDGE_GAIN, NUDGE_MAX = 0.75, 1.25, 1.0 / 32, 1.05


class LocalSelection(NamedTuple):
    values: jax.Array     # (capacity,), padding value 0
    indices: jax.Array    # (capacity,) int32, padding -1
    count: jax.Array      # int32: entries that qualified (k for exact top-k)
    threshold: jax.Array  # float32: the threshold to keep for the next step
    exact: jax.Array      # bool: this step used the exact top-k


def nudge_threshold(threshold, count, k):
    """Moves the threshold toward selecting k entries when the count left
    [0.75 k, 1.25 k]: by the factor ``(count / k) ** (1/32)``, at most 5% a step
    (30% too many raise it 0.8%, half as many lower it 2.1%, 5x or more 5%).

    Near the band a small step: the count reacts to the threshold about as
    ``t ** -8`` on a Gaussian tail, so a fixed 5% step moved it 1.5x and
    overshot. Measured against the fixed 5% step it replaced: benchmarks/README.md,
    "oktopk_threshold_drift.py".
    """
    ratio = jnp.maximum(jnp.asarray(count, jnp.float32), 0.5) / jnp.float32(k)
    factor = jnp.clip(ratio ** jnp.float32(NUDGE_GAIN), 1.0 / NUDGE_MAX, NUDGE_MAX)
    outside = (count > HIGH * k) | (count < LOW * k)
    return jnp.where(outside, threshold * factor, threshold).astype(jnp.float32)


def _pad(x, capacity, fill):
    return jnp.concatenate([x, jnp.full((capacity - x.shape[0],), fill, x.dtype)])


def kth_magnitude_of(values):
    """The k-th magnitude of an exact top-k's values (their smallest magnitude; 0 for none)."""
    return jnp.min(jnp.abs(values.astype(jnp.float32))) if values.shape[0] else jnp.float32(0)


def top_of_list(values, indices, k):
    """``jss.topk`` of a ``jss.threshold_select`` list: ``(values, indices)`` of its k
    largest magnitudes, ties to the lower index, in index order.

    The list holds the entries of ``|x| >= t`` (and NaN) in index order: an upper
    set of ``jss.topk``'s order. So while it holds at least k entries (none
    dropped: ``count <= capacity``), its top k are ``jss.topk(x, k)`` bit for bit,
    read from the list instead of all of ``x``.
    """
    top, at = topk(values, k)
    return top, indices[at]


def hinted_topk(acc, k, last_kth):
    """``jss.topk(acc, k)`` bit for bit, from a list when the last k-th magnitude holds.

    The selection of :func:`~jax_sparse_sync.transforms.flat.accumulate_topk` on an
    accumulator already formed: the entries of magnitude at least ``HINT_FACTOR *
    last_kth`` listed in one pass (``jss.threshold_select``) and, when k to
    ``HINT_CAPACITY * k`` of them qualified, the top k of that list; otherwise (a
    0 hint lists every nonzero) the radix select over all of ``acc``. Costs one
    read of ``acc`` more than the fused pass, which lists while it accumulates.
    """
    room = min(acc.shape[0], HINT_CAPACITY * k)
    values, indices, count = threshold_select(
        acc, jnp.asarray(last_kth, jnp.float32) * jnp.float32(HINT_FACTOR), room)
    return jax.lax.cond((count >= k) & (count <= room), lambda: top_of_list(values, indices, k),
                        lambda: topk(acc, k))


def _exact(acc, k, capacity):
    return _exact_selection(*topk(acc, k), k, capacity)


def _exact_selection(values, indices, k, capacity):
    """An exact top-k's ``values, indices`` as a selection padded to ``capacity``."""
    return LocalSelection(_pad(values, capacity, 0), _pad(indices, capacity, -1),
                          jnp.int32(k), kth_magnitude_of(values), jnp.bool_(True))


def _by_threshold(acc, k, capacity, threshold):
    n = acc.shape[0]
    room = min(n, max(capacity, OVERFLOW_LIST_FACTOR * k))
    values, indices, count = threshold_select(acc, threshold, room)

    def within():  # count <= capacity: the selection itself
        return LocalSelection(values[:capacity], indices[:capacity], count,
                              jnp.asarray(threshold, jnp.float32), jnp.bool_(False))

    def from_list():
        # capacity < count <= room: every top-k entry qualified (NaN too, which
        # threshold_select lists and topk puts first), so the top k of the list, in
        # index order like the list, are the exact top-k of acc, ties to the lower index
        return _exact_selection(*top_of_list(values, indices, k), k, capacity)

    # never drop entries: an overflowing step is redone exactly
    branch = jnp.where(count <= capacity, 0, jnp.where(count <= room, 1, 2))
    return jax.lax.switch(branch, [within, from_list, lambda: _exact(acc, k, capacity)])


def select_local(acc: jax.Array, *, k: int, policy: str, threshold: jax.Array, step: jax.Array,
                 tau: int, capacity: int) -> LocalSelection:
    """Selects about k entries of ``acc`` by ``policy`` (see the module doc)."""
    if policy == "exact":
        return _exact(acc, k, capacity)
    if policy == "threshold_reuse":
        def reuse():
            sel = _by_threshold(acc, k, capacity, threshold)
            return sel._replace(threshold=nudge_threshold(sel.threshold, sel.count, k))
        recompute = step % tau == 0  # on schedule only (a 0 threshold is valid)
        return jax.lax.cond(recompute, lambda: _exact(acc, k, capacity), reuse)
    if policy == "sampled":
        threshold = estimate_threshold(acc, k, "sampled", sample_stride=sample_stride(k))
        return _by_threshold(acc, k, capacity, threshold)
    if policy == "gaussian":
        a = acc.astype(jnp.float32)
        z = ndtri(1.0 - k / (2.0 * acc.shape[0]))
        return _by_threshold(acc, k, capacity, jnp.abs(jnp.mean(a)) + jnp.std(a) * z)
    raise ValueError(f"selection policy must be one of {SELECTION_POLICIES}; got {policy!r}")
