"""``jss.mpi``: the MPI side of the library that a training script touches.

The communicator (``default_comm``), abort-on-error (``abort_on_error``,
``reset_after_mpi_error``) and the host allocator (``tune_host_allocator``).
The modules below implement the MPI transport: the ordered effect, ordered FFI
primitives, one module per MPI op.
"""

from jax_sparse_sync.host_allocator import tune_host_allocator
from jax_sparse_sync.mpi.abort import abort_on_error
from jax_sparse_sync.mpi.comm import default_comm
from jax_sparse_sync.mpi.effects import reset_after_mpi_error

__all__ = [
    "abort_on_error",
    "default_comm",
    "reset_after_mpi_error",
    "tune_host_allocator",
]
