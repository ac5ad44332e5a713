"""``oktopk_sync``: Ok-Topk SGD's gradient synchronization as an Optax transform.

The factory builds an :class:`OktopkSyncConfig` (every argument checked once); a
step is the module's phases on it: :func:`~jax_sparse_sync.transforms.phases.begin_step`,
the accumulate pass, :func:`exchange_phases` over :func:`oktopk_exchange` (the
local selection and :func:`jss.oktopk_allreduce`) and :func:`dense_exchange`, then
the residual settled (:func:`oktopk_step`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import check_nan_policy, wire_dtype_id
from jax_sparse_sync.ops.oktopk import check_partition, even_boundaries, oktopk_allreduce
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.dense_sync import dense_mean
from jax_sparse_sync.transforms.accumulator_source import flat_sync_transformation
from jax_sparse_sync.transforms.flat import split_like
from jax_sparse_sync.transforms.phases import (accumulate, begin_step, exchange_phases, init_size,
                                               settle)
from jax_sparse_sync.transforms.sync_config import (SparseSyncConfig, check_capacity_factor,
                                                    check_choice)
from jax_sparse_sync.transforms.topk_sync_state import kept_wire
from jax_sparse_sync.transforms.selection_policy import (SELECTION_POLICIES, nudge_threshold,
                                                         select_local)
from jax_sparse_sync.transforms.world import check_oktopk_world
from jax_sparse_sync.transforms.warmup import check_flush_every, normalize_warmup

__all__ = ["OktopkSyncState", "OktopkSyncConfig", "oktopk_sync"]

_OP = "oktopk_sync"


class OktopkSyncState(NamedTuple):
    """State of :func:`oktopk_sync`; everything a restored run needs to continue exactly.

    Attributes:
      count: steps taken (int32).
      residual: per-rank error feedback, one flat vector of the N entries in
        ``jax.tree_util`` order (as :class:`~jax_sparse_sync.TopkSyncState`'s;
        ``jss.unflatten_residual`` gives it the parameters' shapes; a state
        saved with a tree-shaped residual still loads).
      boundaries: int32 (P + 1,) region boundaries (recomputed every tau' steps).
        Their number records the world size: a step at another one raises,
        naming :func:`jss.reshard_state`.
      local_threshold: this rank's reused local threshold (float32).
      global_threshold: the reused global threshold (float32, equal on all ranks).
      last_local_count: entries the local selection kept last step (int32).
      last_stats: wire statistics of the last step (see ``jss.SyncStats``;
        ``result_nnz`` is the global count, ``switched_to_dense`` whether the
        balancing step ran).
    """

    count: jax.Array
    residual: jax.Array
    boundaries: jax.Array
    local_threshold: jax.Array
    global_threshold: jax.Array
    last_local_count: jax.Array
    last_stats: jax.Array


class OktopkOutcome(NamedTuple):
    """What a step's exchange (a phase's, a flush's) gives the residual update after it."""

    updates: object          # the mean, cut into the gradient's leaves
    indices: object          # the residual entries to zero (-1: none)
    values: object           # the values this rank chose (16-bit wires keep their rounding)
    boundaries: jax.Array
    local_threshold: jax.Array
    global_threshold: jax.Array
    local_count: jax.Array
    stats: jax.Array


def _check_region_band(region_band) -> tuple[float, float] | None:
    """``(lo, hi)`` as floats with ``0 <= lo <= hi < inf``, or None; else a ``ValueError``."""
    if region_band is None:
        return None
    try:
        band_lo, band_hi = (float(b) for b in region_band)
    except (TypeError, ValueError):
        band_lo = band_hi = float("nan")
    if isinstance(region_band, str) or not 0.0 <= band_lo <= band_hi < float("inf"):
        raise ValueError("jax_sparse_sync.oktopk_sync: `region_band` must be None or a pair "
                         f"(lo, hi) of numbers with 0 <= lo <= hi; got {region_band!r}")
    return band_lo, band_hi


@dataclasses.dataclass(frozen=True)
class OktopkSyncConfig:
    """:func:`oktopk_sync`'s options, checked (:meth:`build`).

    Attributes:
      shared: the shared options
        (:class:`~jax_sparse_sync.transforms.sync_config.SparseSyncConfig`; no
        residual decay).
      tau, tau_prime: steps between exact thresholds, between region repartitions.
      selection: the local selection policy.
      capacity_factor: a threshold selection's room, in units of k.
      band: ``region_band`` as floats ``(lo, hi)``, or None.
      wire_dtype: the Ok-Topk exchange's value dtype (None: float32).
      wire: its id (0 float32, 1 bfloat16, 2 float16).
      partition: ``"regions"`` or ``"hash"``.
    """

    shared: SparseSyncConfig
    tau: int = 32
    tau_prime: int = 64
    selection: str = "threshold_reuse"
    capacity_factor: float = 2.0
    band: tuple[float, float] | None = (0.5, 2.0)
    wire_dtype: Any = None
    wire: int = 0
    partition: str = "regions"

    @classmethod
    def build(cls, *, density=None, k=None, tau=32, tau_prime=64, selection="threshold_reuse",
              capacity_factor=2.0, region_band=(0.5, 2.0), comm=None,
              residual_dtype=jnp.float32, nan_policy="raise", warmup=None, flush_every=None,
              wire_dtype=None, partition="regions") -> "OktopkSyncConfig":
        """The checked configuration (:func:`oktopk_sync`'s arguments); raises what a
        wrong argument deserves, naming it."""
        check_choice(selection, SELECTION_POLICIES, "selection", _OP)
        check_nan_policy(nan_policy, _OP)
        check_partition(partition, _OP)
        wire = wire_dtype_id(wire_dtype, _OP)
        for name, value in (("tau", tau), ("tau_prime", tau_prime)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"jax_sparse_sync.oktopk_sync: `{name}` must be a positive "
                                 f"int; got {value!r}")
        check_capacity_factor(capacity_factor, _OP)
        band = _check_region_band(region_band)
        if density is None and k is None:
            raise ValueError("jax_sparse_sync.oktopk_sync: pass `density=` (e.g. 0.01) or `k=`.")
        # the shared options as SparseSyncConfig.build checks them, but for the
        # residual's dtype, which oktopk_sync takes as given
        shared = SparseSyncConfig(
            op=_OP, density=density, k=k, comm=transport.resolve_comm(comm),
            residual_dtype=residual_dtype, nan_policy=nan_policy,
            warmup=normalize_warmup(warmup, _OP), flush_every=check_flush_every(flush_every, _OP))
        return cls(shared=shared, tau=tau, tau_prime=tau_prime, selection=selection,
                   capacity_factor=capacity_factor, band=band, wire_dtype=wire_dtype, wire=wire,
                   partition=partition)


def kept_and_capacity(config: OktopkSyncConfig, n: int, phase_density=None) -> tuple[int, int]:
    """``(k, capacity)`` of ``n`` entries: the entries kept (the own density's or k, or
    a warm-up phase's density's) and the local selection's static room for them."""
    k_eff = config.shared.kept(n, phase_density)  # errors name oktopk_sync
    capacity = (k_eff if config.selection == "exact"
                else min(n, max(k_eff, int(config.capacity_factor * k_eff))))
    return k_eff, capacity


def region_counts(config: OktopkSyncConfig, k_eff: int, nranks: int) -> tuple[int, int]:
    """Each region owner's ``(at least, at most)`` entries kept under ``region_band``:
    rounded inward, so that the P regions together keep between lo k and hi k."""
    band_lo, band_hi = config.band
    lo_count = math.ceil(band_lo * k_eff / nranks)
    return lo_count, max(lo_count, math.floor(band_hi * k_eff / nranks))


def init_state(config: OktopkSyncConfig, params) -> OktopkSyncState:
    """The state before the first step (``n`` checked against every phase's k)."""
    n = init_size(config.shared, params, kept=functools.partial(kept_and_capacity, config))
    return OktopkSyncState(
        count=jnp.zeros((), jnp.int32),
        residual=jnp.zeros((n,), config.shared.residual_dtype),
        # P of a mesh axis is known inside shard_map/pmap only: init there
        boundaries=even_boundaries(n, transport.comm_size_in_trace(config.shared.comm, _OP)),
        local_threshold=jnp.zeros((), jnp.float32),
        global_threshold=jnp.zeros((), jnp.float32),
        last_local_count=jnp.zeros((), jnp.int32),
        last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()),
    )


