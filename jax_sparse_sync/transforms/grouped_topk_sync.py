"""``grouped_topk_sync``: ``topk_sync`` run group by group along a layer-grouping plan.

Its own transform because grouped execution has its own options: the plan, and
none of ``topk_sync``'s selection policies or quantization (the groups select
with the exact top-k in their own kernels, each as soon as its gradients
exist). ``topk_sync``'s warm-up phases, flushes and leaky residual apply group
by group: the step's phase is one scalar switch per group, around that
group's selection and start only. The per-group update is
:func:`jax_sparse_sync.transforms.grouped.grouped_sync`; the flat entry point
(``update_from``) lets :func:`~jax_sparse_sync.adam_direction_sync` produce
each group's accumulator in the group's own pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.base.arguments import check_nan_policy, wire_word
from jax_sparse_sync.base.transform_arguments import check_float_leaves, resolve_k
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.accumulator_source import flat_sync_transformation
from jax_sparse_sync.transforms.flat import flat_residual, flat_size
from jax_sparse_sync.transforms.grouped import grouped_sync, normalize_groups
from jax_sparse_sync.transforms.topk_sync_state import (TopkSyncState, check_residual_decay,
                                                         initial_topk_sync_state)
from jax_sparse_sync.transforms.warmup import check_flush_every, normalize_warmup
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["grouped_topk_sync"]

_OP = "grouped_topk_sync"


def grouped_topk_sync(
    grouping,
    *,
    density: float | None = None,
    k: int | None = None,
    algorithm: str = "auto",
    comm=None,
    residual_dtype=jnp.float32,
    nan_policy: str = "raise",
    wire_dtype=None,
    index_encoding: str = "int32",
    warmup=None,
    flush_every: int | None = None,
    residual_decay=1.0,
) -> optax.GradientTransformation:
    """Error-feedback Top-k per group of gradient leaves, overlapped with the backward pass.

    One exact top-k and one non-blocking sparse allreduce per group, each
    started as soon as its gradients exist so it overlaps the rest of the
    backward pass (ASC-WFBP; MPI communicators). Every group keeps its share of
    k (``round(k * n_g / N)``, at least 1). Simultaneous groups are held to the
    plan's ``max_concurrent`` in flight (a sequence of pairs: no limit but the
    transport's 8 slots). Every rank must use the same plan. A plan of one
    group of all leaves in tree order is ``topk_sync`` (exact selection) bit
    for bit.

    Args:
      grouping: a layer-grouping plan (``jss.planning.plan_grouping(...)``),
        or a sequence of ``(leaf ids, kind)`` with tree-order leaf ids in
        backward order and kind ``"normal"`` or ``"simultaneous"``.
      density, k, algorithm, comm, residual_dtype, nan_policy, wire_dtype,
        index_encoding: as :func:`~jax_sparse_sync.topk_sync`.
      warmup: as :func:`~jax_sparse_sync.topk_sync`'s (e.g.
        ``jss.density_ramp(density, steps_per_stage=...)``): the step's phase
        applies to every group, each keeping ``round(k_d * n_g / N)`` (at least
        1) at a phase of density ``d`` (``k_d`` that density's k); a phase of
        density 1.0 sends every group whole (float32, the ``"dense"``
        algorithm) and clears its residual. Each group still starts as soon as
        its gradients exist: the phase's switch is per group and holds only
        the group's selection and start (the accumulate pass runs before it,
        the residual update after it, so no N-entry buffer is copied).
      flush_every: as :func:`~jax_sparse_sync.topk_sync`'s: every
        ``flush_every``-th step is a dense step of every group.
      residual_decay: as :func:`~jax_sparse_sync.topk_sync`'s (a leaky
        residual; a float in (0, 1] or a schedule), in each group's
        accumulate pass.

    In front of it, :func:`~jax_sparse_sync.adam_direction_sync` (momentum
    masking included) runs its Adam-direction pass group by group: each
    group's moments, age and accumulator in one pass over the group's entries,
    as soon as the group's gradients exist, then its selection and start
    (``jss.adam_direction_sync(jss.grouped_topk_sync(plan, density=0.01,
    warmup=jss.density_ramp(0.01, steps_per_stage=50)))``). A one-group plan
    is ``adam_direction_sync(topk_sync(...))`` bit for bit.

    Returns:
      An ``optax.GradientTransformation`` whose state is a
      :class:`~jax_sparse_sync.TopkSyncState` (the same layout as
      ``topk_sync``'s, so a checkpoint restores under either).

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> params = {"b": jnp.zeros(4), "w": jnp.ones((4, 4))}
      >>> plan = [((1,), "normal"), ((0,), "simultaneous")]  # w's gradient is ready first
      >>> tx = optax.chain(jss.grouped_topk_sync(plan, k=2), optax.sgd(0.1))
      >>> state = tx.init(params)
      >>> grads = {"b": jnp.array([0., -3., 1., 0.]), "w": jnp.zeros((4, 4)).at[0, 0].set(5.0)}
      >>> updates, state = tx.update(grads, state, params)
      >>> [round(float(u), 4) for u in (updates["w"][0, 0], updates["b"][1])]
      [-0.5, 0.3]
    """
    check_nan_policy(nan_policy, _OP)
    if density is None and k is None:
        raise ValueError(f"jax_sparse_sync.{_OP}: pass `density=` (e.g. 0.01) or `k=`.")
    residual_dtype = jnp.dtype(residual_dtype)
    if not jnp.issubdtype(residual_dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.{_OP}: `residual_dtype` must be a float dtype; "
                        f"got {residual_dtype}")
    if grouping is None or isinstance(grouping, str):
        raise ValueError(
            f"jax_sparse_sync.{_OP}: `grouping` takes a plan, not a method name: "
            "jss.planning.plan_grouping(method, jss.planning.profile_backward(loss, params, "
            f"*batch), nranks=P, density=...) (got {grouping!r}); without a plan use "
            "jss.topk_sync")
    wire = wire_word(wire_dtype, index_encoding, _OP) & 0xF
    comm = transport.resolve_comm(comm)
    if transport.is_mesh_axis(comm):
        raise ValueError(f"jax_sparse_sync.{_OP}: grouping runs on MPI communicators; under "
                         "shard_map use jss.topk_sync (XLA schedules the collective)")
    if algorithm != "auto":
        # validate the name now; P is read at trace time (comm_size_in_trace)
        resolve_algorithm(algorithm, nranks=1, size=1, k=1)
    warmup = normalize_warmup(warmup, _OP)
    flush_every = check_flush_every(flush_every, _OP)
    decay_at = check_residual_decay(residual_decay, _OP)

    def init_fn(params):
        check_float_leaves(params, "parameter", _OP)
        size = flat_size(params)
        if size == 0:
            raise ValueError(f"jax_sparse_sync.{_OP}: the parameters have no entries.")
        resolve_k(size=size, density=density, k=k, op=_OP)
        for _, phase_density in warmup:
            resolve_k(size=size, density=phase_density, k=None, op=_OP)
        return initial_topk_sync_state(size, residual_dtype, world_marker(comm))

    def update_from(source, operands, state):
        # the step with each group's accumulator made by `source` (accumulator_source.py):
        # the plain gradient, or a producer in front (the Adam direction's pass)
        if source.part is None:
            raise ValueError(
                f"jax_sparse_sync.{_OP}: `update_from`'s accumulator source cannot be cut "
                "into groups (its `part` is None); give the AccumulatorSource a "
                "part(operands, leaf_ids, take) that returns one group's operands, or "
                "sync with jss.topk_sync, which takes the whole accumulator")
        like = source.like(operands)
        check_float_leaves(like, "gradient", _OP)
        check_world(state.world, comm, _OP)
        size = flat_size(like)
        residual = flat_residual(state.residual, size, residual_dtype, _OP)
        leaves = jax.tree_util.tree_leaves(like)
        groups = normalize_groups(grouping, len(leaves), _OP)
        k_total = resolve_k(size=size, density=density, k=k, op=_OP)
        sums, new_residual, stats, kept, kth, extra = grouped_sync(
            residual, source, operands, groups, k_total=k_total,
            dtype=residual_dtype, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
            count=state.count, max_concurrent=getattr(grouping, "max_concurrent", None),
            last_kth=state.threshold, wire_dtype=wire_dtype, index_encoding=index_encoding,
            wire=wire, decay=None if decay_at is None else decay_at(state.count),
            phases=warmup, flush_every=flush_every)
        scale = transport.comm_size_in_trace(comm)
        treedef = jax.tree_util.tree_structure(like)
        new_updates = jax.tree_util.tree_unflatten(treedef, [
            (s / scale).reshape(jnp.shape(x)).astype(jnp.result_type(x))
            for s, x in zip(sums, leaves)])
        return new_updates, TopkSyncState(
            count=optax.safe_increment(state.count), residual=new_residual,
            threshold=kth.astype(jnp.float32), last_local_count=jnp.asarray(kept, jnp.int32),
            last_stats=stats.astype(state.last_stats.dtype), world=state.world), extra

    return flat_sync_transformation(init_fn, update_from, residual_dtype)
