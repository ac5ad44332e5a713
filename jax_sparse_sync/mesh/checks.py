"""The argument check every axis-transport call begins with (MPI's header allgather).

Each device checks its own contribution (:func:`local_checks`), then all
devices gather every header (:func:`checked_headers`), so a bad index, a NaN
under ``nan_policy="raise"`` or arguments that differ across devices are seen
by all devices at once and raised together with the MPI transport's messages:
nobody is left waiting in a collective.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.common import (F_BAD_BOUNDARIES, F_BAD_INDEX, F_NONFINITE, HEADER_WORDS,
                                         vary)
from jax_sparse_sync.base.arguments import NAN_POLICIES

__all__ = ["header_error", "raise_on_error", "one_slot_if_empty", "local_checks",
           "checked_headers"]


def header_error(h: np.ndarray, size: int, op: str) -> str | None:
    """The MPI transport's messages, from the gathered headers (numpy, on the host)."""
    h = np.asarray(h).astype(np.int64)
    first = h[0]
    for r in range(h.shape[0]):
        if h[r, 3] != first[3]:
            return (f"jax_sparse_sync.{op}: `size` differs across ranks: rank 0 passed "
                    f"size={first[3]} but rank {r} passed size={h[r, 3]}. Every rank must pass "
                    "the same dense size (the same model, flattened the same way).")
        if h[r, 4] != first[4]:
            names = {v: k for k, v in _ext.ALGORITHM_IDS.items()}

            def describe(word):
                d = names.get(int(word) & 0xFFFF, str(int(word) & 0xFFFF))
                bits, wire = (int(word) >> 16) & 0xFF, (int(word) >> 24) & 0xF
                return (d + (f" (quantize_bits={bits})" if bits else "")
                        + (f" (wire_dtype={('bfloat16', 'float16')[wire - 1]})" if wire else ""))
            return (f"jax_sparse_sync.{op}: `algorithm` differs across ranks (rank 0 uses "
                    f"'{describe(first[4])}', rank {r} uses '{describe(h[r, 4])}'). Pass the "
                    "same algorithm on every rank; algorithm='auto' decides from values that "
                    "are equal on all ranks.")
        if h[r, 5] != first[5]:
            return (f"jax_sparse_sync.{op}: the capacity of `values` differs across ranks: rank 0 "
                    f"passed {first[5]} slots but rank {r} passed {h[r, 5]}. Every process must "
                    "trace the same step (the same shapes).")
        if h[r, 8] != first[8]:
            pname = "block_size" if (int(first[4]) & 0xFFFF) == _ext.ALGORITHM_IDS["block"] else "k"
            return (f"jax_sparse_sync.{op}: `{pname}` differs across ranks: rank 0 passed "
                    f"{pname}={first[8]} but rank {r} passed {pname}={h[r, 8]}. Pass the same "
                    "value on every rank.")
        if h[r, 0] & F_BAD_INDEX:
            return (f"jax_sparse_sync.{op}: `indices` out of range on rank {r}: "
                    f"indices[{h[r, 1]}] = {h[r, 2]} is not in [0, size={size}). Use index -1 "
                    "for padding slots (value 0).")
    bad = [r for r in range(h.shape[0]) if h[r, 0] & F_NONFINITE]
    if bad:
        return (f"jax_sparse_sync.{op}: non-finite (NaN or Inf) entries in `values` on rank(s) "
                f"{', '.join(map(str, bad))}. The gradient diverged or the loss produced NaN; "
                "fix the model, lower the learning rate, or pass nan_policy='propagate' to let "
                "non-finite values reach the sum as a dense allreduce would.")
    if any(h[r, 0] & F_BAD_BOUNDARIES for r in range(h.shape[0])):
        return (f"jax_sparse_sync.{op}: `boundaries` must start at 0, end at `size` and never "
                "decrease (pass recompute_boundaries=True to compute them)")
    return None


def raise_on_error(h, *, size, op):
    msg = header_error(h, size, op)
    if msg is not None:
        raise ValueError(msg)


def one_slot_if_empty(values, indices):
    """An empty contribution as one padding slot (value 0, index -1): the
    exchanges then need no special path for it."""
    if values.shape[0] == 0:
        return jnp.zeros((1,), jnp.float32), jnp.full((1,), -1, jnp.int32)
    return values, indices


def local_checks(values, indices, n: int, nan_policy: str):
    """A device's checks of its contribution before any exchange, as the MPI
    handlers make them: an index outside ``[-1, n)``, and under
    ``nan_policy="raise"`` a non-finite value in a valid slot. Returns
    ``(valid, first_bad, flags)``: which slots hold an entry, the position of
    the first bad index, and the header flags (F_BAD_INDEX | F_NONFINITE)."""
    bad = (indices < -1) | (indices >= n)
    valid = (indices >= 0) & ~bad
    first_bad = jnp.argmax(bad).astype(jnp.int32)
    nonfinite = (valid & ~jnp.isfinite(values)).any() if NAN_POLICIES[nan_policy] == 0 \
        else jnp.asarray(False)
    flags = jnp.where(bad.any(), F_BAD_INDEX, 0) | jnp.where(nonfinite, F_NONFINITE, 0)
    return valid, first_bad, flags


def checked_headers(name, *, flags, size: int, word: int, op: str, first_bad=0, bad_index=0,
                    cap: int = 0, param: int = 0, slots=(0, 0)):
    """The argument check of every axis-transport call (MPI's header allgather).

    Every device contributes a header (its error flags, the first bad index,
    what must agree: size, algorithm word, capacity, ``param`` (Ok-Topk's k,
    the block size), and two algorithm-specific counts in ``slots``); all
    devices gather all headers, so they all see the same error and raise it
    together through a host callback (nobody is left waiting in a collective).

    Returns ``(headers [P, HEADER_WORDS] int32, zero)``: add ``zero`` (an int32
    0 that depends on the check) to the data so the collectives run after it.
    """
    header = jnp.zeros((HEADER_WORDS,), jnp.int32).at[:9].set(jnp.stack([
        jnp.asarray(flags, jnp.int32), jnp.asarray(first_bad, jnp.int32),
        jnp.asarray(bad_index, jnp.int32), jnp.int32(size), jnp.int32(word), jnp.int32(cap),
        jnp.asarray(slots[0], jnp.int32), jnp.asarray(slots[1], jnp.int32), jnp.int32(param)]))
    headers = jax.lax.all_gather(vary(header, name), name, to="invarying")  # [P, HEADER_WORDS]
    error = ((headers[:, 0] != 0) | (headers[:, 3] != headers[0, 3])
             | (headers[:, 4] != headers[0, 4]) | (headers[:, 5] != headers[0, 5])
             | (headers[:, 8] != headers[0, 8])).any()

    def fail():
        jax.debug.callback(raise_on_error, headers, size=size, op=op)
        return jnp.int32(0)

    # Every device sees the same headers, so all raise together (nobody waits in a
    # collective); the data collectives depend on the check, so they come after it.
    return headers, jax.lax.cond(error, fail, lambda: jnp.int32(0))
