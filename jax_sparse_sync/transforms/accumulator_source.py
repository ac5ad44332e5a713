"""The flat entry point of the sparse syncs: the accumulator from a producer.

A sync with a flat residual (:func:`~jax_sparse_sync.topk_sync`,
:func:`~jax_sparse_sync.oktopk_sync`, :func:`~jax_sparse_sync.grouped_topk_sync`)
starts every step with ``acc = decay *
residual + grad``. Its plain ``update`` reads ``grad`` from the gradient's
leaves (:data:`gradient_source`). A transform in front of it that computes
the gradient it hands over in its own flat pass
(:func:`~jax_sparse_sync.adam_direction_sync`) can instead give the sync a
:class:`AccumulatorSource` and write the accumulator itself, in the same pass:
the handed-over vector is never written to memory, cut into leaves, or read
back (``kernels/adam_accumulate.h``).

Such a sync's transformation is a :class:`FlatSyncTransformation`: an
``optax.GradientTransformation`` (it chains and unpacks as one) with one more
attribute, ``update_from(source, operands, state) -> (updates, state,
extra)``. Every step of the sync calls ``source.produce`` once, before the
switch over its warm-up phases and flushes (inside a branch XLA would copy every
buffer the producer writes in place), so the producer's own state updates
(``extra``) are the same whichever phase runs; ``grouped_topk_sync`` calls it
once a group, on the group's operands (:attr:`AccumulatorSource.part`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.transforms.flat import accumulate, accumulate_topk

__all__ = ["Accumulated", "AccumulatorSource", "FlatSyncTransformation", "gradient_source"]


class Accumulated(NamedTuple):
    """What a producer returns.

    Attributes:
      acc: the accumulator, (N,) in the sync's residual dtype.
      values: with a ``k``, the exact top-k of ``|acc|`` (``jss.topk(acc, k)``
        bit for bit), else ``None``.
      indices: their int32 indices in ascending order, else ``None``.
      extra: anything the producer updates alongside (returned by
        ``update_from`` as it is); ``None`` for the plain gradient.
    """

    acc: Any
    values: Any = None
    indices: Any = None
    extra: Any = None


class AccumulatorSource(NamedTuple):
    """How a sync gets its accumulator (static: closures, no arrays).

    Attributes:
      produce: ``(residual, operands, decay, k, last_kth) -> Accumulated``:
        ``residual`` the flat (N,) residual (to be updated in place when
        donated), ``decay`` this step's residual decay (``None``: none), ``k``
        ``None`` or the entries of an exact top-k to return with it, and
        ``last_kth`` the last step's k-th magnitude (a hint; may be ignored).
      like: ``operands -> tree``: the gradient tree the update is shaped and
        typed like.
      part: ``(operands, leaf_ids, take) -> operands`` of one group of gradient
        leaves (a grouped sync, :func:`~jax_sparse_sync.grouped_topk_sync`,
        produces each group's accumulator on its own): ``leaf_ids`` the group's
        tree-order leaf indices (ascending), ``take(flat)`` the group's entries of
        a flat (N,) buffer in that order. The group's ``extra`` must then be a
        tree of flat arrays in the group's layout (the sync puts the groups'
        pieces back in tree order). ``None``: the source cannot be split.
      produce_at: ``(residual, operands, leaf_ids, at, decay, k, last_kth) ->
        (Accumulated, operands)``, or ``None``: ``produce`` for one group of
        consecutive leaves whose entries start at ``at`` of the flat layout, on
        the whole buffers: ``residual`` and the producer's flat state in
        ``operands`` stay (N,), only the group's range of them is read and
        written (in place), ``acc`` and ``extra`` come back whole and the
        returned operands hold the new state for the next group's call. The
        groups' calls then chain through the same buffers, with no slice or
        concatenation of them; ``values`` / ``indices`` are relative to ``at``.
        The same bits as ``produce`` on ``part``'s slices.
      scattered_parts: ``produce_at`` also takes a group whose leaves are not one
        range of the layout: ``at`` is then a tuple, each leaf's first entry,
        and ``values`` / ``indices`` are relative to the group's entries in leaf
        order (``part``'s). ``False``: only groups of consecutive leaves.
      exact_sent: the sync must leave a sent entry's residual exactly zero:
        a 16-bit wire's rounding (``wire_dtype``) is dropped, not kept in the
        residual, because the producer reads ``residual == 0`` as "sent"
        (momentum masking, :func:`~jax_sparse_sync.adam_direction_sync`).
    """

    produce: Callable
    like: Callable
    part: Callable | None = None
    produce_at: Callable | None = None
    exact_sent: bool = False
    scattered_parts: bool = False


class FlatSyncTransformation(optax.GradientTransformation):
    """An ``optax.GradientTransformation`` with a flat entry point.

    ``update_from(source, operands, state, params=None) -> (updates, state,
    extra)`` is ``update`` with the accumulator made by ``source`` (an
    :class:`AccumulatorSource`) from ``operands`` (arrays). Set by the sync
    (``None`` where it takes none: a residual that is not float32).
    """

    update_from: Callable | None = None  # class default; instances set their own


def gradient_source(residual_dtype) -> AccumulatorSource:
    """The plain source: ``operands`` is the gradient tree, ``acc = decay *
    residual + grad`` (:func:`~jax_sparse_sync.transforms.flat.accumulate`, or
    :func:`~jax_sparse_sync.transforms.flat.accumulate_topk` with a ``k``)."""

    def produce(residual, updates, decay, k, last_kth):
        if k is not None:
            acc, values, indices, _ = accumulate_topk(residual, updates, k, decay=decay,
                                                      last_kth=last_kth)
            return Accumulated(acc, values, indices)
        return Accumulated(accumulate(residual, updates, residual_dtype, decay))

    def part(updates, ids, take):
        del take
        leaves = jax.tree_util.tree_leaves(updates)
        return [leaves[i] for i in ids]

    def produce_at(residual, updates, ids, at, decay, k, last_kth):
        # one group's accumulate-and-select on the whole residual: its entries, in
        # place (no slice of the residual in, no concatenation of the groups out);
        # `at` an int (one range) or each leaf's first entry
        if k is None or jnp.dtype(residual_dtype) != jnp.float32:
            raise ValueError("gradient_source.produce_at: needs a k and a float32 residual")
        acc, values, indices, _ = accumulate_topk(residual, part(updates, ids, None), k,
                                                  decay=decay, last_kth=last_kth, at=at)
        return Accumulated(acc, values, indices), updates

    return AccumulatorSource(produce, lambda updates: updates, part, produce_at,
                             scattered_parts=True)


def flat_sync_transformation(init, update_from, residual_dtype) -> FlatSyncTransformation:
    """The transformation of a sync whose steps are ``update_from(source, operands,
    state)``: ``update`` is that with :func:`gradient_source`; ``update_from`` is
    exposed for a float32 residual (the producers' accumulator), else ``None``."""
    plain = gradient_source(residual_dtype)

    def update(updates, state, params=None):
        del params
        new_updates, new_state, _ = update_from(plain, updates, state)
        return new_updates, new_state

    tx = FlatSyncTransformation(init, update)
    if jnp.dtype(residual_dtype) == jnp.float32:
        tx.update_from = lambda source, operands, state, params=None: update_from(
            source, operands, state)
    return tx
