"""``chunked_topk_sync``'s configuration and its payload layout, checked when the transform is built."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.transforms.sync_config import SparseSyncConfig

__all__ = ["ChunkedTopkConfig", "ChunkedLayout", "VALUE_BITS", "VALUE_DTYPES"]

OP = "chunked_topk_sync"
#: the quantized value widths: a sign bit and ``bits - 1`` bits of magnitude level
VALUE_BITS = (2, 4, 8)
#: the unquantized value dtypes (``value_dtype=``), by their bytes on the wire
VALUE_DTYPES = {jnp.dtype(jnp.bfloat16): 2, jnp.dtype(jnp.float32): 4}


class ChunkedLayout(NamedTuple):
    """The static layout of one rank's payload for ``size`` entries.

    Attributes:
      size: N, the flat entries.
      chunk: entries per chunk (the last may be shorter).
      k: slots per chunk (a last chunk shorter than k pads its slots).
      chunks: ``ceil(N / chunk)``.
      value_bits: 2, 4 or 8 (quantized), or 0 (``value_dtype`` values).
      value_dtype: the unquantized values' dtype, or None.
    """

    size: int
    chunk: int
    k: int
    chunks: int
    value_bits: int
    value_dtype: Any

    @property
    def slots(self) -> int:
        """Entries sent: ``chunks * k``."""
        return self.chunks * self.k

    @property
    def offset_dtype(self):
        """uint16 offsets while a chunk's positions leave the all-ones empty-slot
        marker free (``chunk <= 65535``), else uint32."""
        return jnp.uint16 if self.chunk < 65536 else jnp.uint32

    @property
    def offset_bytes(self) -> int:
        return self.slots * jnp.dtype(self.offset_dtype).itemsize

    @property
    def value_bytes(self) -> int:
        """The values' bytes: packed codes (quantized) or ``value_dtype`` values."""
        if self.value_bits:
            return -(-self.slots * self.value_bits // 8)
        return self.slots * VALUE_DTYPES[jnp.dtype(self.value_dtype)]

    @property
    def scale_bytes(self) -> int:
        """One float32 scale per chunk (quantized only)."""
        return 4 * self.chunks if self.value_bits else 0

    @property
    def payload_bytes(self) -> int:
        """Bytes of one rank's payload: the cost model's count
        (:func:`~jax_sparse_sync.model.cost_model.chunked_topk_payload_bytes`), which
        the encoder checks its payload against."""
        return cost_model.chunked_topk_payload_bytes(
            size=self.size, chunk=self.chunk, k_per_chunk=self.k, value_bits=self.value_bits,
            value_bytes=0 if self.value_bits else VALUE_DTYPES[jnp.dtype(self.value_dtype)])


@dataclasses.dataclass(frozen=True)
class ChunkedTopkConfig:
    """:func:`~jax_sparse_sync.chunked_topk_sync`'s options, checked (:meth:`build`).

    Attributes:
      shared: the options every sparse sync shares (comm, NaN policy, residual decay).
      chunk: entries per chunk.
      k_per_chunk: entries kept per chunk.
      value_bits: 2, 4 or 8, or 0 with ``value_dtype``.
      value_dtype: bfloat16 or float32 (unquantized values), or None.
    """

    shared: SparseSyncConfig
    chunk: int
    k_per_chunk: int
    value_bits: int
    value_dtype: Any = None

    @classmethod
    def build(cls, *, chunk, k_per_chunk, density, value_bits, value_dtype, residual_decay,
              comm, nan_policy) -> "ChunkedTopkConfig":
        """The checked configuration; every error names the argument and the fix."""
        check_nan_policy(nan_policy, OP)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk < 2**31:
            raise ValueError(f"jax_sparse_sync.{OP}: `chunk` must be an int >= 1 (entries per "
                             f"chunk; SparseLoCo uses 4096); got {chunk!r}")
        k = _kept_per_chunk(chunk, k_per_chunk, density)
        bits, dtype = _values(value_bits, value_dtype)
        shared = SparseSyncConfig.build(OP, k=k, comm=comm, nan_policy=nan_policy,
                                        residual_decay=residual_decay)
        return cls(shared, chunk, k, bits, dtype)

    def layout(self, size: int) -> ChunkedLayout:
        """The payload layout for ``size`` flat entries."""
        return ChunkedLayout(size, self.chunk, self.k_per_chunk, -(-size // self.chunk),
                             self.value_bits, self.value_dtype)


def _kept_per_chunk(chunk: int, k_per_chunk, density) -> int:
    """Exactly one of ``k_per_chunk`` (in [1, chunk]) and ``density`` (in (0, 1]:
    ``round(density * chunk)``, at least 1)."""
    if (k_per_chunk is None) == (density is None):
        raise ValueError(f"jax_sparse_sync.{OP}: pass exactly one of `k_per_chunk` (entries "
                         f"kept per chunk, e.g. 64 of 4096) or `density` (e.g. 0.0156)")
    if density is not None:
        return resolve_k(size=chunk, density=density, k=None, op=OP)
    if isinstance(k_per_chunk, bool) or not isinstance(k_per_chunk, int):
        raise TypeError(f"jax_sparse_sync.{OP}: `k_per_chunk` must be an int; got "
                        f"{k_per_chunk!r}")
    if not 1 <= k_per_chunk <= chunk:
        raise ValueError(f"jax_sparse_sync.{OP}: `k_per_chunk` must be in [1, chunk={chunk}] "
                         f"(entries kept of each chunk); got k_per_chunk={k_per_chunk}. Lower "
                         f"it or raise `chunk`")
    return k_per_chunk


def _values(value_bits, value_dtype) -> tuple[int, Any]:
    """``(bits, dtype)``: quantized (bits in :data:`VALUE_BITS`, dtype None; 2 by
    default) or unquantized (bits 0, dtype in :data:`VALUE_DTYPES`)."""
    if value_dtype is not None:
        if value_bits is not None:
            raise ValueError(f"jax_sparse_sync.{OP}: pass `value_bits` (quantized values) or "
                             f"`value_dtype` (unquantized values), not both")
        try:
            dtype = jnp.dtype(value_dtype)
        except TypeError:
            dtype = None
        if dtype not in VALUE_DTYPES:
            raise ValueError(f"jax_sparse_sync.{OP}: `value_dtype` must be jnp.bfloat16 or "
                             f"jnp.float32 (unquantized values); got {value_dtype!r}. For "
                             f"quantized values pass value_bits=2, 4 or 8")
        return 0, dtype
    bits = 2 if value_bits is None else value_bits
    if isinstance(bits, bool) or bits not in VALUE_BITS:
        raise ValueError(f"jax_sparse_sync.{OP}: `value_bits` must be one of {VALUE_BITS} (a "
                         f"sign bit and bits-1 bits of magnitude level); got {value_bits!r}. "
                         f"For unquantized values pass value_dtype=jnp.bfloat16 or jnp.float32")
    return bits, None
