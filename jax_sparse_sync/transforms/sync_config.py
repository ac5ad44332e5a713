"""The options every error-feedback sparse sync shares, validated once, when the transform is built.

A sync's factory (``topk_sync``, ``oktopk_sync``, ``shared_support_sync``, ...) builds
a :class:`SparseSyncConfig` of the shared options and, beside it, a configuration of
its own options (a frozen dataclass whose ``__post_init__`` checks them): every error
a user can make in the arguments is raised there, by the factory, before any
parameter is seen. The step's phases (:mod:`~jax_sparse_sync.transforms.phases`) then
read the configurations and never re-check an argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.topk_sync_state import check_residual_decay
from jax_sparse_sync.transforms.warmup import check_flush_every, normalize_warmup

__all__ = ["SparseSyncConfig", "check_positive_int", "check_capacity_factor", "check_choice"]


def check_positive_int(value, name: str, op: str) -> int:
    """``value`` when it is an int >= 1, else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `{name}` must be a positive int; got {value!r}")
    return value


def check_capacity_factor(capacity_factor, op: str) -> float:
    """Room for a threshold selection, in units of k: at least 1."""
    if not capacity_factor >= 1.0:
        raise ValueError(f"jax_sparse_sync.{op}: `capacity_factor` must be >= 1; "
                         f"got {capacity_factor!r}")
    return capacity_factor


def check_choice(value, choices, name: str, op: str):
    """``value`` when it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"jax_sparse_sync.{op}: `{name}` must be one of {tuple(choices)}; "
                         f"got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class SparseSyncConfig:
    """The shared options of a flat error-feedback sync, checked.

    Attributes:
      op: the transform's name, for error messages (``"topk_sync"``).
      density, k: the entries kept a step (exactly one is set).
      comm: the resolved communicator (an mpi4py communicator or a mesh axis).
      residual_dtype: the residual's float dtype.
      nan_policy: ``"raise"`` or ``"propagate"``.
      warmup: the normalized warm-up phases, ``((steps, density), ...)``.
      flush_every: steps between dense flushes, or None.
      decay_at: ``count -> factor`` of a leaky residual, or None (plain error feedback).
    """

    op: str
    density: float | None
    k: int | None
    comm: Any
    residual_dtype: Any
    nan_policy: str = "raise"
    warmup: tuple = ()
    flush_every: int | None = None
    decay_at: Callable | None = None

    @classmethod
    def build(cls, op: str, *, density=None, k=None, comm=None, residual_dtype=jnp.float32,
              nan_policy: str = "raise", warmup=None, flush_every=None,
              residual_decay=1.0) -> "SparseSyncConfig":
        """The checked configuration; raises what a wrong argument deserves, naming it."""
        if density is None and k is None:
            raise ValueError(f"jax_sparse_sync.{op}: pass `density=` (e.g. 0.01) or `k=`.")
        residual_dtype = jnp.dtype(residual_dtype)
        if not jnp.issubdtype(residual_dtype, jnp.floating):
            raise TypeError(f"jax_sparse_sync.{op}: `residual_dtype` must be a float dtype; "
                            f"got {residual_dtype}")
        return cls(op=op, density=density, k=k, comm=transport.resolve_comm(comm),
                   residual_dtype=residual_dtype, nan_policy=nan_policy,
                   warmup=normalize_warmup(warmup, op),
                   flush_every=check_flush_every(flush_every, op),
                   decay_at=check_residual_decay(residual_decay, op))

    def kept(self, size: int, phase_density: float | None = None) -> int:
        """Entries kept of ``size``: the own density (or k), or a warm-up phase's density."""
        if phase_density is None:
            return resolve_k(size=size, density=self.density, k=self.k, op=self.op)
        return resolve_k(size=size, density=phase_density, k=None, op=self.op)

    def decay(self, count):
        """This step's leak factor, or None (plain error feedback: the residual untouched)."""
        return None if self.decay_at is None else self.decay_at(count)

    @property
    def on_mesh_axis(self) -> bool:
        """The sync runs on a mesh axis (inside ``shard_map``), not on MPI."""
        return transport.is_mesh_axis(self.comm)

    def error(self, message: str, kind=ValueError) -> Exception:
        """An exception naming the transform: ``jax_sparse_sync.<op>: message``."""
        return kind(f"jax_sparse_sync.{self.op}: {message}")
