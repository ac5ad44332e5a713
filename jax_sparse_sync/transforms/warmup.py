"""Warm-up phases of a sparse sync: dense steps, then a density ramp (DGC).

Deep Gradient Compression (Lin et al., ICLR'18) keeps the first epochs less
sparse: the sparsity rises exponentially (75%, 93.75%, 98.4%, 99.6%, 99.9%)
while the weights move fastest, and some users sync densely for the first
steps. Here a warm-up is a tuple of ``(steps, density)`` phases run before
the transform's own density; ``density=1.0`` is a dense allreduce of the
accumulator (the residual is sent whole and comes out zero).

Each phase has its own static k, so the update lowers to one
``lax.switch`` over the phases (every branch compiled once; the step count,
equal on every rank, picks the branch, so all ranks issue the same MPI
calls).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.jax_compat import varying_like

__all__ = ["density_ramp", "normalize_warmup", "phase_index", "phase_start", "switch_phases",
           "check_flush_every", "flush_step", "periodic_flush"]

Phase = tuple[int, float]


def density_ramp(density: float, *, steps_per_stage: int, dense_steps: int = 0,
                 factor: float = 4.0) -> tuple[Phase, ...]:
    """DGC's warm-up: densities falling by ``factor`` per stage down to ``density``.

    Args:
      density: the transform's own density (the ramp stops above it).
      steps_per_stage: steps of each ramp stage (DGC: one epoch).
      dense_steps: dense steps before the ramp (0: none).
      factor: density ratio between stages (DGC: 4, i.e. sparsity 75%, 93.75%,
        98.4375%, 99.6%).

    Returns:
      The ``warmup=`` phases for :func:`jss.topk_sync`: ``(dense_steps, 1.0)``
      if any, then ``(steps_per_stage, 1/factor)``, ``(steps_per_stage,
      1/factor**2)``, ... while the density is above ``density``.

    Example:
      >>> import jax_sparse_sync as jss
      >>> jss.density_ramp(0.001, steps_per_stage=100, dense_steps=50)
      ((50, 1.0), (100, 0.25), (100, 0.0625), (100, 0.015625), (100, 0.00390625))
    """
    if not 0.0 < density <= 1.0:
        raise ValueError(f"jax_sparse_sync.density_ramp: `density` must be in (0, 1]; got {density!r}")
    if not factor > 1.0:
        raise ValueError(f"jax_sparse_sync.density_ramp: `factor` must be > 1; got {factor!r}")
    for name, value in (("steps_per_stage", steps_per_stage), ("dense_steps", dense_steps)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"jax_sparse_sync.density_ramp: `{name}` must be an int >= 0; "
                             f"got {value!r}")
    phases: list[Phase] = [(dense_steps, 1.0)] if dense_steps else []
    stage = 1.0 / factor
    while steps_per_stage and stage > density * (1.0 + 1e-9):
        phases.append((steps_per_stage, stage))
        stage /= factor
    return tuple(phases)


def normalize_warmup(warmup: Sequence[Phase] | None, op: str) -> tuple[Phase, ...]:
    """Checks ``warmup`` and returns it as a tuple of ``(steps, density)``; drops 0-step phases."""
    if warmup is None:
        return ()
    try:
        phases = [tuple(p) for p in warmup]
    except TypeError:
        phases = None
    fix = ("pass a sequence of (steps, density) pairs, e.g. warmup=[(100, 1.0), (200, 0.05)] or "
           "warmup=jss.density_ramp(0.001, steps_per_stage=100)")
    if phases is None or any(len(p) != 2 for p in phases):
        raise ValueError(f"jax_sparse_sync.{op}: `warmup` must be (steps, density) pairs; {fix}; "
                         f"got {warmup!r}")
    out = []
    for steps, density in phases:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"jax_sparse_sync.{op}: a `warmup` phase's steps must be an int "
                             f">= 0; got {steps!r} in {warmup!r}")
        if not (isinstance(density, (int, float)) and math.isfinite(density)
                and 0.0 < density <= 1.0):
            raise ValueError(f"jax_sparse_sync.{op}: a `warmup` phase's density must be in "
                             f"(0, 1] (1.0 = dense allreduce); got {density!r} in {warmup!r}")
        if steps:
            out.append((steps, float(density)))
    return tuple(out)


def phase_index(count, phases: Sequence[Phase]):
    """Branch of step ``count``: i for the i-th warm-up phase, ``len(phases)`` after them."""
    ends = jnp.cumsum(jnp.asarray([s for s, _ in phases], jnp.int32))
    return jnp.sum(count >= ends, dtype=jnp.int32)


def phase_start(index: int, phases: Sequence[Phase]) -> int:
    """First step of branch ``index`` (static)."""
    return int(sum(s for s, _ in phases[:index]))


def switch_phases(phases: Sequence[Phase], count, sparse_step: Callable, dense_step: Callable,
                  per_device: Sequence[str], residual, updates, state):
    """One step of a transform with warm-up ``phases``: a ``lax.switch`` keyed by ``count``.

    Args:
      phases: the normalized warm-up (:func:`normalize_warmup`), not empty.
      count: the state's step count (equal on every rank, so every rank takes
        the same branch and issues the same MPI calls).
      sparse_step: ``(residual, updates, state, phase_density=None,
        first_step=0) -> (updates, state)``; ``phase_density`` None is the
        transform's own density, ``first_step`` the phase's first step (for
        the policies that recompute a threshold at a phase's start).
      dense_step: ``(residual, updates, state) -> (updates, state)`` for
        phases of density 1.
      per_device: the state fields that differ across the devices of a mesh
        axis; every branch types them as varying like ``residual`` (the
        branches of a switch must agree under shard_map's check_vma).
      residual, updates, state: the operands.
    """
    branches = [dense_step if d >= 1.0 else
                functools.partial(sparse_step, phase_density=d, first_step=phase_start(i, phases))
                for i, (_, d) in enumerate(phases)]
    branches.append(functools.partial(sparse_step, first_step=phase_start(len(phases), phases)))
    return jax.lax.switch(phase_index(count, phases),
                          [_typed(b, per_device) for b in branches], residual, updates, state)


def _typed(branch: Callable, per_device: Sequence[str]) -> Callable:
    """``branch`` with its per-device state fields typed as varying like the residual."""
    def run(residual, updates, state):
        new_updates, new = branch(residual, updates, state)
        return new_updates, new._replace(**{f: varying_like(getattr(new, f), residual)
                                           for f in per_device})
    return run


def check_flush_every(flush_every: int | None, op: str) -> int | None:
    """Checks a transform's ``flush_every`` (None, or an int >= 1)."""
    if flush_every is None:
        return None
    if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `flush_every` must be None or an int >= 1 (a "
                         f"dense flush of the accumulator every that many steps, e.g. the run's "
                         f"length for one flush at its last step); got {flush_every!r}")
    return flush_every


def flush_step(count, flush_every: int):
    """Whether step ``count`` (0-based) flushes: the ``flush_every``-th, ``2 * flush_every``-th, ... step."""
    return (count + 1) % flush_every == 0


def periodic_flush(flush_every: int, count, step: Callable, dense_step: Callable,
                   per_device: Sequence[str], residual, updates, state):
    """One step that is ``dense_step`` on every ``flush_every``-th step, else ``step``.

    A flush sends each rank's whole accumulator (``residual + grad``) in a dense
    allreduce, so every entry held back since the last flush is applied, averaged
    over the ranks, and the residuals come out zero: error feedback's delayed
    updates stop piling up (the ranks' top-k selections barely overlap at large
    P, so an entry otherwise moves by one rank's accumulation at a time). Both
    branches are compiled; the step count, equal on every rank, picks one, so
    all ranks issue the same MPI calls.
    """
    return jax.lax.cond(flush_step(count, flush_every), _typed(dense_step, per_device),
                        _typed(step, per_device), residual, updates, state)