def oktopk_exchange(config: OktopkSyncConfig, sel, state, *, n, like, phase_density=None,
                    first_step=0) -> OktopkOutcome:
    """The exchange of an Ok-Topk phase (the own density, ``phase_density`` None, or a
    warm-up phase's, starting at step ``first_step``): the local selection of ``sel``
    (the accumulator, float32), :func:`jss.oktopk_allreduce`, the nudged thresholds."""
    k_eff, capacity = kept_and_capacity(config, n, phase_density)
    shared = config.shared
    nranks = transport.comm_size_in_trace(shared.comm, _OP)
    # a phase starts with exact thresholds and fresh boundaries (step 0 of its schedule)
    step = state.count - first_step
    chosen = select_local(sel, k=k_eff, policy=config.selection, threshold=state.local_threshold,
                          step=step, tau=config.tau, capacity=capacity)
    result = oktopk_allreduce(
        chosen.values, chosen.indices, size=n, k=k_eff, boundaries=state.boundaries,
        global_threshold=state.global_threshold,
        # hash owners need no regions: nothing to recompute
        recompute_boundaries=(step % config.tau_prime == 0) & (config.partition == "regions"),
        # on schedule only: a computed threshold of 0 (fewer than k entries in the
        # sum) is a valid threshold, not a request to recompute every step
        recompute_threshold=step % config.tau == 0,
        comm=shared.comm, nan_policy=shared.nan_policy,
        region_counts=None if config.band is None else region_counts(config, k_eff, nranks),
        wire_dtype=config.wire_dtype, partition=config.partition)
    # zero the residual only where this rank's entry made the global top-k
    kept = result.contributed & (chosen.indices >= 0)
    return OktopkOutcome(
        updates=split_like(result.sum, like, scale=nranks),
        indices=jnp.where(kept, chosen.indices, -1),
        values=chosen.values,
        boundaries=result.boundaries,
        local_threshold=chosen.threshold,
        global_threshold=nudge_threshold(result.threshold, result.stats.result_nnz, k_eff),
        local_count=chosen.count,
        stats=jnp.stack(result.stats))


