"""``diloco``: DiLoCo's outer step (Douillard et al. 2023) as an Optax transform, over any sync.

Each rank runs an inner optimizer on its own gradients with no communication; every
``every`` steps the parameters' change since the last outer step (the pseudo-gradient,
``anchor - params``) goes through a sync (the mean over the ranks: dense, on a 16-bit
wire, error-fed Top-k, ...), an outer optimizer applies it to the shared parameters
(the anchor), and every rank continues from the new anchor. Streaming DiLoCo's
fragments take turns, and each can be merged ``delay`` steps after its outer step.

A step: the inner update; per fragment, a ``lax.cond`` on the step count (the same
on every rank, so every rank issues the same collectives) that runs the fragment's
outer step on its turn (no collective runs on an inner step); then the merge into
the update, a select. :func:`diloco_apply_updates` makes the merge exact.

Cost of an inner step through ``update`` beyond the inner optimizer's: its update is
written out once (the outer step's conditional reads it, and a conditional's operands
are materialized) and read back with the anchor by the merge's select, which XLA fuses
with the caller's ``params + updates``: about 4 passes over N floats (the inner
optimizer's own last pass no longer fuses with the addition). A loop that compiles
the inner steps apart (``inner_update`` where ``inner_only(count)``, applied with
``optax.apply_updates``) pays none of it: the inner optimizer's step as it runs alone.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.base.jax_compat import varying_as_inputs
from jax_sparse_sync.base.transform_arguments import check_float_leaves
from jax_sparse_sync.stats import STATS_FIELDS, last_stats, stats_dtype
from jax_sparse_sync.transforms.diloco_config import OP, DiLoCoConfig

__all__ = ["DiLoCoState", "DiLoCoTransformation", "diloco", "diloco_apply_updates"]

_WHERE = f"jax_sparse_sync.{OP}"


class DiLoCoState(NamedTuple):
    """State of :func:`diloco`: arrays only, so it jits, donates and checkpoints.

    Attributes:
      count: the steps taken (int32).
      anchor: the shared parameters (the parameters' tree and dtypes): where every
        rank's working parameters were after the last outer step. Bitwise the same
        on every rank; for evaluation, the model the ranks agree on.
      inner: the inner optimizer's state (this rank's own).
      outer: the outer optimizer's state, one per fragment (the same on every rank).
      sync: the sync's state, one per fragment (e.g. ``topk_sync``'s residual:
        this rank's own).
      snapped: bool, one per parameter leaf: this step's update moves that leaf
        onto ``anchor`` (what :func:`diloco_apply_updates` reads).
      last_stats: this step's wire statistics (``jss.SyncStats`` fields): the
        sync's on a step with an outer step, zeros on the others, so
        ``jss.last_stats`` counts the bytes of every step.
    """

    count: jax.Array
    anchor: Any
    inner: Any
    outer: tuple
    sync: tuple
    snapped: jax.Array
    last_stats: jax.Array


class DiLoCoTransformation(optax.GradientTransformation):
    """What :func:`diloco` returns: an ``optax.GradientTransformation`` (it chains
    and unpacks as one) with two more attributes, for a training loop that compiles
    an inner step of its own.

    ``inner_only(count) -> bool`` (Python ints, no tracing): whether the step taken
    from a state whose ``count`` is ``count`` runs neither an outer step nor a merge.
    ``inner_update(updates, state, params=None) -> (updates, state)``: that step
    without the outer step's conditional: the inner optimizer's update (apply it
    with ``optax.apply_updates``, which XLA then fuses with the inner optimizer's
    last pass) and the state with its count advanced; the same bits as ``update``
    on such a step. Call it only where ``inner_only(count)`` holds.
    """

    inner_only: Callable | None = None  # class defaults; each instance sets its own
    inner_update: Callable | None = None


def diloco(inner: optax.GradientTransformation,
           outer: optax.GradientTransformation | None = None, *, every: int,
           sync: optax.GradientTransformation, fragments=1, delay: int = 0,
           mix: float = 0.0) -> optax.GradientTransformation:
    """DiLoCo: local inner steps, and every ``every`` steps an outer step through ``sync``.

    Each step, on every rank: ``inner`` turns this rank's gradient into an update
    (no communication). After every ``every``-th step (H), the outer step: the
    pseudo-gradient ``anchor - params`` (``params`` after this step's inner update)
    is averaged over the ranks by ``sync``, ``outer`` applies the average to the
    anchor, and the step's update takes every rank's parameters to the new anchor.
    The anchor and the outer state are the same on every rank bit for bit (the
    syncs' results are), so every replica starts the next H steps from the same
    parameters: apply the updates with :func:`diloco_apply_updates`, which puts
    the anchor in place exactly (``optax.apply_updates``' ``params + (anchor -
    params)`` rounds away from the anchor on some entries, differently on each
    rank).

    SparseLoCo: ``sync=jss.topk_sync(density=...)`` (or another sync with error
    feedback) and ``outer=optax.sgd(1.0)``: the residual carries what was not sent
    from one outer step to the next, in place of the outer momentum.

    Streaming DiLoCo: ``fragments=F`` splits the leaves into F fragments of
    consecutive leaves of about equal size (or give each leaf's fragment id); they
    take turns, ``every / F`` steps apart, each with its own sync and outer state,
    so an outer step moves 1/F of the model. ``delay=tau`` merges a fragment into
    the working parameters ``tau`` steps after its outer step: ``mix * params +
    (1 - mix) * anchor`` (``mix=0``: the anchor; with ``mix > 0`` the replicas
    differ after a merge, the anchors do not). The outer step itself is blocking
    here (the sync is any transformation): the delay reproduces Streaming DiLoCo's
    arithmetic of an overlapped exchange, not its hiding of the transfer.

    No collective runs on a step without an outer step: the outer step is a branch
    of a ``lax.cond`` on the step count, which every rank takes together. Chain
    transformations of the gradient in ``inner`` (``optax.chain(clip, adamw)``),
    not after ``diloco``.

    The inner steps as their own program: ``tx.inner_only(count)`` (Python) says
    whether the step from a state of that count has neither an outer step nor a
    merge, and ``tx.inner_update(grads, state, params)`` is that step without the
    outer step's conditional (the same bits as ``tx.update``; apply it with
    ``optax.apply_updates``). A loop that jits both and picks one by the step
    number runs its inner steps at the inner optimizer's own cost.

    Args:
      inner: the local optimizer, e.g. ``optax.adamw(1e-3)``.
      outer: the outer optimizer of the shared parameters; ``None``: Nesterov SGD,
        learning rate 0.7, momentum 0.9 (the DiLoCo paper's).
      every: inner steps between two outer steps of a fragment (H, >= 1).
      sync: maps each rank's pseudo-gradient tree to the mean over the ranks:
        ``jss.dense_sync(...)``, ``jss.topk_sync(...)``, ``jss.oktopk_sync(...)``,
        ... on an MPI communicator or, inside ``shard_map``, ``comm=jss.axis(name)``.
      fragments: an int F <= ``every`` (and <= the number of leaves), or a
        fragment id per leaf (``jax.tree_util`` order, or a tree of ids over the
        parameters, e.g. ``[i % F for i in range(leaves)]`` for strided fragments).
      delay: steps from a fragment's outer step to its merge (tau, < ``every``).
      mix: the working parameters' weight in a merge (alpha, in [0, 1]).

    Returns:
      An ``optax.GradientTransformation`` (a ``DiLoCoTransformation``, with
      ``inner_only`` and ``inner_update``) whose ``update`` needs ``params`` and
      whose state is a :class:`DiLoCoState`.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = jss.diloco(optax.sgd(0.1), every=2, sync=jss.dense_sync())
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> state = tx.init(params)
      >>> for _ in range(2):
      ...     updates, state = tx.update({"w": jnp.array([1.0, -1.0])}, state, params)
      ...     params = jss.diloco_apply_updates(params, updates, state)
      >>> params["w"].tolist() == state.anchor["w"].tolist(), int(state.count)
      (True, 2)
    """
    config = DiLoCoConfig.build(inner=inner, outer=outer, every=every, sync=sync,
                                fragments=fragments, delay=delay, mix=mix)
    tx = DiLoCoTransformation(functools.partial(init, config), functools.partial(update, config))
    tx.inner_only = config.inner_only
    tx.inner_update = functools.partial(inner_update, config)
    return tx


def _parts(leaves, groups):
    return [[leaves[i] for i in ids] for ids in groups]


def init(config: DiLoCoConfig, params) -> DiLoCoState:
    """The state before the first step: the anchor a copy of ``params``."""
    check_float_leaves(params, "parameter", OP)
    groups = config.groups(params)
    leaves = jax.tree_util.tree_leaves(params)
    parts = _parts(leaves, groups)
    try:
        syncs = tuple(config.sync.init(part) for part in parts)
    except Exception as e:
        raise ValueError(f"{_WHERE}: `sync.init` failed on a fragment of the parameters (a "
                         f"list of leaves): {e}. `sync` must take a pseudo-gradient shaped like "
                         f"the parameters, e.g. jss.dense_sync()") from e
    return DiLoCoState(
        count=jnp.zeros((), jnp.int32),
        # a copy: params and the state may both be donated
        anchor=jax.tree_util.tree_map(lambda p: jnp.array(p, copy=True), params),
        inner=config.inner.init(params),
        outer=tuple(config.outer.init(part) for part in parts),
        sync=syncs, snapped=jnp.zeros((len(leaves),), bool), last_stats=_no_stats())


def _no_stats():
    return jnp.zeros((len(STATS_FIELDS),), stats_dtype())


def _stats_of(sync_state):
    """The sync's wire statistics of its step, zeros for a sync without any."""
    try:
        return last_stats(sync_state).astype(stats_dtype())
    except ValueError:
        return _no_stats()


def _check_synced(synced, sent) -> None:
    """The sync's result must be a tree of the pseudo-gradient's leaves, shapes and kinds."""
    got = jax.tree_util.tree_structure(synced)
    want = jax.tree_util.tree_structure(sent)
    same = got == want and all(
        jnp.shape(a) == jnp.shape(b) and jnp.issubdtype(jnp.result_type(a), jnp.floating)
        for a, b in zip(jax.tree_util.tree_leaves(synced), jax.tree_util.tree_leaves(sent)))
    if not same:
        raise ValueError(f"{_WHERE}: `sync` cannot take a pseudo-gradient: given a list of "
                         f"{len(jax.tree_util.tree_leaves(sent))} float leaves it returned "
                         f"{got}; `sync` must map each rank's tree to the mean over the ranks "
                         f"(same leaves and shapes), e.g. jss.dense_sync() or "
                         f"jss.topk_sync(density=0.01)")


def _fragment_outer_step(config: DiLoCoConfig, shared, outer_state, sync_state, params,
                         inner_updates):
    """One fragment's outer step: its pseudo-gradient (``shared - params after this
    step's inner update``) through the sync, the outer update of its shared leaves."""
    local = optax.apply_updates(params, inner_updates)
    pseudo = [a - p for a, p in zip(shared, local)]
    synced, sync_state = config.sync.update(pseudo, sync_state, shared)
    _check_synced(synced, pseudo)
    moves, outer_state = config.outer.update(synced, outer_state, shared)
    return optax.apply_updates(shared, moves), outer_state, sync_state, _stats_of(sync_state)


def _no_outer_step(shared, outer_state, sync_state, params, inner_updates):
    del params, inner_updates
    return list(shared), outer_state, sync_state, _no_stats()


def _outer_steps(config: DiLoCoConfig, groups, t, state: DiLoCoState, anchor, params,
                 inner_updates):
    """The outer step of the fragment whose turn it is after step ``t``, if any.

    One ``lax.cond`` on a boolean per fragment, over that fragment's leaves and states
    only: XLA runs its untaken side in place, where an int-indexed ``lax.switch``
    copied every buffer it passed through (the anchor and the outer momentum, each
    step). Both sides are typed as varying like their inputs (shard_map's check_vma).
    """
    starting = config.starting(t, len(groups))
    anchor, outers, syncs, stats = list(anchor), [], [], _no_stats()
    run = varying_as_inputs(functools.partial(_fragment_outer_step, config))
    for f, ids in enumerate(groups):
        shared, outer_state, sync_state, sent = jax.lax.cond(
            starting == f, run, varying_as_inputs(_no_outer_step), [anchor[i] for i in ids],
            state.outer[f], state.sync[f], [params[i] for i in ids],
            [inner_updates[i] for i in ids])
        for i, new in zip(ids, shared):
            anchor[i] = new
        outers.append(outer_state)
        syncs.append(sync_state)
        stats = jnp.where(starting == f, sent, stats)
    return anchor, tuple(outers), tuple(syncs), stats


def _merges(config: DiLoCoConfig, groups, t, params, inner_updates, anchor):
    """The step's updates: the inner ones, but for the leaves of the fragment merged
    after step ``t``, which go to ``anchor`` (``mix`` 0), else to ``mix * local + (1 -
    mix) * anchor``; and which leaves land on the anchor exactly.

    A select per leaf, not a conditional: XLA fuses it into the inner optimizer's last
    pass (and the caller's ``params + updates``), where a conditional's output would
    be written out and read back (one more read of the anchor a step, instead of a
    write and two reads of the update)."""
    merging = config.merging(t, len(groups))
    updates, snapped = list(inner_updates), [None] * len(params)
    for f, ids in enumerate(groups):
        merged = merging == f
        for i in ids:
            target = anchor[i]
            if config.mix:
                local = params[i] + inner_updates[i]
                target = (config.mix * local + (1.0 - config.mix) * anchor[i]).astype(
                    anchor[i].dtype)
            updates[i] = jnp.where(merged, (target - params[i]).astype(updates[i].dtype),
                                   updates[i])
            snapped[i] = merged & (not config.mix)
    return updates, jnp.stack(snapped)


def update(config: DiLoCoConfig, updates, state: DiLoCoState, params=None):
    """One step: the inner update, the outer step whose turn it is, the merge."""
    if params is None:
        raise ValueError(f"{_WHERE}: `update` needs the parameters (the pseudo-gradient is "
                         f"their change): call tx.update(grads, state, params)")
    check_float_leaves(updates, "gradient", OP)
    groups = config.groups(params)
    if len(state.sync) != len(groups) or len(state.outer) != len(groups):
        raise ValueError(f"{_WHERE}: the state has {len(state.sync)} fragments but `fragments` "
                         f"gives {len(groups)}: restore it under the configuration that wrote it")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    t = state.count + 1
    inner_updates, inner_state = config.inner.update(updates, state.inner, params)
    inner_updates = treedef.flatten_up_to(inner_updates)
    anchor, outers, syncs, stats = _outer_steps(
        config, groups, t, state, treedef.flatten_up_to(state.anchor), leaves, inner_updates)
    new_updates, snapped = _merges(config, groups, t, leaves, inner_updates, anchor)
    return (jax.tree_util.tree_unflatten(treedef, new_updates),
            DiLoCoState(t, jax.tree_util.tree_unflatten(treedef, anchor), inner_state,
                        outers, syncs, snapped, stats))


def inner_update(config: DiLoCoConfig, updates, state: DiLoCoState, params=None):
    """A step with neither an outer step nor a merge (see :class:`DiLoCoTransformation`)."""
    inner_updates, inner_state = config.inner.update(updates, state.inner, params)
    return inner_updates, state._replace(count=state.count + 1, inner=inner_state,
                                         snapped=jnp.zeros_like(state.snapped),
                                         last_stats=_no_stats())


def _find_state(opt_state) -> DiLoCoState:
    found = []

    def walk(x):
        if isinstance(x, DiLoCoState):
            found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)

    walk(opt_state)
    if len(found) != 1:
        raise ValueError(f"jax_sparse_sync.diloco_apply_updates: `state` must hold exactly one "
                         f"DiLoCoState (the state of a jss.diloco, as tx.update returned it); "
                         f"found {len(found)}")
    return found[0]


def diloco_apply_updates(params, updates, state):
    """``optax.apply_updates`` for :func:`diloco`: the leaves an outer step merged are
    set to the shared parameters exactly.

    Where this step's update moves a leaf onto the anchor (``state.snapped``: a
    merge with ``mix=0``), the result is the anchor's value itself, bit for bit, so
    every rank holds the same parameters; elsewhere it is ``params + updates`` as
    ``optax.apply_updates`` computes it. Jit-able: one select a leaf, which XLA
    fuses with the addition.

    Args:
      params: the parameters the step's ``update`` was given.
      updates: the step's updates from :func:`diloco`'s ``update``.
      state: the state that ``update`` returned (a :class:`DiLoCoState`, or an
        optimizer state holding exactly one, e.g. an ``optax.chain``'s tuple).

    Returns:
      The new parameters.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = jss.diloco(optax.sgd(0.1), every=1, sync=jss.dense_sync())
      >>> params = {"w": jnp.array([0.3])}
      >>> updates, state = tx.update({"w": jnp.array([1e-3])}, tx.init(params), params)
      >>> new = jss.diloco_apply_updates(params, updates, state)
      >>> new["w"].tobytes() == state.anchor["w"].tobytes()
      True
    """
    found = _find_state(state)
    moved = optax.apply_updates(params, updates)
    leaves, treedef = jax.tree_util.tree_flatten(moved)
    if found.snapped.shape != (len(leaves),):
        raise ValueError(f"jax_sparse_sync.diloco_apply_updates: the state was written for "
                         f"{found.snapped.shape[0]} parameter leaves, `params` has {len(leaves)}")

    # a select, fused with the addition (and the update's own select in diloco's step)
    out = [jnp.where(found.snapped[i], a.astype(x.dtype), x)
           for i, (x, a) in enumerate(zip(leaves, treedef.flatten_up_to(found.anchor)))]
    return jax.tree_util.tree_unflatten(treedef, out)
