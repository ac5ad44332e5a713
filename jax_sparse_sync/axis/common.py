"""Shared pieces of the axis transport: constants, bit casts and the wire counters.

Every axis algorithm works on a device's sorted unique stream of
``(keys, vals)``; padding slots carry key :data:`SENT`. The counters follow the
counting conventions of :mod:`jax_sparse_sync.stats` (see the table in
:mod:`jax_sparse_sync.axis.sparse_allreduce`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.base.jax_compat import vary
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.stats import stats_dtype

__all__ = ["SENT", "HEADER_WORDS", "HEADER_BYTES", "F_BAD_INDEX", "F_NONFINITE",
           "F_BAD_BOUNDARIES", "log2_ceil", "vary", "f2i", "i2f", "uniform_max", "Counters"]

SENT = np.int32(2**31 - 1)   # sort key of a padding slot: after every real index
HEADER_WORDS = max(8, cost_model.HEADER_BYTES // 4)  # int32 words: as many bytes as MPI's
HEADER_BYTES = 4 * HEADER_WORDS  # header bytes sent to each peer
F_BAD_INDEX, F_NONFINITE, F_BAD_BOUNDARIES = 1, 2, 4

def log2_ceil(p: int) -> int:
    return (p - 1).bit_length() if p > 1 else 0


def f2i(v):
    return jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)


def i2f(i):
    return jax.lax.bitcast_convert_type(i, jnp.float32)


def uniform_max(x, name):
    """max over the axis of an int32 scalar, typed invariant (an all_gather, as MPI's counts)."""
    return jax.lax.all_gather(vary(jnp.asarray(x, jnp.int32), name), name, to="invarying").max()


class Counters:
    """bytes_sent / bytes_received / messages of this device, saturating like the C++ ones."""

    def __init__(self):
        self.dt = stats_dtype()
        self.lim = int(np.iinfo(self.dt).max)
        self.sent = self.received = self.messages = jnp.zeros((), self.dt)

    def value(self, amount):
        if isinstance(amount, (int, np.integer)):
            return jnp.asarray(min(int(amount), self.lim), self.dt)
        return jnp.asarray(amount).astype(self.dt)

    def table(self, amounts, index):
        """One of several static amounts, picked by a traced index."""
        return jnp.asarray([min(int(a), self.lim) for a in amounts], self.dt)[index]

    def _add(self, cur, amount, when):
        a = jnp.where(when, self.value(amount), 0).astype(self.dt)
        return jnp.where(cur > self.lim - a, self.lim, cur + a).astype(self.dt)

    def add(self, sent=0, received=0, messages=0, *, send=True, recv=True):
        self.sent = self._add(self.sent, sent, send)
        self.received = self._add(self.received, received, recv)
        self.messages = self._add(self.messages, messages, send)

    def collective(self, nbytes: int, messages: int):
        """A collective where every device sends and receives ``nbytes``."""
        self.add(nbytes, nbytes, messages)
