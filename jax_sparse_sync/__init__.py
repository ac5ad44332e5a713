"""jax_sparse_sync: sparse gradient synchronization for JAX.

Error-feedback Top-k as Optax transformations, XLA FFI selection kernels, and
an MPI sparse allreduce (SparCML's algorithms, dense allreduce as baseline).
"""

from jax_sparse_sync import cost_model, selection_policy
from jax_sparse_sync.axis import AxisComm, axis  # binds `axis` to the function, not the module
from jax_sparse_sync.block_sync import BlockSyncState, block_allreduce, block_scan, block_sync
from jax_sparse_sync._effects import reset_after_mpi_error
from jax_sparse_sync._ext import cuda_available
from jax_sparse_sync.calibration import calibrate
from jax_sparse_sync.compression import qsgd_dequantize, qsgd_quantize
from jax_sparse_sync.dense_sync import DenseSyncState, dense_sync
from jax_sparse_sync.comm import comm_rank, comm_size, default_comm
from jax_sparse_sync.nonblocking import (
    PendingAllreduce, sparse_allreduce_done, sparse_allreduce_start)
from jax_sparse_sync.oktopk import OktopkResult, oktopk_allreduce
from jax_sparse_sync.oktopk_sync import OktopkSyncState, oktopk_sync
from jax_sparse_sync.selection import (
    bucket_topk, estimate_threshold, kth_magnitude, residual_update, scatter_add, threshold_select,
    topk)
from jax_sparse_sync.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.stats import STATS_FIELDS, SyncStats
from jax_sparse_sync.topk_sync import TopkSyncState, resolve_k, topk_sync
from jax_sparse_sync.sparse_allreduce import resolve_algorithm

__version__ = "0.1.0"

__all__ = [
    "AxisComm",
    "axis",
    "BlockSyncState",
    "DenseSyncState",
    "OktopkResult",
    "OktopkSyncState",
    "PendingAllreduce",
    "STATS_FIELDS",
    "SyncStats",
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
    "estimate_threshold",
    "kth_magnitude",
    "oktopk_allreduce",
    "oktopk_sync",
    "qsgd_dequantize",
    "qsgd_quantize",
    "residual_update",
    "scatter_add",
    "sparse_allreduce",
    "sparse_allreduce_done",
    "sparse_allreduce_start",
    "threshold_select",
    "topk",
    "topk_sync",
    "reset_after_mpi_error",
]
