"""Measuring the local-work term of the cost model: each sync transform's O(N) work.

The local work of a transform's update is everything but the wire: adding
the gradient to the residual, selecting, writing the dense result, cutting it
into the update's leaves. It is timed as the difference between two jitted
steps on synthetic parameters (16 leaves), ``params - lr * tx.update(grads)``
(each step's gradient drawn from a pool of :data:`GRADIENT_POOL`, after
:data:`WARMUP_STEPS` untimed steps)
with the transform on a one-rank communicator (``MPI.COMM_SELF``: the same
kernels, nothing on the wire) and ``params - lr * grads``, at two or more
sizes and (for the sparse transforms) two densities, and fitted as
``fixed_s + per_entry_s * N + per_kept_s * k``. Every rank of the calling
communicator measures at the same time, so ranks that share a host see the
same contention as in training; the medians over ranks are fitted.

``topk_sync_group`` is timed as a grouped ``topk_sync`` with one group per
synthetic leaf (:data:`GROUPS_TIMED` groups, all normal), ``dense_sync_group``
the same at density 1 with ``algorithm="dense"`` (a grouped dense sync): its fit's fixed part
is divided by the group count (:func:`fit_local_work` with ``groups``), so the
term is one group's, ``fixed_s + per_entry_s * n`` for a group of n entries.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

from jax_sparse_sync.model import cost_model
from jax_sparse_sync.planning.timing import median_seconds
from jax_sparse_sync.transforms.dense_sync import dense_sync
from jax_sparse_sync.transforms.grouped_topk_sync import grouped_topk_sync
from jax_sparse_sync.transforms.oktopk_sync import oktopk_sync
from jax_sparse_sync.transforms.topk_sync import topk_sync

__all__ = ["DEFAULT_LOCAL_SIZES", "GROUPS_TIMED", "synthetic_sizes", "synthetic_tree",
           "time_local_work",
           "fit_local_work", "groups_timed", "GRADIENT_POOL", "WARMUP_STEPS", "gradient_draws"]

DEFAULT_LOCAL_SIZES = (1 << 20, 1 << 22)
GROUPS_TIMED = 16  # synthetic_tree's leaves: one group each for topk_sync_group
_LR = 1e-3


def synthetic_sizes(n: int, leaves: int = 16) -> list[int]:
    """The leaf sizes of :func:`synthetic_tree` (``n`` entries in all)."""
    small = max(1, n // (8 * leaves))
    sizes = [small] * (leaves // 2)
    big = (n - sum(sizes)) // (leaves - len(sizes))
    sizes += [big] * (leaves - len(sizes) - 1)
    sizes.append(n - sum(sizes))
    return sizes


def synthetic_tree(n: int, seed: int = 0, leaves: int = 16) -> dict:
    """``leaves`` float32 leaves with ``n`` entries in all (half matrices' worth of
    entries in the first half of the leaves, like weights and biases)."""
    rng = np.random.default_rng(seed)
    return {f"leaf{i:02d}": jnp.asarray(rng.standard_normal(s, np.float32))
            for i, s in enumerate(synthetic_sizes(n, leaves))}


def _transform(kind: str, density: float, comm=None):
    comm = MPI.COMM_SELF if comm is None else comm
    if kind == "dense_sync":
        return dense_sync(comm=comm)
    if kind == "topk_sync":
        return topk_sync(density=density, comm=comm)
    if kind == "topk_sync_threshold":
        return topk_sync(density=density, comm=comm, selection="threshold_reuse")
    if kind == "oktopk_sync":
        return oktopk_sync(density=density, comm=comm)
    if kind == "topk_sync_group":  # backward order: the last leaf first
        return grouped_topk_sync([((i,), "normal") for i in reversed(range(GROUPS_TIMED))],
                                 density=density, comm=comm)
    if kind == "dense_sync_group":  # every entry kept, no selection, the dense allreduce
        return grouped_topk_sync([((i,), "normal") for i in reversed(range(GROUPS_TIMED))],
                                 density=1.0, algorithm="dense", comm=comm)
    raise ValueError(f"unknown local-work kind {kind!r}; expected one of "
                     f"{cost_model.LOCAL_WORK_KINDS}")


#: gradients the timed steps draw from, and the untimed steps before them: each
#: step takes one of the pool at random, so the accumulators wander like a
#: training run's and ``topk_sync``'s k-th-magnitude hint (``flat.accumulate_topk``)
#: holds, as it does in training after its first few steps (with one fixed
#: gradient every step it rarely holds)
GRADIENT_POOL, WARMUP_STEPS = 4, 10


def gradient_draws(pool, repeats: int):
    """The gradients of ``WARMUP_STEPS + repeats`` steps, each one of ``pool`` at random
    (seeded: every variant timed sees the same sequence)."""
    return iter([pool[i] for i in np.random.default_rng(0).integers(len(pool),
                                                                     size=WARMUP_STEPS + repeats)])


def _median_step(step, state, pool, repeats: int, comm=None) -> float:
    box = [state]  # the step donates its state: thread it through the calls
    draws = gradient_draws(pool, repeats)

    def run():
        box[0] = jax.block_until_ready(step(*box[0], next(draws)))
    # compile, first touch; with comm every step starts after a barrier
    return median_seconds(run, repeats=repeats, warmups=WARMUP_STEPS, comm=comm)


def time_local_work(kind: str, size: int, *, density: float = 0.01, repeats: int = 5,
                    comm=None, transport_comm=None) -> float:
    """Seconds of ``kind``'s local work at ``size`` entries on this rank (see the module doc).

    ``comm`` (collective: every rank of it calls): each timed step starts after a
    barrier, so the ranks run the same step at the same moment, as the steps of a
    data-parallel run do (its collectives keep them in lockstep). Without it ranks
    that share cores drift apart and each sees less contention than in training.

    ``transport_comm``: the communicator the transform syncs over (default
    ``MPI.COMM_SELF``: the same kernels, nothing on the wire). With the real one
    the time includes the wire and everything a sync costs on that transport
    (``calibrate``'s per-group cost,
    :func:`jax_sparse_sync.planning.calibration.measure_group_cost`).
    """
    tx = _transform(kind, density, transport_comm)

    def synced(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return jax.tree_util.tree_map(lambda p, u: p - _LR * u, params, updates), opt_state

    def plain(params, grads):
        return (jax.tree_util.tree_map(lambda p, g: p - _LR * g, params, grads),)

    pool = [synthetic_tree(size, 10 + i) for i in range(GRADIENT_POOL)]
    params = synthetic_tree(size, 2)
    t_sync = _median_step(jax.jit(synced, donate_argnums=(0, 1)), (params, tx.init(params)),
                          pool, repeats, comm)
    t_plain = _median_step(jax.jit(plain, donate_argnums=0), (synthetic_tree(size, 2),), pool,
                           repeats, comm)
    return max(0.0, t_sync - t_plain)


def groups_timed(kind: str) -> int:
    """Sync operations in one timed step of ``kind`` (its fixed part is divided by it)."""
    return GROUPS_TIMED if kind in ("topk_sync_group", "dense_sync_group") else 1


def fit_local_work(sizes, times, groups: int = 1, kept=None) -> tuple[float, float, float]:
    """Least-squares ``(fixed_s, per_entry_s, per_kept_s)`` of ``t = groups * fixed +
    per_entry * N + per_kept * k``, all >= 0 (``groups``: sync operations in each
    timed step; ``kept``: the k of each point, None for no per-kept term; the
    points need two ratios k / N to tell the two slopes apart)."""
    if kept is not None:
        (fixed, per_entry, per_kept), ok = _fit(sizes, times, kept)
        if ok and per_kept >= 0:
            return fixed / groups, per_entry, per_kept
    (fixed, per_entry), ok = _fit(sizes, times)
    if not ok:  # noise at small sizes: all of it per entry
        t, n = np.asarray(times, np.float64), np.asarray(sizes, np.float64)
        return 0.0, float(t.max() / n[t.argmax()]), 0.0
    return fixed / groups, per_entry, 0.0


def _fit(sizes, times, kept=None):
    """Least squares on the columns 1, N (and k); ``ok`` when every slope is > 0 (the
    fixed part is clamped at 0)."""
    n = np.asarray(sizes, np.float64)
    t = np.asarray(times, np.float64)
    columns = [np.ones_like(n), n]
    if kept is not None:
        columns.append(np.asarray(kept, np.float64))
    if n.shape != t.shape or n.size < len(columns) or any(c.shape != n.shape for c in columns):
        raise ValueError(f"fit_local_work: need at least {len(columns)} (size, time"
                         f"{', kept' if kept is not None else ''}) points of equal length")
    coef, *_ = np.linalg.lstsq(np.stack(columns, 1), t, rcond=None)
    ok = bool(np.all(coef[1:] > 0))
    return (max(float(coef[0]), 0.0), *map(float, coef[1:])), ok