def dense_exchange(config: OktopkSyncConfig, sel, state, *, n, like) -> OktopkOutcome:
    """A warm-up phase of density 1 or a flush: the whole accumulator, summed densely
    (the thresholds and boundaries carry over)."""
    new_updates, stats = dense_mean(sel, like, comm=config.shared.comm,
                                    nan_policy=config.shared.nan_policy)
    return OktopkOutcome(
        updates=new_updates, indices=None, values=None, boundaries=state.boundaries,
        local_threshold=state.local_threshold, global_threshold=state.global_threshold,
        local_count=jnp.asarray(n, jnp.int32), stats=stats.astype(state.last_stats.dtype))


def oktopk_step(config: OktopkSyncConfig, source, operands, state):
    """One step with the accumulator made by ``source``
    (:class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource`; the
    plain update's reads the gradient tree): ``(updates, state, source's extra)``."""
    shared = config.shared
    like, n, residual = begin_step(
        shared, source, operands, state.residual,
        lambda: check_oktopk_world(state.boundaries, shared.comm))
    # the accumulate pass before any switch and the residual update after it, both
    # in place: inside a branch XLA copies every N-entry buffer written in place
    produced = accumulate(shared, source, residual, operands, state.count)
    acc = produced.acc
    out, cleared = exchange_phases(
        shared, state.count,
        lambda d, first: functools.partial(oktopk_exchange, config, n=n, like=like,
                                           phase_density=d, first_step=first),
        functools.partial(dense_exchange, config, n=n, like=like),
        (acc.astype(jnp.float32), state),
        padded={"indices": -1, "values": 0},
        per_device=("indices", "values", "local_threshold", "local_count", "stats"),
        ref=residual)
    # a 16-bit wire's rounding kept, unless the source reads residual == 0 as sent
    new_residual = settle(acc, out.indices, cleared, values=out.values,
                          wire=kept_wire(source, config.wire))
    return out.updates, OktopkSyncState(
        count=optax.safe_increment(state.count),
        residual=new_residual,
        boundaries=out.boundaries,
        local_threshold=out.local_threshold,
        global_threshold=out.global_threshold,
        last_local_count=out.local_count,
        last_stats=out.stats.astype(state.last_stats.dtype),
    ), produced.extra


