"""Argument checks and names shared by both transports, the ops and the transforms.

The MPI and the mesh-axis transports check a sparse allreduce's arguments the
same way and raise the same messages; this module is that one place.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["NAN_POLICIES", "QSGD_BITS", "check_nan_policy", "check_quantization",
           "check_coo_arguments"]

#: nan_policy name -> id understood by the C++ handler.
NAN_POLICIES = {"raise": 0, "propagate": 1}
#: Bits per entry QSGD quantizes to (``jss.qsgd_quantize``, ``quantize_bits=``).
QSGD_BITS = (2, 4, 8)


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
