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

from jax_sparse_sync.model import cost_model
from jax_sparse_sync.model.grouping import GROUPINGS, GroupingPlan, check_min_gain
from jax_sparse_sync.planning.plan_grouping import plan_grouping, planner_min_gain
from jax_sparse_sync.planning.profile import BackwardProfile, profile_backward

__all__ = ["auto_grouping", "load_grouping"]

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


def auto_grouping(loss_fn, params, *batch, density: float | None = None, k: int | None = None,
                  method: str = "asc", comm=None, path: str | None = None,
                  algorithm: str = "auto", cost_params: cost_model.AlphaBeta | None = None,
                  max_concurrent: int = 2, repeats: int = 5,
                  min_gain: float | None = None) -> GroupingPlan:
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
      min_gain: the margin of ``asc``: a plan of more groups (than the
        ungrouped one-group plan, or than another candidate) is chosen only
        where the model predicts it faster by more than this fraction of the
        step (``0 <= min_gain < 1``; 0: the fastest predicted plan). ``None``:
        the spread of the profile's repeated timings, or
        ``jss.planning.plan_grouping``'s ``DEFAULT_MIN_GAIN`` (5 %) for a profile
        without one. The margin used is logged.

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
        try:
            check_min_gain(min_gain)
        except ValueError as e:
            raise ValueError(f"auto_grouping: {e}") from None
    comm = default_comm() if comm is None else comm
    nranks, rank = comm_size(comm), comm_rank(comm)
    sizes = _leaf_shapes(params)
    profile, source = None, "profiled"
    if path is not None and os.path.exists(path):
        saved, _, _ = load_grouping(path)
        if list(saved.entries) == sizes:
            profile, source = saved, f"saved profile {path}"
    if profile is None:
        profile = profile_backward(loss_fn, params, *batch, repeats=repeats, comm=comm)
    plan = plan_grouping(method, profile, nranks=nranks, density=density, k=k,
                         algorithm=algorithm, params=cost_params, max_concurrent=max_concurrent,
                         min_gain=min_gain)
    if rank == 0:
        margin = planner_min_gain(profile, min_gain)
        logger.info("grouping plan (%s, P = %d, from the %s, margin min_gain = %.1f %%%s):\n%s",
                    method, nranks, source, 100 * margin,
                    "; one group: run the ungrouped topk_sync" if len(plan.groups) == 1 else "",
                    plan.table())
        if path is not None:
            data = {"format": _FORMAT, "profile": profile.to_json(), "plan": plan.to_json(),
                    "settings": {"method": method, "nranks": nranks, "density": density,
                                 "k": k, "algorithm": algorithm,
                                 "max_concurrent": max_concurrent, "min_gain": min_gain}}
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, path)
    if path is not None and nranks > 1 and hasattr(comm, "Barrier"):
        comm.Barrier()  # the file exists for every rank once this returns
    return plan
