"""``jss.planning``: the cost model, calibration, profiling and grouping plans.

The top layer of the package: calibration and profiling run the transforms.
The pure pieces they re-export here (the cost model, the algorithm choice, the
grouping planner) live below the ops in :mod:`jax_sparse_sync.model`.
"""

from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.model.grouping import GROUPINGS, GroupingPlan
from jax_sparse_sync.ops.nonblocking import TimelineRecord, nonblocking_timeline
from jax_sparse_sync.planning.auto_grouping import auto_grouping, load_grouping
from jax_sparse_sync.planning.calibration import calibrate, load_alpha_beta, save_alpha_beta
from jax_sparse_sync.planning.plan_grouping import plan_grouping
from jax_sparse_sync.planning.profile import BackwardProfile, profile_backward

__all__ = [
    "BackwardProfile",
    "GROUPINGS",
    "GroupingPlan",
    "TimelineRecord",
    "auto_grouping",
    "calibrate",
    "cost_model",
    "load_alpha_beta",
    "load_grouping",
    "nonblocking_timeline",
    "plan_grouping",
    "profile_backward",
    "resolve_algorithm",
    "resolve_k",
    "save_alpha_beta",
]
