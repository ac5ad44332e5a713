"""``auto_grouping``: profile the backward pass, plan, log and keep the plan.

The one call a user needs for a grouped ``topk_sync``::

    plan = jss.planning.auto_grouping(loss_fn, params, *batch, density=0.01,
                                      path="grouping.json")      # every rank
    tx = optax.chain(jss.grouped_topk_sync(plan, density=0.01), optax.adam(1e-3))

It runs :func:`jss.planning.profile_backward` (every rank at once, so all agree on the
profile), plans with :func:`jss.planning.plan_grouping` (``"asc"`` by default: never
predicted slower than ungrouped, WFBP or MG-WFBP) on the installed cost model
(``jss.planning.calibrate(contention=True, local=...)`` or ``$JSS_ALPHA_BETA``), logs the
plan's table on rank 0 (logger ``jax_sparse_sync.grouping``, level INFO) and,
with ``path``, saves the profile and the plan as JSON. A later call with the same
``path`` and the same parameter shapes re-plans from the saved profile without
profiling again (the saved calibration), so a restarted job gets its plan at
once; a saved profile of other shapes is measured anew and overwritten.

Why a function and not ``topk_sync(grouping="auto")``: an Optax transform's
``update(grads, state)`` never sees the loss function or a batch, and the groups
must be known when the step is traced, so the profile has to be taken before the
transform is built.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from jax_sparse_sync.model import cost_model
from jax_sparse_sync.model.grouping import GROUPINGS, GroupingPlan, check_min_gain
from jax_sparse_sync.planning.plan_grouping import (group_local_kind, plan_grouping,
                                                     planner_min_gain)
from jax_sparse_sync.planning.profile import BackwardProfile, profile_backward

__all__ = ["auto_grouping", "load_grouping", "step_group_cost"]

logger = logging.getLogger("jax_sparse_sync.grouping")
_FORMAT = "jax_sparse_sync.grouping/1"


def _leaf_shapes(params):
    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves(params)
    return [int(np.size(x)) for x in leaves]


def load_grouping(path: str) -> tuple[BackwardProfile, GroupingPlan, dict]:
    """``(profile, plan, settings)`` saved by :func:`auto_grouping` at ``path``."""
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != _FORMAT:
        raise ValueError(f"auto_grouping: {path} is not a saved grouping (format "
                         f"{data.get('format')!r}, expected {_FORMAT!r}); delete it or pass "
                         "another path")
    return (BackwardProfile.from_json(data["profile"]), GroupingPlan.from_json(data["plan"]),
            data["settings"])


def _grouped_step(loss_fn, params, batch, plan, *, density, k, algorithm, comm):
    """A jitted training step with ``grouped_topk_sync(plan)`` on ``comm`` (learning rate
    0: the parameters stay), as a call that runs one step and blocks on it."""
    import jax
    import jax.numpy as jnp
    import optax

    from jax_sparse_sync.transforms.grouped_topk_sync import grouped_topk_sync

    tx = optax.chain(grouped_topk_sync(plan, density=density, k=k, algorithm=algorithm,
                                       comm=comm), optax.sgd(0.0))

    def step(p, state):
        updates, state = tx.update(jax.grad(loss_fn)(p, *batch), state, p)
        return optax.apply_updates(p, updates), state

    step = jax.jit(step, donate_argnums=(0, 1))
    p = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), params)
    box = [(p, tx.init(p))]

    def run():
        box[0] = jax.block_until_ready(step(*box[0]))
    return run


def _interleaved_medians(runs, *, repeats: int, comm) -> list[float]:
    """Median seconds (the slowest rank's) of each of ``runs`` after two warm-ups each,
    timed in turns (A B A B ...: drift on a shared machine hits every run alike)."""
    from jax_sparse_sync.planning.timing import timed_samples

    for run in runs:
        for _ in range(2):
            run()
    samples = [[] for _ in runs]
    for _ in range(repeats):
        for i, run in enumerate(runs):
            samples[i] += timed_samples(run, repeats=1, warmups=0, comm=comm, slowest=True)
    return [float(np.median(s)) for s in samples]


def step_group_cost(loss_fn, params, *batch, profile: BackwardProfile, nranks: int,
                    density=None, k=None, algorithm: str = "auto",
                    cost_params: cost_model.AlphaBeta | None = None, max_concurrent: int = 2,
                    comm=None, repeats: int = 5) -> tuple[cost_model.AlphaBeta, dict]:
    """``(cost_params with the per-group cost the model misses, the record)``, from the
    model's own training step.

    A group costs a step more on the real transport than the local-work calibration
    sees (the start, the worker thread's hand-off and the done compete with the
    backward pass for its core; a synthetic grouped step without a backward pass
    does not show it). So the step itself is timed with two plans of the profile,
    one group and WFBP (a group per leaf), each the median of ``repeats`` steps after
    two warm-ups (the slowest rank's), the two plans' steps timed in turns (so a
    drift of the machine's speed during the timing reaches both alike), and the
    difference of their measured times
    beyond the difference of their predictions, per extra group, is added to the fixed
    part of the local-work term the planner charges each group
    (``calibration.fit_group_fixed``: ``c = max(0, ((m_wfbp - m_one) - (p_wfbp - p_one))
    / (G_wfbp - 1))``; the step's tail after the sync cancels). Collective.

    The record: ``kind``, ``groups`` ``[1, G]``, ``measured_s``, ``predicted_s``,
    ``per_group_s``.
    """
    from jax_sparse_sync.base.transform_arguments import resolve_k
    from jax_sparse_sync.planning.calibration import fit_group_fixed

    cost_params = cost_params or cost_model.current_alpha_beta()
    size = sum(profile.entries)
    kk = resolve_k(size=size, density=density, k=k)
    alg = algorithm if algorithm != "auto" else cost_model.choose_algorithm(
        nranks=nranks, size=size, k=kk, params=cost_params)
    kind = group_local_kind(cost_params, size=size, k=kk, algorithm=alg)
    plans = [plan_grouping(m, profile, nranks=nranks, density=density, k=k, algorithm=algorithm,
                           params=cost_params, max_concurrent=max_concurrent)
             for m in ("none", "wfbp")]
    groups = [len(p.groups) for p in plans]
    record = {"kind": kind, "groups": groups, "measured_s": None, "predicted_s": None,
              "per_group_s": 0.0}
    if groups[1] <= groups[0]:  # one leaf: no second plan to compare
        return cost_params, record
    measured = _interleaved_medians(
        [_grouped_step(loss_fn, params, batch, p, density=density, k=k, algorithm=algorithm,
                       comm=comm) for p in plans], repeats=repeats, comm=comm)
    predicted = [p.predicted_s for p in plans]
    fitted = fit_group_fixed(cost_params, kind, [groups[1] - groups[0]],
                             [measured[1] - measured[0]], [predicted[1] - predicted[0]])
    record.update(measured_s=measured, predicted_s=predicted,
                  per_group_s=fitted.local_work(kind)[0] - cost_params.local_work(kind)[0])
    return fitted, record


def auto_grouping(loss_fn, params, *batch, density: float | None = None, k: int | None = None,
                  method: str = "asc", comm=None, path: str | None = None,
                  algorithm: str = "auto", cost_params: cost_model.AlphaBeta | None = None,
                  max_concurrent: int = 2, repeats: int = 5,
                  min_gain: float | None = None, fit_group_cost: bool = False) -> GroupingPlan:
    """Profiles the backward pass (or reads a saved profile), plans and logs the plan.

    Collective: call it on every rank of ``comm`` with the same arguments; every
    rank returns the same plan.

    Args:
      loss_fn: ``loss_fn(params, *batch) -> scalar`` (as ``jax.grad`` takes it).
      params: the parameter pytree the optimizer updates.
      *batch: a representative batch (the shapes of training).
      density, k: as ``topk_sync`` (exactly one).
      method: one of ``jss.planning.GROUPINGS`` (default ``"asc"``).
      comm: mpi4py communicator (default: the library's world); its size is P.
      path: JSON file of the saved profile and plan (rank 0 writes it). If it
        exists and holds a profile of the same leaf sizes, no profiling is done.
      algorithm: the sparse allreduce ``topk_sync`` will use.
      cost_params: the cost model (default: the installed one).
      max_concurrent: groups on the wire at once at most.
      repeats: timed runs per probe of the profile (at least 2 measure the
        profile's ``timing_spread``, the default margin below).
      min_gain: the margin of ``asc``: a grouped plan is chosen over the
        ungrouped one-group plan only where the model predicts it faster by
        more than this fraction of the step (``0 <= min_gain < 1``; 0: the fastest predicted plan). ``None``:
        the spread of the profile's repeated timings, at least
        ``DEFAULT_MIN_GAIN`` (5 %, ``jax_sparse_sync.planning.plan_grouping``).
        The margin used is logged.
      fit_group_cost: before planning, time the model's own step with the
        one-group and the WFBP plan and add the per-group cost the cost model
        misses to it (:func:`step_group_cost`; two more compilations and
        ``2 (repeats + 2)`` steps); saved with ``path`` and reused with the saved
        profile.

    Returns:
      The ``GroupingPlan`` for ``jss.grouped_topk_sync(plan, ...)``; ``print(plan)`` shows it.
      A plan of one group means grouping is not predicted to pay beyond the margin:
      ``jss.topk_sync`` (the ungrouped sync) is then the step to run.

    Raises:
      ValueError: unknown ``method``, ``min_gain`` outside ``[0, 1)``, bad
        ``density`` / ``k``, or a file at ``path`` that is not a saved grouping.
    """
    from jax_sparse_sync.mpi.comm import default_comm
    from jax_sparse_sync.ops.transport import comm_rank, comm_size

    if method not in GROUPINGS:
        raise ValueError(f"auto_grouping: unknown method {method!r}; expected one of {GROUPINGS}")
    if min_gain is not None:
        check_min_gain(min_gain, "auto_grouping", default=True)
    comm = default_comm() if comm is None else comm
    nranks, rank = comm_size(comm), comm_rank(comm)
    sizes = _leaf_shapes(params)
    profile, source = None, "profiled"
    if path is not None and os.path.exists(path):
        saved, _, _ = load_grouping(path)
        if list(saved.entries) == sizes:
            profile, source = saved, f"saved profile {path}"
    saved_cost = None
    if profile is None:
        profile = profile_backward(loss_fn, params, *batch, repeats=repeats, comm=comm)
    elif fit_group_cost:
        saved_cost = load_grouping(path)[2].get("group_cost")
    group_cost = None
    if fit_group_cost:
        from jax_sparse_sync.planning.calibration import fit_group_fixed

        base = cost_params or cost_model.current_alpha_beta()
        if saved_cost is not None:  # the saved profile's fit: no steps to time again
            group_cost = saved_cost
            cost_params = fit_group_fixed(base, saved_cost["kind"], [1],
                                          [saved_cost["per_group_s"]], [0.0])
        else:
            cost_params, group_cost = step_group_cost(
                loss_fn, params, *batch, profile=profile, nranks=nranks, density=density, k=k,
                algorithm=algorithm, cost_params=base, max_concurrent=max_concurrent,
                comm=comm, repeats=repeats)
    plan = plan_grouping(method, profile, nranks=nranks, density=density, k=k,
                         algorithm=algorithm, params=cost_params, max_concurrent=max_concurrent,
                         min_gain=min_gain)
    if rank == 0:
        margin = planner_min_gain(profile, min_gain)
        logger.info("grouping plan (%s, P = %d, from the %s, margin min_gain = %.1f %%%s):\n%s",
                    method, nranks, source, 100 * margin,
                    "; one group: run the ungrouped topk_sync" if len(plan.groups) == 1 else "",
                    plan.table())
        if group_cost is not None:
            logger.info("per-group cost beyond the cost model: %.3f ms (%s)",
                        group_cost["per_group_s"] * 1e3, group_cost)
        if path is not None:
            data = {"format": _FORMAT, "profile": profile.to_json(), "plan": plan.to_json(),
                    "settings": {"method": method, "nranks": nranks, "density": density,
                                 "k": k, "algorithm": algorithm,
                                 "max_concurrent": max_concurrent, "min_gain": min_gain,
                                 "group_cost": group_cost}}
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, path)
    if path is not None and nranks > 1 and hasattr(comm, "Barrier"):
        comm.Barrier()  # the file exists for every rank once this returns
    return plan
