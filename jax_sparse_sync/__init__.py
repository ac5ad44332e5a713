"""jax_sparse_sync: sparse gradient synchronization for JAX.

Error-feedback Top-k as Optax transformations, XLA FFI selection kernels, and
an MPI sparse allreduce (SparCML's algorithms, dense allreduce as baseline).
"""

from jax_sparse_sync import cost_model
from jax_sparse_sync.comm import comm_rank, comm_size, default_comm
from jax_sparse_sync.selection import topk
from jax_sparse_sync.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.stats import SyncStats

__version__ = "0.1.0"

__all__ = [
    "SyncStats",
    "comm_rank",
    "comm_size",
    "cost_model",
    "default_comm",
    "sparse_allreduce",
    "topk",
]
