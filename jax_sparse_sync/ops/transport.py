"""Which transport a ``comm`` argument selects: the one place that knows both.

``comm`` is ``None`` (the library's clone of ``COMM_WORLD``), an mpi4py
communicator (the MPI transport: C++ handlers behind XLA FFI custom calls) or
``jss.axis(name)`` (the JAX-collective transport, inside shard_map/pmap). The
user-callable ops resolve ``comm`` here and call :func:`implementation` for
the transport's version of their algorithm, so no op imports the other
transport itself.
"""

from __future__ import annotations

from mpi4py import MPI

from jax_sparse_sync.mesh.allgather_bytes import axis_allgather_bytes
from jax_sparse_sync.mesh.block import axis_block_allreduce
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.mesh.dense import axis_dense_allreduce
from jax_sparse_sync.mesh.oktopk import axis_oktopk_allreduce
from jax_sparse_sync.mesh.region_gather import axis_region_gather
from jax_sparse_sync.mesh.region_reduce import axis_region_reduce
from jax_sparse_sync.mesh.sparse_allreduce import axis_sparse_allreduce
from jax_sparse_sync.mpi.allgather_bytes import mpi_allgather_bytes
from jax_sparse_sync.mpi.block import mpi_block_allreduce
from jax_sparse_sync.mpi.comm import check_mpi_comm
from jax_sparse_sync.mpi.dense_allreduce import mpi_dense_allreduce
from jax_sparse_sync.mpi.oktopk import mpi_oktopk_allreduce
from jax_sparse_sync.mpi.region_gather import mpi_region_gather
from jax_sparse_sync.mpi.region_reduce import mpi_region_reduce
from jax_sparse_sync.mpi.sparse_allreduce import mpi_sparse_allreduce

__all__ = ["resolve_comm", "resolve_mpi_comm", "is_mesh_axis", "comm_size", "comm_rank",
           "comm_size_in_trace", "implementation", "OPS"]

#: op name -> (MPI implementation, mesh-axis implementation); both take the same
#: arguments (``comm`` resolved) and return the same outputs.
OPS = {
    "sparse_allreduce": (mpi_sparse_allreduce, axis_sparse_allreduce),
    "oktopk_allreduce": (mpi_oktopk_allreduce, axis_oktopk_allreduce),
    "block_allreduce": (mpi_block_allreduce, axis_block_allreduce),
    "dense_allreduce": (mpi_dense_allreduce, axis_dense_allreduce),
    "region_reduce": (mpi_region_reduce, axis_region_reduce),
    "region_gather": (mpi_region_gather, axis_region_gather),
    "allgather_bytes": (mpi_allgather_bytes, axis_allgather_bytes),
}


def resolve_comm(comm: MPI.Comm | AxisComm | None) -> MPI.Comm | AxisComm:
    """``None`` -> the default communicator; an mpi4py ``Comm`` or a mesh axis
    (``jss.axis(name)``, the JAX-collective transport) is returned as is."""
    if isinstance(comm, AxisComm):
        return comm
    return check_mpi_comm(comm)


def is_mesh_axis(comm) -> bool:
    """Whether ``comm`` selects the JAX-collective transport."""
    return isinstance(comm, AxisComm)


def implementation(op: str, comm):
    """The transport's implementation of ``op`` for an already resolved ``comm``."""
    mpi, axis = OPS[op]
    return axis if is_mesh_axis(comm) else mpi


def resolve_mpi_comm(comm, op: str) -> MPI.Comm:
    """Like :func:`resolve_comm`, for the ops that exist on MPI only (non-blocking
    calls, calibration)."""
    if is_mesh_axis(comm):
        raise TypeError(
            f"jax_sparse_sync.{op} runs over MPI only; `comm=jss.axis(...)` (the "
            "JAX-collective transport) supports sparse_allreduce, oktopk_allreduce, "
            "block_allreduce, dense_allreduce, topk_sync, oktopk_sync, block_sync and dense_sync (under "
            "shard_map/pmap XLA schedules and overlaps the collectives itself). Pass an mpi4py "
            "communicator or None.")
    return check_mpi_comm(comm)


def comm_size(comm: MPI.Comm | None = None) -> int:
    """Number of ranks P of ``comm`` (default communicator if None)."""
    return resolve_comm(comm).Get_size()


def comm_rank(comm: MPI.Comm | None = None) -> int:
    """This process's rank in ``comm`` (default communicator if None)."""
    return resolve_comm(comm).Get_rank()


def comm_size_in_trace(comm: MPI.Comm | AxisComm | None = None,
                       op: str = "sparse_allreduce") -> int:
    """P of ``comm``: ``Get_size()`` of an MPI communicator, or the size of a mesh
    axis, which is only known while tracing inside shard_map/pmap over it (``op``
    names the caller in the error raised elsewhere)."""
    comm = resolve_comm(comm)
    if is_mesh_axis(comm):
        return comm.size(op)
    return comm.Get_size()
