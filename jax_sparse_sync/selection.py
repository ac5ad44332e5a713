"""Selection ops: exact top-k by magnitude (XLA FFI custom call)."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)

__all__ = ["topk", "SELECTION_DTYPES"]

#: Input dtypes the selection kernels accept.
SELECTION_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_selection_dtype(x: jax.Array, op: str, arg: str = "x") -> None:
    if x.dtype not in SELECTION_DTYPES:
        kind = "integer" if jnp.issubdtype(x.dtype, jnp.integer) else str(x.dtype)
        raise TypeError(
            f"jax_sparse_sync.{op}: `{arg}` has dtype {x.dtype} ({kind}); selection works on "
            f"float32, bfloat16 or float16. Cast it first, e.g. `{arg}.astype(jnp.float32)`."
        )


def check_k(k, n: int, op: str) -> int:
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(
            f"jax_sparse_sync.{op}: `k` must be a Python int known at trace time; got {k!r}"
        ) from None
    if not 0 <= k <= n:
        raise ValueError(
            f"jax_sparse_sync.{op}: `k` must be in [0, {n}] (the number of elements); got k={k}. "
            f"Use a smaller k, or a density in (0, 1]."
        )
    return k


def topk(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Exact top-k of ``|x|`` over ``x.ravel()``.

    A radix select on the magnitude bits (no full sort), then one compaction
    pass. Ties at the k-th magnitude go to the lower index, so the result is
    deterministic. NaN ranks above every number (it is always selected, so a
    diverging gradient is seen by the sync rather than hidden in a residual).

    Args:
      x: float32, bfloat16 or float16 array of any shape.
      k: number of entries to keep, ``0 <= k <= x.size``.

    Returns:
      ``(values, indices)``: ``values`` keep their sign and ``x``'s dtype,
      ``indices`` are int32 positions in ``x.ravel()``. The k entries come in
      ascending index order (the contract leaves the order unspecified).

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> v, i = jss.topk(jnp.array([0.1, -3.0, 2.0, 0.5]), 2)
      >>> i.tolist(), v.tolist()
      ([1, 2], [-3.0, 2.0])
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "topk")
    n = int(np.prod(x.shape, dtype=np.int64))
    k = check_k(k, n, "topk")
    if n >= 2**31:
        raise ValueError(f"jax_sparse_sync.topk: x.size={n} needs int64 indices; the limit is 2**31-1")
    if k == 0:
        return jnp.zeros((0,), x.dtype), jnp.zeros((0,), jnp.int32)
    call = jax.ffi.ffi_call(
        "jss_topk",
        (jax.ShapeDtypeStruct((k,), x.dtype), jax.ShapeDtypeStruct((k,), jnp.int32)),
        vmap_method="sequential",
    )
    return call(x.reshape(-1), k=np.int64(k))
