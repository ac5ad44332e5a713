"""``topk_sync``: error-feedback Top-k gradient synchronization as an Optax transform."""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import (check_nan_policy, check_quantization, wire_dtype_id,
                                             wire_word)
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.bindings.selection import bucket_topk
from jax_sparse_sync.ops.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.base.transform_arguments import check_float_leaves, resolve_k
from jax_sparse_sync.transforms.cyclic_selection import cyclic_exchange
from jax_sparse_sync.transforms.union_selection import union_exchange
from jax_sparse_sync.transforms.accumulator_source import flat_sync_transformation
from jax_sparse_sync.transforms.flat import flat_residual, flat_size, split_like
from jax_sparse_sync.transforms.grouped_topk_sync import grouped_topk_sync
from jax_sparse_sync.transforms.selection_policy import (SELECTION_POLICIES, kth_magnitude_of,
                                                         select_local)
from jax_sparse_sync.transforms.topk_sync_state import (TopkSyncState, check_residual_decay,
                                                         initial_topk_sync_state, kept_wire,
                                                         settle_residual, wire_rounding_lost)
from jax_sparse_sync.transforms.world import check_world, world_marker
from jax_sparse_sync.transforms.dense_sync import dense_mean
from jax_sparse_sync.transforms.warmup import check_flush_every, normalize_warmup, run_phases

__all__ = ["TopkSyncState", "topk_sync", "SELECTIONS", "SELECTION_TABLE", "Selection",
           "ExchangeArguments"]


class ExchangeArguments(NamedTuple):
    """What every exchange is called with besides the accumulator and the local choice."""

    size: int
    k: int            # entries kept (per bucket for selection="bucket")
    step: jax.Array   # the step count (int32): the QSGD seed, cyclic's leader
    comm: object
    algorithm: str
    nan_policy: str
    quantize_bits: int
    qsgd_bucket: int
    wire_dtype: object = None
    index_encoding: str = "int32"


def sparse_exchange(acc, values, indices, args: ExchangeArguments):
    """The local choice summed over the ranks by ``algorithm``'s sparse allreduce."""
    del acc
    summed, stats = sparse_allreduce(
        values.astype(jnp.float32), indices, size=args.size, algorithm=args.algorithm,
        comm=args.comm, nan_policy=args.nan_policy, quantize_bits=args.quantize_bits,
        qsgd_bucket=args.qsgd_bucket, seed=args.step, wire_dtype=args.wire_dtype,
        index_encoding=args.index_encoding, return_stats="vector")
    return summed, indices, stats


def cyclic_selection_exchange(acc, values, indices, args: ExchangeArguments):
    """ScaleCom: rank ``step mod P`` chooses the indices (it selects; no local choice)."""
    del values, indices
    return cyclic_exchange(acc.astype(jnp.float32), args.k, args.step, comm=args.comm,
                           nan_policy=args.nan_policy)


def union_selection_exchange(acc, values, indices, args: ExchangeArguments):
    """Every rank's accumulator summed on the union of the ranks' local choices."""
    del values
    return union_exchange(acc.astype(jnp.float32), indices, comm=args.comm,
                          algorithm=args.algorithm, nan_policy=args.nan_policy)


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


class Selection(NamedTuple):
    """One ``selection=`` of topk_sync: how each rank chooses, how the ranks exchange.

    Attributes:
      local: the local choice it starts from (a selection policy, or ``"bucket"``);
        ``None`` when the exchange chooses (its ``values`` and ``indices`` are None).
      exchange: ``(acc, values, indices, ExchangeArguments) -> (summed, indices,
        stats)``: the sum over ranks as a dense (size,) float32 vector, the
        indices to zero in the residual (-1: none), the stats vector.
      quantizable: the values travel through the sparse allreduce (so
        ``quantize_bits`` applies).
      mesh_axis: runs on a mesh axis (``comm=jss.axis(name)``) as well as MPI.
    """

    local: str | None
    exchange: Callable
    quantizable: bool = True
    mesh_axis: bool = True


