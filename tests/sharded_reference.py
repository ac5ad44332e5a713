"""The reference of ``jss.sharded_sync``: P ranks simulated in one process.

NumPy does everything the sync itself does: each rank's error-feedback top-k,
the fixed owner regions, the owners' sums in rank order, the change's
compression (the owner's own top-k and residual, the lazy mask, the dense
region) and the change every rank applies. The owner's optimizer is the inner
Optax transformation itself (jitted, on the owner's region), as a black box:
the reference checks the sharding, not Optax's arithmetic. The transports must
equal it bit for bit.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from reference import topk_reference


class ShardedRun(NamedTuple):
    params: np.ndarray          # after the last step
    residuals: list             # per rank, (N,)
    inner: list                 # per owner, the inner state (NumPy leaves)
    change_residuals: list      # per owner, (slot,) (topk), else empty
    reduce_sent: list           # last step: per rank, its entries per owner (region reduce)
    change_sent: list           # last step: per owner, the change's entries it sent
    reduce_union: int           # last step: the entries the owners summed (all regions)


def regions(n: int, p: int) -> list[tuple[int, int]]:
    return [(n * q // p, n * (q + 1) // p) for q in range(p)]


def slot_of(n: int, p: int) -> int:
    return -(-n // p)


def padded_region(x: np.ndarray, lo: int, hi: int, slot: int) -> np.ndarray:
    out = np.zeros(slot, np.float32)
    out[:hi - lo] = x[lo:hi]
    return out


@functools.cache
def _owner_update(inner, p: int, clip: bool):
    """The owner's step: its region's sum over ranks / P (times the clip's scale with
    ``clip``), then the inner optimizer, written as the step writes it, so that XLA fuses
    and contracts the same operations (on MPI; a mesh axis's program may contract the
    clipped step otherwise: tests/axis/axis_sharded_cases.py)."""
    if clip:
        return jax.jit(lambda total, scale, state, prm: inner.update(
            (total / np.float32(p)) * scale, state, prm))
    return jax.jit(lambda total, scale, state, prm: inner.update(total / np.float32(p), state,
                                                                 prm))


@functools.cache
def _owner_square_sum(p: int):
    """An owner's sum of squares of its region's mean gradient (the clip's part): the
    step's dot product, jitted (XLA:CPU's dot routine, so the same order of additions)."""
    return jax.jit(lambda total: (lambda g: jnp.dot(g, g, precision=jax.lax.Precision.HIGHEST))(
        total / np.float32(p)))


def clip_scale(totals, p: int, max_grad_norm: float):
    """The scale of the owners' mean gradients clipped by their global norm: the owners'
    sums of squares added in rank order, ``max_grad_norm / norm`` where the norm is larger
    (``optax.clip_by_global_norm``'s rule), else 1."""
    if max_grad_norm is None:
        return np.float32(1.0)
    total = np.float32(0.0)
    for q, t in enumerate(totals):
        part = np.float32(_owner_square_sum(p)(t))
        total = part if q == 0 else np.float32(total + part)
    norm = np.sqrt(total, dtype=np.float32)
    limit = np.float32(max_grad_norm)
    return np.float32(1.0) if norm < limit else np.float32(limit / norm)


def sharded_sync_reference(params0, grad_fns, *, k: int, steps: int, inner, change: str,
                           change_k: int = 0, start=None, first_step: int = 0,
                           max_grad_norm: float | None = None) -> ShardedRun:
    """``steps`` steps of ``jss.sharded_sync(inner, k=k, change=change,
    max_grad_norm=max_grad_norm)`` on ``len(grad_fns)`` ranks; ``grad_fns[r](params,
    step)`` is rank r's gradient. ``start``: ``(residuals, inner states, change
    residuals)`` per rank to continue from (a restored state) instead of a fresh one,
    at step ``first_step``."""
    p, n = len(grad_fns), params0.size
    slot, bounds = slot_of(n, p), regions(n, p)
    owner_update = _owner_update(inner, p, max_grad_norm is not None)
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros(n, np.float32) for _ in range(p)]
    states = [jax.tree_util.tree_map(np.asarray, inner.init(padded_region(params, lo, hi, slot)))
              for lo, hi in bounds]
    change_res = [np.zeros(slot if change == "topk" else 0, np.float32) for _ in range(p)]
    if start is not None:
        residuals, states, change_res = (list(x) for x in start)
    for step in range(first_step, first_step + steps):
        totals = [np.zeros(slot, np.float32) for _ in range(p)]
        reduce_sent, union = [], np.zeros(n, bool)
        for r in range(p):  # rank order: the owners' sums
            acc = residuals[r] + grad_fns[r](params, step).astype(np.float32)
            values, idx = topk_reference(acc, k)
            residuals[r] = acc.copy()
            residuals[r][idx] = 0.0
            union[idx] = True
            reduce_sent.append([int(np.sum((idx >= lo) & (idx < hi))) for lo, hi in bounds])
            for q, (lo, hi) in enumerate(bounds):
                part = np.zeros(slot, np.float32)
                mine = (idx >= lo) & (idx < hi)
                part[idx[mine] - lo] = values[mine]
                totals[q] = totals[q] + part
        applied = np.zeros(n, np.float32)
        change_sent = []
        scale = clip_scale(totals, p, max_grad_norm)
        for q, (lo, hi) in enumerate(bounds):
            update, new_state = owner_update(totals[q], scale, states[q],
                                             padded_region(params, lo, hi, slot))
            update = np.asarray(update, np.float32).copy()
            new_state = jax.tree_util.tree_map(np.asarray, new_state)
            valid = np.arange(slot) < hi - lo
            if change == "lazy":
                touched = totals[q] != 0
                new_state = jax.tree_util.tree_map(
                    lambda new, old: np.where(touched, new, old)
                    if np.ndim(old) == 1 and np.shape(old)[0] == slot else new,
                    new_state, states[q])
                valid = valid & touched
            update[~valid] = 0.0
            states[q] = new_state
            if change == "topk":
                acc = change_res[q] + update
                values, local = topk_reference(acc, change_k)
                sent = local < hi - lo
                applied[lo + local[sent]] = values[sent]
                change_res[q] = acc.copy()
                change_res[q][local] = 0.0
                change_sent.append(int(sent.sum()))
            else:
                applied[lo:hi] = np.where(valid[:hi - lo], update[:hi - lo], 0.0)
                change_sent.append(int(valid.sum()))
        params = (params + applied).astype(np.float32)
    return ShardedRun(params, residuals, states, change_res, reduce_sent, change_sent,
                      int(union.sum()))
