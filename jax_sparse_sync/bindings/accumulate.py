"""The accumulate kernels (``jss_accumulate``, ``jss_accumulate_topk``) as JAX functions.

Thin bindings: the operands are already laid out by
:func:`jax_sparse_sync.transforms.flat.accumulate` / ``accumulate_topk``, which
choose these kernels on CPU and, where the CUDA module is built, on GPU arrays
(``jax_sparse_sync._ext.kernel_platforms``), and XLA's own passes elsewhere (the
same bits). C++: ``kernels/accumulate.h``; CUDA: ``kernels/fused_accumulate.cuh``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)
from jax_sparse_sync.base.leaf_layout import placed

__all__ = ["accumulate_kernel", "accumulate_topk_kernel"]


def accumulate_kernel(residual, factor, flat, *, has_decay: bool):
    """``factor[0] * residual + concat(flat)`` (the factor only ``has_decay``), one pass,
    in place (input-output aliased: no copy when the residual is donated)."""
    call = jax.ffi.ffi_call("jss_accumulate", jax.ShapeDtypeStruct(residual.shape, jnp.float32),
                            vmap_method="sequential", input_output_aliases={0: 0})
    return call(residual, factor, *flat, has_decay=np.int64(has_decay))


def accumulate_topk_kernel(residual, factor, hint, flat, *, has_decay: bool, k: int, cap: int,
                           starts: tuple):
    """:func:`accumulate_kernel` on the leaves ``flat`` placed at ``starts`` of the (N,)
    residual, and the exact top-k of their entries, in one pass.

    ``hint`` (1,) is the magnitude above which entries are listed (``cap`` of them
    at most) for the selection.

    Returns ``(acc, values, indices, hint_used)``.
    """
    n = residual.shape[0]
    # leaves that do not follow one another: the part's accumulator also written in
    # their order, for the selection (the kernel's `gathered` scratch)
    _, gathered = placed(flat, starts)
    call = jax.ffi.ffi_call(
        "jss_accumulate_topk",
        (jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((k,), jnp.float32),
         jax.ShapeDtypeStruct((k,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32),
         jax.ShapeDtypeStruct((gathered,), jnp.float32)),
        vmap_method="sequential", input_output_aliases={0: 0})
    acc, values, indices, used, _ = call(residual, factor, hint, *flat,
                                         has_decay=np.int64(has_decay), k=np.int64(k),
                                         cap=np.int64(cap),
                                         starts=np.asarray(starts, dtype=np.int64))
    return acc, values, indices, used[0]