def oktopk_sync(
    *,
    density: float | None = None,
    k: int | None = None,
    tau: int = 32,
    tau_prime: int = 64,
    selection: str = "threshold_reuse",
    capacity_factor: float = 2.0,
    region_band: tuple[float, float] | None = (0.5, 2.0),
    comm=None,
    residual_dtype=jnp.float32,
    nan_policy: str = "raise",
    warmup=None,
    flush_every: int | None = None,
    wire_dtype=None,
    partition: str = "regions",
) -> optax.GradientTransformation:
    """Ok-Topk SGD synchronization (Li and Hoefler, PPoPP'22) across ranks or devices.

    Each step, on every rank: ``acc = residual + grad``; select about k local
    entries (``selection``); :func:`jss.oktopk_allreduce` sums them region by
    region and keeps the global top-k of the sum; the update is that divided
    by P; the residual keeps ``acc`` except where the local entry made it into
    the global top-k (those are zeroed). The exact local and global thresholds
    are computed every ``tau`` steps and reused (nudged) in between; the region
    boundaries every ``tau_prime`` steps. All of it lives in the state.

    Args:
      density: fraction of entries kept, in (0, 1]. Exclusive with ``k``.
      k: entries kept, locally and globally.
      tau: steps between exact threshold computations (32 for CNNs in the paper).
      tau_prime: steps between region repartitions (64 in the paper).
      selection: local selection policy, ``"threshold_reuse"`` (Ok-Topk),
        ``"exact"``, ``"sampled"`` or ``"gaussian"`` (see ``jax_sparse_sync.transforms.selection_policy``).
      capacity_factor: static room for threshold selection, in units of k;
        an overflowing step falls back to the exact top-k.
      region_band: ``(lo, hi)`` with 0 <= lo <= hi, in units of k / P: on the
        steps that reuse the global threshold (not the every-``tau`` exact
        ones, which keep k) each region owner keeps at least ``ceil(lo k / P)`` entries of its reduced
        region (all its nonzero ones if it has fewer) and at most
        ``floor(hi k / P)``: the threshold's choice when it falls in between,
        otherwise the region's exact top entries (computed locally: nothing
        more travels). Bounds the global count to about [lo k, hi k] and the
        words sent with it. Without it (``None``, the paper's rule) error
        feedback makes a reused global threshold's count swing far below and
        above k from one step to the next.
      comm: mpi4py communicator; ``None`` is the library's clone of COMM_WORLD;
        ``jss.axis(name)`` inside shard_map/pmap (call ``init`` and ``update``
        there): JAX collectives over the mesh axis, the residual and the
        local threshold per device (shard the state over the axis), the
        boundaries and global threshold equal on all devices.
      residual_dtype: dtype of the residual (float32 by default).
      nan_policy: ``"raise"`` or ``"propagate"``, as in :func:`jss.topk_sync`.
      warmup: phases run before ``density``/``k`` takes over, as ``(steps,
        density)`` pairs, as in :func:`jss.topk_sync`: ``density=1.0`` is a
        dense allreduce of ``residual + grad`` (the residual comes out zero),
        a smaller one an Ok-Topk phase with that density. Each phase starts
        with exact thresholds and fresh region boundaries, so the steps after
        a dense warm-up are a fresh ``oktopk_sync``'s. ``None``: off.
      flush_every: every ``flush_every``-th step is a dense allreduce of the
        accumulator (the residuals come out zero), as in
        :func:`jss.topk_sync`; the thresholds and boundaries carry over.
        ``None``: off.
      wire_dtype: ``None`` (float32), ``jnp.bfloat16`` or ``jnp.float16``: the
        values of the Ok-Topk exchange travel as 16 bits
        (:func:`jss.oktopk_allreduce`'s ``wire_dtype``: 6 bytes an entry instead
        of 8, sums in float32, identical on every rank). What rounding takes from
        a rank's own entries that made the global top-k stays in its residual
        (``residual[i] = v - round(v)`` there instead of 0), as in
        :func:`jss.topk_sync`, and is dropped under
        :func:`jss.adam_direction_sync`'s momentum masking (which reads a zero
        residual as "sent"). The dense steps (``warmup`` density 1,
        ``flush_every``) stay float32.
      partition: who owns (reduces and selects) an index, as in
        :func:`jss.oktopk_allreduce`: ``"regions"`` (the paper's contiguous
        regions, repartitioned every ``tau_prime`` steps) or ``"hash"`` (ZEN's
        hash owners: data-independent and balanced on any support, so there is
        nothing to repartition; the state's ``boundaries`` stay as ``init`` made
        them and ``tau_prime`` is unused). ``region_band`` then limits each hash
        owner. Both transports.

    Cost: per step, one pass over the N entries (``acc``), the local selection
    (a threshold pass, or an exact top-k every ``tau`` steps), and an Ok-Topk
    allreduce (:func:`jss.oktopk_allreduce`): O(k) words a rank, whatever P;
    a dense step (``warmup`` density 1, ``flush_every``) is a dense allreduce of N.
    Donate the optimizer state (``jax.jit(step, donate_argnums=(0, 1))``): the
    sync updates its N-float buffers in place, which a plain ``jax.jit`` copies
    every step; :func:`jss.check_donation` tells (once) which buffers a step
    copies. Measured results: ``docs/results.md``.

    Returns:
      An ``optax.GradientTransformation`` with an :class:`OktopkSyncState`.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(jss.oktopk_sync(k=2, selection="exact"), optax.sgd(1.0))
      >>> params = {"w": jnp.zeros(5)}
      >>> updates, state = tx.update({"w": jnp.array([0.1, -4., 0., 3., 1.])}, tx.init(params))
      >>> updates["w"].tolist()
      [-0.0, 4.0, -0.0, -3.0, -0.0]
    """
    config = OktopkSyncConfig.build(
        density=density, k=k, tau=tau, tau_prime=tau_prime, selection=selection,
        capacity_factor=capacity_factor, region_band=region_band, comm=comm,
        residual_dtype=residual_dtype, nan_policy=nan_policy, warmup=warmup,
        flush_every=flush_every, wire_dtype=wire_dtype, partition=partition)

    def init_fn(params):
        return init_state(config, params)

    def update_from(source, operands, state):
        return oktopk_step(config, source, operands, state)

    return flat_sync_transformation(init_fn, update_from, config.shared.residual_dtype)
