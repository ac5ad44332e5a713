"""Restoring a checkpoint on another number of ranks: :func:`reshard_state`.

An error-feedback state is per rank: each rank's residual holds what it has
accumulated but not yet sent. A checkpoint written by P ranks is P states; a
job of Q ranks needs Q. This module converts one into the other so that what
the ranks held back is neither lost nor counted twice.

The rule, one for every per-rank array: rank i of P stands for the share
``[i/P, (i+1)/P)`` of the global batch, new rank j of Q for ``[j/Q, (j+1)/Q)``;
new rank j gets the mean of the old ranks whose shares overlap its own,
weighted by the overlap (the weights of each new rank sum to 1). Growing by a
whole factor (4 -> 8) gives each new rank a copy of its parent's arrays;
shrinking by one (4 -> 2) gives it the mean of its group.

Why a mean and not a sum: the sync applies ``sum_i(sent_i) / P``, so what the
residuals will still add to the parameters is ``sum_i(residual_i) / P``, the
mean over ranks. The rule keeps that mean: ``mean_j(new_j) = mean_i(old_i)``.
Putting each old residual on one new rank (and zeros on the others) would keep
the sum instead, and so halve what reaches the parameters at 4 -> 8 and double
it at 4 -> 2.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.ops.oktopk import even_boundaries
from jax_sparse_sync.transforms.adam_direction_sync import AdamDirectionSyncState
from jax_sparse_sync.transforms.adam_pass import AGE_DTYPE, MAX_AGE
from jax_sparse_sync.transforms.block_sync import BlockSyncState
from jax_sparse_sync.transforms.chunked_topk_sync import ChunkedTopkSyncState
from jax_sparse_sync.transforms.dense_sync import DenseSyncState
from jax_sparse_sync.transforms.oktopk_sync import OktopkSyncState
from jax_sparse_sync.transforms.sharded_reshard import reshard_sharded_state, sharded_template
from jax_sparse_sync.transforms.sharded_sync import ShardedSyncState
from jax_sparse_sync.transforms.shared_support_sync import SharedSupportSyncState
from jax_sparse_sync.transforms.topk_sync_state import TopkSyncState

__all__ = ["reshard_state", "checkpoint_template", "pairwise_rank_sum", "share_weights"]

OP = "jax_sparse_sync.reshard_state"
#: The library's states that :func:`reshard_state` converts (any other leaf is copied).
SYNC_STATES = (TopkSyncState, OktopkSyncState, SharedSupportSyncState, AdamDirectionSyncState,
               DenseSyncState, BlockSyncState, ShardedSyncState, ChunkedTopkSyncState)


def share_weights(old_size: int, new_size: int, new_rank: int) -> list[tuple[int, int]]:
    """The old ranks that new rank ``new_rank`` covers, as ``(old_rank, numerator)``
    pairs: its weight is ``numerator / old_size``, the weights sum to 1.

    The overlap of ``[i/P, (i+1)/P)`` and ``[j/Q, (j+1)/Q)``, times Q, in integer
    units of ``1/(P Q)``: ``[i Q, (i+1) Q)`` against ``[j P, (j+1) P)``.
    """
    lo, hi = new_rank * old_size, (new_rank + 1) * old_size
    terms = []
    for i in range(lo // new_size, min(old_size, -(-hi // new_size))):
        overlap = min(hi, (i + 1) * new_size) - max(lo, i * new_size)
        if overlap > 0:
            terms.append((i, overlap))
    return terms


def pairwise_rank_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The sum of ``arrays`` (one per rank, in rank order) as a balanced pairwise
    tree in their dtype: ``(x0 + x1) + (x2 + x3)`` for four (recursive
    doubling's order). With this order, resharding between powers of two keeps
    the mean over ranks bitwise (see :func:`reshard_state`)."""
    if len(arrays) == 1:
        return np.asarray(arrays[0])
    half = len(arrays) // 2
    return np.add(pairwise_rank_sum(arrays[:half]), pairwise_rank_sum(arrays[half:]))


def _weighted_mean(xs: Sequence[Any], terms, old_size: int):
    """``sum(numerator / P * xs[i])`` over ``terms``, in the arrays' dtype."""
    arrays = [np.asarray(xs[i]) for i, _ in terms]
    numerators = {n for _, n in terms}
    if len(numerators) == 1:  # equal weights: one pairwise sum, one scaling
        if len(arrays) == 1:  # weight 1: a copy of the parent's
            return arrays[0].copy()
        total = pairwise_rank_sum(arrays)
        return (total * np.asarray(terms[0][1] / old_size, total.dtype)).astype(total.dtype)
    mixed = sum(np.float64(n) / old_size * a.astype(np.float64) for a, (_, n) in zip(arrays, terms))
    return np.asarray(mixed).astype(arrays[0].dtype)


