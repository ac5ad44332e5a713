"""``allgather`` (TopkA) on the axis transport: gather every device's slots, sum in rank order."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_sparse_sync.mesh.common import SENT, log2_ceil, pack_entries, unpack_entries, wire_words
from jax_sparse_sync.mesh.ladder import capacity_ladder, ladder_index

__all__ = ["allgather_sum"]


def allgather_sum(keys, vals, n, name, p, max_nnz, ctr, wire=0):
    cap = keys.shape[0]
    buckets = capacity_ladder(cap, -(-cap // 4))

    def gather(c):
        packed = pack_entries(jnp.where(keys[:c] == SENT, -1, keys[:c]), vals[:c], wire)
        ks, vs = unpack_entries(jax.lax.all_gather(packed, name, to="invarying"), c, wire)

        def add_rank(r, out):  # rank order; one rank's indices are unique: no atomics decide
            return out.at[jnp.where(ks[r] < 0, n, ks[r])].add(vs[r], mode="drop",
                                                               unique_indices=True)

        return jax.lax.fori_loop(0, p, add_rank, jnp.zeros((n,), jnp.float32))

    index = ladder_index(max_nnz, buckets)
    out = jax.lax.switch(index, [functools.partial(gather, c) for c in buckets])
    ctr.collective(ctr.table([(p - 1) * 4 * wire_words(c, wire) for c in buckets], index),
                   log2_ceil(p))
    return out, 0


_KEEP, _MERGE, _TAKE = 0, 1, 2
