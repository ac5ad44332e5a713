"""``jss.mpi``: the MPI side of the library that a training script touches.

The communicator (``default_comm``), abort-on-error (``abort_on_error``,
``reset_after_mpi_error``), the watchdog for stuck collectives (``set_timeout``,
``get_timeout``, ``sync_timeout``) and the host allocator (``tune_host_allocator``).
The modules below implement the MPI transport: the ordered effect, ordered FFI
primitives, one module per MPI op.
"""

from jax_sparse_sync.host_allocator import tune_host_allocator
from jax_sparse_sync.mpi.abort import abort_on_error
from jax_sparse_sync.mpi.comm import default_comm
from jax_sparse_sync.mpi.effects import reset_after_mpi_error
from jax_sparse_sync.mpi.watchdog import get_timeout, set_timeout, sync_timeout

__all__ = [
    "abort_on_error",
    "default_comm",
    "get_timeout",
    "reset_after_mpi_error",
    "set_timeout",
    "sync_timeout",
    "tune_host_allocator",
]
