"""The phases every flat error-feedback sync's step runs: accumulate -> select -> exchange -> settle.

A sync's step, whatever the sync (``topk_sync``, ``oktopk_sync``,
``grouped_topk_sync``, ``shared_support_sync``, and ``adam_direction_sync`` in
front of one of them):

1. **begin** (:func:`begin_step`): the gradient tree checked (float leaves, the
   state written on this communicator's size) and the flat residual read;
2. **accumulate** (:func:`accumulate`): ``acc = decay * residual + grad`` in one
   pass written into the residual's buffer, by the sync's
   :class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource` (the
   gradient's leaves, or a producer such as the fused Adam pass), optionally with
   the exact top-k selected in the same pass;
3. **select** and **exchange**: the sync's own (a selection policy, then a sparse
   allreduce); with a warm-up or flushes, one ``lax.switch`` over the phases'
   exchanges (:func:`exchange_phases`), which write no N-entry buffer (XLA copies
   every buffer a branch writes in place);
4. **settle** (:func:`settle`): the sent entries zeroed in the residual, in place,
   what a 16-bit wire rounded away kept, and the step count advanced.

The accumulate pass runs before the switch and the residual update after it, so
both stay in place whichever phase runs.
"""

from __future__ import annotations

from jax_sparse_sync.base.transform_arguments import check_float_leaves
from jax_sparse_sync.transforms.flat import flat_residual, flat_size
from jax_sparse_sync.transforms.sync_config import SparseSyncConfig
from jax_sparse_sync.transforms.topk_sync_state import settle_residual
from jax_sparse_sync.transforms.warmup import run_phases

__all__ = ["init_size", "begin_step", "accumulate", "exchange_phases", "settle"]


def init_size(config: SparseSyncConfig, params, kept=None) -> int:
    """The flat size of ``params``, checked: float leaves, at least one entry, and
    the own density and every warm-up phase's resolvable to a k (``kept(size,
    phase_density)``, :meth:`SparseSyncConfig.kept` by default)."""
    check_float_leaves(params, "parameter", config.op)
    size = flat_size(params)
    if size == 0:
        raise config.error("the parameters have no entries.")
    kept = config.kept if kept is None else kept
    kept(size)
    for _, phase_density in config.warmup:
        kept(size, phase_density)
    return size


def begin_step(config: SparseSyncConfig, source, operands, residual, check_state):
    """Phase 1: ``(like, size, flat residual)`` of a step on ``operands``.

    ``like`` is the gradient tree the update is shaped like; ``check_state()``
    raises when the state was written on a communicator of another size.
    """
    like = source.like(operands)
    check_float_leaves(like, "gradient", config.op)
    check_state()
    size = flat_size(like)
    return like, size, flat_residual(residual, size, config.residual_dtype, config.op)


def accumulate(config: SparseSyncConfig, source, residual, operands, count, *, k=None,
               last_kth=None):
    """Phase 2: the accumulator (and, with ``k``, its exact top-k) in one pass, in place."""
    return source.produce(residual, operands, config.decay(count), k, last_kth)


def exchange_phases(config: SparseSyncConfig, count, exchange, dense, operands, *, padded,
                    per_device, ref, flush=None):
    """Phase 3: the exchange of step ``count``: the warm-up phase's, the own density's
    or a flush's (:func:`~jax_sparse_sync.transforms.warmup.run_phases`)."""
    return run_phases(config.warmup, config.flush_every, count, exchange, dense, operands,
                      padded=padded, per_device=per_device, ref=ref, flush=flush)


def settle(acc, indices, cleared, *, values=None, wire: int = 0, lost=None):
    """Phase 4: the residual after the step (sent entries zeroed, in place; a dense
    branch that ran (``cleared``) zeroes it all; a 16-bit wire's rounding kept)."""
    return settle_residual(acc, indices, values, wire, cleared, lost=lost)