def _age_mean(ages: Sequence[Any], terms, old_size: int):
    """The ranks' int16 ages averaged as float32, rounded to the nearest age."""
    mean = _weighted_mean([np.asarray(a, np.float32) for a in ages], terms, old_size)
    return np.clip(np.rint(mean), 0, MAX_AGE).astype(AGE_DTYPE)


def _tree_mean(trees: Sequence[Any], terms, old_size: int):
    return jax.tree_util.tree_map(lambda *xs: _weighted_mean(xs, terms, old_size), *trees)


def _equal(values: Sequence[Any], what: str):
    """The value all old ranks agree on (bitwise), else a ValueError."""
    first = np.asarray(values[0])
    for rank, value in enumerate(values[1:], 1):
        value = np.asarray(value)
        if value.shape != first.shape or value.dtype != first.dtype or \
                value.tobytes() != first.tobytes():
            raise ValueError(
                f"{OP}: {what} differs between old rank 0 and old rank {rank}; it must be the "
                f"same on every rank (were the checkpoints written at different steps, or by "
                f"different jobs?)")
    return values[0]


def _zero(value):
    return np.zeros_like(np.asarray(value))


def _check_world(states, where: str) -> None:
    """The ``world`` fields, when recorded, say P ranks and the given rank order."""
    worlds = [s.world for s in states]
    if all(w is None for w in worlds):
        return
    for rank, world in enumerate(worlds):
        world = None if world is None else np.asarray(world)
        if world is None or world.shape != (len(states),) or int(np.argmax(world)) != rank \
                or int(world.sum()) != 1:
            raise ValueError(
                f"{OP}: entry {rank} of `states` ({where}) was not written by rank {rank} of "
                f"{len(states)} (its `world` is {None if world is None else world.tolist()}); "
                "pass every old rank's state, in rank order")


def _new_world(new_size: int, new_rank: int):
    return np.eye(new_size, dtype=np.int32)[new_rank]


def _flat_size(residual) -> int:
    return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(residual))


def _reshard_sync_state(states, terms, new_size: int, new_rank: int, where: str):
    """New rank ``new_rank``'s version of one of the library's states."""
    old_size = len(states)
    first = states[0]
    if not all(type(s) is type(first) for s in states):
        raise ValueError(f"{OP}: the states at {where} are of different types across ranks: "
                         f"{sorted({type(s).__name__ for s in states})}")
    if isinstance(first, (DenseSyncState, BlockSyncState)):
        return type(first)(last_stats=_zero(first.last_stats))
    if isinstance(first, ShardedSyncState):  # its regions re-cut (sharded_reshard.py)
        _check_world(states, where)
        return reshard_sharded_state(states, new_size, new_rank, where, equal=_equal,
                                     mean=lambda xs: _tree_mean(xs, terms, old_size),
                                     world=_new_world)
    count = _equal([s.count for s in states], f"`count` at {where}")
    if isinstance(first, TopkSyncState):
        _check_world(states, where)
        return TopkSyncState(
            count=count,
            residual=_tree_mean([s.residual for s in states], terms, old_size),
            threshold=_weighted_mean([s.threshold for s in states], terms, old_size),
            last_local_count=_zero(first.last_local_count),
            last_stats=_zero(first.last_stats),
            world=_new_world(new_size, new_rank))
    if isinstance(first, OktopkSyncState):
        for rank, s in enumerate(states):
            if np.shape(s.boundaries) != (old_size + 1,):
                raise ValueError(f"{OP}: entry {rank} of `states` ({where}) has "
                                 f"{np.shape(s.boundaries)[0]} region boundaries, so it was "
                                 f"written by {np.shape(s.boundaries)[0] - 1} ranks, not "
                                 f"{old_size}; pass every old rank's state, in rank order")
        return OktopkSyncState(
            count=count,
            residual=_tree_mean([s.residual for s in states], terms, old_size),
            # the same ranks: the data-derived regions (equal on every rank) carry over
            boundaries=(_equal([s.boundaries for s in states], f"`boundaries` at {where}")
                        if new_size == old_size else
                        np.asarray(even_boundaries(_flat_size(first.residual), new_size))),
            local_threshold=_weighted_mean([s.local_threshold for s in states], terms, old_size),
            global_threshold=_equal([s.global_threshold for s in states],
                                    f"`global_threshold` at {where}"),
            last_local_count=_zero(first.last_local_count),
            last_stats=_zero(first.last_stats))
    if isinstance(first, ChunkedTopkSyncState):
        _check_world(states, where)
        return ChunkedTopkSyncState(
            count=count, residual=_tree_mean([s.residual for s in states], terms, old_size),
            last_stats=_zero(first.last_stats), world=_new_world(new_size, new_rank))
    if isinstance(first, SharedSupportSyncState):
        _check_world(states, where)
        return SharedSupportSyncState(
            count=count,
            residual=_tree_mean([s.residual for s in states], terms, old_size),
            support=_equal([s.support for s in states], f"`support` at {where}"),
            threshold=_weighted_mean([s.threshold for s in states], terms, old_size),
            last_stats=_zero(first.last_stats),
            world=_new_world(new_size, new_rank))
    # AdamDirectionSyncState: the pending masks applied with the old residuals first
    moments = [tuple(np.asarray(x) for x in s.moments()) for s in states]
    return AdamDirectionSyncState(
        count=count,
        mu=_weighted_mean([m for m, _ in moments], terms, old_size),
        nu=_weighted_mean([s.nu for s in states], terms, old_size),
        age=_age_mean([a for _, a in moments], terms, old_size),
        sync=_reshard_sync_state([s.sync for s in states], terms, new_size, new_rank,
                                 where + ".sync"),
        noise=None if first.noise is None else _tree_mean([s.noise for s in states], terms,
                                                          old_size))


