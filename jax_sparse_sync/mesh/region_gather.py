"""The region gather on a mesh axis: one ``all_gather`` of every owner's entries.

:func:`jss.sharded_sync`'s second exchange. Each device's entries lie in its own
region, so nothing needs reducing: after the argument check (MPI's header
allgather), one ``all_gather`` brings every device each owner's entries, written
into the dense result (the regions are disjoint: every rank writes the same
bits). The message has a static shape: the entries' capacity (8 bytes a slot)
or, where that is larger, the region dense (``4 ceil(N / P)`` bytes, its entries
scattered into it first), always dense with ``dense=True``. So the counts here
are the capacity's, where MPI's split-allgather counts the entries sent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.checks import checked_headers, local_checks, one_slot_if_empty
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.mesh.common import (HEADER_BYTES, Counters, log2_ceil, pack_entries,
                                         unpack_entries, vary)
from jax_sparse_sync.mesh.split_allgather import assemble
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["axis_region_gather"]


def axis_region_gather(values, indices, *, size: int, dense: bool, comm: AxisComm,
                       nan_policy: str = "raise"):
    """``(the dense (size,) vector of every device's entries, stats vector)``, as
    :func:`~jax_sparse_sync.mpi.region_gather.mpi_region_gather`."""
    op = "region_gather"
    n, name, p = int(size), comm.name, comm.size(op)
    values, indices = one_slot_if_empty(values.astype(jnp.float32), indices)
    cap = values.shape[0]
    bounds = [n * q // p for q in range(p + 1)]
    slot = -(-n // p)
    valid, first_bad, flags = local_checks(values, indices, n, nan_policy)
    algorithm = _ext.ALGORITHM_IDS["dsar_split_allgather" if dense else "split_allgather"]
    _, zero = checked_headers(name, flags=flags, first_bad=first_bad,
                              bad_index=indices[first_bad], size=n, word=algorithm, cap=cap,
                              op=op)
    ctr = Counters()
    lg = log2_ceil(p)
    ctr.collective(HEADER_BYTES * (p - 1), lg)
    keys = jnp.where(valid, indices, n) + zero
    vals = jnp.where(valid, values, 0.0)
    if dense or 2 * cap > slot:  # the region dense: fewer bytes than the entries' slots
        lo = jnp.asarray(bounds, jnp.int32)[jax.lax.axis_index(name)]
        region = jnp.zeros((slot,), jnp.float32).at[keys - lo].set(vals, mode="drop",
                                                                  unique_indices=True)
        out = assemble(jax.lax.all_gather(vary(region, name), name, to="invarying"), bounds)
        ctr.collective(4 * slot * (p - 1), lg)
        switched = 1
    else:
        rows = jax.lax.all_gather(vary(pack_entries(keys, vals, 0), name), name, to="invarying")
        ks, vs = unpack_entries(rows, cap, 0)
        out = jnp.zeros((n,), jnp.float32).at[ks.reshape(-1)].set(vs.reshape(-1), mode="drop",
                                                                  unique_indices=True)
        ctr.collective(8 * cap * (p - 1), lg)
        switched = 0
    dt = ctr.dt
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, jnp.count_nonzero(out).astype(dt),
                       jnp.asarray(switched, dt), ctr.value(algorithm)])
    assert stats.shape == (len(STATS_FIELDS),)
    return out, stats
