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

from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.accumulator_source import flat_sync_transformation
from jax_sparse_sync.transforms.grouped import grouped_sync, normalize_groups
from jax_sparse_sync.transforms.grouped_topk_config import OP as _OP, GroupedTopkConfig
from jax_sparse_sync.transforms.phases import begin_step, init_size
from jax_sparse_sync.transforms.topk_sync_state import TopkSyncState, initial_topk_sync_state
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["grouped_topk_sync"]


def init_state(config: GroupedTopkConfig, params) -> TopkSyncState:
    """The state before the first step (the parameters checked against every phase's k)."""
    size = init_size(config.shared, params)
    return initial_topk_sync_state(size, config.shared.residual_dtype,
                                   world_marker(config.shared.comm))


def check_source(source) -> None:
    """A ``ValueError`` naming the fix when ``source`` cannot be cut into groups."""
    if source.part is None:
        raise ValueError(
            f"jax_sparse_sync.{_OP}: `update_from`'s accumulator source cannot be cut "
            "into groups (its `part` is None); give the AccumulatorSource a "
            "part(operands, leaf_ids, take) that returns one group's operands, or "
            "sync with jss.topk_sync, which takes the whole accumulator")


def updates_like(like, sums, scale):
    """The sums per leaf (flat float32, tree order) divided by ``scale`` and shaped
    and typed as the gradient tree ``like``."""
    leaves = jax.tree_util.tree_leaves(like)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), [
        (s / scale).reshape(jnp.shape(x)).astype(jnp.result_type(x))
        for s, x in zip(sums, leaves)])


def grouped_topk_step(config: GroupedTopkConfig, source, operands, state):
    """One step with each group's accumulator made by ``source``
    (:class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource`: the
    plain gradient, or a producer in front such as the Adam direction's pass):
    ``(updates, state, source's extra)``."""
    shared = config.shared
    check_source(source)
    like, size, residual = begin_step(shared, source, operands, state.residual,
                                      lambda: check_world(state.world, shared.comm, _OP))
    groups = normalize_groups(config.grouping, len(jax.tree_util.tree_leaves(like)), _OP)
    out = grouped_sync(config, residual, source, operands, groups,
                       k_total=shared.kept(size), count=state.count,
                       last_kth=state.threshold, decay=shared.decay(state.count))
    new_updates = updates_like(like, out.sums, transport.comm_size_in_trace(shared.comm))
    return new_updates, TopkSyncState(
        count=optax.safe_increment(state.count), residual=out.residual,
        threshold=out.kth.astype(jnp.float32), last_local_count=jnp.asarray(out.kept, jnp.int32),
        last_stats=out.stats.astype(state.last_stats.dtype), world=state.world), out.extra


def grouped_topk_sync(grouping, *, density: float | None = None, k: int | None = None,
                      algorithm: str = "auto", comm=None, residual_dtype=jnp.float32,
                      nan_policy: str = "raise", wire_dtype=None, index_encoding: str = "int32",
                      warmup=None, flush_every: int | None = None,
                      residual_decay=1.0) -> optax.GradientTransformation:
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
      density, k, algorithm, comm: as :func:`~jax_sparse_sync.topk_sync`.
      residual_dtype, nan_policy: as :func:`~jax_sparse_sync.topk_sync`.
      wire_dtype, index_encoding: as :func:`~jax_sparse_sync.topk_sync`.
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

    Cost: one accumulate pass over the N entries in all and, per group, one
    exact top-k of its entries and one non-blocking sparse allreduce of its k_g
    (a dense step: of its n_g); the residual stays in place where no warm-up
    phase or flush reads the groups' accumulators
    (:func:`~jax_sparse_sync.transforms.grouped.grouped_step`).

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
    config = GroupedTopkConfig.build(
        grouping, density=density, k=k, algorithm=algorithm, comm=comm,
        residual_dtype=residual_dtype, nan_policy=nan_policy, wire_dtype=wire_dtype,
        index_encoding=index_encoding, warmup=warmup, flush_every=flush_every,
        residual_decay=residual_decay)

    def init_fn(params):
        return init_state(config, params)

    def update_from(source, operands, state):
        return grouped_topk_step(config, source, operands, state)

    return flat_sync_transformation(init_fn, update_from, config.shared.residual_dtype)
