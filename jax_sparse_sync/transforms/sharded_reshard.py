""":func:`jss.reshard_state` for :func:`jss.sharded_sync`'s state: the regions re-cut.

A sharded state holds two kinds of arrays. The gradient's residual is per rank,
like every sync's: it follows :mod:`~jax_sparse_sync.transforms.reshard`'s rule
(new rank j gets the mean of the old ranks whose shares of the batch overlap its
own, so the residuals' mean over ranks is kept). The inner optimizer's state and
the owner's change residual are not per rank but pieces of one vector: rank q of
P holds entries ``[q N / P, (q + 1) N / P)``. They are put back together (each
old region's entries, in rank order) and cut again at Q's boundaries, so every
entry keeps its bits and only its owner changes: the change residual's sum is
kept exactly, and the optimizer continues as if nothing had happened. Scalar
leaves of the inner state (its step count) must be equal on every old rank.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from jax_sparse_sync.ops.region_reduce import region_bounds, region_slot
from jax_sparse_sync.transforms.sharded_sync import ShardedSyncState

__all__ = ["recut", "reshard_sharded_state", "sharded_template"]


def recut(pieces: Sequence[Any], size: int, new_size: int, new_rank: int) -> np.ndarray:
    """New rank ``new_rank``'s region (of ``new_size`` ranks) of the vector whose old
    regions are ``pieces`` (one per old rank, in rank order, each ``ceil(size / P)``
    entries, zero-padded), as a ``ceil(size / new_size)`` array, zero-padded."""
    old = region_bounds(size, len(pieces))
    whole = np.concatenate([np.asarray(x)[:hi - lo] for x, (lo, hi) in
                            zip(pieces, zip(old, old[1:]))])
    lo, hi = region_bounds(size, new_size)[new_rank:new_rank + 2]
    out = np.zeros((region_slot(size, new_size),), whole.dtype)
    out[:hi - lo] = whole[lo:hi]
    return out


def _flat_size(state: ShardedSyncState) -> int:
    return int(np.size(state.residual))


def reshard_sharded_state(states: Sequence[ShardedSyncState], new_size: int, new_rank: int,
                          where: str, *, mean: Callable, equal: Callable,
                          world: Callable) -> ShardedSyncState:
    """New rank ``new_rank``'s state of ``new_size`` ranks, from the old ranks' ``states``.

    ``mean(arrays)``: the per-rank rule's weighted mean; ``equal(values, what)``: the
    value all old ranks agree on (else a ValueError); ``world(new_size, new_rank)``:
    the new marker (all from :mod:`~jax_sparse_sync.transforms.reshard`)."""
    first = states[0]
    n, old_size = _flat_size(first), len(states)
    old_slot = region_slot(n, old_size)

    def region_or_scalar(path, *leaves):
        shape = np.shape(leaves[0])
        if shape == (old_slot,):
            return recut(leaves, n, new_size, new_rank)
        if shape == ():
            return equal(leaves, f"the inner state's {jax.tree_util.keystr(path)} at {where}")
        raise ValueError(f"jax_sparse_sync.reshard_state: the inner state's leaf "
                         f"{jax.tree_util.keystr(path)} at {where} has shape {shape}, not the "
                         f"region's ({old_slot},) of {old_size} ranks nor a scalar; pass every "
                         "old rank's state, in rank order")
    change = (recut([s.change_residual for s in states], n, new_size, new_rank)
              if np.size(first.change_residual) else np.asarray(first.change_residual))
    zero = np.zeros_like(np.asarray(first.last_stats))
    return ShardedSyncState(
        count=equal([s.count for s in states], f"`count` at {where}"),
        residual=mean([s.residual for s in states]),
        inner=jax.tree_util.tree_map_with_path(region_or_scalar, *[s.inner for s in states]),
        change_residual=change, last_stats=zero, reduce_stats=zero.copy(),
        world=world(new_size, new_rank))


def sharded_template(state: ShardedSyncState, world_size: int, rank: int,
                     world: Callable) -> ShardedSyncState:
    """``state`` (this job's) shaped as rank ``rank`` of ``world_size`` holds it (a restore
    target, :func:`jss.checkpoint_template`): the region leaves ``ceil(N / P)`` long."""
    n = _flat_size(state)
    slot, new_slot = np.size(state.change_residual), region_slot(n, world_size)
    here = jax.tree_util.tree_leaves(state.inner)
    here_slot = max((np.shape(x)[0] for x in here if np.ndim(x) == 1), default=0)

    def resize(leaf):
        if np.ndim(leaf) == 1 and np.shape(leaf)[0] == here_slot:
            return np.zeros((new_slot,), np.asarray(leaf).dtype)
        return leaf
    return state._replace(
        inner=jax.tree_util.tree_map(resize, state.inner),
        change_residual=np.zeros((new_slot if slot else 0,), np.float32),
        world=None if state.world is None else world(world_size, rank))
