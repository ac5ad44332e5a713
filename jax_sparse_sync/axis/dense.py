"""``dense`` on the axis transport: one ``psum`` of the dense vector.

:func:`dense_sum` is the sparse allreduce's ``algorithm="dense"`` (COO input,
densified first); :func:`axis_dense_allreduce` is :func:`jss.dense_allreduce`
on a mesh axis: the dense vector itself, ``psum``-ed, with no index array.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.axis.checks import checked_headers
from jax_sparse_sync.axis.common import (F_NONFINITE, HEADER_BYTES, Counters, log2_ceil, vary)
from jax_sparse_sync.axis.comm import AxisComm
from jax_sparse_sync.ops.arguments import NAN_POLICIES
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["dense_sum", "axis_dense_allreduce"]


def dense_sum(values, indices, n, name, p, ctr):
    vec = jnp.zeros((n,), jnp.float32).at[jnp.where(indices < 0, n, indices)].add(
        values, mode="drop")
    out = jax.lax.psum(vec, name)
    ctr.collective(2 * (p - 1) * n * 4 // p, 2 * log2_ceil(p))
    return out, 0


def axis_dense_allreduce(x, *, comm: AxisComm, nan_policy: str = "propagate",
                         op: str = "dense_allreduce"):
    """The sum of the float32 vector ``x`` over ``comm``'s mesh axis: ``(sum, stats vector)``.

    The argument check of every axis-transport call (the header ``all_gather``:
    sizes agree, and under ``nan_policy="raise"`` no device holds a non-finite
    entry), then one ``psum``. Statistics as the MPI transport's (header plus
    the bandwidth-optimal allreduce volume; ``result_nnz`` is N: the result is
    dense and is not scanned).
    """
    p, name, n = comm.size(op), comm.name, x.shape[0]
    nonfinite = (~jnp.isfinite(x)).any() if NAN_POLICIES[nan_policy] == 0 else False
    _, zero = checked_headers(name, flags=jnp.where(nonfinite, F_NONFINITE, 0), size=n,
                              word=_ext.ALGORITHM_IDS["dense"], cap=n, op=op)
    out = jax.lax.psum(vary(x, name) + zero.astype(jnp.float32), name)
    ctr = Counters()
    ctr.collective(HEADER_BYTES * (p - 1), log2_ceil(p))
    if p > 1:
        ctr.collective(2 * (p - 1) * n * 4 // p, 2 * log2_ceil(p))
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, ctr.value(n), ctr.value(0),
                       ctr.value(_ext.ALGORITHM_IDS["dense"])])
    assert stats.shape == (len(STATS_FIELDS),)
    return out, stats
