"""MPI communicators: the library's default communicator and handle plumbing.

(Which transport a ``comm`` argument selects, MPI or a mesh axis, is decided in
one place: :mod:`jax_sparse_sync.ops.transport`.)

Communicators reach the C++ handlers as an int64 attribute holding a
communicator id (:func:`comm_attribute`), which the extension turns back into
the ``MPI_Comm`` through the communicator's Fortran handle (``comm.py2f()``). The default communicator is a clone of
``COMM_WORLD``, so our messages never interleave with the user's own mpi4py
traffic. A plain ``python script.py`` is a valid world of one rank.
"""

from __future__ import annotations

import functools

import numpy as np
from mpi4py import MPI

from jax_sparse_sync import _ext

__all__ = ["default_comm", "check_mpi_comm"]


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


# The id compiled programs name a communicator by (ffi/runtime/mpi_comm.h), cached on the
# communicator itself as an MPI attribute: MPI drops it when the communicator is
# freed and does not copy it to a duplicate, so a new communicator that is given
# a freed one's Fortran handle gets an id of its own (keyed by the handle, it
# would be taken for the freed one, and after renew_after_mpi_error run on that
# one's duplicate: another group).
_ID_KEYVAL = MPI.Comm.Create_keyval()
# id index -> the communicator the id names in the native modules: the one first
# handed over, or its fresh duplicate after an MPI error (renew_after_mpi_error).
_IN_USE: dict[int, MPI.Comm] = {}
# Communicators replaced after an MPI error, kept referenced (the library's own
# duplicates are never freed): a peer may still hold a message addressed to one, and
# a freed communicator's context id can be given to a new communicator, which that
# message would then match. (A user's own communicator is theirs to free.)
_RETIRED: list[MPI.Comm] = []


def _native_modules():
    return [m for m in (_ext.cpu_module, _ext.cuda_module) if m is not None]


def comm_attribute(comm: MPI.Comm) -> int:
    """The ``comm`` attribute of a collective's custom call: a communicator id.

    Ids are numbered in the order this process first hands a communicator to a
    collective (the default clone of ``COMM_WORLD`` is nearly always first) and
    registered with each native module next to the communicator's Fortran
    handle. A program holds the id instead of the handle because handles differ
    between the ranks of one job and between jobs (MPICH numbers communicators
    in the order each process allocates them), ids do not: the ranks compile the
    same program, so JAX's persistent compilation cache, where one is set,
    serves every rank and every later job. Past the extension's table size (4096
    communicators) the Fortran handle itself is used, which works the same,
    only without that sharing.
    """
    comm_id = comm.Get_attr(_ID_KEYVAL)
    if comm_id is None:
        handle = int(comm.py2f())
        index = len(_IN_USE)
        if index >= _ext.cpu_module.COMM_ID_CAPACITY:
            return handle
        for module in _native_modules():
            module.register_comm_id(index, handle)
        comm_id = _ext.cpu_module.COMM_ID_BASE + index
        comm.Set_attr(_ID_KEYVAL, comm_id)
        _IN_USE[index] = comm
    return comm_id


def renew_after_mpi_error() -> None:
    """Moves every communicator id to a fresh duplicate if an MPI call failed on any rank.

    Collective over each communicator the library has used: every rank must call
    it, which ``jss.mpi.reset_after_mpi_error`` does. An MPI error in the middle of
    an exchange leaves the messages a peer had already sent (MPI cannot cancel a
    send; an eager one has arrived, a larger one waits for a matching receive)
    addressed to the failed call's communicator, where they would match the next
    call's receives: a wrong sum or a read of the failed call's freed buffer. A
    duplicate has a new context, which no such message matches. The ranks agree
    (an allreduce on each communicator's collective context, which the
    point-to-point messages of the exchanges never use) so that a rank whose own
    calls all succeeded duplicates too. Both steps are non-blocking and posted for
    every communicator at once (``MPI_Iallreduce`` on each, then ``MPI_Comm_idup``
    on each that needs it), so the ranks need not have handed their communicators
    to the library in the same order: each communicator sees one agreement and at
    most one duplication, whatever its id on each rank. Compiled programs keep
    working: they name the id, which now maps to the duplicate, which has the
    replaced communicator's error handler (errors still return). The replaced
    communicators are kept (see ``_RETIRED``); ids past the table's capacity
    (Fortran handles themselves) are not moved.
    """
    seen = [m.take_mpi_error_seen() for m in _native_modules()]  # clears both
    local = np.array([any(seen)], dtype=np.int32)
    live = [(index, comm) for index, comm in sorted(_IN_USE.items())
            if comm != MPI.COMM_NULL]  # one freed by its owner is not used again under its id
    agreed = [np.zeros(1, dtype=np.int32) for _ in live]
    MPI.Request.Waitall([comm.Iallreduce([local, MPI.INT], [flag, MPI.INT], op=MPI.LOR)
                         for (_, comm), flag in zip(live, agreed)])
    renewing = [(index, comm) for (index, comm), flag in zip(live, agreed) if flag[0]]
    started = [comm.Idup() for _, comm in renewing]  # inherits the error handler (MPI 9.3)
    MPI.Request.Waitall([request for _, request in started])
    for (index, comm), (fresh, _) in zip(renewing, started):
        for module in _native_modules():
            module.register_comm_id(index, int(fresh.py2f()))
        _RETIRED.append(comm)
        _IN_USE[index] = fresh


def check_mpi_comm(comm) -> MPI.Comm:
    """``None`` -> the default communicator; an mpi4py ``Comm`` is checked and returned."""
    if comm is None:
        return default_comm()
    if not isinstance(comm, MPI.Comm):
        raise TypeError(
            f"`comm` must be an mpi4py communicator (e.g. MPI.COMM_WORLD.Split(...)), a mesh axis "
            f"(jss.axis('data'), inside shard_map/pmap) or None for the default clone of "
            f"COMM_WORLD; got {type(comm).__name__}."
        )
    if comm == MPI.COMM_NULL:
        raise ValueError("`comm` is MPI.COMM_NULL; this rank is not part of that communicator.")
    return comm
