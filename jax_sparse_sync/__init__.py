"""jax_sparse_sync: sparse gradient synchronization for JAX.

Error-feedback Top-k as Optax transformations, XLA FFI selection kernels, and
an MPI sparse allreduce (SparCML's algorithms, dense allreduce as baseline).

The namespace follows optax: the training-facing API is here (the transforms
and their states, the ops, ``SyncStats`` / ``last_stats``, ``axis`` to name a
mesh axis); the rest is grouped:

- ``jss.planning``: the cost model, calibration, profiling and grouping plans;
- ``jss.mpi``: the communicator, abort-on-error and the host allocator.

The package is laid out in layers, each importing only lower ones
(tests/test_package_layout.py ranks them and checks every import):
``base`` (argument checks, JAX helpers) < ``_ext`` (the compiled FFI modules)
< ``model`` (pure cost model and planner), ``stats`` < ``bindings`` (every
``ffi_call``: the FFI kernels as JAX functions) < ``mesh``, ``mpi`` (the two
transports) < ``ops``
(``ops/transport.py`` picks the transport) < ``transforms`` (Optax) <
``planning`` (calibration and profiling, which run the transforms).
"""

import importlib
import importlib.metadata
import warnings

# First, before the imports below start threads (mpi4py's MPI initialization, JAX's
# workers), so that they share one glibc heap: freed host buffers are kept for reuse
# and a step's big outputs stop page-faulting (host_allocator.py; opt out with
# JSS_TUNE_HOST_ALLOCATOR=0).
from jax_sparse_sync import host_allocator as _host_allocator

_host_allocator.apply_default_tuning()

from jax_sparse_sync import _moved, mpi, planning
from jax_sparse_sync._ext import cuda_available
from jax_sparse_sync.mesh.comm import axis
from jax_sparse_sync.bindings.compression import qsgd_dequantize, qsgd_quantize
from jax_sparse_sync.bindings.selection import (
    bucket_topk, estimate_threshold, kth_magnitude, residual_update, scatter_add, threshold_select,
    topk)
from jax_sparse_sync.ops.block import block_allreduce
from jax_sparse_sync.ops.dense_allreduce import dense_allreduce
from jax_sparse_sync.ops.nonblocking import (
    PendingAllreduce, sparse_allreduce_done, sparse_allreduce_start)
from jax_sparse_sync.ops.oktopk import OktopkResult, oktopk_allreduce
from jax_sparse_sync.ops.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.ops.transport import comm_rank, comm_size
from jax_sparse_sync.stats import SyncStats, last_stats
from jax_sparse_sync.transforms.adam_direction_sync import (
    AdamDirectionSyncState,
    adam_direction_sync,
)
from jax_sparse_sync.transforms.block_sync import BlockSyncState, block_sync
from jax_sparse_sync.transforms.chunked_topk_sync import ChunkedTopkSyncState, chunked_topk_sync
from jax_sparse_sync.transforms.dense_sync import DenseSyncState, dense_sync
from jax_sparse_sync.transforms.diloco import DiLoCoState, diloco, diloco_apply_updates
from jax_sparse_sync.transforms.donation import NotDonatedWarning, check_donation
from jax_sparse_sync.transforms.flat import unflatten_residual
from jax_sparse_sync.transforms.grouped_topk_sync import grouped_topk_sync
from jax_sparse_sync.transforms.oktopk_sync import OktopkSyncState, oktopk_sync
from jax_sparse_sync.transforms.reshard import checkpoint_template, reshard_state
from jax_sparse_sync.transforms.sharded_sync import ShardedSyncState, sharded_sync
from jax_sparse_sync.transforms.shared_support_sync import (
    SharedSupportSyncState, shared_support_sync)
from jax_sparse_sync.transforms.topk_sync import TopkSyncState, topk_sync
from jax_sparse_sync.transforms.warmup import density_ramp

_moved.install()  # jax_sparse_sync.kernels.* and jax_sparse_sync.axis.* for one release

try:  # the one place the version is written is pyproject.toml
    __version__ = importlib.metadata.version("jax_sparse_sync")
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AdamDirectionSyncState",
    "BlockSyncState",
    "ChunkedTopkSyncState",
    "DenseSyncState",
    "DiLoCoState",
    "NotDonatedWarning",
    "OktopkResult",
    "OktopkSyncState",
    "PendingAllreduce",
    "ShardedSyncState",
    "SharedSupportSyncState",
    "SyncStats",
    "TopkSyncState",
    "adam_direction_sync",
    "axis",
    "block_allreduce",
    "block_sync",
    "bucket_topk",
    "check_donation",
    "checkpoint_template",
    "chunked_topk_sync",
    "comm_rank",
    "comm_size",
    "cuda_available",
    "dense_allreduce",
    "dense_sync",
    "density_ramp",
    "diloco",
    "diloco_apply_updates",
    "estimate_threshold",
    "grouped_topk_sync",
    "kth_magnitude",
    "last_stats",
    "mpi",
    "oktopk_allreduce",
    "oktopk_sync",
    "planning",
    "qsgd_dequantize",
    "qsgd_quantize",
    "reshard_state",
    "residual_update",
    "scatter_add",
    "sharded_sync",
    "shared_support_sync",
    "sparse_allreduce",
    "sparse_allreduce_done",
    "sparse_allreduce_start",
    "threshold_select",
    "topk",
    "topk_sync",
    "unflatten_residual",
]

#: Top-level names of 0.1.0 that moved, by the namespace they live in now. They
#: resolve for one more release, with a DeprecationWarning naming the new place.
_MOVED_TO_NAMESPACE = {
    "planning": ("BackwardProfile", "GROUPINGS", "GroupingPlan", "TimelineRecord", "calibrate",
                 "cost_model", "nonblocking_timeline", "plan_grouping", "profile_backward",
                 "resolve_algorithm", "resolve_k"),
    "mpi": ("abort_on_error", "default_comm", "reset_after_mpi_error", "tune_host_allocator"),
}
#: The others: old name -> (module, attribute, what to use now).
_DEPRECATED = {
    "AxisComm": ("jax_sparse_sync.mesh.comm", "AxisComm",
                 "jss.axis(name) to name a mesh axis (the class is "
                 "jax_sparse_sync.mesh.comm.AxisComm)"),
    "STATS_FIELDS": ("jax_sparse_sync.stats", "STATS_FIELDS", "jss.SyncStats._fields"),
    "block_scan": ("jax_sparse_sync.bindings.block_scan", "block_scan",
                   "jax_sparse_sync.bindings.block_scan.block_scan"),
    "selection_policy": ("jax_sparse_sync.transforms", "selection_policy",
                         "jax_sparse_sync.transforms.selection_policy"),
    **{name: (f"jax_sparse_sync.{space}", name, f"jss.{space}.{name}")
       for space, names in _MOVED_TO_NAMESPACE.items() for name in names},
}


def __getattr__(name):
    if name in _DEPRECATED:
        module, attribute, replacement = _DEPRECATED[name]
        warnings.warn(f"jax_sparse_sync.{name} is deprecated and will be removed in the next "
                      f"release; use {replacement}.", DeprecationWarning, stacklevel=2)
        if attribute == "selection_policy":  # a module: import it (the package does not)
            return importlib.import_module(f"{module}.{attribute}")
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'jax_sparse_sync' has no attribute {name!r}")
