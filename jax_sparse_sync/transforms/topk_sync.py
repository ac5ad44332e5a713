"""``topk_sync``: error-feedback Top-k gradient synchronization as an Optax transform.

The factory builds a checked :class:`~jax_sparse_sync.transforms.topk_sync_config.TopkSyncConfig`
and returns the step of :mod:`~jax_sparse_sync.transforms.topk_sync_step` over it;
the selections are :data:`~jax_sparse_sync.transforms.topk_selection.SELECTION_TABLE`.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import optax

from jax_sparse_sync.transforms import topk_sync_step
from jax_sparse_sync.transforms.accumulator_source import flat_sync_transformation
from jax_sparse_sync.transforms.grouped_topk_sync import grouped_topk_sync
from jax_sparse_sync.transforms.topk_selection import (SELECTION_TABLE, SELECTIONS,
                                                       ExchangeArguments, Selection,
                                                       sparse_exchange)
from jax_sparse_sync.transforms.topk_sync_config import TopkSyncConfig, check_deprecated_grouping
from jax_sparse_sync.transforms.topk_sync_state import TopkSyncState

__all__ = ["TopkSyncState", "topk_sync", "SELECTIONS", "SELECTION_TABLE", "Selection",
           "ExchangeArguments", "sparse_exchange"]


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

    Host memory: on the CPU, ``import jax_sparse_sync`` has already tuned glibc's
    allocator so that the N-float buffers of every step are reused instead of
    page-faulted anew each call (2-4x the call's time otherwise); there is nothing
    to call. ``JSS_TUNE_HOST_ALLOCATOR=0`` in the environment opts out
    (``jss.mpi.tune_host_allocator()``, docs/performance.md).

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
        nothing to the residuals. ``None``: off.

      residual_decay: each step the residual is multiplied by this factor
        before the gradient is added (``acc = residual_decay * residual +
        grad``, in the same pass): what a rank holds back for long fades
        instead of arriving as one stale burst (a leaky error feedback;
        entries held for ``s`` steps keep ``residual_decay**s`` of it). A
        float in (0, 1], or a schedule (step count -> factor, e.g.
        ``optax.linear_schedule(0.95, 1.0, 300)``: a leak that fades out);
        1.0 (default) is plain error feedback, bit for bit. Hold it nearer
        1 at lower densities (entries wait ~1/density steps).
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
        (``wire_dtype`` drops it too under masking).

    Donate the optimizer state: jit the training step with
    ``donate_argnums`` covering it (e.g. ``jax.jit(step, donate_argnums=(0, 1))``
    for ``step(params, opt_state, ...)``). The sync updates its N-float
    buffers in place; under a plain ``jax.jit`` XLA copies each of them first,
    every step. :func:`jss.check_donation` tells (once) which buffers a step copies.

    Cost per step: one pass over the N-entry accumulator (``acc = decay *
    residual + grad``, fused with the exact top-k for a float32 residual), the
    selection, the sparse allreduce of ``algorithm`` (bytes: ``jss.planning.cost_model``),
    and the in-place zeroing of the k sent entries.

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
    config = TopkSyncConfig.build(
        density=density, k=k, algorithm=algorithm, comm=comm, residual_dtype=residual_dtype,
        nan_policy=nan_policy, quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket,
        selection=selection, bucket=bucket, tau=tau, capacity_factor=capacity_factor,
        warmup=warmup, flush_every=flush_every, residual_decay=residual_decay,
        wire_dtype=wire_dtype, index_encoding=index_encoding,
        warmup_wire_dtype=warmup_wire_dtype)
    shared = config.shared
    grouping = check_deprecated_grouping(
        grouping, selection=selection, quantize_bits=quantize_bits, comm=shared.comm,
        residual_decay=residual_decay, flush_every=flush_every, warmup=shared.warmup)
    if grouping is not None:  # deprecated: the options above are the ones grouping takes
        return grouped_topk_sync(grouping, density=density, k=k, algorithm=algorithm,
                                 comm=shared.comm, residual_dtype=shared.residual_dtype,
                                 nan_policy=nan_policy, wire_dtype=wire_dtype,
                                 index_encoding=index_encoding)
    return flat_sync_transformation(functools.partial(topk_sync_step.init, config),
                                    functools.partial(topk_sync_step.update_from, config),
                                    shared.residual_dtype)
