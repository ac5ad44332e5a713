"""The region reduce on a mesh axis: split-allgather's first phase on its own.

Device q owns the fixed region ``[q N / P, (q + 1) N / P)``; one ``all_to_all``
sends each owner its slice and the owner sums its region in rank order
(:func:`~jax_sparse_sync.mesh.split_allgather.split_phase1`, the bits of the MPI
transport's ``ffi/collectives/region_reduce.cc`` but for the sign of a zero sum).
Then one ``all_gather`` of the owners' merged counts, as MPI gathers them (the
union's size, ``result_nnz``). Nothing else is gathered: the reduce-scatter of
:func:`jss.sharded_sync`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.checks import checked_headers, local_checks, one_slot_if_empty
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.mesh.common import HEADER_BYTES, SENT, Counters, log2_ceil, vary
from jax_sparse_sync.mesh.split_allgather import split_phase1
from jax_sparse_sync.mesh.streams import canonical_stream
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["axis_region_reduce"]


def axis_region_reduce(values, indices, *, size: int, comm: AxisComm, nan_policy: str = "raise"):
    """This device's region of the sum over the axis of the sparse ``(values,
    indices)``: ``(region f32[ceil(size / P)], stats vector)``, as
    :func:`~jax_sparse_sync.mpi.region_reduce.mpi_region_reduce`."""
    op = "region_reduce"
    n, name, p = int(size), comm.name, comm.size(op)
    values, indices = one_slot_if_empty(values.astype(jnp.float32), indices)
    rank = jax.lax.axis_index(name)
    valid, first_bad, flags = local_checks(values, indices, n, nan_policy)
    keys, vals = canonical_stream(jnp.where(valid, indices, SENT), jnp.where(valid, values, 0.0))
    bounds = jnp.asarray([n * q // p for q in range(p + 1)], jnp.int32)
    starts = jnp.searchsorted(keys, bounds, side="left")
    max_slice = (starts[1:] - starts[:-1]).max().astype(jnp.int32)
    algorithm = _ext.ALGORITHM_IDS[op]
    headers, zero = checked_headers(
        name, flags=flags, first_bad=first_bad, bad_index=indices[first_bad], size=n,
        word=algorithm, cap=values.shape[0], slots=(max_slice, jnp.sum(keys != SENT)), op=op)
    ctr = Counters()
    ctr.collective(HEADER_BYTES * (p - 1), log2_ceil(p))
    keys, vals = vary(keys + zero, name), vary(vals, name)
    region, present, _ = split_phase1(keys, vals, n, name, p, rank, headers[:, 6].max(), ctr)
    merged = jax.lax.all_gather(vary(jnp.sum(present).astype(jnp.int32), name), name,
                                to="invarying")
    ctr.collective(4 * (p - 1), log2_ceil(p))
    dt = ctr.dt
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, merged.sum().astype(dt),
                       jnp.zeros((), dt), ctr.value(algorithm)])
    assert stats.shape == (len(STATS_FIELDS),)
    return region, stats
