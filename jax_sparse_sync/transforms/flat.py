"""The flat layout the sparse transforms work in, and its few memory passes.

Selection is global over the whole gradient, so the transforms work on one
flat vector: every leaf raveled and concatenated in ``jax.tree_util`` order.
The residual lives in that layout in the state (one buffer, not a tree), so a
step costs a few passes over N entries and no copies that XLA cannot alias:

* :func:`accumulate`: ``acc = residual + grads`` in one pass, without a
  concatenated copy of the gradient (an FFI kernel on CPU);
* the selection reads ``acc``; ``jss.residual_update`` zeroes the sent entries
  in place, and that buffer is the new residual;
* :func:`split_like` cuts the dense sum into the update tree with the division
  by P and the cast fused into the same pass (and, inside a training step,
  into the optimizer's own pass over the update).

States saved before the residual became flat (a tree shaped like the
parameters) still load: :func:`flat_residual` ravels them on the first step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jax_sparse_sync._ext import kernel_platforms
from jax_sparse_sync.base.jax_compat import varying_as_inputs
from jax_sparse_sync.base.leaf_layout import leaf_offsets, one_range  # noqa: F401 (re-exported)
from jax_sparse_sync.bindings.accumulate import accumulate_kernel, accumulate_topk_kernel
from jax_sparse_sync.bindings.selection import topk

__all__ = ["flat_size", "ravel_leaves", "accumulate", "accumulate_topk", "split_like", "flat_residual", "unflatten_residual"]


def flat_size(tree) -> int:
    """Entries of all leaves of ``tree``."""
    return sum(int(np.prod(jnp.shape(x), dtype=np.int64)) for x in jax.tree_util.tree_leaves(tree))


def ravel_leaves(tree, dtype) -> jax.Array:
    """All leaves raveled, cast to ``dtype`` and concatenated (one pass)."""
    parts = [jnp.ravel(leaf).astype(dtype) for leaf in jax.tree_util.tree_leaves(tree)]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def accumulate(residual: jax.Array, grads, dtype, decay=None) -> jax.Array:
    """``decay * residual + concat(ravel(leaf) for leaf in grads)`` in ``dtype``, in one
    pass (``decay`` a float or a traced scalar; ``None``: the residual as it is).

    On CPU, for a float32 accumulator, one FFI call (``jss_accumulate``,
    ``kernels/accumulate.h``): each gradient leaf read from its own buffer,
    one read of the residual, one write, on all cores; on GPU arrays the same
    call where the CUDA module is built (``kernels/fused_accumulate.cuh``, the
    same bits). Elsewhere (float64 / 16-bit accumulators, a build without it)
    the concatenation of per-leaf sums ``residual[lo:hi] + leaf``, which XLA
    writes straight into its place in the output. Both give the same bits
    (tested; with a ``decay`` XLA may fuse the product and the sum, 1 ulp apart).
    """
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(grads) if jnp.size(leaf)]
    residual = residual.astype(dtype)
    if jnp.dtype(dtype) == jnp.float32 and leaves:
        flat, factor, has_decay = _kernel_operands(leaves, decay)
        kernel = varying_as_inputs(accumulate_kernel, has_decay=has_decay)
        return jax.lax.platform_dependent(
            residual, factor, flat,
            **{platform: kernel for platform in kernel_platforms("jss_accumulate")},
            default=varying_as_inputs(_accumulate_xla, has_decay=has_decay))
    if decay is not None:
        residual = residual * jnp.asarray(decay, dtype)  # fused into the same pass
    return _concat_sums(residual, leaves, dtype)


def _concat_sums(residual, leaves, dtype):
    offsets = leaf_offsets(leaves)
    parts = [jax.lax.slice_in_dim(residual, lo, hi) + jnp.ravel(leaf).astype(dtype)
             for leaf, lo, hi in zip(leaves, offsets, offsets[1:])]
    if not parts:
        return residual
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def _kernel_operands(leaves, decay):
    """The kernels' operands: the non-empty leaves raveled in float32, the decay as a
    (1,) float32 array (1.0 when ``None``), and whether there is one."""
    flat = [jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves if jnp.size(leaf)]
    factor = jnp.reshape(jnp.asarray(1.0 if decay is None else decay, jnp.float32), (1,))
    return flat, factor, decay is not None


def _accumulate_xla(residual, factor, flat, *, has_decay):
    if has_decay:
        residual = residual * factor[0]
    return _concat_sums(residual, flat, jnp.float32)


#: the hint is the last k-th magnitude times this: the list holds the top k as long
#: as the k-th magnitude falls less than 5 % from one step to the next (in error
#: feedback's steady state it moves well under 1 % a step)
HINT_FACTOR = 0.95
#: the list's room, in units of k (more listed entries: the whole of acc is selected
#: from). Entries pile up just below the threshold in error feedback's steady state
#: (on Gaussian gradients at 0.1 %, a few k above 0.95 of it).
HINT_CAPACITY = 16


def accumulate_topk(residual: jax.Array, grads, k: int, *, decay=None, last_kth=None,
                    at=None):
    """:func:`accumulate` and the exact top-k of the result, sharing its pass.

    ``jss.topk(accumulate(residual, grads, float32, decay), k)`` bit for bit.
    On CPU one FFI call (``jss_accumulate_topk``, ``kernels/accumulate.h``):
    while each block of the accumulator is in cache, the entries of magnitude
    at least ``0.95 * last_kth`` (the k-th magnitude of the previous step) are
    listed; when at least k and at most 16 k are, the radix select runs on that
    list only, so the step reads the accumulator once instead of three times.
    Otherwise (first steps, a k-th magnitude that fell more than 5 %, or a
    flatter distribution) it selects from the whole accumulator, as
    ``jss.topk`` does. On GPU arrays, where the CUDA module is built, the same
    call runs its CUDA twin (``kernels/fused_accumulate.cuh``: the list collected
    while each entry is in registers, the choice made on the device; the same
    bits). Elsewhere :func:`accumulate`, then ``jss.topk``.

    Args:
      residual: (N,) float32.
      grads: the gradient tree (its leaves, raveled in tree order, are the flat layout).
      k: entries to keep, ``1 <= k <= N``.
      decay: as in :func:`accumulate`.
      last_kth: the previous step's k-th magnitude (a float32 scalar), or ``None``.
      at: ``None``: ``grads`` is the whole gradient. Else ``grads`` is part of it
        (one group of :func:`~jax_sparse_sync.grouped_topk_sync`) and ``at`` says
        where in the residual: an int, the first entry of the range its leaves
        cover one after the other, or a sequence of ints, each leaf's first entry
        (leaves that need not follow one another). Only those entries are read
        and written, in place; the rest of the (N,) accumulator is the
        residual's; the top-k is over the part's entries in the order of its
        leaves, ``indices`` relative to that order. The same bits as the call on
        the part's entries cut out of the residual and concatenated.

    Returns:
      ``(acc, values, indices, hint_used)``: the accumulator (N,) float32, the k
      values and int32 indices in ascending index order, and an int32 scalar,
      1 when the hint's list was enough (0 where XLA's passes ran instead of the kernel).
    """
    all_leaves = jax.tree_util.tree_leaves(grads)
    leaves, factor, has_decay = _kernel_operands(all_leaves, decay)
    residual = residual.astype(jnp.float32)
    hint = jnp.reshape(jnp.float32(0.0) if last_kth is None
                       else jnp.asarray(last_kth, jnp.float32) * jnp.float32(HINT_FACTOR), (1,))
    starts = tuple(s for s, x in zip(leaf_starts(all_leaves, residual.shape[0], at,
                                                 "jax_sparse_sync.accumulate_topk",
                                                 "the residual's"), all_leaves)
                   if jnp.size(x))  # the kernel's operands: the non-empty leaves
    n = sum(int(x.shape[0]) for x in leaves)
    consts = dict(has_decay=has_decay, k=int(k), cap=int(min(n, HINT_CAPACITY * k)),
                  starts=starts)
    kernel = varying_as_inputs(accumulate_topk_kernel, **consts)
    return jax.lax.platform_dependent(
        residual, factor, hint, leaves,
        **{platform: kernel for platform in kernel_platforms("jss_accumulate_topk")},
        default=varying_as_inputs(_accumulate_topk_xla, **consts))


def leaf_starts(leaves, total: int, at, op: str, what: str) -> tuple:
    """Each leaf's first entry in a flat (total,) buffer, from ``at`` as
    :func:`accumulate_topk` takes it (``None``, an int or one int per leaf), checked
    to fit; ``op`` and ``what`` (e.g. ``"the residual's"``) name the call in the error."""
    sizes = [int(np.prod(jnp.shape(x), dtype=np.int64)) for x in leaves]
    if at is None or isinstance(at, (int, np.integer)):
        first = 0 if at is None else int(at)
        places = [first + lo for lo in leaf_offsets(leaves)[:-1]]
    else:
        places = [int(x) for x in at]
        if len(places) != len(leaves):
            raise ValueError(f"{op}: `at` has {len(places)} starts for {len(leaves)} gradient "
                             f"leaves (one per leaf)")
    for j, (place, size) in enumerate(zip(places, sizes)):
        if not 0 <= place <= total - size:
            where = (f"the range at {at} of {sum(sizes)} entries"
                     if at is None or isinstance(at, (int, np.integer))
                     else f"leaf {j} at {place} of {size} entries")
            raise ValueError(f"{op}: {where} does not fit {what} {total}")
    return tuple(places)


def cut_at(whole, starts, sizes):
    """The entries of ``whole`` at each ``starts[j]`` (``sizes[j]`` of them), in that
    order, as one buffer: a part of a flat buffer as :func:`accumulate_topk` places it."""
    pieces = [jax.lax.slice_in_dim(whole, s, s + z) for s, z in zip(starts, sizes)]
    return jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def put_at(whole, part, starts, sizes):
    """``whole`` with :func:`cut_at`'s entries replaced by ``part``'s."""
    lo = 0
    for s, z in zip(starts, sizes):
        whole = jax.lax.dynamic_update_slice_in_dim(whole, jax.lax.slice_in_dim(part, lo, lo + z),
                                                    s, 0)
        lo += z
    return whole


def _accumulate_topk_xla(residual, factor, hint, flat, *, has_decay, k, cap, starts):
    sizes = [int(x.shape[0]) for x in flat]
    if sum(sizes) < residual.shape[0]:
        # a part: its entries cut out (in the leaves' order), put back into the whole buffer
        acc, values, indices, used = _accumulate_topk_xla(
            cut_at(residual, starts, sizes), factor, hint, flat, has_decay=has_decay, k=k,
            cap=cap, starts=tuple(leaf_offsets(flat)[:-1]))
        return put_at(residual, acc, starts, sizes), values, indices, used
    acc = _accumulate_xla(residual, factor, flat, has_decay=has_decay)
    values, indices = topk(acc, k)
    return acc, values, indices, jnp.zeros((), jnp.int32)


def split_like(flat: jax.Array, like, scale=None):
    """``flat`` (N,) cut into a tree shaped like ``like``, each leaf in its dtype,
    multiplied by ``scale`` first if given (fused into the same pass)."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    offsets = leaf_offsets(leaves)
    out = []
    for leaf, lo, hi in zip(leaves, offsets, offsets[1:]):
        part = jax.lax.slice_in_dim(flat, lo, hi)
        if scale is not None:
            part = part / scale
        out.append(part.reshape(jnp.shape(leaf)).astype(jnp.result_type(leaf)))
    return jax.tree_util.tree_unflatten(treedef, out)


