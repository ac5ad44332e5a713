"""``jss.planning.plan_grouping``: a layer-grouping plan for ``topk_sync`` from a backward
profile and the calibrated cost model (the glue between ``profile.py``,
``cost_model.py`` and the pure planner ``grouping.py``)."""

from __future__ import annotations

from jax_sparse_sync.model import cost_model, grouping
from jax_sparse_sync.planning.profile import BackwardProfile
from jax_sparse_sync.base.transform_arguments import resolve_k

__all__ = ["plan_grouping", "layer_times", "sparse_link", "planner_min_gain",
           "group_local_kind", "DEFAULT_MIN_GAIN"]

#: The planner's least margin: a grouped plan must be predicted at least this much
#: faster (a fraction of the step) than the one-group (ungrouped) plan. The profile's
#: own timing spread is only a lower bound of a step's noise: the probes (compute
#: alone, repeated back to back) vary less than a step with its sync does. How 5 %
#: was chosen: docs/topics/scheduling.md.
DEFAULT_MIN_GAIN = 0.05


def planner_min_gain(profile: BackwardProfile, min_gain: float | None = None,
                     op: str = "plan_grouping") -> float:
    """The margin ``plan_grouping`` plans with: ``min_gain`` when given (checked:
    ``0 <= min_gain < 1``, else a ValueError naming ``op``, the function that
    received it), else the larger of the profile's measured ``timing_spread``
    (capped at 0.99) and :data:`DEFAULT_MIN_GAIN`."""
    if min_gain is not None:
        return grouping.check_min_gain(min_gain, op, default=True)
    if profile.timing_spread is not None:  # a spread of 100 % or more: hold to one group
        return max(DEFAULT_MIN_GAIN, min(float(profile.timing_spread), 0.99))
    return DEFAULT_MIN_GAIN


def layer_times(profile: BackwardProfile) -> grouping.LayerTimes:
    """The planner's input: the profile's leaves in backward order."""
    order = profile.order
    ready, last = [], 0.0
    for i in order:  # non-decreasing by construction of the order; keep it so under rounding
        last = max(last, profile.ready_s[i])
        ready.append(last)
    return grouping.LayerTimes(
        leaves=tuple(order), ready_s=tuple(ready),
        entries=tuple(profile.entries[i] for i in order),
        dense_bytes=tuple(profile.dense_bytes[i] for i in order),
        compute_s=max(profile.compute_s, last), names=tuple(profile.names[i] for i in order))


def group_local_kind(params: cost_model.AlphaBeta, *, size: int, k: int, algorithm: str) -> str:
    """The local-work kind the planner charges each group (``sparse_link``): the grouped
    dense sync's term for every entry kept with ``algorithm="dense"``, else
    ``topk_sync_group``'s, each when calibrated; else the ungrouped ``topk_sync``'s."""
    if k >= size and algorithm == "dense" and any(params.local_work("dense_sync_group")):
        return "dense_sync_group"  # a grouped dense sync: every entry kept, no selection
    if any(params.local_work("topk_sync_group")):
        return "topk_sync_group"
    return "topk_sync"


def sparse_link(*, nranks: int, size: int, k: int, algorithm: str = "auto",
                params: cost_model.AlphaBeta | None = None, max_concurrent: int = 2):
    """``(Link, message_bytes, local_s)`` of a grouped ``topk_sync``.

    A group of n entries keeps ``k * n / size`` of them; its message is the
    bytes the sparse allreduce sends (``cost_model.wire_volume``, worst case),
    its startup ``alpha`` times the algorithm's message count, the link's burst
    ``params.beta * params.burst_bytes`` seconds (``Link.burst_s``), its local work
    the calibrated ``topk_sync_group`` term of n entries (one group of a
    grouped step; the ungrouped ``topk_sync`` term if that is not calibrated);
    with every entry kept (``k == size``) and ``algorithm="dense"``, a grouped
    dense sync, the ``dense_sync_group`` term when it is calibrated.
    """
    params = params or cost_model.current_alpha_beta()
    alg = algorithm if algorithm != "auto" else cost_model.choose_algorithm(
        nranks=nranks, size=size, k=k, params=params)

    def k_of(n: int) -> int:
        return min(n, max(1, round(k * n / size)))

    def message_bytes(n: int) -> float:
        return float(cost_model.wire_volume(alg, nranks=nranks, size=n, k=k_of(n)).bytes_max)

    messages = cost_model.wire_volume(alg, nranks=nranks, size=size, k=k).messages
    link = grouping.Link(a=messages * params.alpha, b=params.beta, gamma=params.gamma,
                         max_concurrent=max_concurrent,
                         burst_s=params.beta * params.burst_bytes)
    kind = group_local_kind(params, size=size, k=k, algorithm=alg)
    return link, message_bytes, (lambda n: cost_model.local_work_time(kind, size=n, k=k_of(n),
                                                                      params=params))


