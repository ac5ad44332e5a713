"""Checks shared by the Optax transforms: float leaves, and k from density."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["resolve_k", "check_float_leaves"]


def resolve_k(*, size: int, density: float | None, k: int | None, op: str = "topk_sync") -> int:
    """Entries kept per step: ``k`` as given, or ``round(density * size)`` (at least 1);
    errors name ``op``, the transform the user called."""
    if (density is None) == (k is None):
        raise ValueError(f"jax_sparse_sync.{op}: pass exactly one of `density` or `k`.")
    if density is not None:
        if not 0.0 < float(density) <= 1.0:
            raise ValueError(
                f"jax_sparse_sync.{op}: `density` must be in (0, 1]; got {density}. "
                "For example density=0.01 keeps 1% of the gradient entries each step."
            )
        return min(size, max(1, int(round(float(density) * size))))
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"jax_sparse_sync.{op}: `k` must be an int; got {k!r}")
    if not 1 <= k <= size:
        raise ValueError(
            f"jax_sparse_sync.{op}: `k` must be in [1, {size}] (the number of gradient "
            f"entries); got k={k}. Lower k or use density=..."
        )
    return k


def check_float_leaves(tree, what: str, op: str = "topk_sync") -> None:
    """TypeError naming the leaf when a gradient or parameter is not floating point."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"jax_sparse_sync.{op}: {what} leaf {jax.tree_util.keystr(path) or '<root>'} "
                f"has dtype {dtype}; sparse sync needs floating-point gradients. Exclude integer "
                "leaves with optax.masked(...) or cast them."
            )
