"""jax_sparse_sync: sparse gradient synchronization for JAX.

Error-feedback Top-k as Optax transformations, XLA FFI selection kernels, and
an MPI sparse allreduce (SparCML's algorithms, dense allreduce as baseline).

The package is laid out by layer (each subpackage's docstring says more):
``transforms/`` (Optax) -> ``ops/`` (user-callable ops; ``ops/transport.py``
picks the transport) -> ``mpi/`` and ``axis/`` (the two transports) ->
``planning/`` (cost model, calibration), ``stats.py`` and ``_ext.py`` (the
compiled FFI modules). This module holds the public API only.
"""

from jax_sparse_sync._ext import cuda_available
from jax_sparse_sync.axis.comm import AxisComm, axis
from jax_sparse_sync.host_allocator import tune_host_allocator
from jax_sparse_sync.mpi.abort import abort_on_error
from jax_sparse_sync.mpi.comm import default_comm
from jax_sparse_sync.mpi.effects import reset_after_mpi_error
from jax_sparse_sync.base.arguments import resolve_algorithm
from jax_sparse_sync.ops.block import block_allreduce
from jax_sparse_sync.kernels.block_scan import block_scan
from jax_sparse_sync.kernels.compression import qsgd_dequantize, qsgd_quantize
from jax_sparse_sync.ops.nonblocking import (
    PendingAllreduce, TimelineRecord, nonblocking_timeline, sparse_allreduce_done,
    sparse_allreduce_start)
from jax_sparse_sync.ops.oktopk import OktopkResult, oktopk_allreduce
from jax_sparse_sync.kernels.selection import (
    bucket_topk, estimate_threshold, kth_magnitude, residual_update, scatter_add, threshold_select,
    topk)
from jax_sparse_sync.ops.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.ops.transport import comm_rank, comm_size
from jax_sparse_sync.model import cost_model
from jax_sparse_sync.planning.calibration import calibrate
from jax_sparse_sync.model.grouping import GROUPINGS, GroupingPlan
from jax_sparse_sync.planning.plan_grouping import plan_grouping
from jax_sparse_sync.planning.profile import BackwardProfile, profile_backward
from jax_sparse_sync.stats import STATS_FIELDS, SyncStats, last_stats
from jax_sparse_sync.transforms import selection_policy
from jax_sparse_sync.transforms.adam_direction_sync import (
    AdamDirectionSyncState,
    adam_direction_sync,
)
from jax_sparse_sync.transforms.block_sync import BlockSyncState, block_sync
from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.transforms.dense_sync import DenseSyncState, dense_sync
from jax_sparse_sync.transforms.flat import unflatten_residual
from jax_sparse_sync.transforms.oktopk_sync import OktopkSyncState, oktopk_sync
from jax_sparse_sync.transforms.topk_sync import TopkSyncState, topk_sync
from jax_sparse_sync.transforms.warmup import density_ramp

__version__ = "0.1.0"

__all__ = [
    "abort_on_error",
    "adam_direction_sync",
    "AdamDirectionSyncState",
    "AxisComm",
    "axis",
    "BackwardProfile",
    "BlockSyncState",
    "DenseSyncState",
    "GROUPINGS",
    "GroupingPlan",
    "OktopkResult",
    "OktopkSyncState",
    "PendingAllreduce",
    "STATS_FIELDS",
    "SyncStats",
    "TimelineRecord",
    "TopkSyncState",
    "block_allreduce",
    "block_scan",
    "block_sync",
    "bucket_topk",
    "calibrate",
    "comm_rank",
    "cuda_available",
    "comm_size",
    "cost_model",
    "default_comm",
    "resolve_algorithm",
    "resolve_k",
    "dense_sync",
    "last_stats",
    "density_ramp",
    "estimate_threshold",
    "kth_magnitude",
    "nonblocking_timeline",
    "oktopk_allreduce",
    "oktopk_sync",
    "plan_grouping",
    "profile_backward",
    "qsgd_dequantize",
    "qsgd_quantize",
    "residual_update",
    "scatter_add",
    "selection_policy",
    "sparse_allreduce",
    "sparse_allreduce_done",
    "sparse_allreduce_start",
    "threshold_select",
    "topk",
    "topk_sync",
    "tune_host_allocator",
    "unflatten_residual",
    "reset_after_mpi_error",
]
