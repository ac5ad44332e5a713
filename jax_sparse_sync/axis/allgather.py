"""``allgather`` (TopkA) on the axis transport: gather every device's slots, sum in rank order."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_sparse_sync.axis.common import SENT, f2i, i2f, log2_ceil
from jax_sparse_sync.axis.ladder import capacity_ladder, ladder_index

__all__ = ["allgather_sum"]


def allgather_sum(keys, vals, n, name, p, max_nnz, ctr):
    cap = keys.shape[0]
    buckets = capacity_ladder(cap, -(-cap // 4))

    def gather(c):
        packed = jnp.stack([jnp.where(keys[:c] == SENT, -1, keys[:c]), f2i(vals[:c])])
        rows = jax.lax.all_gather(packed, name, to="invarying")  # [P, 2, c]

        def add_rank(r, out):  # rank order; one rank's indices are unique: no atomics decide
            row = rows[r]
            return out.at[jnp.where(row[0] < 0, n, row[0])].add(i2f(row[1]), mode="drop",
                                                                 unique_indices=True)

        return jax.lax.fori_loop(0, p, add_rank, jnp.zeros((n,), jnp.float32))

    index = ladder_index(max_nnz, buckets)
    out = jax.lax.switch(index, [functools.partial(gather, c) for c in buckets])
    ctr.collective(ctr.table([(p - 1) * 8 * c for c in buckets], index), log2_ceil(p))
    return out, 0


_KEEP, _MERGE, _TAKE = 0, 1, 2
