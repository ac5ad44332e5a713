"""``topk_sync``'s step: the shared phases (:mod:`~jax_sparse_sync.transforms.phases`)
with its selection and exchange.

accumulate (``acc = decay * residual + grad`` in place, fused with the exact top-k
for a float32 residual) -> select (the selection's local choice) -> exchange (its
sparse allreduce; a warm-up's phases and the flushes as one ``lax.switch``) ->
settle (the sent entries zeroed in place, a 16-bit wire's rounding kept).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.bindings.selection import bucket_topk
from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.accumulator_source import Accumulated
from jax_sparse_sync.transforms.dense_sync import dense_mean
from jax_sparse_sync.transforms.flat import split_like
from jax_sparse_sync.transforms.phases import (accumulate, begin_step, exchange_phases,
                                               init_size, settle)
from jax_sparse_sync.transforms.selection_policy import kth_magnitude_of, select_local
from jax_sparse_sync.transforms.topk_selection import ExchangeArguments
from jax_sparse_sync.transforms.topk_sync_config import WIRE_DTYPES, TopkSyncConfig
from jax_sparse_sync.transforms.topk_sync_state import (TopkSyncState, initial_topk_sync_state,
                                                         kept_wire, wire_rounding_lost)
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["init", "update_from", "PhaseOutcome"]

#: residual dtypes the in-place residual update takes (float64 goes through XLA's scatter)
_SELECTABLE = (jnp.float32, jnp.bfloat16, jnp.float16)


class PhaseOutcome(NamedTuple):
    """What a warm-up phase's (or a flush's) exchange gives the step after the switch."""

    updates: object        # the mean, cut into the gradient's leaves
    indices: jax.Array     # the residual entries to zero (-1: none)
    lost: object           # what a 16-bit wire took from the values sent (v - round(v)), or None
    threshold: jax.Array
    local_count: jax.Array
    stats: jax.Array


class StepContext(NamedTuple):
    """What every exchange branch of one step shares (static, or traced before the switch)."""

    size: int
    like: Any               # the gradient tree the update is shaped like
    source: Any             # the AccumulatorSource
    produced: Accumulated   # the accumulate phase's output
    own_kth: Any            # the fused selection's k-th magnitude (kept through a warm-up)
    scale: Any              # P: the sum becomes the mean


def init(config: TopkSyncConfig, params) -> TopkSyncState:
    """The state before the first step (every phase's k checked against the size)."""
    size = init_size(config.shared, params, kept=config.kept)
    return initial_topk_sync_state(size, config.shared.residual_dtype,
                                   world_marker(config.shared.comm))


def update_from(config: TopkSyncConfig, source, operands, state):
    """One step on the accumulator ``source`` makes (the plain update's: the gradient)."""
    shared = config.shared
    like, size, residual = begin_step(shared, source, operands, state.residual,
                                      lambda: check_world(state.world, shared.comm, shared.op))
    return step(config, residual, operands, state, size, source, like)


def step(config: TopkSyncConfig, residual, operands, state, size: int, source, like):
    """accumulate -> (select, exchange: one branch per phase) -> settle."""
    produced = accumulate(config.shared, source, residual, operands, state.count,
                          k=config.kept(size) if config.fused else None,
                          last_kth=state.threshold)
    acc = produced.acc
    sel = acc if acc.dtype in _SELECTABLE else acc.astype(jnp.float32)
    ctx = StepContext(size, like, source, produced,
                      kth_magnitude_of(produced.values) if config.fused else None,
                      transport.comm_size_in_trace(config.shared.comm))
    # the flushes are float32; a density-1 warm-up phase runs on warmup_wire_dtype
    out, cleared = exchange_phases(
        config.shared, state.count, functools.partial(exchange_branch, config, ctx),
        functools.partial(dense_exchange, config, ctx, WIRE_DTYPES[config.dense_wire]),
        (sel, state), padded={"indices": -1, "lost": 0},
        per_device=("indices", "lost", "threshold", "local_count"), ref=residual,
        flush=functools.partial(dense_exchange, config, ctx, None))
    new_residual = settle(acc, out.indices, cleared, lost=out.lost)
    return out.updates, TopkSyncState(
        count=optax.safe_increment(state.count),
        residual=new_residual,
        threshold=out.threshold,
        last_local_count=out.local_count,
        last_stats=out.stats.astype(state.last_stats.dtype),
        world=state.world,
    ), produced.extra


def exchange_branch(config: TopkSyncConfig, ctx: StepContext, phase_density, first_step):
    """The branch of a sparse phase: ``(sel, state) -> PhaseOutcome``."""
    return functools.partial(sparse_exchange, config, ctx, phase_density, first_step)


def sparse_exchange(config: TopkSyncConfig, ctx: StepContext, phase_density, first_step, sel,
                    state) -> PhaseOutcome:
    """select -> exchange of one phase: the mean of the ranks' choices, cut into leaves."""
    k = config.kept(ctx.size, phase_density)
    values, indices, threshold, local_count = select(config, ctx, sel, state, k, phase_density,
                                                     first_step)
    if ctx.own_kth is not None:
        threshold = ctx.own_kth
    shared = config.shared
    summed, indices, stats = config.spec.exchange(sel, values, indices, ExchangeArguments(
        size=ctx.size, k=k, step=state.count, comm=shared.comm, algorithm=config.algorithm,
        nan_policy=shared.nan_policy, quantize_bits=config.quantize_bits,
        qsgd_bucket=config.qsgd_bucket, wire_dtype=config.branch_wire(phase_density)[1],
        index_encoding=config.index_encoding))
    lost = rounding_kept(config, ctx.source, values, phase_density)
    # the mean, cut into the gradient's leaves and dtypes in one pass (which XLA
    # fuses into the next optimizer's pass over the update)
    return PhaseOutcome(split_like(summed, ctx.like, scale=ctx.scale), indices, lost,
                        jnp.asarray(threshold, jnp.float32),
                        jnp.asarray(local_count, jnp.int32), stats)


def select(config: TopkSyncConfig, ctx: StepContext, sel, state, k: int, phase_density,
           first_step):
    """(values, indices, threshold, kept count) of this rank's choice; index -1 pads.

    The fused pass already chose the own density's exact top-k; a selection whose
    exchange chooses (``cyclic``) has no local choice (values and indices None).
    """
    if config.fused and phase_density is None:
        return ctx.produced.values, ctx.produced.indices, ctx.own_kth, k
    if config.spec.local is None:
        return None, None, state.threshold, k
    if config.spec.local == "bucket":
        values, indices = bucket_topk(sel, k, config.bucket)
        return values, indices, state.threshold, jnp.sum(indices >= 0, dtype=jnp.int32)
    chosen = select_local(sel.astype(jnp.float32), k=k, policy=config.spec.local,
                          threshold=state.threshold, step=state.count - first_step,
                          tau=config.tau, capacity=config.capacity(sel.shape[0], k))
    return chosen.values, chosen.indices, chosen.threshold, chosen.count


def rounding_kept(config: TopkSyncConfig, source, values, phase_density):
    """What the residual keeps of a 16-bit wire's rounding of the sent ``values``.

    ``wire_dtype`` keeps its rounding in the residual; ``warmup_wire_dtype`` does
    not (its sent entries' residual stays exactly zero, which is how momentum
    masking tells what was sent), nor does any wire under momentum masking
    (:func:`kept_wire`). Where the own density keeps it, every branch returns an
    array of the same length (zeros where nothing is kept), so the switch's
    branches agree; where no branch keeps any, None, and the step scatter-adds
    nothing into the residual.
    """
    keep = phase_density is None or not config.warmup_wire_set
    branch_wire = config.branch_wire(phase_density)[0]
    lost = wire_rounding_lost(values, kept_wire(source, branch_wire if keep else 0))
    if lost is None and kept_wire(source, config.wire) and values is not None:
        lost = jnp.zeros(values.shape, jnp.float32)
    return lost


def dense_exchange(config: TopkSyncConfig, ctx: StepContext, wire_dtype, sel,
                   state) -> PhaseOutcome:
    """Density 1 (a warm-up phase or a flush): the whole accumulator summed densely; the
    residual is cleared (on a 16-bit warm-up wire too: its rounding is not kept)."""
    shared = config.shared
    updates, stats = dense_mean(sel.astype(jnp.float32), ctx.like, comm=shared.comm,
                                nan_policy=shared.nan_policy, wire_dtype=wire_dtype)
    threshold = state.threshold if ctx.own_kth is None else ctx.own_kth
    return PhaseOutcome(updates, None, None, jnp.asarray(threshold, jnp.float32),
                        jnp.asarray(ctx.size, jnp.int32), stats)
