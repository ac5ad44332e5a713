"""MPI communicators: the library's default communicator and handle plumbing.

Communicators reach the C++ handlers as an int64 attribute holding the
communicator's Fortran handle (``comm.py2f()``), which every MPI implementation
can turn back into its ``MPI_Comm``. The default communicator is a clone of
``COMM_WORLD``, so our messages never interleave with the user's own mpi4py
traffic. A plain ``python script.py`` is a valid world of one rank.
"""

from __future__ import annotations

import functools

from mpi4py import MPI

from jax_sparse_sync import _ext
from jax_sparse_sync.axis import AxisComm

__all__ = ["default_comm", "comm_handle", "comm_size", "comm_rank", "resolve_comm",
           "comm_size_in_trace", "resolve_mpi_comm"]


def _check_same_mpi() -> None:
    # mpi4py and our extension must use the same libmpi (one MPI_Init, one world).
    ours = _ext.cpu_module.mpi_library_version().strip()
    theirs = MPI.Get_library_version().strip()
    if ours.split("\n")[0] != theirs.split("\n")[0]:
        raise ImportError(
            "jax_sparse_sync was built against a different MPI library than the one mpi4py "
            f"loaded.\n  extension: {ours.splitlines()[0]}\n  mpi4py:    {theirs.splitlines()[0]}\n"
            "Rebuild jax_sparse_sync in this environment (pip install --no-build-isolation .), "
            "or point both at the same MPI (JSS_MPI_C_COMPILER / MPI4PY_LIBMPI)."
        )


_check_same_mpi()


@functools.cache
def default_comm() -> MPI.Comm:
    """The library's default communicator: a clone of ``MPI.COMM_WORLD``.

    Errors on it are returned to the caller (and become Python exceptions)
    instead of aborting the job.
    """
    comm = MPI.COMM_WORLD.Clone()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def resolve_comm(comm: MPI.Comm | AxisComm | None) -> MPI.Comm | AxisComm:
    """``None`` -> the default communicator; an mpi4py ``Comm`` or a mesh axis
    (``jss.axis(name)``, the JAX-collective transport) is returned as is."""
    if comm is None:
        return default_comm()
    if isinstance(comm, AxisComm):
        return comm
    if not isinstance(comm, MPI.Comm):
        raise TypeError(
            f"`comm` must be an mpi4py communicator (e.g. MPI.COMM_WORLD.Split(...)), a mesh axis "
            f"(jss.axis('data'), inside shard_map/pmap) or None for the default clone of "
            f"COMM_WORLD; got {type(comm).__name__}."
        )
    if comm == MPI.COMM_NULL:
        raise ValueError("`comm` is MPI.COMM_NULL; this rank is not part of that communicator.")
    return comm


def comm_handle(comm: MPI.Comm | None) -> int:
    """The int64 handle the FFI handlers receive for ``comm``."""
    return int(resolve_comm(comm).py2f())


def comm_size(comm: MPI.Comm | None = None) -> int:
    """Number of ranks P of ``comm`` (default communicator if None)."""
    return resolve_comm(comm).Get_size()


def comm_rank(comm: MPI.Comm | None = None) -> int:
    """This process's rank in ``comm`` (default communicator if None)."""
    return resolve_comm(comm).Get_rank()


def resolve_mpi_comm(comm, op: str) -> MPI.Comm:
    """Like :func:`resolve_comm`, for the ops that exist on MPI only (non-blocking
    calls, calibration)."""
    comm = resolve_comm(comm)
    if isinstance(comm, AxisComm):
        raise TypeError(
            f"jax_sparse_sync.{op} runs over MPI only; `comm=jss.axis(...)` (the "
            "JAX-collective transport) supports sparse_allreduce, oktopk_allreduce, "
            "block_allreduce, topk_sync, oktopk_sync, block_sync and dense_sync (under "
            "shard_map/pmap XLA schedules and overlaps the collectives itself). Pass an mpi4py "
            "communicator or None.")
    return comm


def comm_size_in_trace(comm: MPI.Comm | AxisComm | None = None,
                       op: str = "sparse_allreduce") -> int:
    """P of ``comm``: ``Get_size()`` of an MPI communicator, or the size of a mesh
    axis, which is only known while tracing inside shard_map/pmap over it (``op``
    names the caller in the error raised elsewhere)."""
    comm = resolve_comm(comm)
    if isinstance(comm, AxisComm):
        return comm.size(op)
    return comm.Get_size()
