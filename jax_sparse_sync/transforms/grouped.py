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
state checkpoints and restores the same way whatever the plan. Each group's
accumulate-and-select (and, in front of it, ``adam_direction_sync``'s pass) runs
on the group's entries of the whole flat state, in place
(``AccumulatorSource.produce_at``: one range, or each leaf at its own place),
where no phase switch reads the groups' accumulators; otherwise on the group's
slices, concatenated back after the step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.mpi.nonblocking import MAX_WINDOW
from jax_sparse_sync.ops.nonblocking import (PendingAllreduce, sparse_allreduce_done,
                                             sparse_allreduce_start)
from jax_sparse_sync.bindings.selection import topk
from jax_sparse_sync.stats import STATS_FIELDS, saturating_sum
from jax_sparse_sync.transforms.selection_policy import kth_magnitude_of
from jax_sparse_sync.transforms.topk_sync_state import kept_wire, settle_residual
from jax_sparse_sync.transforms.warmup import run_phases

__all__ = ["normalize_groups", "grouped_sync", "GroupOutcome"]

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


class GroupOutcome(NamedTuple):
    """What one group's exchange (a warm-up phase's, a flush's, or the own
    density's branch) leaves for the step after its switch."""

    handle: jax.Array       # the started allreduce (int32; its done comes after every start)
    indices: jax.Array      # the entries to zero in the group's residual (-1: none)
    values: object          # the values sent (a 16-bit wire keeps their rounding), or None
    kth: jax.Array          # the group's k-th magnitude (the next step's hint)
    local_count: jax.Array  # entries this rank sent


def grouped_sync(residual, source, operands, groups, *, k_total: int, dtype, algorithm, comm,
                 nan_policy, count, max_concurrent: int | None = None, last_kth=None,
                 wire_dtype=None, index_encoding: str = "int32", wire: int = 0, decay=None,
                 phases=(), flush_every: int | None = None):
    """One grouped step. Returns ``(summed per leaf (flat f32, tree order), new
    residual, stats vector, kept count, smallest k-th magnitude of the groups,
    extra)``.

    Args:
      residual: the flat (N,) residual in tree order.
      source: the :class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource`
        of the accumulator (the plain gradient, or a producer such as the Adam
        direction's); its ``part`` cuts ``operands`` into a group's.
      operands: the source's operands.
      groups: :func:`normalize_groups`'s value.
      count: the step count (int32, the same on every rank): picks the step's
        phase and is each allreduce's ``seed``.
      k_total: the entries kept at the transform's own density (each group
        keeps ``round(k * n_g / N)``, at least 1).
      max_concurrent: simultaneous groups in flight at most (``None``: no limit
        but the transport's 8 slots).
      last_kth: the previous step's returned k-th magnitude, the hint of each
        float32 group's fused accumulate-and-select.
      wire_dtype, index_encoding: the sparse allreduce's wire format; ``wire``:
        the value dtype's id (what rounding drops stays in the residual).
      decay: the residual's decay this step (``None``: plain error feedback).
      phases, flush_every: the warm-up phases and flushes
        (:func:`~jax_sparse_sync.transforms.warmup.run_phases`): the step's
        phase, picked from ``count``, applies to every group: a phase of
        density ``d`` keeps ``round(k_d * n_g / N)`` of each group, a dense one
        (and a flush) sends each group whole in a dense allreduce and clears
        its residual.

    ``extra``: the source's ``extra`` with every group's pieces put back in tree order.
    """
    wire_format = dict(wire_dtype=wire_dtype, index_encoding=index_encoding)
    leaves = jax.tree_util.tree_leaves(source.like(operands))
    sizes = [int(np.prod(jnp.shape(x), dtype=np.int64)) for x in leaves]
    offsets = [0] + np.cumsum(sizes).tolist()
    total = offsets[-1]
    # Within a group the entries are laid out in tree order (the selection does not
    # depend on the order): a group of consecutive leaves is then one range of the
    # residual (and of a producer's flat state): its slice, with the new residual the
    # groups' buffers concatenated (no per-leaf pieces for XLA to shuffle), or, with
    # a producer that works on parts, the group's entries of the whole buffers in place.
    groups = tuple((tuple(sorted(ids)), kind) for ids, kind in groups)
    all_consecutive = all(ids == tuple(range(ids[0], ids[-1] + 1)) for ids, _ in groups)
    # float32: the accumulate pass and the own density's exact top-k in one kernel;
    # every entry kept (density 1, e.g. a grouped dense sync): no selection runs
    fused = jnp.dtype(dtype) == jnp.float32 and k_total < total
    # A producer that works on a part of the whole flat buffers (source.produce_at:
    # the plain gradient's accumulate-and-select, the Adam pass; a group of any
    # leaves with source.scattered_parts): the groups' passes chain through the residual's
    # and the producer's own (N,) buffers in place, and one residual update settles
    # every group's sent entries at the end. Otherwise each group's pass gets its
    # slices (copies: a slice is a new buffer to XLA) and the pieces are
    # concatenated back (for the plain sync's 7.5M MLP a step, 2.2 ms of slices and
    # a 4 ms concatenation; 4 of each of N floats for the Adam state). Not with warm-up phases, flushes or every entry
    # kept: their branches read the group's accumulator, and that read of a buffer
    # the next group's pass writes in place made XLA copy the whole residual (1-3
    # copies of N, tried with an optimization barrier and with a write-back).
    in_place = (source.produce_at is not None and (all_consecutive or source.scattered_parts)
                and fused and not phases and flush_every is None)
    whole, chained, sent = residual, operands, []
    # a 16-bit wire's rounding stays in the residual, unless the source reads a zero
    # residual as "sent" (momentum masking): then it is dropped
    rounding_wire = kept_wire(source, wire)

    def group_k(k_all: int, n: int) -> int:
        return min(n, max(1, int(round(k_all * n / total))))

    pending, settled, kths, counts, extras = [], [], [], [], []
    for ids, kind in groups:
        consecutive = ids == tuple(range(ids[0], ids[-1] + 1))
        n = sum(sizes[i] for i in ids)

        def take(flat, ids=ids, consecutive=consecutive):
            if consecutive:
                return jax.lax.slice_in_dim(flat, offsets[ids[0]], offsets[ids[-1] + 1])
            parts = [jax.lax.slice_in_dim(flat, offsets[i], offsets[i + 1]) for i in ids]
            return parts[0] if len(parts) == 1 else jnp.concatenate(parts)

        k_own = group_k(k_total, n)
        # The accumulate pass (and the producer's own state) runs before the phases'
        # switch and the residual update after it: XLA copies every buffer a branch
        # writes in place (warmup.switch_exchanges).
        if in_place:
            # the group's place: one range, or each leaf's first entry
            at = offsets[ids[0]] if consecutive else tuple(offsets[i] for i in ids)
            produced, chained = source.produce_at(whole, chained, ids, at, decay, k_own,
                                                  last_kth)
            # the own density's branch alone, which reads the kernel's top-k only
            whole, acc = produced.acc, None
        else:
            produced = source.produce(take(residual).astype(dtype),
                                      source.part(operands, ids, take), decay,
                                      k_own if fused else None, last_kth)
            acc = produced.acc
            extras.append(produced.extra)
        own_kth = kth_magnitude_of(produced.values) if fused else None

        def exchange(phase_density, first_step, n=n, k_own=k_own, produced=produced,
                     own_kth=own_kth, kind=kind):
            del first_step  # the exact top-k keeps no state between steps

            def run(acc):
                if phase_density is None and k_total >= total:
                    # every entry kept: the exact top-k of all n entries is the
                    # accumulator itself in index order
                    values = acc.astype(jnp.float32)
                    indices = jnp.arange(n, dtype=jnp.int32)
                    kth, count = jnp.float32(0.0), n
                elif phase_density is None and fused:
                    values, indices = produced.values, produced.indices
                    kth, count = own_kth, k_own
                else:
                    count = k_own if phase_density is None else group_k(
                        resolve_k(size=total, density=phase_density, k=None), n)
                    values, indices = topk(acc.astype(jnp.float32), count)
                    kth = own_kth if own_kth is not None else kth_magnitude_of(values)
                pending = _start(values, indices, n, kind, algorithm, comm, nan_policy, count,
                                 max_concurrent, wire_format)
                return GroupOutcome(pending.handle, indices, values if rounding_wire else None,
                                    jnp.asarray(kth, jnp.float32), jnp.asarray(count, jnp.int32))
            return run

        def dense(acc, n=n, own_kth=own_kth, kind=kind):
            # density 1 (a dense warm-up phase, a flush): the group's accumulator summed
            # in float32 by the dense algorithm; its residual is cleared after the switch
            pending = _start(acc.astype(jnp.float32), jnp.arange(n, dtype=jnp.int32), n, kind,
                             "dense", comm, nan_policy, count, max_concurrent, {})
            kth = jnp.float32(0.0) if own_kth is None else own_kth
            return GroupOutcome(pending.handle, None, None, jnp.asarray(kth, jnp.float32),
                                jnp.asarray(n, jnp.int32))

        out, cleared = run_phases(phases, flush_every, count, exchange, dense, (acc,),
                                  padded={"indices": -1, "values": 0},
                                  per_device=("indices", "values", "kth", "local_count"),
                                  ref=residual)
        pending.append(PendingAllreduce(handle=out.handle, size=n, dtype="float32"))
        if in_place:  # no phases: nothing is cleared
            sent.append((_to_flat_layout(out.indices, at, [sizes[i] for i in ids]), out))
        else:
            settled.append(settle_residual(acc, out.indices, out.values, rounding_wire, cleared))
        kths.append(out.kth)
        counts.append(out.local_count)
    sums, stats = [], []
    for p in pending:  # every done after the last start
        s, st = sparse_allreduce_done(p, return_stats=True)
        sums.append(s)
        stats.append(jnp.stack([jnp.asarray(x) for x in st]))

    def per_leaf(pieces):
        # each group's flat piece cut back into its leaves
        out = {}
        for (ids, _), piece in zip(groups, pieces):
            lo = 0
            for i in ids:
                out[i] = jax.lax.slice_in_dim(piece, lo, lo + sizes[i])
                lo += sizes[i]
        return out

    def tree_order(pieces):
        # the groups' flat pieces as one (N,) buffer in tree order
        if len(groups) == 1:
            return pieces[0]
        if all_consecutive:
            by_start = sorted(range(len(groups)), key=lambda g: groups[g][0][0])
            return jnp.concatenate([pieces[g] for g in by_start])
        by_leaf = per_leaf(pieces)
        return jnp.concatenate([by_leaf[i] for i in range(len(leaves))])

    summed_by_leaf = per_leaf(sums)
    if in_place:
        # every group's sent entries zeroed in the whole accumulator at once (the
        # groups' indices are unique within each, their ranges disjoint; -1: none),
        # as each group's own residual update would
        indices = jnp.concatenate([jnp.where(o.indices < 0, -1, placed)
                                   for placed, o in sent])
        values = jnp.concatenate([o.values for _, o in sent]) if rounding_wire else None
        new_residual = settle_residual(whole, indices, values, rounding_wire)
        extra = produced.extra  # the last group's pass: the whole state
    else:
        new_residual = tree_order(settled)
        extra = jax.tree_util.tree_map(lambda *pieces: tree_order(list(pieces)), *extras)
    stats = jnp.stack(stats)
    # bytes, messages, nnz and dense switches add up over the groups; the algorithm is the last's
    alg = STATS_FIELDS.index("algorithm")
    summed_stats = saturating_sum(stats, axis=0).at[alg].set(stats[-1, alg])  # no wrap
    kept = sum(counts[1:], counts[0])
    # one hint for every group (the state keeps one scalar, whatever the plan):
    # the smallest group's k-th magnitude lists at least k_g entries in each group
    # whose magnitudes did not fall, and the kernel checks the rest
    kth = jnp.min(jnp.stack(kths))
    return ([summed_by_leaf[i] for i in range(len(leaves))], new_residual, summed_stats, kept,
            kth, extra)


def _to_flat_layout(indices, at, sizes):
    """A group's indices (into its entries in leaf order) as indices of the flat
    layout: ``at`` the group's first entry (one range) or each leaf's."""
    if isinstance(at, int):
        return indices + at
    ends = np.cumsum(sizes)
    shifts = jnp.asarray([a - (e - z) for a, e, z in zip(at, ends, sizes)], jnp.int32)
    # the leaf of each index: how many leaves end at or before it
    leaf = jnp.searchsorted(jnp.asarray(ends[:-1], jnp.int32), indices, side="right")
    return indices + shifts[leaf]


def _start(values, indices, n, kind, algorithm, comm, nan_policy, seed, max_concurrent,
           wire_format):
    return sparse_allreduce_start(
        values, indices, size=n, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
        seed=seed, wait_for_previous=(kind == "normal"),
        max_in_flight=(min(max_concurrent, MAX_WINDOW)
                       if kind == "simultaneous" and max_concurrent else None),
        defer_checks=True, **wire_format)
