"""The allgather of one fixed-size byte payload per device on a mesh axis (``all_gather``).

The mesh-axis twin of :mod:`jax_sparse_sync.mpi.allgather_bytes`: the argument
check every axis-transport call begins with (the header ``all_gather``: the
payload's length and ``param`` agree; under ``nan_policy="raise"`` a device
flagging a NaN/Inf makes every device raise), then one ``all_gather`` of the
payloads, counted as the MPI transport counts its ``MPI_Allgather``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.mesh.checks import checked_headers
from jax_sparse_sync.mesh.common import F_NONFINITE, HEADER_BYTES, Counters, log2_ceil, vary
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["axis_allgather_bytes"]

OP = "allgather_bytes"


def axis_allgather_bytes(payload, non_finite, *, comm: AxisComm, nan_policy: str, param: int):
    """Every device's ``payload`` (uint8 (B,)) over ``comm``'s mesh axis: ``(gathered
    uint8 (P, B), row r device r's, the same on every device; stats vector)``."""
    p, name, nbytes = comm.size(OP), comm.name, payload.shape[0]
    flags = jnp.where(jnp.asarray(non_finite) & (NAN_POLICIES[nan_policy] == 0), F_NONFINITE, 0)
    word = _ext.ALGORITHM_IDS["allgather"]
    _, zero = checked_headers(name, flags=flags, size=nbytes, word=word, cap=nbytes,
                              param=int(param), op=OP)
    # the gather depends on the check, so it runs after it
    payload = vary(payload, name) + zero.astype(jnp.uint8)
    gathered = jax.lax.all_gather(payload, name, to="invarying")
    ctr = Counters()
    ctr.collective(HEADER_BYTES * (p - 1), log2_ceil(p))
    if p > 1 and nbytes:
        ctr.collective(nbytes * (p - 1), log2_ceil(p))
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, ctr.value(0), ctr.value(0),
                       ctr.value(word)])
    assert stats.shape == (len(STATS_FIELDS),)
    return gathered, stats
