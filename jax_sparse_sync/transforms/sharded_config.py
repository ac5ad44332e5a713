""":func:`jss.sharded_sync`'s options, checked when the transform is built.

Besides the shared options (:class:`~jax_sparse_sync.transforms.sync_config.SparseSyncConfig`:
density or k, communicator, NaN policy), a sharded sync takes the inner
optimizer each owner runs on its region, how the region's change travels, and
the change's density. Every argument error is raised by the factory, before any
parameter is seen, naming the argument; the inner optimizer is run once on a
small vector here to check that it is elementwise (:func:`check_elementwise`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_sparse_sync.model.sharded import CHANGES, change_entries, choose_change
from jax_sparse_sync.transforms.sync_config import SparseSyncConfig, check_choice

__all__ = ["ShardedSyncConfig", "check_elementwise", "region_leaf"]

OP = "sharded_sync"


def _run(inner, params, grads):
    """``inner`` for len(grads) steps on the float32 vector ``params``: (updates, state)."""
    state = inner.init(params)
    updates = []
    for g in grads:
        u, state = inner.update(g, state, params)
        updates.append(u)
    return updates, state


def _whole_and_parts(inner, params, grads, cut: int):
    """:func:`_run` on the whole vector and on its two parts, as one jitted program (one
    compilation instead of one per operation)."""
    def run_all(params, grads):
        return (_run(inner, params, grads),
                _run(inner, params[:cut], [g[:cut] for g in grads]),
                _run(inner, params[cut:], [g[cut:] for g in grads]))
    return jax.tree_util.tree_map(np.asarray, jax.jit(run_all)(params, grads))


def region_leaf(leaf, length: int) -> bool:
    """Whether an inner state leaf holds one entry per parameter of a region of ``length``."""
    return jnp.ndim(leaf) == 1 and jnp.shape(leaf)[0] == length


@functools.lru_cache(maxsize=64)
def _checked_elementwise(inner) -> None:
    """:func:`check_elementwise` once per (hashable) optimizer: a transform built twice on
    the same one, as a script restarting from a checkpoint does, compiles the check once."""
    _check_elementwise(inner, OP)


def check_elementwise(inner, op: str = OP) -> None:
    """Raises a ``ValueError`` naming ``inner`` unless it is an elementwise optimizer
    (:func:`_check_elementwise`; remembered for an optimizer already checked)."""
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(f"jax_sparse_sync.{op}: `inner` must be an optax.GradientTransformation "
                        f"(e.g. optax.adamw(1e-3)); got {inner!r}")
    try:
        hash(inner)
    except TypeError:
        _check_elementwise(inner, op)
        return
    _checked_elementwise(inner)


def _check_elementwise(inner, op: str) -> None:
    """Raises a ``ValueError`` naming ``inner`` unless it is an elementwise optimizer.

    Each owner runs ``inner`` on its region only, so an entry's update may depend
    on that entry's gradient, parameter and state alone (Adam, AdamW, SGD with
    momentum, RMSProp, Lion; schedules of the step count). The check runs it two
    steps on an 8-entry vector whose halves differ in scale by 300x, and on the two
    parts (3 and 5 entries) alone: the parts' updates must equal the whole's, and
    every state leaf must be a scalar or hold one entry per parameter. Global-norm
    clipping, trust ratios (LAMB, LARS) and Adafactor's update clipping fail it.
    """
    rng = np.random.default_rng(0)
    n, cut = 8, 3
    scale = np.where(np.arange(n) < cut, 1.0, 300.0)
    params = rng.standard_normal(n).astype(np.float32)
    grads = [(rng.standard_normal(n) * scale).astype(np.float32) for _ in range(2)]
    try:
        (whole, state), (low, low_state), (high, high_state) = _whole_and_parts(
            inner, params, grads, cut)
    except Exception as e:  # noqa: BLE001 - any failure says the same: not a flat optimizer
        raise ValueError(f"jax_sparse_sync.{op}: `inner` could not run on a flat float32 "
                         f"vector of parameters ({type(e).__name__}: {e}); each owner runs it "
                         "on its region of the flattened parameters") from e
    for parts, length in ((state, n), (low_state, cut), (high_state, n - cut)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(parts)[0]:
            if jnp.ndim(leaf) != 0 and not region_leaf(leaf, length):
                raise ValueError(
                    f"jax_sparse_sync.{op}: `inner`'s state leaf {jax.tree_util.keystr(path)} "
                    f"has shape {jnp.shape(leaf)} for {length} parameters; a sharded state needs "
                    "every leaf to be a scalar or to hold one entry per parameter (an "
                    "elementwise optimizer such as optax.adamw)")
    for step, (u, a, b) in enumerate(zip(whole, low, high)):
        if not np.allclose(u, np.concatenate([a, b]), rtol=1e-6, atol=0.0):
            raise ValueError(
                f"jax_sparse_sync.{op}: `inner` is not elementwise: at step {step + 1} its "
                "update of a vector differs from the updates of the vector's parts (global-norm "
                "clipping, trust ratios (LAMB, LARS) and Adafactor's update clipping read "
                "every entry). Each owner runs `inner` on its region alone; clip the gradient "
                "before the sync instead, e.g. optax.chain(optax.clip_by_global_norm(1.0), "
                "jss.sharded_sync(optax.adamw(1e-3), density=0.01))")


def _check_density(value, name: str, op: str = OP):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"jax_sparse_sync.{op}: `{name}` must be in (0, 1]; got {value!r} "
                         "(e.g. 0.01 keeps 1% of the entries)")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ShardedSyncConfig:
    """:func:`jss.sharded_sync`'s options, checked (:meth:`build`).

    Attributes:
      shared: the shared options (float32 residual; no warm-up, flushes or decay).
      inner: the elementwise optimizer each owner runs on its region.
      change: ``"topk"``, ``"lazy"``, ``"dense"`` or ``"auto"`` (resolved when the
        world size is known: :meth:`resolved_change`).
      change_density: the fraction of its region an owner sends with ``"topk"``;
        None: k entries (as many as each rank selects of its gradient).
      max_grad_norm: the reduced gradient clipped by its global norm, or None.
    """

    shared: SparseSyncConfig
    inner: Any
    change: str = "auto"
    change_density: float | None = None
    max_grad_norm: float | None = None

    @classmethod
    def build(cls, inner, *, density=None, k=None, change="auto", change_density=None,
              max_grad_norm=None, comm=None, nan_policy="raise") -> "ShardedSyncConfig":
        """The checked configuration; raises what a wrong argument deserves, naming it."""
        check_choice(change, CHANGES + ("auto",), "change", OP)
        if density is not None and k is not None:
            raise ValueError(f"jax_sparse_sync.{OP}: pass exactly one of `density` or `k`.")
        _check_density(density, "density")
        change_density = _check_density(change_density, "change_density")
        if change_density is not None and change in ("lazy", "dense"):
            raise ValueError(f"jax_sparse_sync.{OP}: `change_density` sets how much of its "
                             f"region an owner sends with change='topk'; change={change!r} "
                             "sends every entry that moved, so leave it None")
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(
                max_grad_norm, (int, float)) or not 0.0 < float(max_grad_norm) < float("inf")):
            raise ValueError(f"jax_sparse_sync.{OP}: `max_grad_norm` must be None or a positive "
                             f"number (e.g. 1.0); got {max_grad_norm!r}")
        shared = SparseSyncConfig.build(OP, density=density, k=k, comm=comm,
                                        nan_policy=nan_policy)
        check_elementwise(inner)
        return cls(shared=shared, inner=inner, change=change, change_density=change_density,
                   max_grad_norm=None if max_grad_norm is None else float(max_grad_norm))

    def change_k(self, size: int, nranks: int) -> int:
        """Entries of its region an owner sends with ``"topk"``
        (:func:`~jax_sparse_sync.model.sharded.change_entries`)."""
        return change_entries(size=size, nranks=nranks, k=self.shared.kept(size),
                              change_density=self.change_density)

    def resolved_change(self, size: int, nranks: int) -> str:
        """``change``, with ``"auto"`` resolved by the cost model
        (:func:`~jax_sparse_sync.model.sharded.choose_change`)."""
        if self.change != "auto":
            return self.change
        return choose_change(nranks=nranks, size=size, k=self.shared.kept(size),
                             change_k=self.change_k(size, nranks))
