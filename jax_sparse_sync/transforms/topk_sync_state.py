"""The state of ``topk_sync`` and ``grouped_topk_sync``: one layout, so a checkpoint
restores under either (the grouped residual keeps the ungrouped flat layout)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.arguments import round_to_wire
from jax_sparse_sync.bindings.selection import residual_update
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["TopkSyncState", "initial_topk_sync_state", "keep_wire_rounding", "kept_wire",
           "wire_rounding_lost", "check_residual_decay"]


def kept_wire(source, wire: int) -> int:
    """The wire whose rounding the residual keeps: ``wire`` (0 float32, 1 bfloat16,
    2 float16), or 0 (none kept) for a ``source`` whose producer reads a zero
    residual as "sent" (``AccumulatorSource.exact_sent``: momentum masking), where
    a sent entry's residual must stay exactly zero."""
    return 0 if source.exact_sent else wire


def wire_rounding_lost(values, wire: int):
    """What a 16-bit wire takes from this rank's sent ``values``: ``v - round(v)``
    in float32 (``wire``: 1 bfloat16, 2 float16); None for 0 (float32: nothing)."""
    if not wire:
        return None
    v = values.astype(jnp.float32)
    return v - round_to_wire(v, wire)


def add_wire_rounding(residual, lost, indices):
    """``residual[i] += lost`` at each sent entry (``indices`` unique, -1 padding)."""
    n = residual.shape[0]
    return residual.at[jnp.where(indices < 0, n, indices)].add(lost.astype(residual.dtype),
                                                               mode="drop")


def keep_wire_rounding(residual, values, indices, wire: int):
    """Error feedback keeps what a 16-bit wire drops: ``residual[i] += v - round(v)``
    for each sent entry (``indices`` unique, -1 padding), where ``round`` is the
    wire's rounding of ``v`` (``wire``: 0 float32, nothing to keep; 1 bfloat16; 2
    float16). What the ranks' partial sums lose on the wire is not kept (it is
    not any one rank's)."""
    if not wire:
        return residual
    return add_wire_rounding(residual, wire_rounding_lost(values, wire), indices)


def settle_residual(acc, indices, values, wire: int, cleared=None, *, lost=None):
    """The residual after a step: ``acc`` with the sent entries (``indices``, -1
    padding) zeroed, in place for float32 and 16-bit residuals (float64 through
    XLA's scatter); a 16-bit wire's rounding of ``values`` kept
    (:func:`keep_wire_rounding`; ``values`` None: float32, nothing kept), or,
    where the branches of a step differ in their wire, ``lost`` (a branch's
    :func:`wire_rounding_lost`, 0 where nothing is kept) added at ``indices``;
    all zero where ``cleared`` (a traced bool: this step was a dense one)."""
    n = acc.shape[0]
    if acc.dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        residual = residual_update(acc, indices)
    else:  # float64 residuals (x64)
        residual = acc.at[jnp.where(indices < 0, n, indices)].set(0, mode="drop")
    if values is not None:
        residual = keep_wire_rounding(residual, values, indices, wire)
    if lost is not None:
        residual = add_wire_rounding(residual, lost, indices)
    if cleared is not None:  # one pass, on every step of a transform with dense steps
        residual = jnp.where(cleared, jnp.zeros_like(residual), residual)
    return residual


class TopkSyncState(NamedTuple):
    """State of :func:`topk_sync`: arrays only, so it checkpoints with the optimizer.

    Attributes:
      count: number of steps taken (int32).
      residual: what this rank has accumulated but not yet sent (error
        feedback): one flat vector of all N entries in ``residual_dtype``, the
        parameter leaves raveled and concatenated in ``jax.tree_util`` order
        (``jss.unflatten_residual(state.residual, params)`` gives it their
        shapes). One buffer, so a step updates it in place. It differs from
        rank to rank: checkpoint it per rank. A state saved when the residual
        was a tree shaped like the parameters still loads: the first step
        ravels it (same order, same values).
      threshold: the reused local threshold (``selection="threshold_reuse"``;
        the last estimate for ``"gaussian"``; the k-th magnitude for ``"exact"``).
      last_local_count: entries the local selection kept last step (int32).
      last_stats: this rank's wire statistics of the last step, one entry per
        field of :class:`~jax_sparse_sync.SyncStats` (int64 with x64 enabled,
        otherwise int32 saturating at 2**31 - 1); read it with
        ``jss.SyncStats.from_vector(state.last_stats)``.
      world: on the MPI transport, int32 (P,): 1 at this rank, 0 elsewhere, for
        the communicator that wrote the state (its length is the world size); a
        step on a communicator of another size raises a ``ValueError`` naming
        :func:`jss.reshard_state`, which converts a checkpoint between world
        sizes. ``None`` on a mesh axis and in states saved before it existed.
    """

    count: jax.Array
    residual: jax.Array
    threshold: jax.Array
    last_local_count: jax.Array
    last_stats: jax.Array
    world: jax.Array | None = None


def initial_topk_sync_state(size: int, residual_dtype, world=None) -> TopkSyncState:
    """The state before the first step: nothing held back, no threshold, no traffic."""
    return TopkSyncState(
        count=jnp.zeros((), jnp.int32),
        residual=jnp.zeros((size,), residual_dtype),
        threshold=jnp.zeros((), jnp.float32),
        last_local_count=jnp.zeros((), jnp.int32),
        last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()),
        world=world,
    )


def check_residual_decay(residual_decay, op: str):
    """``None`` for plain error feedback (1.0), else a function step count -> factor."""
    where = f"jax_sparse_sync.{op}: `residual_decay`"
    if callable(residual_decay):
        first = residual_decay(0)
        if not (jnp.ndim(first) == 0 and 0.0 < float(first) <= 1.0):
            raise ValueError(f"{where} schedule must give a factor in (0, 1]; at step 0 it "
                             f"gives {first!r}")
        return lambda count: jnp.asarray(residual_decay(count), jnp.float32)
    if not (isinstance(residual_decay, (int, float)) and 0.0 < residual_decay <= 1.0):
        raise ValueError(f"{where} must be a float in (0, 1] (1.0: plain error feedback) or a "
                         f"schedule (step -> factor); got {residual_decay!r}")
    if residual_decay == 1.0:
        return None
    factor = float(residual_decay)
    return lambda count: factor
