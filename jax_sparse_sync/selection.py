"""Selection ops: exact top-k by magnitude (XLA FFI custom call)."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)

__all__ = ["topk", "bucket_topk", "threshold_select", "SELECTION_DTYPES"]

#: Input dtypes the selection kernels accept.
SELECTION_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_selection_dtype(x: jax.Array, op: str, arg: str = "x") -> None:
    if x.dtype not in SELECTION_DTYPES:
        kind = "integer" if jnp.issubdtype(x.dtype, jnp.integer) else str(x.dtype)
        raise TypeError(
            f"jax_sparse_sync.{op}: `{arg}` has dtype {x.dtype} ({kind}); selection works on "
            f"float32, bfloat16 or float16. Cast it first, e.g. `{arg}.astype(jnp.float32)`."
        )


def check_k(k, n: int, op: str, name: str = "k") -> int:
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(
            f"jax_sparse_sync.{op}: `{name}` must be a Python int known at trace time; got {k!r}"
        ) from None
    if not 0 <= k <= n:
        raise ValueError(
            f"jax_sparse_sync.{op}: `{name}` must be in [0, {n}]; got {name}={k}. "
            f"Use a smaller {name}, or a density in (0, 1]."
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


def bucket_topk(x: jax.Array, k_per_bucket: int, bucket: int = 512) -> tuple[jax.Array, jax.Array]:
    """Top-k of ``|x|`` inside every bucket of ``bucket`` consecutive entries.

    SparCML's bucketed selection: cheaper than a global top-k and spreads the
    kept entries over the whole vector. Slot ``b * k_per_bucket + j`` belongs
    to bucket ``b``; a last bucket shorter than ``k_per_bucket`` is padded with
    value 0 and index -1 (the padding convention of :func:`sparse_allreduce`).

    Args:
      x: float32, bfloat16 or float16 array of any shape (over ``x.ravel()``).
      k_per_bucket: entries kept per bucket, ``0 <= k_per_bucket <= bucket``.
      bucket: bucket length (512 in SparCML).

    Returns:
      ``(values, indices)`` of length ``ceil(x.size / bucket) * k_per_bucket``.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> v, i = jss.bucket_topk(jnp.array([1., -5., 2., 0., 3., 0.5]), 1, bucket=4)
      >>> i.tolist(), v.tolist()
      ([1, 4], [-5.0, 3.0])
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "bucket_topk")
    if not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"jax_sparse_sync.bucket_topk: `bucket` must be a positive int; got {bucket!r}")
    k = check_k(k_per_bucket, bucket, "bucket_topk", "k_per_bucket")
    n = int(np.prod(x.shape, dtype=np.int64))
    if n >= 2**31:
        raise ValueError(f"jax_sparse_sync.bucket_topk: x.size={n} needs int64 indices; the limit is 2**31-1")
    cap = -(-n // bucket) * k
    if cap == 0:
        return jnp.zeros((0,), x.dtype), jnp.zeros((0,), jnp.int32)
    call = jax.ffi.ffi_call(
        "jss_bucket_topk",
        (jax.ShapeDtypeStruct((cap,), x.dtype), jax.ShapeDtypeStruct((cap,), jnp.int32)),
        vmap_method="sequential",
    )
    return call(x.reshape(-1), bucket=np.int64(bucket), k=np.int64(k))


def threshold_select(x: jax.Array, threshold: float | jax.Array,
                     capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Entries with ``|x| >= threshold`` (and ``x != 0``), compacted, in one pass.

    Args:
      x: float32, bfloat16 or float16 array of any shape (over ``x.ravel()``).
      threshold: non-negative magnitude (may be traced, e.g. from an Optax state).
      capacity: static number of output slots.

    Returns:
      ``(values, indices, count)``: the first ``min(count, capacity)`` selected
      entries in index order, padded with value 0 and index -1; ``count`` (int32
      scalar) is how many qualified. ``count > capacity`` means overflow: the
      output is incomplete and the caller must fall back (the Optax transforms
      do, to exact top-k). NaN counts as above every threshold.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> v, i, c = jss.threshold_select(jnp.array([0.5, -2.0, 0.1, 3.0]), 1.0, capacity=3)
      >>> v.tolist(), i.tolist(), int(c)
      ([-2.0, 3.0, 0.0], [1, 3, -1], 2)
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "threshold_select")
    n = int(np.prod(x.shape, dtype=np.int64))
    capacity = check_k(capacity, n, "threshold_select", "capacity")
    call = jax.ffi.ffi_call(
        "jss_threshold_select",
        (jax.ShapeDtypeStruct((capacity,), x.dtype), jax.ShapeDtypeStruct((capacity,), jnp.int32),
         jax.ShapeDtypeStruct((), jnp.int32)),
        vmap_method="sequential",
    )
    return call(x.reshape(-1), jnp.asarray(threshold, jnp.float32).reshape(()),
                capacity=np.int64(capacity))
