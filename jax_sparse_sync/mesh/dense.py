"""``dense`` on the axis transport: one ``psum`` of the dense vector.

:func:`dense_sum` is the sparse allreduce's ``algorithm="dense"`` (COO input,
densified first); :func:`axis_dense_allreduce` is :func:`jss.dense_allreduce`
on a mesh axis: the dense vector itself, ``psum``-ed, with no index array.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.checks import checked_headers
from jax_sparse_sync.mesh.common import (F_NONFINITE, HEADER_BYTES, Counters, log2_ceil, vary)
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["dense_sum", "sum_on_16bit_wire", "axis_dense_allreduce"]


def dense_sum(values, indices, n, name, p, ctr):
    vec = jnp.zeros((n,), jnp.float32).at[jnp.where(indices < 0, n, indices)].add(
        values, mode="drop")
    out = jax.lax.psum(vec, name)
    ctr.collective(2 * (p - 1) * n * 4 // p, 2 * log2_ceil(p))
    return out, 0


def sum_on_16bit_wire(x, name, p, wire):
    """The MPI transport's 16-bit wire (``ffi/collectives/dense_and_allgather.cc``) with JAX collectives:
    ``all_to_all`` of the vector rounded to ``wire`` in P blocks, each device's block
    summed in float32 in rank order and rounded once, ``all_gather`` of the blocks."""
    n = x.shape[0]
    block = -(-n // p)
    blocks = jnp.pad(x, (0, block * p - n)).astype(wire).reshape(p, block)
    received = jax.lax.all_to_all(blocks, name, 0, 0, tiled=True)  # row r: from device r
    acc = received[0].astype(jnp.float32)
    for r in range(1, p):
        acc = acc + received[r].astype(jnp.float32)
    gathered = jax.lax.all_gather(acc.astype(wire), name, tiled=True)
    return gathered[:n].astype(jnp.float32), block


def axis_dense_allreduce(x, *, comm: AxisComm, nan_policy: str = "propagate",
                         wire_dtype: int = 0, op: str = "dense_allreduce"):
    """The sum of the float32 vector ``x`` over ``comm``'s mesh axis: ``(sum, stats vector)``.

    The argument check of every axis-transport call (the header ``all_gather``:
    sizes agree, and under ``nan_policy="raise"`` no device holds a non-finite
    entry), then one ``psum``. Statistics as the MPI transport's (header plus
    the bandwidth-optimal allreduce volume; ``result_nnz`` is N: the result is
    dense and is not scanned). ``wire_dtype`` 1 / 2: the bfloat16 / float16
    wire of the MPI transport, with ``all_to_all`` and ``all_gather``.
    """
    p, name, n = comm.size(op), comm.name, x.shape[0]
    nonfinite = (~jnp.isfinite(x)).any() if NAN_POLICIES[nan_policy] == 0 else False
    _, zero = checked_headers(name, flags=jnp.where(nonfinite, F_NONFINITE, 0), size=n,
                              word=_ext.ALGORITHM_IDS["dense"], cap=n, param=int(wire_dtype),
                              op=op)
    x = vary(x, name) + zero.astype(jnp.float32)
    ctr = Counters()
    ctr.collective(HEADER_BYTES * (p - 1), log2_ceil(p))
    if wire_dtype and n:
        out, block = sum_on_16bit_wire(x, name, p, (None, jnp.bfloat16, jnp.float16)[wire_dtype])
        ctr.collective(2 * (p - 1) * block * 2, (p - 1) + log2_ceil(p))
    else:
        out = jax.lax.psum(x, name)
        if p > 1:
            ctr.collective(2 * (p - 1) * n * 4 // p, 2 * log2_ceil(p))
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, ctr.value(n), ctr.value(0),
                       ctr.value(_ext.ALGORITHM_IDS["dense"])])
    assert stats.shape == (len(STATS_FIELDS),)
    return out, stats
