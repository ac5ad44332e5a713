"""``grouped_topk_sync``'s update: one selection and one non-blocking sparse
allreduce per group of gradient leaves (a layer-grouping plan, ASC-WFBP).

Each group (leaves in backward order) is accumulated with its slice of the
residual, gets its own top-k (``k_g = round(k * n_g / N)``, at least 1, so the
total stays about k), and is started with ``jss.sparse_allreduce_start`` as
soon as its gradients exist: XLA places the start between the remaining
backward-pass operations (measured on XLA:CPU, see benchmarks/grouping.py),
so the group is on the wire while the earlier layers' gradients are computed.
A ``"normal"`` group starts with ``wait_for_previous`` (the worker thread
waits for the link, XLA's thread does not), a ``"simultaneous"`` one runs
concurrently with those in flight, at most the plan's ``max_concurrent`` at
once (``max_in_flight``, as the planner's model). The argument check is deferred to the
worker (``defer_checks``), so a start never waits for the other ranks. All
dones come after the last start; every rank issues the same sequence (the
plan is the same on every rank: computed from the same profile and
calibration, see ``jss.planning.plan_grouping``).

The residual keeps the flat tree-order layout of the ungrouped path, so a
state checkpoints and restores the same way whatever the plan.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.mpi.nonblocking import MAX_WINDOW
from jax_sparse_sync.ops.nonblocking import sparse_allreduce_done, sparse_allreduce_start
from jax_sparse_sync.kernels.selection import residual_update, topk
from jax_sparse_sync.stats import STATS_FIELDS, saturating_sum
from jax_sparse_sync.transforms.flat import accumulate_topk
from jax_sparse_sync.transforms.selection_policy import kth_magnitude_of
from jax_sparse_sync.transforms.topk_sync_state import keep_wire_rounding

__all__ = ["normalize_groups", "grouped_sync"]

KINDS = ("normal", "simultaneous")


def normalize_groups(grouping, num_leaves: int, op: str = "topk_sync") -> tuple:
    """``((leaf ids...), kind)`` per group from a ``GroupingPlan`` (anything with
    ``.groups`` of objects with ``leaves`` and ``kind``) or a sequence of
    ``(leaves, kind)`` pairs; checks every leaf appears exactly once."""
    groups = getattr(grouping, "groups", grouping)
    out = []
    for g in groups:
        leaves, kind = (g.leaves, g.kind) if hasattr(g, "leaves") else g
        if kind not in KINDS:
            raise ValueError(f"jax_sparse_sync.{op}: a group's kind must be one of {KINDS}; "
                             f"got {kind!r}")
        out.append((tuple(int(i) for i in leaves), kind))
    seen = sorted(i for leaves, _ in out for i in leaves)
    if seen != list(range(num_leaves)):
        raise ValueError(
            f"jax_sparse_sync.{op}: `grouping` must cover each of the {num_leaves} gradient leaves "
            f"exactly once (tree-order indices); it covers {len(seen)} ids "
            f"{'with repeats' if len(set(seen)) != len(seen) else ''}. Was the plan made for "
            "other parameters? Make it from jss.planning.profile_backward of this model.")
    if any(not leaves for leaves, _ in out):
        raise ValueError(f"jax_sparse_sync.{op}: `grouping` has an empty group")
    return tuple(out)


def grouped_sync(residual, leaves, groups, *, k_total: int, dtype, algorithm, comm, nan_policy,
                 seed, max_concurrent: int | None = None, last_kth=None, wire_dtype=None,
                 index_encoding: str = "int32", wire: int = 0):
    """Returns ``(summed per leaf (flat f32, tree order), new residual, stats vector,
    kept count, smallest k-th magnitude of the groups)``. ``max_concurrent``: simultaneous
    groups in flight at most (``None``: no limit but the transport's 8 slots).
    ``last_kth``: the previous step's returned k-th magnitude, the hint of each float32
    group's fused accumulate-and-select (``accumulate_topk``). ``wire_dtype`` /
    ``index_encoding``: the sparse allreduce's wire format; ``wire``: the value
    dtype's id (what rounding drops stays in the residual)."""
    wire_format = dict(wire_dtype=wire_dtype, index_encoding=index_encoding)
    sizes = [int(np.prod(jnp.shape(x), dtype=np.int64)) for x in leaves]
    offsets = [0] + np.cumsum(sizes).tolist()
    total = offsets[-1]
    pending, accs = [], []
    # Within a group the entries are laid out in tree order (the selection does not
    # depend on the order): a group of consecutive leaves is then one slice of the
    # residual plus the concatenated gradients, and the new residual is the groups'
    # buffers concatenated, with no per-leaf pieces for XLA to shuffle.
    groups = tuple((tuple(sorted(ids)), kind) for ids, kind in groups)
    kths = []
    for ids, kind in groups:
        consecutive = ids == tuple(range(ids[0], ids[-1] + 1))
        n = offsets[ids[-1] + 1] - offsets[ids[0]] if consecutive else sum(sizes[i] for i in ids)
        k = min(n, max(1, int(round(k_total * n / total))))
        if k_total >= total:
            # Every entry kept (density 1, e.g. with algorithm="dense": a grouped dense
            # sync): the exact top-k of all n entries is the accumulator itself in index
            # order, so no selection runs; bit for bit what the paths below compute.
            grads = [jnp.ravel(leaves[i]).astype(dtype) for i in ids]
            res = (jax.lax.slice_in_dim(residual, offsets[ids[0]], offsets[ids[-1] + 1])
                   if consecutive else jnp.concatenate(
                       [jax.lax.slice_in_dim(residual, offsets[i], offsets[i + 1]) for i in ids]))
            acc = res.astype(dtype) + (grads[0] if len(grads) == 1 else jnp.concatenate(grads))
            values = acc.astype(jnp.float32)
            indices = jnp.arange(n, dtype=jnp.int32)
            kths.append(jnp.float32(0.0))  # no hint needed: nothing is selected
            pending.append(_start(values, indices, n, kind, algorithm, comm, nan_policy, seed,
                                  max_concurrent, wire_format))
            accs.append((keep_wire_rounding(jnp.zeros((n,), acc.dtype), values, indices, wire),
                         k))
            continue
        if jnp.dtype(dtype) == jnp.float32:
            # The ungrouped step's kernel on the group's slice: the residual and the
            # group's gradient leaves added and selected in one pass, from a short
            # list when the last k-th magnitude still holds (no concatenation of the
            # gradients, no second and third read of the accumulator). Bit for bit
            # what the path below computes. A group whose leaves are not consecutive
            # in tree order (a planner's boundary between a layer's bias and its
            # kernel) gets its residual pieces gathered into one buffer first: one
            # copy of n floats, where the general path below took 14x the
            # consecutive group's time (MLP 7.9M, 2 groups: 1000 vs 72 ms)
            group_residual = (
                jax.lax.slice_in_dim(residual, offsets[ids[0]], offsets[ids[-1] + 1])
                if consecutive else jnp.concatenate(
                    [jax.lax.slice_in_dim(residual, offsets[i], offsets[i + 1]) for i in ids]))
            acc, values, indices, _ = accumulate_topk(
                group_residual, [leaves[i] for i in ids], k, last_kth=last_kth)
            kths.append(kth_magnitude_of(values))
            pending.append(_start(values, indices, n, kind, algorithm, comm, nan_policy, seed,
                                  max_concurrent, wire_format))
            accs.append((keep_wire_rounding(residual_update(acc, indices), values, indices, wire),
                         k))
            continue
        grads = [jnp.ravel(leaves[i]).astype(dtype) for i in ids]
        if len(grads) > 1:
            # XLA:CPU otherwise fuses the weight-gradient producers into the
            # concatenation's loop (measured: MLP 7.5M, 3 groups of 2-4 leaves,
            # 125 ms a step against 45 ms with one group per leaf)
            grads = list(jax.lax.optimization_barrier(grads))
        if consecutive:
            acc = (jax.lax.slice_in_dim(residual, offsets[ids[0]], offsets[ids[-1] + 1])
                   .astype(dtype) + (grads[0] if len(grads) == 1 else jnp.concatenate(grads)))
        else:
            parts = [jax.lax.slice_in_dim(residual, offsets[i], offsets[i + 1]).astype(dtype)
                     + g for i, g in zip(ids, grads)]
            acc = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
        values, indices = topk(acc.astype(jnp.float32), k)
        kths.append(kth_magnitude_of(values))
        pending.append(_start(values, indices, n, kind, algorithm, comm, nan_policy, seed,
                              max_concurrent, wire_format))
        accs.append((keep_wire_rounding(residual_update(acc, indices) if acc.dtype == jnp.float32
                                        else acc.at[indices].set(0), values, indices, wire), k))
    sums, stats = [], []
    for p in pending:
        s, st = sparse_allreduce_done(p, return_stats=True)
        sums.append(s)
        stats.append(jnp.stack([jnp.asarray(x) for x in st]))
    # back to tree order
    piece_sum, piece_res = {}, {}
    for (ids, _), s, (r, _) in zip(groups, sums, accs):
        lo = 0
        for i in ids:
            piece_sum[i] = jax.lax.slice_in_dim(s, lo, lo + sizes[i])
            piece_res[i] = jax.lax.slice_in_dim(r, lo, lo + sizes[i])
            lo += sizes[i]
    order = range(len(leaves))
    if all(ids == tuple(range(ids[0], ids[-1] + 1)) for ids, _ in groups):
        by_start = sorted(range(len(groups)), key=lambda g: groups[g][0][0])
        new_residual = jnp.concatenate([accs[g][0] for g in by_start]) if len(groups) > 1 \
            else accs[0][0]
    else:
        new_residual = jnp.concatenate([piece_res[i] for i in order]) if len(leaves) > 1 \
            else piece_res[0]
    stats = jnp.stack(stats)
    # bytes, messages, nnz and dense switches add up over the groups; the algorithm is the last's
    alg = STATS_FIELDS.index("algorithm")
    summed_stats = saturating_sum(stats, axis=0).at[alg].set(stats[-1, alg])  # no wrap
    kept = sum(k for _, k in accs)
    # one hint for every group (the state keeps one scalar, whatever the plan):
    # the smallest group's k-th magnitude lists at least k_g entries in each group
    # whose magnitudes did not fall, and the kernel checks the rest
    kth = jnp.min(jnp.stack(kths))
    return [piece_sum[i] for i in order], new_residual, summed_stats, kept, kth


def _start(values, indices, n, kind, algorithm, comm, nan_policy, seed, max_concurrent,
           wire_format):
    return sparse_allreduce_start(
        values, indices, size=n, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
        seed=seed, wait_for_previous=(kind == "normal"),
        max_in_flight=(min(max_concurrent, MAX_WINDOW)
                       if kind == "simultaneous" and max_concurrent else None),
        defer_checks=True, **wire_format)