#: topk_sync's selections: the shared policies, SparCML's bucketed top-k,
#: ScaleCom's cyclic local top-k (indices chosen by one rank a step) and the union
#: of every rank's top-k summed over all ranks. A new selection is one entry.
SELECTION_TABLE = {
    **{policy: Selection(policy, sparse_exchange) for policy in SELECTION_POLICIES},
    "bucket": Selection("bucket", sparse_exchange),
    "cyclic": Selection(None, cyclic_selection_exchange, quantizable=False, mesh_axis=False),
    "union": Selection("exact", union_selection_exchange, quantizable=False),
}
SELECTIONS = tuple(SELECTION_TABLE)


def topk_sync(
    *,
    density: float | None = None,
    k: int | None = None,
    algorithm: str = "auto",
    comm=None,
    residual_dtype=jnp.float32,
    nan_policy: str = "raise",
    quantize_bits: int = 0,
    qsgd_bucket: int = 1024,
    selection: str = "exact",
    bucket: int = 512,
    tau: int = 32,
    capacity_factor: float = 2.0,
    grouping=None,
    warmup=None,
    flush_every: int | None = None,
    residual_decay=1.0,
    wire_dtype=None,
    index_encoding: str = "int32",
    warmup_wire_dtype=None,
) -> optax.GradientTransformation:
    """Error-feedback Top-k synchronization of gradients across MPI ranks.

    Each step, on every rank: ``acc = residual + grad`` (all leaves flattened
    and concatenated in ``jax.tree_util`` order); keep the global top-k of
    ``|acc|``; sum the kept entries over ranks with a sparse allreduce; the
    update is that sum divided by P, unflattened to the gradient's tree and
    dtypes; the new residual is ``acc`` with the kept entries zeroed. Every
    rank ends the step with the same update bit for bit, so replicas stay
    identical.

    Args:
      density: fraction of entries kept per step, in (0, 1]. Exclusive with ``k``.
      k: number of entries kept per step, in [1, N].
      algorithm: sparse allreduce algorithm (see :func:`sparse_allreduce`);
        ``"auto"`` picks by the cost model from (P, N, k).
      comm: mpi4py communicator; ``None`` is the library's clone of COMM_WORLD.
      residual_dtype: dtype the residual accumulates in (float32 by default,
        whatever the gradients' dtype).
      nan_policy: ``"raise"``: a NaN/Inf in any rank's selected entries makes
        every rank raise (the step is not applied, the old state is intact);
        ``"propagate"``: non-finite values are summed like any other.
      quantize_bits: with ``algorithm="dsar_split_allgather"``: send DSAR's
        dense phase as QSGD codes of 2, 4 or 8 bits (SparCML's quantized
        TopK SGD); the rounding seed is the step count. 0 = off.
      qsgd_bucket: entries per QSGD scale.
      selection: ``"exact"``: the global top-k of the whole accumulator;
        ``"threshold_reuse"`` (Ok-Topk's: exact every ``tau`` steps, the
        threshold reused and nudged in between), ``"sampled"`` (the k-th
        magnitude of a strided sample, every step) or ``"gaussian"`` (Gaussiank)
        select by threshold into ``capacity_factor * k`` slots, falling back
        to the exact top-k on overflow (see ``jax_sparse_sync.transforms.selection_policy``);
        ``"bucket"``: the top ``k`` of every ``bucket`` consecutive entries
        (SparCML's bucketed selection; with ``density``, k per bucket is
        ``round(density * bucket)``, at least 1); ``"cyclic"``: ScaleCom's
        cyclic local top-k, the indices of rank ``step mod P``'s exact top-k
        used by every rank, so each kept entry is the mean of all P ranks'
        accumulators (two dense allreduces, of 2k and k floats; ``algorithm``
        is not used; MPI communicators; see
        ``jax_sparse_sync.transforms.cyclic_selection``); ``"union"``: every
        rank's exact top-k, then every rank's accumulator summed on the union
        of the P choices, so up to P k entries move a step, each by the mean
        of all P ranks' accumulators and zeroed in every residual (the indices
        shared by ``algorithm``'s sparse allreduce, the values by a dense
        allreduce of P k floats: about twice the bytes of ``"exact"``; see
        ``jax_sparse_sync.transforms.union_selection``).
      bucket: bucket length for ``selection="bucket"``.
      tau: steps between exact thresholds for ``selection="threshold_reuse"``.
      capacity_factor: room for threshold selection, in units of k (>= 1).
      grouping: deprecated (removed in the next release): ``topk_sync(grouping=plan,
        density=...)`` is ``jss.grouped_topk_sync(plan, density=...)``, which it
        returns (warning); the other options must keep their defaults (pass
        ``warmup``, ``flush_every`` or ``residual_decay`` to
        ``grouped_topk_sync``, which takes them).
      warmup: phases run before ``density``/``k`` takes over, as
        ``(steps, density)`` pairs: the first ``steps`` steps keep that
        density, then the next phase, and so on; ``density=1.0`` is a dense
        allreduce of ``residual + grad`` (the residual comes out zero).
        ``jss.density_ramp(density, steps_per_stage=...)`` builds DGC's
        warm-up (densities 1/4, 1/16, ... down to ``density``). Threshold
        policies recompute their threshold on each phase's first step. The
        step lowers to one ``lax.switch`` over the phases. ``None``: off.
      flush_every: every ``flush_every``-th step (steps ``flush_every - 1``,
        ``2 * flush_every - 1``, ... counted from 0) sends the whole
        accumulator in a dense allreduce instead, as a warm-up phase of
        density 1 does: everything held back in the ranks' residuals is
        applied, averaged over the ranks, and the residuals come out zero.
        Costs one dense allreduce per ``flush_every`` steps. The run's
        length flushes once, at its last step, so the final parameters owe
        nothing to the residuals. ``None``: off. On the LM of
        ``examples/train_lm.py`` (P = 8, Adam directions, 1 %) a flush every
        100 steps jumped the loss at each flush and trailed the run without
        (benchmarks/README.md, "Convergence"): what was held back is stale by then.

      residual_decay: each step the residual is multiplied by this factor
        before the gradient is added (``acc = residual_decay * residual +
        grad``, in the same pass): what a rank holds back for long fades
        instead of arriving as one stale burst (a leaky error feedback;
        entries held for ``s`` steps keep ``residual_decay**s`` of it). A
        float in (0, 1], or a schedule (step count -> factor, e.g.
        ``optax.linear_schedule(0.95, 1.0, 300)``: a leak that fades out);
        1.0 (default) is plain error feedback, bit for bit. On the LM of
        ``examples/train_lm.py`` (P = 8, Adam directions, 1 %) 0.95 was ahead
        of dense at step 100 and behind at the end; 0.99 ended 0.003 better
        than plain (benchmarks/README.md, "Convergence"); hold it nearer 1 at lower
        densities (entries wait ~1/density steps).
      wire_dtype: ``None`` (float32), ``jnp.bfloat16`` or ``jnp.float16``: the
        kept values travel as 16 bits (:func:`~jax_sparse_sync.sparse_allreduce`'s
        ``wire_dtype``: value bytes halved exactly, sums in float32, identical on
        every rank). What rounding takes from a rank's own values stays in its
        residual (error feedback), except under
        :func:`jss.adam_direction_sync`'s momentum masking, which reads a zero
        residual as "sent": there it is dropped, as with ``warmup_wire_dtype``.
        For the selections whose values go through the sparse allreduce (not
        ``"cyclic"`` / ``"union"``).
      index_encoding: ``"int32"`` or ``"auto"`` (MPI only): the kept indices
        encoded per message (:func:`~jax_sparse_sync.sparse_allreduce`'s
        ``index_encoding``); the same selections.
      warmup_wire_dtype: the value dtype on the wire during the ``warmup``
        phases: ``None`` (default) the sparse phases on ``wire_dtype``, the
        density-1 phases float32; ``jnp.bfloat16`` / ``jnp.float16`` (or
        ``jnp.float32``) for every warm-up phase, dense ones included, while
        ``wire_dtype`` keeps the transform's own density (and the flushes stay
        float32). The ramp's dense-ish stages (25 %, 6.25 % of the entries)
        send most of a run's bytes, so ``warmup_wire_dtype=jnp.bfloat16`` with
        ``wire_dtype=None`` halves their value bytes and keeps the long sparse
        part exact. The values are rounded and summed as with ``wire_dtype``
        (a density-1 phase is ``jss.dense_allreduce(wire_dtype=)``), sums in
        float32, every rank the same bits; unlike ``wire_dtype``, what the
        rounding takes from a rank's own values (at most half a 16-bit ulp
        each, round to nearest even) is dropped, not kept in the residual: a
        sent entry's residual stays exactly zero, which is what
        :func:`jss.adam_direction_sync`'s momentum masking reads as "sent"
        (``wire_dtype`` drops it too under masking). Measured on
        the LM: ``docs/topics/time_to_accuracy.md``.

    Donate the optimizer state: jit the training step with
    ``donate_argnums`` covering it (e.g. ``jax.jit(step, donate_argnums=(0, 1))``
    for ``step(params, opt_state, ...)``). The sync updates its N-float
    buffers in place; under a plain ``jax.jit`` XLA copies each of them first,
    every step. Measured at 7.5M entries, P = 2 (``benchmarks/dense_allreduce.py``,
    ``docs/topics/dense_sync.md``): the ``topk_sync(density=0.001)`` update
    took 32 ms donated and 89 ms under a plain ``jax.jit``.
    :func:`jss.check_donation` tells (once) which buffers a step copies.

    Returns:
      An ``optax.GradientTransformation`` whose state is a :class:`TopkSyncState`.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
      >>> tx = optax.chain(jss.topk_sync(k=2), optax.sgd(0.1))
      >>> state = tx.init(params)
      >>> grads = {"w": jnp.zeros((4, 4)).at[0, 0].set(5.0), "b": jnp.array([0., -3., 1., 0.])}
      >>> updates, state = tx.update(grads, state, params)
      >>> [round(float(u), 4) for u in (updates["w"][0, 0], updates["b"][1], updates["b"][2])]
      [-0.5, 0.3, -0.0]
    """
    check_nan_policy(nan_policy, "topk_sync")
    wire = wire_word(wire_dtype, index_encoding, "topk_sync") & 0xF
    try:
        warm_wire = wire if warmup_wire_dtype is None else wire_dtype_id(warmup_wire_dtype,
                                                                         "topk_sync")
    except ValueError:
        raise ValueError("jax_sparse_sync.topk_sync: `warmup_wire_dtype` must be None (the "
                         "warm-up on `wire_dtype`), jnp.float32, jnp.bfloat16 or jnp.float16; "
                         f"got {warmup_wire_dtype!r}") from None
    warm_dtype = wire_dtype if warmup_wire_dtype is None else \
        (None, jnp.bfloat16, jnp.float16)[warm_wire]
    # a density-1 warm-up phase: float32 unless warmup_wire_dtype says otherwise
    dense_wire_id = 0 if warmup_wire_dtype is None else warm_wire
    if density is None and k is None:
        raise ValueError("jax_sparse_sync.topk_sync: pass `density=` (e.g. 0.01) or `k=`.")
    residual_dtype = jnp.dtype(residual_dtype)
    if not jnp.issubdtype(residual_dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.topk_sync: `residual_dtype` must be a float dtype; "
                        f"got {residual_dtype}")
    if selection not in SELECTION_TABLE:
        raise ValueError(f"jax_sparse_sync.topk_sync: `selection` must be one of "
                         f"{tuple(SELECTION_TABLE)}; got {selection!r}")
    spec = SELECTION_TABLE[selection]
    if not spec.quantizable and (wire or warm_wire or index_encoding != "int32"):
        raise ValueError(f"jax_sparse_sync.topk_sync: selection={selection!r} sends its values "
                         "with a dense allreduce; wire_dtype, warmup_wire_dtype and "
                         "index_encoding apply to the selections whose entries go through "
                         "the sparse allreduce")
    if not spec.quantizable and quantize_bits:
        raise ValueError(f"jax_sparse_sync.topk_sync: selection={selection!r} sends its values "
                         "with a dense allreduce; quantize_bits applies to "
                         "algorithm='dsar_split_allgather' only (set quantize_bits=0)")
    if not spec.mesh_axis:
        if transport.is_mesh_axis(transport.resolve_comm(comm)):
            raise ValueError(f"jax_sparse_sync.topk_sync: selection={selection!r} runs on MPI "
                             "communicators (comm=None or an mpi4py communicator)")
    if selection == "bucket" and (not isinstance(bucket, int) or bucket < 1):
        raise ValueError(f"jax_sparse_sync.topk_sync: `bucket` must be a positive int; got {bucket!r}")
    comm = transport.resolve_comm(comm)
    if isinstance(grouping, str) and grouping == "none":
        grouping = None
    if isinstance(grouping, str):  # a mistake before a deprecation: the error first
        raise ValueError(
            "jax_sparse_sync.topk_sync: `grouping` takes a plan, not a method name: "
            "jss.grouped_topk_sync(jss.planning.auto_grouping(loss, params, *batch, density=...)) "
            "profiles, plans and logs one (or jss.planning.plan_grouping(method, "
            "jss.planning.profile_backward(loss, params, *batch), nranks=P, density=...)) "
            f"(got {grouping!r})")
    if grouping is not None:
        warnings.warn("jax_sparse_sync.topk_sync(grouping=...) is deprecated and will be removed "
                      "in the next release; use jss.grouped_topk_sync(grouping, density=..., ...)",
                      DeprecationWarning, stacklevel=2)
        if selection != "exact" or quantize_bits:  # (cyclic and union included)
            raise ValueError("jax_sparse_sync.topk_sync: `grouping` needs selection='exact' and "
                             "quantize_bits=0 (per-group thresholds are not implemented)")
        if transport.is_mesh_axis(comm):
            raise ValueError("jax_sparse_sync.topk_sync: `grouping` runs on MPI communicators; "
                             "under shard_map leave grouping=None (XLA schedules the collective)")

    decay_at = check_residual_decay(residual_decay, "topk_sync")
    if decay_at is not None and grouping is not None:
        raise ValueError("jax_sparse_sync.topk_sync: `residual_decay` with `grouping` is "
                         "jss.grouped_topk_sync(grouping, residual_decay=..., density=...) "
                         "(topk_sync(grouping=...) is deprecated)")
    warmup = normalize_warmup(warmup, "topk_sync")
    if warmup_wire_dtype is not None and not warmup:
        raise ValueError("jax_sparse_sync.topk_sync: `warmup_wire_dtype` sets the wire of the "
                         "`warmup` phases, and there are none; pass warmup=... (e.g. "
                         "jss.density_ramp(0.01, steps_per_stage=25)) or use `wire_dtype`")
    if warm_wire and quantize_bits:
        raise ValueError("jax_sparse_sync.topk_sync: `warmup_wire_dtype` (16-bit values) and "
                         "`quantize_bits` do not combine; choose one")

    def decay_now(state):
        # this step's leak factor (None: plain error feedback, the residual untouched)
        return None if decay_at is None else decay_at(state.count)
    flush_every = check_flush_every(flush_every, "topk_sync")
    if flush_every is not None and grouping is not None:
        raise ValueError("jax_sparse_sync.topk_sync: `flush_every` and `grouping` do not combine "
                         "in the deprecated topk_sync(grouping=...); use "
                         "jss.grouped_topk_sync(grouping, flush_every=..., density=...)")
    if warmup and grouping is not None:
        raise ValueError("jax_sparse_sync.topk_sync: `warmup` and `grouping` do not combine "
                         "in the deprecated topk_sync(grouping=...); use "
                         "jss.grouped_topk_sync(grouping, warmup=..., density=...)")
    if grouping is not None:  # deprecated: the options above are the ones grouping takes
        return grouped_topk_sync(grouping, density=density, k=k, algorithm=algorithm,
                                 comm=comm, residual_dtype=residual_dtype, nan_policy=nan_policy,
                                 wire_dtype=wire_dtype, index_encoding=index_encoding)

    def kept_per_unit(size: int, phase_density: float | None = None) -> int:
        # entries kept: globally (exact) or per bucket (bucket)
        d, kk = (density, k) if phase_density is None else (phase_density, None)
        if spec.local == "bucket":
            return resolve_k(size=min(size, bucket), density=d, k=kk)
        return resolve_k(size=size, density=d, k=kk)

    if not isinstance(tau, int) or tau < 1:
        raise ValueError(f"jax_sparse_sync.topk_sync: `tau` must be a positive int; got {tau!r}")
    if not capacity_factor >= 1.0:
        raise ValueError(f"jax_sparse_sync.topk_sync: `capacity_factor` must be >= 1; "
                         f"got {capacity_factor!r}")

    def select(acc, state, phase_density=None, first_step=0):
        """(values, indices, threshold, kept count); index -1 marks padding."""
        k_eff = kept_per_unit(acc.shape[0], phase_density)
        if spec.local == "bucket":
            values, indices = bucket_topk(acc, k_eff, bucket)
            return values, indices, state.threshold, jnp.sum(indices >= 0, dtype=jnp.int32)
        policy = spec.local
        capacity = k_eff if policy == "exact" else min(acc.shape[0],
                                                       max(k_eff, int(capacity_factor * k_eff)))
        sel = select_local(acc.astype(jnp.float32), k=k_eff, policy=policy,
                           threshold=state.threshold, step=state.count - first_step, tau=tau,
                           capacity=capacity)
        return sel.values, sel.indices, sel.threshold, sel.count
    if algorithm != "auto":
        # validate the name now; P is read at trace time (comm_size_in_trace)
        resolve_algorithm(algorithm, nranks=1, size=1, k=1)
    check_quantization(quantize_bits, qsgd_bucket, algorithm, "topk_sync")

    def init_fn(params):
        check_float_leaves(params, "parameter")
        size = flat_size(params)
        if size == 0:
            raise ValueError("jax_sparse_sync.topk_sync: the parameters have no entries.")
        kept_per_unit(size)
        for _, phase_density in warmup:
            kept_per_unit(size, phase_density)
        return initial_topk_sync_state(size, residual_dtype, world_marker(comm))

    def update_from(source, operands, state):
        # the step with the accumulator made by `source` (accumulator_source.py); the
        # plain update's source reads the gradient tree (operands) leaf by leaf
        like = source.like(operands)
        check_float_leaves(like, "gradient")
        check_world(state.world, comm, "topk_sync")
        size = flat_size(like)
        residual = flat_residual(state.residual, size, residual_dtype, "topk_sync")
        return step(residual, operands, state, size, source)

    # float32 exact top-k: the accumulate pass and the selection in one kernel, the
    # last k-th magnitude (state.threshold) letting it select from a short list
    fused = spec.local == "exact" and residual_dtype == jnp.float32

    def step(residual, operands, state, size, source):
        # One pass: acc = decay * residual + grad written into the residual's buffer
        # (each gradient leaf read from its own), with the exact top-k when fused.
        # With a warm-up or flushes the phases differ only in what they choose and
        # how they exchange, so that pass (with a producer's own state, e.g. the
        # Adam moments) runs once before the phases' switch and the residual update
        # once after it, both in place: inside a branch, XLA would copy every
        # N-entry buffer written in place (the LM's Adam-direction ramp at 1 %: 20
        # copies of 10.9M floats compiled, 4 run a step).
        k_own = kept_per_unit(size)
        produced = source.produce(residual, operands, decay_now(state),
                                  k_own if fused else None, state.threshold)
        acc = produced.acc
        sel = acc if acc.dtype in _SELECTABLE else acc.astype(jnp.float32)
        like = source.like(operands)
        scale = transport.comm_size_in_trace(comm)
        # the fused selection's hint (its own k-th magnitude) is kept through the
        # warm-up, so the first step at the own density selects from a short list
        own_kth = kth_magnitude_of(produced.values) if fused else None

        def exchange_branch(phase_density, first_step):
            # the warm-up phases' wire (warmup_wire_dtype), the own density's wire_dtype
            branch_wire, branch_dtype = ((wire, wire_dtype) if phase_density is None
                                         else (warm_wire, warm_dtype))

            def run(sel, state):
                k_eff = kept_per_unit(size, phase_density)
                if fused and phase_density is None:
                    values, indices = produced.values, produced.indices
                    local_count = k_eff
                elif spec.local is None:  # the exchange chooses
                    values = indices = None
                    threshold, local_count = state.threshold, k_eff
                else:
                    values, indices, threshold, local_count = select(sel, state, phase_density,
                                                                     first_step)
                if own_kth is not None:
                    threshold = own_kth
                summed, indices, stats = spec.exchange(sel, values, indices, ExchangeArguments(
                    size=size, k=k_eff, step=state.count, comm=comm, algorithm=algorithm,
                    nan_policy=nan_policy, quantize_bits=quantize_bits,
                    qsgd_bucket=qsgd_bucket, wire_dtype=branch_dtype,
                    index_encoding=index_encoding))
                # the mean, cut into the gradient's leaves and dtypes in one pass (which
                # XLA fuses into the next optimizer's pass over the update)
                # wire_dtype keeps its rounding in the residual; warmup_wire_dtype
                # does not (its sent entries' residual stays exactly zero, which is
                # how momentum masking tells what was sent: adam_pass.py)
                # (nor under momentum masking: kept_wire, source.exact_sent)
                keep = phase_density is None or warmup_wire_dtype is None
                lost = wire_rounding_lost(values, kept_wire(source, branch_wire if keep else 0))
                if lost is None and kept_wire(source, wire) and values is not None:
                    # the own density keeps its rounding: zeros here, as long as
                    # this branch's indices (the padded fields must agree); under
                    # exact_sent no branch keeps any, so every branch returns None
                    # and no step scatter-adds zeros into the residual
                    lost = jnp.zeros(values.shape, jnp.float32)
                return PhaseOutcome(split_like(summed, like, scale=scale), indices, lost,
                                    jnp.asarray(threshold, jnp.float32),
                                    jnp.asarray(local_count, jnp.int32), stats)
            return run

        def dense_branch_on(branch_dtype):
            def run(sel, state):
                # density 1: the whole accumulator summed densely; the residual is
                # cleared (on a 16-bit warm-up wire too: its rounding is not kept)
                new_updates, stats = dense_mean(sel.astype(jnp.float32), like, comm=comm,
                                                nan_policy=nan_policy, wire_dtype=branch_dtype)
                threshold = state.threshold if own_kth is None else own_kth
                return PhaseOutcome(new_updates, None, None,
                                    jnp.asarray(threshold, jnp.float32),
                                    jnp.asarray(size, jnp.int32), stats)
            return run

        # the flushes are float32; a density-1 warm-up phase runs on warmup_wire_dtype
        out, cleared = run_phases(warmup, flush_every, state.count, exchange_branch,
                                  dense_branch_on((None, jnp.bfloat16, jnp.float16)[dense_wire_id]),
                                  (sel, state),
                                  padded={"indices": -1, "lost": 0},
                                  per_device=("indices", "lost", "threshold", "local_count"),
                                  ref=residual, flush=dense_branch_on(None))
        new_residual = settle_residual(acc, out.indices, None, 0, cleared, lost=out.lost)
        return out.updates, TopkSyncState(
            count=optax.safe_increment(state.count),
            residual=new_residual,
            threshold=out.threshold,
            last_local_count=out.local_count,
            last_stats=out.stats.astype(state.last_stats.dtype),
            world=state.world,
        ), produced.extra

    return flat_sync_transformation(init_fn, update_from, residual_dtype)
