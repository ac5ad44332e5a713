"""``dense`` on the axis transport: one ``psum`` of the densified vector."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.axis.common import log2_ceil

__all__ = ["dense_sum"]


def dense_sum(values, indices, n, name, p, ctr):
    vec = jnp.zeros((n,), jnp.float32).at[jnp.where(indices < 0, n, indices)].add(
        values, mode="drop")
    out = jax.lax.psum(vec, name)
    ctr.collective(2 * (p - 1) * n * 4 // p, 2 * log2_ceil(p))
    return out, 0
