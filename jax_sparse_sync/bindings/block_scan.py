"""``block_scan``: which blocks of a vector hold a nonzero (the FFI kernel)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)

__all__ = ["block_scan", "check_block_size"]


def check_block_size(block_size, op):
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `block_size` must be a positive int; "
                         f"got {block_size!r}")


def block_scan(x: jax.Array, block_size: int = 256) -> jax.Array:
    """bool mask over the blocks of ``x.ravel()``: True where a block holds a nonzero.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.bindings.block_scan import block_scan
      >>> block_scan(jnp.array([0., 0., 1., 0., 0., 0., 0.]), 2).tolist()
      [False, True, False, False]
    """
    check_block_size(block_size, "block_scan")
    x = jnp.asarray(x)  # float32, bfloat16 and float16 are scanned as they are
    x = (x if x.dtype in (jnp.float32, jnp.bfloat16, jnp.float16) else x.astype(jnp.float32)).reshape(-1)
    nb = -(-x.shape[0] // block_size)
    mask = jax.ffi.ffi_call("jss_block_scan", jax.ShapeDtypeStruct((nb,), jnp.uint8),
                            vmap_method="sequential")(x, block_size=np.int64(block_size))
    return mask.astype(bool)


