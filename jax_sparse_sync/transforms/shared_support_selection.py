"""How :func:`~jax_sparse_sync.shared_support_sync` chooses the coordinates it sends.

* :func:`support_of_sum`: a refresh step's support, the k largest magnitudes of
  the sparse allreduce's sum (bitwise identical on every rank, so is the choice),
  read from the sum's at most P k nonzeros;
* :func:`random_offsets` and :func:`nth_outside`: with ``random_fraction``, the
  coordinates a shared step draws off the support, one per stratum, from a PRNG
  keyed by a shared seed and the step count (the same on every rank without a
  message).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.bindings.selection import threshold_select, topk
from jax_sparse_sync.transforms.selection_policy import top_of_list

__all__ = ["support_of_sum", "random_offsets", "nth_outside"]


def support_of_sum(summed: jax.Array, k: int, nonzeros: int) -> jax.Array:
    """``jss.topk(summed, k)``'s indices bit for bit, read from ``summed``'s nonzeros.

    The k largest magnitudes of ``summed`` (NaN above everything, ties to the
    lower index), and, where ``summed`` has fewer than k nonzeros, all of them
    and the lowest-indexed zeros (``-0.0`` counts as zero), in ascending order.
    One pass over ``summed`` lists its nonzeros (``jss.threshold_select``; a
    sparse allreduce's sum has at most P k), then a top-k of that list of
    ``nonzeros`` slots, instead of a radix select over all N entries (several
    passes, each starting the CPU's threads). Should more than ``nonzeros``
    entries be nonzero, it selects from the whole of ``summed``.

    Args:
      summed: (N,) float32.
      k: entries to choose, ``0 <= k <= N``.
      nonzeros: static bound on the nonzeros of ``summed`` (``k <= nonzeros <= N``).

    Returns:
      (k,) int32 indices, ascending.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.transforms.shared_support_selection import support_of_sum
      >>> support_of_sum(jnp.array([0., 2., 0., -2., 1.]), 2, nonzeros=3).tolist()
      [1, 3]
      >>> support_of_sum(jnp.array([0., 0., 0., 5., 0.]), 3, nonzeros=3).tolist()
      [0, 1, 3]
    """
    n = summed.shape[0]
    if k == 0:
        return jnp.zeros((0,), jnp.int32)

    def over_all_of_summed():
        return topk(summed, k)[1]

    if nonzeros > n // 2:
        # a list of more than half of summed (many ranks, a high density) costs more
        # than the radix select over all of it
        return over_all_of_summed()
    values, indices, count = threshold_select(summed, -1.0, nonzeros)

    def of_the_list():
        # the listed entries are summed's nonzeros in index order: while there are k
        # of them, their top k (ties to the lower index) are summed's, in index order
        return top_of_list(values, indices, k)[1]

    def all_and_zeros():
        # fewer than k nonzeros: all of them, and the lowest-indexed zeros
        window = min(n, 2 * k)  # holds at least k - count zeros
        listed = indices[:k]  # the count nonzeros in front, then -1 padding
        is_nonzero = jnp.zeros((window,), bool).at[jnp.where(listed >= 0, listed, window)].set(
            True, mode="drop")
        zeros = jnp.nonzero(~is_nonzero, size=k, fill_value=0)[0].astype(jnp.int32)
        slot = jnp.arange(k, dtype=jnp.int32)
        return jnp.sort(jnp.where(slot < count, listed, zeros[jnp.maximum(slot - count, 0)]))

    # (more nonzeros than the bound: selected from the whole of summed)
    case = jnp.where(count > nonzeros, 2, jnp.where(count >= k, 0, 1))
    return jax.lax.switch(case, [of_the_list, all_and_zeros, over_all_of_summed])


def random_offsets(seed: int, step: jax.Array, m: int, r: int) -> jax.Array:
    """``r`` distinct offsets into ``[0, m)``, ascending: one drawn uniformly from
    each of ``r`` equal strata (``[i m // r, (i + 1) m // r)``) by a PRNG keyed by
    ``seed`` and ``step``, so the same on every rank for the same step.

    Args:
      seed: an int.
      step: the step count (an int32 scalar, may be traced).
      m: the range, ``r <= m < 2**31``.
      r: how many.

    Returns:
      (r,) int32.

    Example:
      >>> from jax_sparse_sync.transforms.shared_support_selection import random_offsets
      >>> o = random_offsets(0, 3, 10, 2)
      >>> bool(0 <= o[0] < 5 <= o[1] < 10)
      True
    """
    bounds = np.arange(r + 1, dtype=np.int64) * m // r  # static: the strata
    key = jax.random.fold_in(jax.random.PRNGKey(seed), step)
    within = jax.random.randint(key, (r,), 0, jnp.asarray(np.diff(bounds), jnp.int32),
                                dtype=jnp.int32)
    return jnp.asarray(bounds[:-1], jnp.int32) + within


def nth_outside(support: jax.Array, offsets: jax.Array) -> jax.Array:
    """The ``offsets``-th coordinates (0-based) of ``[0, N)`` without ``support``.

    ``np.setdiff1d(np.arange(N), support)[offsets]``, without the N entries: the
    ``u``-th coordinate off an ascending ``support`` is ``u`` plus the number of
    ``j`` with ``support[j] - j <= u``. Ascending offsets give ascending, distinct
    coordinates.

    Args:
      support: (s,) int32, ascending and distinct.
      offsets: int32, each in ``[0, N - s)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.transforms.shared_support_selection import nth_outside
      >>> nth_outside(jnp.array([0, 1, 4], jnp.int32), jnp.array([0, 1, 2], jnp.int32)).tolist()
      [2, 3, 5]
    """
    if support.shape[0] == 0:
        return offsets
    gaps = support - jnp.arange(support.shape[0], dtype=support.dtype)  # non-decreasing
    return offsets + jnp.searchsorted(gaps, offsets, side="right").astype(offsets.dtype)
