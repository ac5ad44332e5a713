"""Per-device residuals when the number of devices changes (checkpoint restore)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["resize_residuals"]


def resize_residuals(residual, new_size: int):
    """Residuals stacked per device (leading axis P) -> the same for ``new_size`` devices.

    Error feedback owes the model ``sum_i residual_i / P`` (what the ranks kept
    back, averaged like the updates). Giving each of the P' new devices the
    mean of the old residuals owes exactly the same:
    ``sum_j mean / P' = sum_i residual_i / P``. With the same P, restore the
    checkpointed residuals as they are instead (bit-exact continuation).

    Args:
      residual: a pytree whose leaves have a leading axis of the old device
        count (e.g. ``opt_state[0].residual`` gathered to the host).
      new_size: the new number of devices P'.

    Returns:
      The same pytree with leading axis ``new_size``.
    """
    if not isinstance(new_size, int) or new_size < 1:
        raise ValueError(f"jax_sparse_sync.resize_residuals: `new_size` must be a positive int; "
                         f"got {new_size!r}")

    def resize(x):
        x = jnp.asarray(x)
        if x.ndim == 0:
            raise ValueError("jax_sparse_sync.resize_residuals: leaves need a leading device axis")
        mean = jnp.mean(x.astype(jnp.float32), axis=0).astype(x.dtype)
        return jnp.broadcast_to(mean, (new_size,) + x.shape[1:])

    return jax.tree_util.tree_map(resize, residual)
