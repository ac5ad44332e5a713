"""Shared pieces of the axis transport: constants, bit casts and the wire counters.

Every axis algorithm works on a device's sorted unique stream of
``(keys, vals)``; padding slots carry key :data:`SENT`. The counters follow the
counting conventions of :mod:`jax_sparse_sync.stats` (see the table in
:mod:`jax_sparse_sync.mesh.sparse_allreduce`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.base.arguments import round_to_wire
from jax_sparse_sync.base.jax_compat import vary
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.stats import stats_dtype

__all__ = ["SENT", "HEADER_WORDS", "HEADER_BYTES", "F_BAD_INDEX", "F_NONFINITE",
           "F_BAD_BOUNDARIES", "log2_ceil", "vary", "f2i", "i2f", "uniform_max", "Counters",
           "WIRE16", "wire_words", "pack_entries", "unpack_entries", "round_to_wire"]

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


#: wire dtype id (``base.arguments.WIRE_DTYPES``) -> its 16-bit JAX dtype
WIRE16 = {1: jnp.bfloat16, 2: jnp.float16}


def wire_words(c: int, wire: int) -> int:
    """int32 words of a message of ``c`` entries: ``c`` indices, then ``c`` float32
    values (``wire`` 0) or ``c`` 16-bit values two to a word (1 bfloat16, 2 float16)."""
    return 2 * c if wire == 0 else c + (c + 1) // 2


def pack_entries(idx, vals, wire: int):
    """``idx`` int32 ``[..., c]`` and ``vals`` float32 ``[..., c]`` -> one int32 message
    ``[..., wire_words(c, wire)]``; 16-bit values are rounded to nearest even (as the
    MPI transport's ``ffi/collectives/wire_codec.h``)."""
    if wire == 0:
        return jnp.concatenate([idx, f2i(vals)], axis=-1)
    c = idx.shape[-1]
    v = vals.astype(WIRE16[wire])
    if c % 2:
        v = jnp.concatenate([v, jnp.zeros(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    words = jax.lax.bitcast_convert_type(v.reshape(v.shape[:-1] + (-1, 2)), jnp.int32)
    return jnp.concatenate([idx, words], axis=-1)


def unpack_entries(msg, c: int, wire: int):
    """The inverse of :func:`pack_entries`: ``(idx int32 [..., c], vals float32 [..., c])``."""
    idx = msg[..., :c]
    if wire == 0:
        return idx, i2f(msg[..., c:])
    halves = jax.lax.bitcast_convert_type(msg[..., c:], WIRE16[wire])  # [..., ceil(c/2), 2]
    return idx, halves.reshape(halves.shape[:-2] + (-1,))[..., :c].astype(jnp.float32)


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