def plan_grouping(method: str, profile: BackwardProfile, *, nranks: int,
                  density: float | None = None, k: int | None = None, algorithm: str = "auto",
                  params: cost_model.AlphaBeta | None = None, bucket_mb: float = 25.0,
                  max_concurrent: int = 2, min_gain: float | None = None) -> grouping.GroupingPlan:
    """A grouping plan for ``jss.grouped_topk_sync(plan, ...)``.

    With ``method="asc"`` the planner prefers the ungrouped plan within the noise: a
    grouped plan is chosen over the one-group plan only where its predicted gain
    over it exceeds ``min_gain`` of the step (``jax_sparse_sync.model.grouping.plan``). The margin is ``min_gain`` when
    given, else the noise of the timings: the spread of the profile's own
    repeated timings (``profile.timing_spread``), at least
    :data:`DEFAULT_MIN_GAIN` (the probes vary less than a whole step does). A
    gain the timings cannot resolve is not worth more groups, whose cost the
    model knows least.
    Every plan is priced by the cost model ``params``: the wire by alpha, beta
    and gamma, and each group's local work, fixed part included, by the
    ``topk_sync_group`` term (with a per-group cost fitted by
    ``jss.planning.calibration.fit_group_fixed`` when the caller fitted one).

    Args:
      method: one of ``jss.planning.GROUPINGS`` (none, wfbp, mg, bucket, asc).
      profile: ``jss.planning.profile_backward(loss_fn, params, *batch, comm=...)``.
      nranks: P.
      density, k: as ``topk_sync`` (exactly one).
      algorithm: the sparse allreduce algorithm of ``topk_sync``.
      params: cost model (default: the calibrated one, ``jss.planning.calibrate(contention=True)``).
      bucket_mb: bucket size of ``"bucket"``.
      max_concurrent: groups on the wire at once at most.
      min_gain: ``asc``'s margin over the one-group plan, a fraction in ``[0, 1)``
        (``0``: the fastest predicted plan, however small its gain); ``None``: the larger of the
        profile's ``timing_spread`` and :data:`DEFAULT_MIN_GAIN`.

    Returns:
      A ``GroupingPlan``; ``print(plan)`` shows its groups and predicted times.
      Deterministic: the same profile and parameters give the same plan on
      every rank.

    Example:
      >>> import jax_sparse_sync as jss
      >>> prof = jss.planning.BackwardProfile(names=("b", "w"), entries=(10, 1000), dense_bytes=(40, 4000),
      ...                            ready_s=(0.002, 0.001), compute_s=0.003, order=(1, 0))
      >>> plan = jss.planning.plan_grouping("wfbp", prof, nranks=4, density=0.01)
      >>> plan.leaf_groups()
      ((1,), (0,))
    """
    margin = planner_min_gain(profile, min_gain)
    size = sum(profile.entries)
    k = resolve_k(size=size, density=density, k=k)
    link, message_bytes, local_s = sparse_link(nranks=nranks, size=size, k=k,
                                               algorithm=algorithm, params=params,
                                               max_concurrent=max_concurrent)
    return grouping.plan(method, layer_times(profile), link, message_bytes, local_s,
                         bucket_mb=bucket_mb, min_gain=margin)
