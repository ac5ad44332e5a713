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
calls). The branches only choose and exchange (:func:`switch_exchanges`):
the accumulate pass runs before the switch and the residual update after
it, in place, because XLA copies every buffer a branch writes in place.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jax_sparse_sync.base.jax_compat import varying_like

__all__ = ["density_ramp", "normalize_warmup", "phase_index", "phase_start",
           "check_flush_every", "flush_step", "phase_branch", "switch_exchanges",
           "run_phases"]

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


def phase_branch(phases: Sequence[Phase], count, flush_every: int | None):
    """The branch of step ``count`` among ``phases`` (:func:`phase_index`), then
    the transform's own density (``len(phases)``), then a flush
    (``len(phases) + 1``: every ``flush_every``-th step when set)."""
    index = phase_index(count, phases) if phases else jnp.int32(0)
    if flush_every is not None:
        index = jnp.where(flush_step(count, flush_every), jnp.int32(len(phases) + 1), index)
    return index


def switch_exchanges(index, branches: Sequence[Callable], operands, *, padded: dict,
                     per_device: Sequence[str], ref):
    """``lax.switch`` over branches that only exchange: none of them writes an
    N-entry buffer in place.

    The accumulate pass (and a producer's own state, such as the Adam moments)
    runs before the switch and the residual update after it: XLA copies every
    buffer that a branch of a conditional writes in place (with an
    Adam-direction producer inside the branches, several N-entry copies a
    step). The branches differ in how many entries they choose,
    so the fields named in ``padded`` (``{field: fill}``, 1-D arrays, e.g. the
    indices to zero with -1) are padded with ``fill`` to the longest branch's
    length (``None`` in a branch: all ``fill``).

    Args:
      index: the branch (int32 scalar, equal on every rank).
      branches: ``(*operands) -> NamedTuple`` of the same fields, each.
      operands: the branches' operands.
      padded: the 1-D fields padded to a common length, and their fill.
      per_device: the fields typed as varying like ``ref`` under shard_map
        (the branches of a switch must agree).
      ref: an array varying over the mesh axes the per-device fields vary over.
    """
    shapes = [jax.eval_shape(b, *operands) for b in branches]
    # a field that no branch returns stays None
    kinds = {field: [getattr(s, field) for s in shapes if getattr(s, field) is not None]
             for field in padded}
    lengths = {field: max(x.shape[0] for x in found) for field, found in kinds.items() if found}

    def pad(branch, shape):
        def run(*ops):
            out = branch(*ops)
            fixes = {}
            for field, fill in padded.items():
                if field not in lengths:
                    continue
                x = getattr(out, field)
                if x is None:
                    x = jnp.full((lengths[field],), fill, kinds[field][0].dtype)
                elif x.shape[0] < lengths[field]:
                    x = jnp.concatenate([x, jnp.full((lengths[field] - x.shape[0],), fill,
                                                     x.dtype)])
                fixes[field] = x
            out = out._replace(**fixes)
            return out._replace(**{f: varying_like(getattr(out, f), ref) for f in per_device
                                   if getattr(out, f) is not None})
        return run

    return jax.lax.switch(index, [pad(b, s) for b, s in zip(branches, shapes)], *operands)


def run_phases(phases: Sequence[Phase], flush_every: int | None, count, exchange: Callable,
               dense: Callable, operands, *, padded: dict, per_device: Sequence[str], ref,
               flush: Callable | None = None):
    """One step's exchange: the warm-up phase of step ``count``, the transform's own
    density after them, or a flush.

    Args:
      phases: the normalized warm-up (may be empty).
      flush_every: :func:`check_flush_every`'s value.
      count: the step count (equal on every rank).
      exchange: ``(phase_density, first_step) -> branch``; ``phase_density``
        None is the transform's own density.
      dense: the branch of a density-1 phase and of a flush.
      flush: the branch of a flush, where it differs from ``dense`` (e.g. a
        warm-up on a 16-bit wire, flushes in float32); None: ``dense``.
      operands, padded, per_device, ref: as :func:`switch_exchanges`.

    Returns:
      ``(outcome, cleared)``: the branch's outcome, and a traced bool that is
      true where a dense branch ran (the residual is then all sent), or None
      where there is no dense branch. Without phases or flushes, the own
      density's branch is called directly (no switch).
    """
    branches = [dense if d >= 1.0 else exchange(d, phase_start(i, phases))
                for i, (_, d) in enumerate(phases)]
    branches.append(exchange(None, phase_start(len(phases), phases)))
    dense_ids = [i for i, (_, d) in enumerate(phases) if d >= 1.0]
    if flush_every is not None:
        branches.append(dense if flush is None else flush)
        dense_ids.append(len(branches) - 1)
    if len(branches) == 1:
        return branches[0](*operands), None
    index = phase_branch(phases, count, flush_every)
    out = switch_exchanges(index, branches, operands, padded=padded, per_device=per_device,
                           ref=ref)
    cleared = jnp.any(index == jnp.asarray(dense_ids, jnp.int32)) if dense_ids else None
    return out, cleared
