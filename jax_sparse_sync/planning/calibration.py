"""``calibrate``: measure alpha (latency) and beta (time per byte) of the transport.

A sweep of message sizes, timed on the real MPI transport as our algorithms
use it (every rank exchanging with a neighbour at once), then a least-squares
fit ``t(m) = alpha + beta * m``. Rank 0 fits and broadcasts, so every rank
holds the same numbers and ``algorithm="auto"`` picks the same algorithm
everywhere. With ``local=True`` it also measures the local-work term of each
sync transform (:mod:`jax_sparse_sync.planning.local_work`), so the model
predicts step time, not only wire time.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import numbers
import os
import warnings

import numpy as np
from mpi4py import MPI

from jax_sparse_sync.ops import transport
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.planning.local_work import (DEFAULT_LOCAL_SIZES, GROUPS_TIMED, fit_local_work,
                                                 groups_timed, synthetic_sizes, time_local_work)
from jax_sparse_sync.planning.timing import median_seconds
from jax_sparse_sync.base.transform_arguments import resolve_k

__all__ = ["calibrate", "fit_alpha_beta", "fit_gamma", "fit_group_fixed", "load_alpha_beta",
           "measure_group_cost", "save_alpha_beta", "GROUP_COST_KINDS"]

#: the local-work kinds that are one group of a grouped sync (``calibrate(group_cost=True)``)
GROUP_COST_KINDS = ("topk_sync_group", "dense_sync_group")

DEFAULT_SIZES = tuple(2**e for e in range(3, 23, 2))  # 8 B .. 2 MiB, every 4x
#: beta is the slope of the sizes within this factor of the largest (the top three of a 4x sweep)
BANDWIDTH_SPAN = 16
#: the sweep goes on with 4x larger messages until one exchange takes this long
DEFAULT_BANDWIDTH_SECONDS = 0.2
#: ... or the messages reach this many bytes
DEFAULT_MAX_BYTES = 1 << 26
DEFAULT_CONTENTION_SIZES = tuple(2**e for e in range(6, 22, 3))  # 64 B .. 2 MiB a rank
#: the least repeats of each contention timing (calibrate(contention=True))
CONTENTION_REPEATS = 5
#: the local work's second density: ``density / LOW_DENSITY_RATIO``
LOW_DENSITY_RATIO = 10


def fit_alpha_beta(sizes, times) -> cost_model.AlphaBeta:
    """Fits ``t = alpha + beta * m``: beta from the largest messages, alpha from the smallest.

    A sweep's times are not one line: a link's first window (TCP's congestion
    window, a shaper's token bucket) carries small and medium messages faster
    than the link's rate, and on a loaded machine the latency-bound sizes scatter
    widely. One least-squares line through every size would let the many small
    sizes set the slope. So:

    * the times are reduced to one median per size (sizes may repeat);
    * ``beta`` is the ordinary least-squares slope of the sizes of at least
      ``1 / BANDWIDTH_SPAN`` of the largest (at least the two largest): the rate
      of a sustained stream, where any first-window offset is a constant that the
      slope does not see;
    * ``alpha`` is the median of ``t - beta * m`` over the latency-bound sizes
      (``beta * m`` at most half of ``t``; all sizes if none is).

    Both are clamped to be >= 0 (beta > 0).
    """
    m = np.asarray(sizes, np.float64)
    t = np.asarray(times, np.float64)
    if m.shape != t.shape or m.ndim != 1:
        raise ValueError("fit_alpha_beta: `sizes` and `times` must be 1-D and of equal length; "
                         f"got shapes {m.shape} and {t.shape}")
    uniq = np.unique(m)
    if uniq.size < 2:
        raise ValueError("fit_alpha_beta: need (size, time) pairs of at least two different "
                         f"sizes; got sizes {list(map(int, uniq))}")
    med = np.array([np.median(t[m == u]) for u in uniq])
    big = uniq >= uniq[-1] / BANDWIDTH_SPAN
    if big.sum() < 2:
        big[-2:] = True
    beta = float(np.polyfit(uniq[big], med[big], 1)[0])
    if not beta > 0:  # noise larger than the bytes' time: all of the largest's time per byte
        beta = float(med[-1] / uniq[-1])
    rest = med - beta * uniq
    latency_bound = beta * uniq <= 0.5 * med
    alpha = float(np.median(rest[latency_bound] if latency_bound.any() else rest))
    return cost_model.AlphaBeta(alpha=max(alpha, 0.0), beta=max(beta, 1e-15))


def fit_group_fixed(params: cost_model.AlphaBeta, kind: str, groups, measured_s,
                    predicted_s) -> cost_model.AlphaBeta:
    """``params`` with the per-group fixed local work of ``kind`` fitted to measured steps.

    The local-work timing of a ``*_group`` kind runs on a one-rank communicator, so
    its fixed part misses what a group costs the step on the real transport (the
    start, the worker thread's hand-off and its done, on a core the backward pass
    also needs). Given grouped plans measured next to their predictions under
    ``params`` (``groups[i]`` groups each), the added fixed seconds per group are
    the least-squares ``c`` of ``measured - predicted = c * groups`` (clamped at
    0), added to ``kind``'s fixed term: every later prediction and plan charges
    each group ``c`` more, in the one local-work term the planner uses.
    """
    g = np.asarray(groups, np.float64)
    d = np.asarray(measured_s, np.float64) - np.asarray(predicted_s, np.float64)
    if g.shape != d.shape or g.size < 1 or not np.all(g >= 1):
        raise ValueError("fit_group_fixed: need one group count >= 1 per measured and "
                         f"predicted step; got groups={groups!r}")
    extra = max(0.0, float((g * d).sum() / (g * g).sum()))
    fixed, per_entry, per_kept = params.local_work(kind)
    local = tuple(w for w in params.local if w[0] != kind) + (
        (kind, fixed + extra, per_entry, per_kept),)
    return dataclasses.replace(params, local=local)


def measure_group_cost(comm, kind: str, params: cost_model.AlphaBeta, *, size: int,
               density: float = 0.01, repeats: int = 5) -> tuple[cost_model.AlphaBeta, dict]:
    """``(params with kind's per-group cost added, the record)``: what one group of a
    grouped sync costs a step on ``comm`` beyond what ``params`` predict.

    The local-work timing of a ``*_group`` kind runs on a one-rank communicator
    (nothing on the wire), so its fixed part misses what each group costs on the
    real transport: the worker thread's hand-off, the start and the done on the
    cores the step also uses. Here the same synthetic grouped step (:data:`GROUPS_TIMED` groups of
    ``size`` entries in all, every group ready at once, all normal) is timed on
    ``comm`` (the slowest rank's, as a data-parallel step waits for it), its time
    predicted by the grouping simulator under ``params`` (each group's local work
    and its wire time: ``plan_grouping.sparse_link``), and the difference per
    group, ``c = max(0, (measured - predicted) / groups)``, is added to
    ``kind``'s fixed part (:func:`fit_group_fixed` with one point). Collective.

    The record: ``kind``, ``size``, ``groups``, ``measured_s``, ``predicted_s``,
    ``per_group_s``.
    """
    from jax_sparse_sync.model import grouping
    from jax_sparse_sync.planning.plan_grouping import sparse_link

    if kind not in GROUP_COST_KINDS:
        raise ValueError(f"measure_group_cost: kind must be one of {GROUP_COST_KINDS}; "
                         f"got {kind!r}")
    p = comm.Get_size()
    dense = kind == "dense_sync_group"
    mine = time_local_work(kind, size, density=1.0 if dense else density, repeats=repeats,
                           comm=comm, transport_comm=comm)
    measured = float(max(comm.allgather(mine)))
    sizes = synthetic_sizes(size)
    order = tuple(reversed(range(len(sizes))))  # the timed transform's backward order
    layers = grouping.LayerTimes(leaves=order, ready_s=(0.0,) * len(sizes),
                                 entries=tuple(sizes[i] for i in order),
                                 dense_bytes=tuple(4 * sizes[i] for i in order), compute_s=0.0)
    k = size if dense else resolve_k(size=size, density=density, k=None)
    link, message_bytes, local_s = sparse_link(nranks=p, size=size, k=k,
                                               algorithm="dense" if dense else "auto",
                                               params=params)
    predicted = grouping.simulate(layers, [((i,), "normal") for i in order], link,
                                  message_bytes, local_s).predicted_s
    out = fit_group_fixed(params, kind, [GROUPS_TIMED], [measured], [predicted])
    per_group = out.local_work(kind)[0] - params.local_work(kind)[0]
    out = comm.bcast(out, root=0)  # every rank plans with the same numbers
    return out, {"kind": kind, "size": int(size), "groups": GROUPS_TIMED,
                 "measured_s": measured, "predicted_s": predicted,
                 "per_group_s": comm.bcast(per_group, root=0)}


def save_alpha_beta(params: cost_model.AlphaBeta, path: str, **extra) -> None:
    record = {"alpha_s": params.alpha, "beta_s_per_byte": params.beta,
              "local_work": [{"kind": k, "fixed_s": f, "per_entry_s": e,
                              "per_kept_s": rest[0] if rest else 0.0}
                             for k, f, e, *rest in params.local], "gamma": params.gamma,
              "burst_bytes": params.burst_bytes, **extra}
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


def load_alpha_beta(path: str) -> cost_model.AlphaBeta:
    """Reads a file written by :func:`calibrate` (or :func:`save_alpha_beta`)."""
    with open(path) as f:
        record = json.load(f)
    # files without local work: not calibrated; without per_kept_s: 0 per kept entry
    local = tuple((str(w["kind"]), float(w["fixed_s"]), float(w["per_entry_s"]),
                   float(w.get("per_kept_s", 0.0))) for w in record.get("local_work", ()))
    return cost_model.AlphaBeta(alpha=float(record["alpha_s"]),
                                beta=float(record["beta_s_per_byte"]), local=local,
                                gamma=float(record.get("gamma", 1.0)),
                                burst_bytes=float(record.get("burst_bytes", 0.0)))


def calibrate(comm=None, *, sizes=DEFAULT_SIZES, repeats: int = 5, path: str | None = None,
              bandwidth_seconds: float | None = DEFAULT_BANDWIDTH_SECONDS,
              max_bytes: int = DEFAULT_MAX_BYTES, install: bool = True, local: bool | tuple = False,
              local_sizes=DEFAULT_LOCAL_SIZES, density: float = 0.01,
              local_densities=None, contention: bool = False,
              contention_sizes=DEFAULT_CONTENTION_SIZES,
              group_cost: bool = False, burst_bytes: float = 0.0) -> cost_model.AlphaBeta:
    """Measures alpha and beta of the MPI transport of ``comm`` and fits them.

    Every rank sends ``m`` bytes to its right neighbour while receiving from
    its left one (the pattern of a ring or split-allgather phase); the time of
    a step is the slowest rank's, the median of ``repeats``. Past ``sizes`` the
    sweep goes on with 4x larger messages until one exchange takes at least
    ``bandwidth_seconds``, so beta is the rate of a sustained stream rather than of
    the link's first window (see :func:`fit_alpha_beta` for the fit). Collective:
    call it on every rank of ``comm``.

    Args:
      comm: mpi4py communicator (default: the library's clone of COMM_WORLD).
      sizes: message sizes in bytes.
      repeats: timed repetitions per size (after one warm-up).
      bandwidth_seconds: the sweep is extended (4x a step, up to ``max_bytes``)
        until its largest exchange takes at least this long; 0 or None: exactly
        ``sizes``. The default 0.2 s extends the sweep to 8 MiB on a 200 Mbit/s
        link and stops at ``max_bytes`` on faster ones.
      max_bytes: the largest message of the extended sweep (buffers of this
        size are allocated twice on every rank).
      path: if given, rank 0 writes the fit and the raw timings there as JSON.
      install: make the fit the parameters ``algorithm="auto"`` uses.
      local: also measure the local work of the sync transforms (True: every
        kind of ``cost_model.LOCAL_WORK_KINDS``; or a tuple of kinds), at
        ``local_sizes`` entries and ``local_densities``; takes a few seconds a
        kind and point.
      local_sizes: gradient sizes of the local-work measurement (at least two).
        A kind whose synced step is never slower than the plain one at these
        sizes (its work within the noise) is priced at 0, with a
        ``RuntimeWarning`` on rank 0 naming it.
      density: density of the sparse transforms' local-work measurement.
      local_densities: the densities the sparse transforms' local work is timed
        at (default: ``density`` and a tenth of it), at least two, so the fit
        tells the work per kept entry from the work per entry; ``dense_sync``
        is timed once per size.
      contention: also measure the contention factor gamma of ASC-WFBP: the
        time of one non-blocking sparse allreduce (allgather of m bytes a
        rank) against two started at once, at ``contention_sizes``;
        ``gamma = median((t_two - t_0) / (t_one - t_0))`` over the
        bandwidth-bound sizes (:func:`fit_gamma`; ``t_0``: the smallest size's
        single time, the startup), clamped to [1, 2], each time a median of at
        least :data:`CONTENTION_REPEATS`. The layer-grouping planner
        (``jss.planning.plan_grouping``) uses it.
      contention_sizes: bytes a rank contributes per operation (at least two).
      group_cost: with ``local`` including a grouped kind (``topk_sync_group``,
        ``dense_sync_group``) and more than one rank, also time that kind's
        grouped step on ``comm`` itself (:func:`measure_group_cost`: the wire, the
        worker thread's hand-off and the done included, which the one-rank
        local-work timing does not see) and add what it costs beyond the fitted
        model, per group, to the kind's fixed part: the one term the grouping
        planner charges each group. Takes a few seconds more.
      burst_bytes: the link's burst, when known: the bytes a link that has been
        idle passes at once before its rate applies (a token bucket, e.g.
        262144 for a ``tc tbf`` burst of 256 KiB). Not measured (the sweep's
        back-to-back exchanges drain a bucket); kept in the result
        (``AlphaBeta.burst_bytes``) and the saved file, and used by the grouping
        planner and ``group_cost``'s prediction. 0: none.

    Returns:
      The fitted :class:`~jax_sparse_sync.model.cost_model.AlphaBeta`, equal on all ranks.
      With one rank there is no transport: alpha and beta stay the current ones
      (the local work is still measured when asked).
    """
    if not (isinstance(burst_bytes, numbers.Real) and not isinstance(burst_bytes, bool)
            and math.isfinite(burst_bytes) and burst_bytes >= 0):
        raise ValueError(f"calibrate: burst_bytes must be a finite number of bytes >= 0 (the "
                         f"link's token bucket, e.g. 262144 for a 256 KiB tc tbf burst; 0: "
                         f"none); got {burst_bytes!r}")
    comm = transport.resolve_mpi_comm(comm, "calibrate").Dup()  # our own traffic, our own communicator
    try:
        p, rank = comm.Get_size(), comm.Get_rank()
        params, medians = cost_model.current_alpha_beta(), []
        if p > 1:
            sizes, medians = _time_sendrecv(comm, sizes, repeats, bandwidth_seconds or 0.0,
                                            int(max_bytes))
            params = fit_alpha_beta(sizes, medians) if rank == 0 else None
            params = comm.bcast(params, root=0)
        params = dataclasses.replace(params, burst_bytes=float(burst_bytes))
        if local:
            kinds = cost_model.LOCAL_WORK_KINDS if local is True else tuple(local)
            densities = (tuple(local_densities) if local_densities is not None
                         else (density, density / LOW_DENSITY_RATIO))
            params = dataclasses.replace(params, local=_local_work(comm, kinds, local_sizes,
                                                                   densities, repeats))
        contention_times = {}
        if contention and p > 1:
            gamma, contention_times = _contention(comm, contention_sizes, repeats)
            params = dataclasses.replace(params, gamma=gamma)
        group_costs = []
        if group_cost and local and p > 1:
            for kind in (k for k in kinds if k in GROUP_COST_KINDS):
                params, record = measure_group_cost(comm, kind, params, size=min(local_sizes),
                                                    density=density, repeats=repeats)
                group_costs.append(record)
        if rank == 0 and path:
            save_alpha_beta(params, path, nranks=p, sizes=list(map(int, sizes)), median_s=medians,
                            contention=contention_times, group_cost=group_costs,
                            local_sizes=list(map(int, local_sizes)) if local else [],
                            local_densities=list(map(float, densities)) if local else [],
                            mpi=MPI.Get_library_version().splitlines()[0],
                            date=datetime.datetime.now(datetime.timezone.utc).isoformat())
        if install:
            cost_model.set_alpha_beta(params)
        return params
    finally:
        comm.Free()


def _time_sendrecv(comm, sizes, repeats: int, bandwidth_seconds: float = 0.0,
                   max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[list[int], list[float]]:
    """``(sizes, medians)``: median seconds of a neighbour exchange of each size (the
    slowest rank's, so every rank extends the sweep alike), the sizes extended 4x a step
    while the largest took less than ``bandwidth_seconds`` and 4x is at most ``max_bytes``."""
    p, rank = comm.Get_size(), comm.Get_rank()
    right, left = (rank + 1) % p, (rank - 1) % p
    sizes = [int(m) for m in sizes]
    medians = []

    def exchange(m: int) -> float:
        send = np.zeros(m, np.uint8)
        recv = np.empty(m, np.uint8)
        return median_seconds(lambda: comm.Sendrecv(send, dest=right, recvbuf=recv, source=left),
                              repeats=repeats, comm=comm, slowest=True)

    for m in sizes:
        medians.append(exchange(m))
    largest_s = medians[int(np.argmax(sizes))] if sizes else 0.0
    while sizes and largest_s < bandwidth_seconds and 4 * max(sizes) <= max_bytes:
        sizes.append(4 * max(sizes))
        largest_s = exchange(sizes[-1])
        medians.append(largest_s)
    return sizes, medians


def _local_work(comm, kinds, local_sizes, densities, repeats: int) -> tuple:
    """``(kind, fixed_s, per_entry_s, per_kept_s)`` per kind: every rank times at once,
    the median over ranks is fitted (on rank 0, then broadcast)."""
    if len(local_sizes) < 2:
        raise ValueError("calibrate: `local_sizes` needs at least two sizes to fit "
                         f"fixed + per-entry time; got {local_sizes!r}")
    if len(set(densities)) < 2 or not all(0 < d <= 1 for d in densities):
        raise ValueError("calibrate: `local_densities` needs at least two different densities "
                         f"in (0, 1] to fit the work per kept entry; got {densities!r}")
    out = []
    for kind in kinds:
        points = [(int(n), d) for n in local_sizes
                  for d in (densities if kind not in cost_model.DENSE_LOCAL_WORK_KINDS
                            else densities[:1])]
        times = []
        for n, d in points:  # every timed step starts after a barrier on comm
            mine = time_local_work(kind, n, density=d, repeats=repeats, comm=comm)
            times.append(float(np.median(comm.allgather(mine))))
        kept = (None if kind in cost_model.DENSE_LOCAL_WORK_KINDS
                else [resolve_k(size=n, density=d, k=None) for n, d in points])
        if comm.Get_rank() == 0 and max(times) <= 0:
            # the sync step was never slower than the plain one: its local work is
            # within the noise at these sizes, and the fit prices it at 0
            warnings.warn(
                f"calibrate: the local work of {kind!r} was not measurable above the noise at "
                f"local_sizes={tuple(int(n) for n in local_sizes)} (the synced step was never "
                "slower than the plain one); it is priced at 0. Pass larger `local_sizes` "
                "or more `repeats` to measure it.", RuntimeWarning, stacklevel=3)
        fit = (fit_local_work([n for n, _ in points], times, groups_timed(kind), kept)
               if comm.Get_rank() == 0 else (0, 0, 0))
        out.append((kind, *comm.bcast(fit, root=0)))
    return tuple(out)


# A calibration file named by the environment is loaded at import.
if os.environ.get("JSS_ALPHA_BETA"):
    cost_model.set_alpha_beta(load_alpha_beta(os.environ["JSS_ALPHA_BETA"]))


def _contention(comm, sizes, repeats: int) -> tuple[float, dict]:
    """gamma from one vs two simultaneous non-blocking allgathers (see calibrate)."""
    import jax
    import jax.numpy as jnp

    from jax_sparse_sync.ops.nonblocking import sparse_allreduce_done, sparse_allreduce_start

    def run(k: int, count: int) -> float:
        values = jnp.ones((k,), jnp.float32)
        indices = jnp.arange(k, dtype=jnp.int32)

        def simultaneous():
            pend = [sparse_allreduce_start(values, indices, size=k, algorithm="allgather",
                                           comm=comm, defer_checks=True) for _ in range(count)]
            jax.block_until_ready([sparse_allreduce_done(h) for h in pend])
        return median_seconds(simultaneous, repeats=repeats, comm=comm, slowest=True)

    sizes = sorted(int(m) for m in sizes)
    if len(sizes) < 2:
        raise ValueError("calibrate: `contention_sizes` needs at least two sizes")
    # at least 5 repeats: a median of 3 took one stalled exchange (2 MiB alone in 146
    # instead of 87 ms on 200 Mbit/s) for the link's rate
    repeats = max(repeats, CONTENTION_REPEATS)
    one = [run(max(1, m // cost_model.ENTRY_BYTES), 1) for m in sizes]
    two = [run(max(1, m // cost_model.ENTRY_BYTES), 2) for m in sizes]
    gamma = comm.bcast(fit_gamma(sizes, one, two), root=0)
    return gamma, {"sizes": sizes, "one_s": one, "two_s": two}


def fit_gamma(sizes, one, two) -> float:
    """ASC-WFBP's contention factor from one vs two simultaneous operations of each size:
    the median over the bandwidth-bound sizes (at least ``1 / BANDWIDTH_SPAN`` of the
    largest, as :func:`fit_alpha_beta`'s beta) of ``(two - t0) / (one - t0)``, ``t0`` the
    smallest size's single time (the startup), clamped to [1, 2]; 1 if no size is
    above the startup.

    The latency-bound sizes do not enter: their times are the startup plus noise, so
    their ratios can be anything (negative where two operations took less than the
    startup), and a median that counts them can land far from the ratio of the
    bandwidth-bound sizes."""
    sizes, one, two = (np.asarray(x, dtype=float) for x in (sizes, one, two))
    if not (sizes.ndim == 1 and sizes.shape == one.shape == two.shape and len(sizes) >= 2):
        raise ValueError("fit_gamma: sizes, one and two must be 1-D of one length, at least 2")
    order = np.argsort(sizes, kind="stable")
    sizes, one, two = sizes[order], one[order], two[order]
    t0 = one[0]
    big = sizes[1:] * BANDWIDTH_SPAN >= sizes[-1]
    ratios = [(b - t0) / (a - t0) for a, b, keep in zip(one[1:], two[1:], big)
              if keep and a - t0 > 0]
    return float(np.clip(np.median(ratios), 1.0, 2.0)) if ratios else 1.0
