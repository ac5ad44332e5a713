"""Argument checks and names shared by both transports, the ops and the transforms.

The MPI and the mesh-axis transports check a sparse allreduce's arguments the
same way and raise the same messages; this module is that one place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["NAN_POLICIES", "QSGD_BITS", "WIRE_DTYPES", "INDEX_ENCODINGS", "check_nan_policy",
           "check_quantization", "check_coo_arguments", "wire_dtype_id", "wire_word",
           "round_to_wire", "OKTOPK_PARTITIONS"]

#: nan_policy name -> id understood by the C++ handler.
NAN_POLICIES = {"raise": 0, "propagate": 1}
#: Ok-Topk's owners of an index (the position is the FFI attribute ``partition``):
#: contiguous regions, or ZEN's hash owner (``hash_owner`` in ffi/collectives/algorithms.h).
OKTOPK_PARTITIONS = ("regions", "hash")
#: Bits per entry QSGD quantizes to (``jss.qsgd_quantize``, ``quantize_bits=``).
QSGD_BITS = (2, 4, 8)
#: The wire dtypes of values (``wire_dtype=``) and their ids in the C++ handlers.
WIRE_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
#: How a sparse message's indices travel (``index_encoding=``) and their ids in
#: the C++ handlers: ``"int32"`` a plain list; ``"auto"`` the smallest of a list,
#: bit-packed gaps and a bitmap, per message (:mod:`jax_sparse_sync.ops.index_encoding`).
INDEX_ENCODINGS = {"int32": 0, "auto": 1}


def wire_dtype_id(wire_dtype, op: str) -> int:
    """``None`` / float32 -> 0, bfloat16 -> 1, float16 -> 2; anything else: ValueError."""
    if wire_dtype is None:
        return 0
    try:
        name = jnp.dtype(wire_dtype).name
    except TypeError:
        name = None
    if name not in WIRE_DTYPES:
        raise ValueError(f"jax_sparse_sync.{op}: `wire_dtype` must be None (float32), "
                         f"jnp.bfloat16 or jnp.float16; got {wire_dtype!r}")
    return WIRE_DTYPES[name]


def wire_word(wire_dtype, index_encoding, op: str) -> int:
    """The sparse allreduce's wire format word (``ffi/collectives/wire_codec.h``'s ``WireFormat``):
    the value dtype's id plus 16 x the index encoding's id; ValueError naming ``op``."""
    if index_encoding not in INDEX_ENCODINGS:
        raise ValueError(f"jax_sparse_sync.{op}: `index_encoding` must be one of "
                         f"{sorted(INDEX_ENCODINGS)}; got {index_encoding!r}")
    return wire_dtype_id(wire_dtype, op) | (INDEX_ENCODINGS[index_encoding] << 4)


def round_to_wire(x, wire_dtype_index: int):
    """``x`` (float32) rounded to the wire dtype of id ``wire_dtype_index`` (nearest even)
    and widened back to float32: what a receiver gets. The identity for 0 (float32)."""
    if wire_dtype_index == 0:
        return x
    wire = (None, jnp.bfloat16, jnp.float16)[wire_dtype_index]
    # The barrier keeps the narrowing: XLA's GPU compiler removes a float32 -> 16-bit ->
    # float32 round trip (xla_allow_excess_precision, on by default), which made the
    # rounding vanish there (a residual that kept none of the wire's rounding; seen on an
    # H100). lax.reduce_precision would not do for float16: it flushes its subnormals.
    return jax.lax.optimization_barrier(x.astype(wire)).astype(jnp.float32)


def check_nan_policy(nan_policy, op: str) -> None:
    """ValueError naming ``op`` when ``nan_policy`` is not one of :data:`NAN_POLICIES`."""
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"jax_sparse_sync.{op}: `nan_policy` must be one of "
                         f"{sorted(NAN_POLICIES)}; got {nan_policy!r}")


def check_quantization(quantize_bits, qsgd_bucket, algorithm: str, op: str) -> None:
    """QSGD on the dense phase exists for DSAR only."""
    if quantize_bits == 0:
        return
    if quantize_bits not in QSGD_BITS:
        raise ValueError(f"jax_sparse_sync.{op}: `quantize_bits` must be 0 (off) or one of "
                         f"{QSGD_BITS}; got {quantize_bits!r}")
    if algorithm != "dsar_split_allgather":
        raise ValueError(
            f"jax_sparse_sync.{op}: `quantize_bits` quantizes DSAR's dense phase; it needs "
            f"algorithm='dsar_split_allgather', not {algorithm!r}.")
    if not isinstance(qsgd_bucket, int) or qsgd_bucket < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `qsgd_bucket` must be a positive int; "
                         f"got {qsgd_bucket!r}")


def check_coo_arguments(values, indices, size, nan_policy, op) -> int:
    """The checks every sparse allreduce call makes (MPI and mesh-axis transports
    alike); returns ``size`` as an int."""
    if values.ndim != 1 or indices.ndim != 1 or values.shape != indices.shape:
        raise ValueError(
            f"jax_sparse_sync.{op}: `values` and `indices` must be 1-D and of the same "
            f"length; got shapes {values.shape} and {indices.shape}."
        )
    if values.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise TypeError(
            f"jax_sparse_sync.{op}: `values` has dtype {values.dtype}; pass float32, "
            "bfloat16 or float16 (cast integer data with .astype(jnp.float32))."
        )
    if indices.dtype != jnp.int32:
        raise TypeError(
            f"jax_sparse_sync.{op}: `indices` has dtype {indices.dtype}; pass int32 "
            "(indices.astype(jnp.int32))."
        )
    size = int(size)
    if not 0 < size < 2**31:
        raise ValueError(f"jax_sparse_sync.{op}: `size` must be in [1, 2**31); got {size}")
    check_nan_policy(nan_policy, op)
    return size