def _is_sync_state(node) -> bool:
    return isinstance(node, SYNC_STATES)


def reshard_state(states: Sequence[Any], new_size: int, *, rank: int | None = None):
    """Converts the optimizer states of P ranks into those of ``new_size`` ranks.

    For restoring a checkpoint on another number of ranks (MPI transport): load
    every old rank's optimizer state (the whole ``optax`` state tree, e.g. of
    ``optax.chain(jss.topk_sync(...), optax.adam(...))``), in rank order, and
    give each new rank its entry of the result. A step on states of another
    world size, not resharded, raises a ``ValueError`` that names this function.

    Every ``*_sync`` state in the tree is converted; every other leaf (the
    optimizer's own moments, schedules' counts) must be bitwise the same on all
    old ranks, as after a synced step, and is carried over.

    New rank j gets, of every per-rank array, the mean of the old ranks whose
    shares of the batch (``[i/P, (i+1)/P)``) overlap its own
    (``[j/Q, (j+1)/Q)``), weighted by the overlap: a copy of its parent's
    arrays when growing by a whole factor (4 -> 8), the mean of its group when
    shrinking by one (4 -> 2). So the residuals' mean over ranks, which is what
    they will still add to the parameters (the sync applies the sum over ranks
    divided by P), is preserved: ``sum(new) / Q == sum(old) / P``. Exactly,
    bitwise, when P and Q are powers of two and both sums are taken in
    :func:`pairwise_rank_sum`'s order (barring underflow to subnormals: the
    rule copies, sums a group in that order and scales by a power of two);
    otherwise to within the rounding of the weighted means (float64
    accumulation, one rounding per entry). Tested end to end in
    ``tests/mpi/reshard_case.py``.

    Per state:

    * residuals (``topk_sync``, ``grouped_topk_sync``, ``oktopk_sync``,
      ``shared_support_sync``, ``chunked_topk_sync``, the sync inside
      ``adam_direction_sync``): the weighted mean above;
    * ``count``, ``support`` (shared support) and Ok-Topk's
      ``global_threshold``: equal on every rank, carried (checked equal);
    * local thresholds (``threshold`` of ``topk_sync`` and
      ``shared_support_sync``, ``local_threshold``): carried, by the same
      weighted mean (a child keeps its parent's; a merged rank the mean of
      its group's): the next steps nudge them toward k entries as usual and
      recompute them exactly at the next multiple of ``tau``. Not reset to 0:
      Ok-Topk nudges a threshold by a factor, so a 0 would stay 0 until then;
    * Ok-Topk's region ``boundaries``: re-derived, even boundaries for Q ranks
      (as ``init`` makes; recomputed from the data every ``tau_prime`` steps);
      carried when Q == P, so that resharding to the same size changes nothing
      (the continued run is bitwise the uninterrupted one, tested);
    * ``adam_direction_sync``'s ``mu``, ``nu``, ``age`` and ``noise``: its
      pending momentum masks are applied first (:meth:`moments`, with the old
      residuals they refer to), then the weighted mean;
    * :func:`jss.sharded_sync`'s inner optimizer state and change residual:
      not per rank but the regions of one vector, so they are put back together
      and re-cut at the new ranks' boundaries (every entry keeps its bits; the
      change residual's sum is kept exactly; scalar leaves, the inner step count,
      checked equal); its gradient residual follows the weighted mean above
      (:mod:`~jax_sparse_sync.transforms.sharded_reshard`);
    * ``last_local_count``, ``last_stats`` (and ``dense_sync``'s,
      ``block_sync``'s): zero; they describe a rank's last step, which the new
      rank has not taken;
    * ``world``: new rank j's marker for Q ranks.

    Args:
      states: the old ranks' optimizer states, in rank order (P of them), as
        loaded (NumPy or JAX arrays).
      new_size: Q, the number of ranks that will continue.
      rank: return only new rank ``rank``'s state (what each new rank needs;
        saves computing the others). ``None``: all Q, a list.

    Returns:
      A list of Q state trees, or new rank ``rank``'s tree; the converted
      arrays are host NumPy arrays (``jax.device_put`` them, or pass them to
      the jitted step).

    Example:
      >>> import jax.numpy as jnp, numpy as np, optax, jax_sparse_sync as jss
      >>> s = lambda r, c: jss.TopkSyncState(jnp.int32(c), jnp.array(r, jnp.float32),
      ...     jnp.float32(0), jnp.int32(0), jnp.zeros(7, jnp.int32))
      >>> old = [s([1., 0.], 3), s([0., 2.], 3), s([4., 0.], 3), s([0., 8.], 3)]  # P = 4
      >>> [x.residual.tolist() for x in jss.reshard_state(old, 2)]  # each rank's group's mean
      [[0.5, 1.0], [2.0, 4.0]]
    """
    states = list(states)
    if not states:
        raise ValueError(f"{OP}: `states` is empty; pass every old rank's state, in rank order")
    if isinstance(new_size, bool) or not isinstance(new_size, int) or new_size < 1:
        raise ValueError(f"{OP}: `new_size` must be a positive int (the new number of ranks); "
                         f"got {new_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                             or not 0 <= rank < new_size):
        raise ValueError(f"{OP}: `rank` must be None or an int in [0, new_size={new_size}); "
                         f"got {rank!r}")
    old_size = len(states)
    try:
        structure = jax.tree_util.tree_structure(states[0], is_leaf=_is_sync_state)
        for i, s in enumerate(states[1:], 1):
            other = jax.tree_util.tree_structure(s, is_leaf=_is_sync_state)
            if other != structure:
                raise ValueError(f"{OP}: the state of old rank {i} is not shaped like old rank "
                                 f"0's ({other} against {structure}); pass the same optimizer's "
                                 "states")
    except TypeError as e:  # pragma: no cover - unusual pytrees
        raise ValueError(f"{OP}: could not read `states` as pytrees: {e}") from e

    def build(new_rank):
        terms = share_weights(old_size, new_size, new_rank)

        def convert(path, *nodes):
            where = jax.tree_util.keystr(path) or "the root"
            if _is_sync_state(nodes[0]):
                return _reshard_sync_state(list(nodes), terms, new_size, new_rank, where)
            return _equal(nodes, f"the leaf {where} (not a jax_sparse_sync state: only "
                                 "replicated leaves are carried)")
        return jax.tree_util.tree_map_with_path(convert, *states, is_leaf=_is_sync_state)

    if rank is not None:
        return build(rank)
    return [build(j) for j in range(new_size)]


def checkpoint_template(state: Any, world_size: int, *, rank: int = 0):
    """``state`` shaped as a rank of a ``world_size``-rank job holds it: a restore target.

    A checkpointer that restores into a target of the right shapes (Orbax's
    ``StandardCheckpointer.restore(path, target)``) needs, for a checkpoint
    written by P ranks, a state whose ``world`` has P entries and whose Ok-Topk
    ``boundaries`` have P + 1; this job's ``tx.init(params)`` has this job's
    sizes. This gives ``state`` with those two fields resized (for ``rank`` of
    ``world_size``); every other leaf is unchanged (only its shape and dtype
    matter to a restore).

    Args:
      state: an optimizer state of this job (``tx.init(params)``), any tree.
      world_size: P, the number of ranks that wrote the checkpoint.
      rank: which of them (the ``world`` marker's position; a restore overwrites it).

    Returns:
      The tree, with NumPy arrays in the resized fields.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"jax_sparse_sync.checkpoint_template: `world_size` must be a positive "
                         f"int (the number of ranks that wrote the checkpoint); got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"jax_sparse_sync.checkpoint_template: `rank` must be an int in "
                         f"[0, world_size={world_size}); got {rank!r}")

    def resize(node):
        if isinstance(node, OktopkSyncState):
            return node._replace(boundaries=np.asarray(
                even_boundaries(_flat_size(node.residual), world_size)))
        if isinstance(node, AdamDirectionSyncState):
            return node._replace(sync=resize(node.sync))
        if isinstance(node, ShardedSyncState):
            return sharded_template(node, world_size, rank, _new_world)
        if isinstance(node, (TopkSyncState, SharedSupportSyncState, ChunkedTopkSyncState)) \
                and node.world is not None:
            return node._replace(world=_new_world(world_size, rank))
        return node
    return jax.tree_util.tree_map(resize, state, is_leaf=_is_sync_state)
