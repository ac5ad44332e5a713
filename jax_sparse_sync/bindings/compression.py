"""QSGD quantization ops (XLA FFI custom calls).

``qsgd_quantize`` cuts a vector into buckets, scales each by its largest
magnitude and rounds every entry stochastically to one of ``2**(bits-1) - 1``
levels (plus a sign bit), so ``E[qsgd_dequantize(qsgd_quantize(x))] == x``.
The randomness is a counter-based hash of ``(seed, position)``: the same seed
reproduces the same codes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)
from jax_sparse_sync.base.arguments import QSGD_BITS

__all__ = ["qsgd_quantize", "qsgd_dequantize", "qsgd_packed_bytes", "QSGD_BITS"]


def _check(bits: int, bucket: int, op: str) -> None:
    if bits not in QSGD_BITS:
        raise ValueError(f"jax_sparse_sync.{op}: `bits` must be one of {QSGD_BITS}; got {bits!r}")
    if not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `bucket` must be a positive int; got {bucket!r}")


def qsgd_packed_bytes(size: int, bits: int) -> int:
    """Bytes of packed codes for ``size`` entries at ``bits`` per entry."""
    return (size * bits + 7) // 8


def qsgd_quantize(x: jax.Array, *, bits: int = 4, bucket: int = 1024,
                  seed: int | jax.Array = 0) -> tuple[jax.Array, jax.Array]:
    """Quantizes ``x.ravel()`` with QSGD.

    Args:
      x: float array. float32, bfloat16 and float16 go to the kernel as they
        are (each entry widened exactly to float32 there, so a 16-bit input
        gives the same codes as its float32 cast); other floats (float64) are
        cast to float32 first.
      bits: bits per entry, 2, 4 or 8 (one of them the sign).
      bucket: entries per scale.
      seed: int or int32 scalar (may be traced, e.g. the step count).

    Returns:
      ``(packed, scales)``: uint8 codes, ``ceil(size * bits / 8)`` bytes, and one
      float32 scale per bucket (NaN for a bucket holding a NaN or Inf).

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> packed, scales = jss.qsgd_quantize(jnp.array([1.0, -0.5, 0.0, 0.25]), bits=8)
      >>> jss.qsgd_dequantize(packed, scales, size=4, bits=8).round(2).tolist()
      [1.0, -0.5, 0.0, 0.25]
    """
    _check(bits, bucket, "qsgd_quantize")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.qsgd_quantize: `x` has dtype {x.dtype}; pass a float array")
    n = int(np.prod(x.shape, dtype=np.int64))
    seed = jnp.asarray(seed, jnp.int32).reshape(())
    call = jax.ffi.ffi_call(
        "jss_qsgd_quantize",
        (jax.ShapeDtypeStruct((qsgd_packed_bytes(n, bits),), jnp.uint8),
         jax.ShapeDtypeStruct((-(-n // bucket),), jnp.float32)),
        vmap_method="sequential",
    )
    if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = x.astype(jnp.float32)
    return call(x.reshape(-1), seed, bits=np.int64(bits), bucket=np.int64(bucket))


def qsgd_dequantize(packed: jax.Array, scales: jax.Array, *, size: int, bits: int = 4,
                    bucket: int = 1024) -> jax.Array:
    """Inverse of :func:`qsgd_quantize`: float32 vector of length ``size``."""
    _check(bits, bucket, "qsgd_dequantize")
    packed, scales = jnp.asarray(packed), jnp.asarray(scales)
    if packed.dtype != jnp.uint8 or packed.shape != (qsgd_packed_bytes(size, bits),):
        raise ValueError(
            f"jax_sparse_sync.qsgd_dequantize: `packed` must be uint8 of shape "
            f"({qsgd_packed_bytes(size, bits)},) for size={size}, bits={bits}; got "
            f"{packed.dtype}{packed.shape}")
    if scales.shape != (-(-size // bucket),):
        raise ValueError(
            f"jax_sparse_sync.qsgd_dequantize: `scales` must have shape ({-(-size // bucket)},) "
            f"for size={size}, bucket={bucket}; got {scales.shape}")
    call = jax.ffi.ffi_call("jss_qsgd_dequantize", jax.ShapeDtypeStruct((size,), jnp.float32),
                            vmap_method="sequential")
    return call(packed, scales.astype(jnp.float32), bits=np.int64(bits), bucket=np.int64(bucket))
