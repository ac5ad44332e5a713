"""``grouped_topk_sync``'s update: one selection and one non-blocking sparse
allreduce per group of gradient leaves (a layer-grouping plan, ASC-WFBP).

Each group (leaves in backward order) is accumulated with its slice of the
residual, gets its own top-k (``k_g = round(k * n_g / N)``, at least 1, so the
total stays about k), and is started with ``jss.sparse_allreduce_start`` as
soon as its gradients exist: XLA places the start between the remaining
backward-pass operations, so the group is on the wire while the earlier
layers' gradients are computed. A ``"normal"`` group starts with
``wait_for_previous`` (the worker thread waits for the link, XLA's thread does
not), a ``"simultaneous"`` one runs concurrently with those in flight, at most
the plan's ``max_concurrent`` at once (``max_in_flight``, as the planner's
model). The argument check is deferred to the worker (``defer_checks``), so a
start never waits for the other ranks. All dones come after the last start;
every rank issues the same sequence (the plan is the same on every rank:
computed from the same profile and calibration, see
``jss.planning.plan_grouping``).

The residual keeps the flat tree-order layout of the ungrouped path, so a
state checkpoints and restores the same way whatever the plan. Each group's
accumulate-and-select (and, in front of it, ``adam_direction_sync``'s pass) runs
on the group's entries of the whole flat state, in place
(``AccumulatorSource.produce_at``: one range, or each leaf at its own place),
where no phase switch reads the groups' accumulators; otherwise on the group's
slices, concatenated back after the step.

A step (:func:`grouped_sync`) is these module-level phases, group by group:
:func:`produce_group` (accumulate and select), :func:`exchange_group` (the
phase's switch around the group's start: :func:`sparse_branch` or
:func:`dense_branch`), then, after the last start, :func:`finish_allreduces`
and the reassembly in tree order (:func:`per_leaf`, :func:`tree_order`,
:func:`settle_in_place`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.mpi.nonblocking import MAX_WINDOW
from jax_sparse_sync.ops.nonblocking import (PendingAllreduce, sparse_allreduce_done,
                                             sparse_allreduce_start)
from jax_sparse_sync.bindings.selection import topk
from jax_sparse_sync.stats import STATS_FIELDS, saturating_sum
from jax_sparse_sync.transforms.grouped_topk_config import GroupedTopkConfig
from jax_sparse_sync.transforms.phases import exchange_phases, settle
from jax_sparse_sync.transforms.selection_policy import kth_magnitude_of
from jax_sparse_sync.transforms.topk_sync_state import kept_wire

__all__ = ["normalize_groups", "grouped_sync", "GroupOutcome", "GroupedResult"]

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


class GroupedResult(NamedTuple):
    """What :func:`grouped_sync` returns."""

    sums: list              # the sum over the ranks per leaf (flat float32, tree order)
    residual: jax.Array     # the new flat (N,) residual, tree order
    stats: jax.Array        # the groups' stats vectors added up (the algorithm: the last's)
    kept: jax.Array         # entries this rank sent, over the groups
    kth: jax.Array          # the smallest of the groups' k-th magnitudes (the next hint)
    extra: Any              # the source's extra, every group's pieces in tree order


class Layout(NamedTuple):
    """A step's leaves and groups (static, the same on every rank).

    Within a group the entries are laid out in tree order (the selection does not
    depend on the order): a group of consecutive leaves is then one range of the
    residual (and of a producer's flat state).
    """

    sizes: list             # each leaf's entries, tree order
    offsets: list           # each leaf's first entry in the flat layout, then N
    groups: tuple           # (leaf ids ascending, kind) per group, in the plan's order
    all_consecutive: bool   # every group is one range

    @property
    def total(self) -> int:
        """N, the entries of all leaves."""
        return self.offsets[-1]


class GroupedStep(NamedTuple):
    """One grouped step's choices, the same for every group."""

    config: GroupedTopkConfig
    layout: Layout
    k_total: int            # the entries kept at the own density, over all groups
    count: jax.Array        # the step count: the step's phase, each allreduce's seed
    decay: Any              # the residual's decay this step (None: plain error feedback)
    last_kth: Any           # the previous step's k-th magnitude (the selection's hint)
    fused: bool             # the accumulate pass and the own density's top-k in one kernel
    in_place: bool          # the groups' passes on the whole flat buffers (produce_at)
    rounding_wire: int      # the wire whose rounding the residual keeps (0: none)


class Group(NamedTuple):
    """One group of the plan."""

    ids: tuple              # tree-order leaf ids, ascending
    kind: str               # "normal" or "simultaneous"
    consecutive: bool       # the leaves are one range of the flat layout
    n: int                  # the group's entries
    k_own: int              # the entries it keeps at the own density


class GroupResult(NamedTuple):
    """What one group's step leaves for the reassembly after the last start."""

    pending: PendingAllreduce
    outcome: GroupOutcome
    residual: Any           # the group's settled residual piece (None: settled in place)
    placed: Any             # its indices in the flat layout (in place), else None
    extra: Any              # the source's extra for the group (the whole state in place)


def _consecutive(ids) -> bool:
    return ids == tuple(range(ids[0], ids[-1] + 1))


def group_layout(like, groups) -> Layout:
    """The :class:`Layout` of the gradient tree ``like`` cut into ``groups``
    (:func:`normalize_groups`'s value)."""
    leaves = jax.tree_util.tree_leaves(like)
    sizes = [int(np.prod(jnp.shape(x), dtype=np.int64)) for x in leaves]
    offsets = [0] + np.cumsum(sizes).tolist()
    groups = tuple((tuple(sorted(ids)), kind) for ids, kind in groups)
    return Layout(sizes, offsets, groups, all(_consecutive(ids) for ids, _ in groups))


def grouped_step(config: GroupedTopkConfig, layout: Layout, source, *, k_total: int, count,
                 decay, last_kth) -> GroupedStep:
    """The step's choices for every group.

    ``fused``: a float32 residual runs the accumulate pass and the own density's
    exact top-k in one kernel; with every entry kept (density 1, e.g. a grouped
    dense sync) no selection runs. ``in_place``: a producer that works on a part of
    the whole flat buffers (``source.produce_at``: the plain gradient's
    accumulate-and-select, the Adam pass; a group of any leaves with
    ``source.scattered_parts``) chains the groups' passes through the residual's
    and its own (N,) buffers in place, and one residual update settles every
    group's sent entries at the end; otherwise each group's pass gets its slices
    (copies: a slice is a new buffer to XLA) and the pieces are concatenated back.
    Not with warm-up phases, flushes or every entry kept: their branches read the
    group's accumulator, and that read of a buffer the next group's pass writes in
    place makes XLA copy the whole residual.
    """
    shared = config.shared
    fused = jnp.dtype(shared.residual_dtype) == jnp.float32 and k_total < layout.total
    in_place = (source.produce_at is not None
                and (layout.all_consecutive or source.scattered_parts)
                and fused and not shared.warmup and shared.flush_every is None)
    # a 16-bit wire's rounding stays in the residual, unless the source reads a zero
    # residual as "sent" (momentum masking): then it is dropped
    return GroupedStep(config, layout, k_total, count, decay, last_kth, fused, in_place,
                       kept_wire(source, config.wire))


def group_k(step: GroupedStep, k_all: int, n: int) -> int:
    """A group of ``n`` entries' share of ``k_all``: ``round(k_all * n / N)``, at least 1."""
    return min(n, max(1, int(round(k_all * n / step.layout.total))))


def make_group(step: GroupedStep, ids, kind) -> Group:
    """The :class:`Group` of leaves ``ids`` (ascending)."""
    n = sum(step.layout.sizes[i] for i in ids)
    return Group(ids, kind, _consecutive(ids), n, group_k(step, step.k_total, n))


def take(layout: Layout, group: Group, flat):
    """The group's entries of a flat (N,) buffer, in leaf order (a copy)."""
    offsets, ids = layout.offsets, group.ids
    if group.consecutive:
        return jax.lax.slice_in_dim(flat, offsets[ids[0]], offsets[ids[-1] + 1])
    parts = [jax.lax.slice_in_dim(flat, offsets[i], offsets[i + 1]) for i in ids]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def group_place(layout: Layout, group: Group):
    """The group's place in the flat layout: its first entry (one range), or each leaf's."""
    if group.consecutive:
        return layout.offsets[group.ids[0]]
    return tuple(layout.offsets[i] for i in group.ids)


def produce_group(step: GroupedStep, group: Group, source, operands, residual, whole, chained):
    """Accumulate (and, fused, select) one group: ``(produced, acc, whole, chained)``.

    In place, the pass runs on the whole buffers ``whole`` (the residual) and
    ``chained`` (the producer's operands), which it returns updated, and ``acc``
    is None (the own density's branch reads the kernel's top-k only); otherwise on
    the group's slices of ``residual`` and ``operands``, ``acc`` the group's
    accumulator.
    """
    if step.in_place:
        produced, chained = source.produce_at(whole, chained, group.ids,
                                              group_place(step.layout, group), step.decay,
                                              group.k_own, step.last_kth)
        return produced, None, produced.acc, chained
    cut = functools.partial(take, step.layout, group)
    produced = source.produce(cut(residual).astype(step.config.shared.residual_dtype),
                              source.part(operands, group.ids, cut), step.decay,
                              group.k_own if step.fused else None, step.last_kth)
    return produced, produced.acc, whole, chained


def start_group(step: GroupedStep, group: Group, values, indices, algorithm: str, wire_format,
                seed):
    """The group's non-blocking sparse allreduce, started (its checks deferred)."""
    max_concurrent = step.config.max_concurrent
    return sparse_allreduce_start(
        values, indices, size=group.n, algorithm=algorithm, comm=step.config.shared.comm,
        nan_policy=step.config.shared.nan_policy, seed=seed,
        wait_for_previous=(group.kind == "normal"),
        max_in_flight=(min(max_concurrent, MAX_WINDOW)
                       if group.kind == "simultaneous" and max_concurrent else None),
        defer_checks=True, **wire_format)


def sparse_branch(step: GroupedStep, group: Group, produced, own_kth, phase_density,
                  acc) -> GroupOutcome:
    """The branch of a sparse phase (the own density, ``phase_density`` None, or a
    warm-up phase's): the group's top-k of ``acc`` (the fused kernel's at the own
    density), started."""
    if phase_density is None and step.k_total >= step.layout.total:
        # every entry kept: the exact top-k of all n entries is the accumulator
        # itself in index order
        values = acc.astype(jnp.float32)
        indices = jnp.arange(group.n, dtype=jnp.int32)
        kth, count = jnp.float32(0.0), group.n
    elif phase_density is None and step.fused:
        values, indices = produced.values, produced.indices
        kth, count = own_kth, group.k_own
    else:
        count = group.k_own if phase_density is None else group_k(
            step, step.config.shared.kept(step.layout.total, phase_density), group.n)
        values, indices = topk(acc.astype(jnp.float32), count)
        kth = own_kth if own_kth is not None else kth_magnitude_of(values)
    # the seed is the count sent, as it has always been here (the dense branch's: the step)
    pending = start_group(step, group, values, indices, step.config.algorithm,
                          step.config.wire_format, count)
    return GroupOutcome(pending.handle, indices, values if step.rounding_wire else None,
                        jnp.asarray(kth, jnp.float32), jnp.asarray(count, jnp.int32))


def sparse_exchange(step: GroupedStep, group: Group, produced, own_kth, phase_density,
                    first_step):
    """The branch of a sparse phase (:func:`exchange_phases`' ``exchange``)."""
    del first_step  # the exact top-k keeps no state between steps
    return functools.partial(sparse_branch, step, group, produced, own_kth, phase_density)


def dense_branch(step: GroupedStep, group: Group, own_kth, acc) -> GroupOutcome:
    """Density 1 (a dense warm-up phase, a flush): the group's accumulator summed in
    float32 by the dense algorithm; its residual is cleared after the switch."""
    pending = start_group(step, group, acc.astype(jnp.float32),
                          jnp.arange(group.n, dtype=jnp.int32), "dense", {}, step.count)
    kth = jnp.float32(0.0) if own_kth is None else own_kth
    return GroupOutcome(pending.handle, None, None, jnp.asarray(kth, jnp.float32),
                        jnp.asarray(group.n, jnp.int32))


def exchange_group(step: GroupedStep, group: Group, produced, acc, residual):
    """The group's exchange: the step's phase (one scalar switch around the group's
    selection and start only; the accumulate pass ran before it, the residual
    update comes after it). ``(GroupOutcome, cleared)``."""
    own_kth = kth_magnitude_of(produced.values) if step.fused else None
    return exchange_phases(
        step.config.shared, step.count,
        functools.partial(sparse_exchange, step, group, produced, own_kth),
        functools.partial(dense_branch, step, group, own_kth), (acc,),
        padded={"indices": -1, "values": 0},
        per_device=("indices", "values", "kth", "local_count"), ref=residual)


def sync_group(step: GroupedStep, group: Group, source, operands, residual, whole, chained):
    """One group's accumulate, phase switch and start: ``(GroupResult, whole, chained)``."""
    produced, acc, whole, chained = produce_group(step, group, source, operands, residual,
                                                  whole, chained)
    out, cleared = exchange_group(step, group, produced, acc, residual)
    pending = PendingAllreduce(handle=out.handle, size=group.n, dtype="float32")
    if step.in_place:  # no phases: nothing is cleared
        placed = _to_flat_layout(out.indices, group_place(step.layout, group),
                                 [step.layout.sizes[i] for i in group.ids])
        return GroupResult(pending, out, None, placed, produced.extra), whole, chained
    piece = settle(acc, out.indices, cleared, values=out.values, wire=step.rounding_wire)
    return GroupResult(pending, out, piece, None, produced.extra), whole, chained


def finish_allreduces(pending) -> tuple[list, list]:
    """Every group's done, in start order (after the last start): the sums and the
    stats vectors."""
    sums, stats = [], []
    for p in pending:
        s, st = sparse_allreduce_done(p, return_stats=True)
        sums.append(s)
        stats.append(jnp.stack([jnp.asarray(x) for x in st]))
    return sums, stats


def per_leaf(layout: Layout, pieces) -> dict:
    """Each group's flat piece cut back into its leaves: ``{leaf id: flat piece}``."""
    out = {}
    for (ids, _), piece in zip(layout.groups, pieces):
        lo = 0
        for i in ids:
            out[i] = jax.lax.slice_in_dim(piece, lo, lo + layout.sizes[i])
            lo += layout.sizes[i]
    return out


def tree_order(layout: Layout, pieces):
    """The groups' flat pieces as one (N,) buffer in tree order."""
    groups = layout.groups
    if len(groups) == 1:
        return pieces[0]
    if layout.all_consecutive:
        by_start = sorted(range(len(groups)), key=lambda g: groups[g][0][0])
        return jnp.concatenate([pieces[g] for g in by_start])
    by_leaf = per_leaf(layout, pieces)
    return jnp.concatenate([by_leaf[i] for i in range(len(layout.sizes))])


def settle_in_place(step: GroupedStep, whole, results):
    """Every group's sent entries zeroed in the whole accumulator at once (the
    groups' indices are unique within each, their ranges disjoint; -1: none), as
    each group's own residual update would."""
    indices = jnp.concatenate([jnp.where(r.outcome.indices < 0, -1, r.placed)
                               for r in results])
    values = (jnp.concatenate([r.outcome.values for r in results]) if step.rounding_wire
              else None)
    return settle(whole, indices, None, values=values, wire=step.rounding_wire)


def summed_stats(stats):
    """The groups' stats vectors as one: bytes, messages, nnz and dense switches add
    up (saturating, no wrap); the algorithm is the last group's."""
    stats = jnp.stack(stats)
    alg = STATS_FIELDS.index("algorithm")
    return saturating_sum(stats, axis=0).at[alg].set(stats[-1, alg])


def grouped_sync(config: GroupedTopkConfig, residual, source, operands, groups, *,
                 k_total: int, count, last_kth=None, decay=None) -> GroupedResult:
    """One grouped step.

    Args:
      config: the transform's configuration (the shared options, the plan's
        ``max_concurrent``, the algorithm and the wire format).
      residual: the flat (N,) residual in tree order.
      source: the :class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource`
        of the accumulator (the plain gradient, or a producer such as the Adam
        direction's); its ``part`` cuts ``operands`` into a group's.
      operands: the source's operands.
      groups: :func:`normalize_groups`'s value.
      k_total: the entries kept at the transform's own density (each group
        keeps ``round(k * n_g / N)``, at least 1).
      count: the step count (int32, the same on every rank): picks the step's
        phase (``config.shared``'s warm-up and flushes, applied to every group: a
        phase of density ``d`` keeps ``round(k_d * n_g / N)`` of each group, a
        dense one and a flush send each group whole in a dense allreduce and
        clear its residual) and is a dense allreduce's ``seed`` (a sparse one's
        is the group's count sent).
      last_kth: the previous step's returned k-th magnitude, the hint of each
        float32 group's fused accumulate-and-select.
      decay: the residual's decay this step (``None``: plain error feedback).

    Returns:
      A :class:`GroupedResult`: the sum per leaf (flat float32, tree order), the
      new residual, the stats vector, the kept count, the smallest k-th magnitude
      of the groups, and the source's ``extra`` with every group's pieces put back
      in tree order.

    Cost: one accumulate pass over the N entries in all (group by group), one
    exact top-k and one non-blocking sparse allreduce per group; the residual
    and the producer's state in place where :func:`grouped_step` allows it, else
    one slice and one concatenation of each.
    """
    layout = group_layout(source.like(operands), groups)
    step = grouped_step(config, layout, source, k_total=k_total, count=count, decay=decay,
                        last_kth=last_kth)
    whole, chained, results = residual, operands, []
    for ids, kind in layout.groups:
        result, whole, chained = sync_group(step, make_group(step, ids, kind), source, operands,
                                            residual, whole, chained)
        results.append(result)
    sums, stats = finish_allreduces([r.pending for r in results])
    summed_by_leaf = per_leaf(layout, sums)
    if step.in_place:
        new_residual = settle_in_place(step, whole, results)
        extra = results[-1].extra  # the last group's pass: the whole state
    else:
        new_residual = tree_order(layout, [r.residual for r in results])
        extra = jax.tree_util.tree_map(lambda *pieces: tree_order(layout, list(pieces)),
                                       *[r.extra for r in results])
    stats = summed_stats(stats)
    counts = [r.outcome.local_count for r in results]
    kept = sum(counts[1:], counts[0])
    # one hint for every group (the state keeps one scalar, whatever the plan): the
    # smallest group's k-th magnitude lists at least k_g entries in each group whose
    # magnitudes did not fall, and the kernel checks the rest
    kth = jnp.min(jnp.stack([r.outcome.kth for r in results]))
    return GroupedResult([summed_by_leaf[i] for i in range(len(layout.sizes))], new_residual,
                         stats, kept, kth, extra)


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
