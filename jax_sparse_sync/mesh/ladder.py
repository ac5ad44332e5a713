"""The capacity ladder: static buffer sizes for data-dependent amounts.

XLA needs every exchanged buffer's shape at compile time, but how many
entries travel depends on the data. Each exchange therefore has a ladder of
static capacities from the algorithm's bound halving down, and one
``lax.switch`` branch per rung; the counts that pick the rung are known to
every device before the exchange, so all devices take the same branch and the
smallest rung that holds everything (at most 2x the entries' bytes travel).
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["capacity_ladder", "ladder_index"]


def capacity_ladder(hi: int, lo: int) -> list[int]:
    """Static capacities hi, ceil(hi/2), ceil(hi/4), ... down to the first <= lo; ascending."""
    out = [max(1, hi)]
    while out[-1] > max(1, lo):
        out.append(-(-out[-1] // 2))
    return sorted(set(out))


def ladder_index(need, buckets: list[int]):
    """Index of the smallest bucket >= need (need <= buckets[-1]); uniform if need is."""
    if len(buckets) == 1:
        return jnp.int32(0)
    return jnp.sum(jnp.asarray(buckets[:-1], jnp.int32) < need).astype(jnp.int32)
