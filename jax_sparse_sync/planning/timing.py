"""The one timing loop of calibration and profiling: the median of repeated calls."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

__all__ = ["median_seconds", "timed_samples", "relative_deviations"]


def median_seconds(run: Callable[[], object], *, repeats: int, warmups: int = 1, comm=None,
                   slowest: bool = False) -> float:
    """Median wall seconds of ``run()`` over ``repeats`` calls after ``warmups`` untimed ones
    (the arguments as :func:`timed_samples`'s)."""
    return float(np.median(timed_samples(run, repeats=repeats, warmups=warmups, comm=comm,
                                         slowest=slowest)))


def relative_deviations(samples) -> list[float]:
    """``|t - m| / m`` of repeated timings ``t`` around their median ``m``, without the
    median repeat itself of an odd count (its 0 is the median's, not the noise's):
    pooled over many probes, their median estimates the half-IQR of one timing (for
    symmetric noise) and one stalled repeat moves it little. Empty for fewer than two
    samples or a median of 0."""
    t = np.asarray(samples, np.float64)
    med = float(np.median(t)) if t.size else 0.0
    if t.size < 2 or not med > 0:
        return []
    dev = sorted(np.abs(t - med) / med)
    return [float(d) for d in (dev[1:] if t.size % 2 else dev)]


def timed_samples(run: Callable[[], object], *, repeats: int, warmups: int = 1, comm=None,
                  slowest: bool = False) -> list[float]:
    """Wall seconds of ``run()`` in each of ``repeats`` calls after ``warmups`` untimed ones.

    Args:
      run: does the work and returns when it is done (block on JAX results inside).
      repeats: timed calls (>= 1).
      warmups: untimed calls first (compilation, first touch of buffers).
      comm: an mpi4py communicator: every call starts after a barrier, so the
        ranks time the same moment (collective: every rank must call).
      slowest: with ``comm``: each sample is the slowest rank's (an allreduce
        of the times with MAX), so every rank returns the same median.
    """
    if comm is not None and slowest:
        from mpi4py import MPI
    times = []
    for rep in range(warmups + repeats):
        if comm is not None:
            comm.Barrier()
        t0 = time.perf_counter()
        run()
        dt = time.perf_counter() - t0
        if comm is not None and slowest:
            dt = comm.allreduce(dt, op=MPI.MAX)
        if rep >= warmups:
            times.append(dt)
    return times
