"""The flat layout the sparse transforms work in, and its few memory passes.

Selection is global over the whole gradient, so the transforms work on one
flat vector: every leaf raveled and concatenated in ``jax.tree_util`` order.
The residual lives in that layout in the state (one buffer, not a tree), so a
step costs a few passes over N entries and no copies that XLA cannot alias:

* :func:`accumulate`: ``acc = residual + grads`` in one fused pass, without
  a concatenated copy of the gradient;
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

__all__ = ["flat_size", "ravel_leaves", "accumulate", "split_like", "flat_residual", "unflatten_residual"]


def flat_size(tree) -> int:
    """Entries of all leaves of ``tree``."""
    return sum(int(np.prod(jnp.shape(x), dtype=np.int64)) for x in jax.tree_util.tree_leaves(tree))


def _offsets(leaves) -> list[int]:
    return [0] + np.cumsum([int(np.prod(jnp.shape(x), dtype=np.int64)) for x in leaves]).tolist()


def ravel_leaves(tree, dtype) -> jax.Array:
    """All leaves raveled, cast to ``dtype`` and concatenated (one pass)."""
    parts = [jnp.ravel(leaf).astype(dtype) for leaf in jax.tree_util.tree_leaves(tree)]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def accumulate(residual: jax.Array, grads, dtype, decay=None) -> jax.Array:
    """``decay * residual + concat(ravel(leaf) for leaf in grads)`` in ``dtype``, in one
    pass (``decay`` a float or a traced scalar; ``None``: the residual as it is).

    Written as the concatenation of per-leaf sums ``residual[lo:hi] + leaf``:
    XLA fuses each slice-and-add and writes it straight into its place in the
    output, so no concatenated gradient is materialized. Measured at 4M
    entries in 16 leaves (XLA CPU, jax 0.10): 1.8 ms, against 13 ms for
    ``residual + concatenate(leaves)`` (a copy of the gradient, then an add)
    and 4.4 s for dynamic-update-slice adds into the residual's buffer.
    """
    leaves = jax.tree_util.tree_leaves(grads)
    offsets = _offsets(leaves)
    residual = residual.astype(dtype)
    if decay is not None:
        residual = residual * jnp.asarray(decay, dtype)  # fused into the same pass
    parts = [jax.lax.slice_in_dim(residual, lo, hi) + jnp.ravel(leaf).astype(dtype)
             for leaf, lo, hi in zip(leaves, offsets, offsets[1:]) if hi > lo]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def split_like(flat: jax.Array, like, scale=None):
    """``flat`` (N,) cut into a tree shaped like ``like``, each leaf in its dtype,
    multiplied by ``scale`` first if given (fused into the same pass)."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    offsets = _offsets(leaves)
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
    offsets = _offsets(leaves)
    lead = residual.shape[:-1]
    if residual.shape[-1] != offsets[-1]:
        raise ValueError(f"jax_sparse_sync.unflatten_residual: `residual` has "
                         f"{residual.shape[-1]} entries per row but `params` has {offsets[-1]}")
    out = [residual[..., lo:hi].reshape(lead + tuple(jnp.shape(leaf)))
           for leaf, lo, hi in zip(leaves, offsets, offsets[1:])]
    return jax.tree_util.tree_unflatten(treedef, out)