def flat_residual(residual, size: int, dtype, op: str) -> jax.Array:
    """The state's residual as one flat (size,) vector.

    Accepts the flat vector (this version's layout) or a tree of leaves (a
    state saved by versions up to 0.1.0, where the residual was shaped like
    the parameters): that one is raveled in ``jax.tree_util`` order, which is
    the flat layout's order, so training continues exactly.
    """
    if isinstance(residual, (jax.Array, np.ndarray)) and jnp.ndim(residual) == 1 \
            and residual.shape[0] == size:
        return residual
    got = flat_size(residual)
    if got != size:
        raise ValueError(
            f"jax_sparse_sync.{op}: the gradient has {size} entries but the residual has {got}; "
            "was the state initialised for other parameters?")
    return ravel_pytree(jax.tree_util.tree_map(lambda x: jnp.asarray(x).astype(dtype),
                                               residual))[0]


def unflatten_residual(residual: jax.Array, params):
    """A sync transform's flat residual as a tree shaped like ``params``.

    The state keeps the residual flat (all leaves raveled and concatenated in
    ``jax.tree_util`` order); this gives it the parameters' structure and
    shapes, for inspection or for code written against the tree layout.

    Args:
      residual: ``state.residual`` of :func:`~jax_sparse_sync.topk_sync` or
        :func:`~jax_sparse_sync.oktopk_sync` (shape ``(N,)``; with a leading
        device axis ``(P, N)`` under shard_map, each row is unflattened).
      params: the parameters (or anything with their structure and shapes).

    Returns:
      A tree like ``params`` with the residual's dtype (and leading axis).

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((2, 2))}
      >>> tx = jss.topk_sync(k=1)
      >>> _, state = tx.update({"b": jnp.array([1., 5.]), "w": jnp.ones((2, 2))},
      ...                      tx.init(params))
      >>> jss.unflatten_residual(state.residual, params)["b"].tolist()
      [1.0, 0.0]
    """
    residual = jnp.asarray(residual)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    offsets = leaf_offsets(leaves)
    lead = residual.shape[:-1]
    if residual.shape[-1] != offsets[-1]:
        raise ValueError(f"jax_sparse_sync.unflatten_residual: `residual` has "
                         f"{residual.shape[-1]} entries per row but `params` has {offsets[-1]}")
    out = [residual[..., lo:hi].reshape(lead + tuple(jnp.shape(leaf)))
           for leaf, lo, hi in zip(leaves, offsets, offsets[1:])]
    return jax.tree_util.tree_unflatten(treedef, out)
