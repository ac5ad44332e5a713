"""End the whole MPI job when one rank fails: :func:`abort_on_error`.

Why: in an MPI job every rank waits for the others inside each collective.
When one rank dies of an uncaught Python exception, Python prints the
traceback and the rank stops in ``MPI_Finalize`` (mpi4py calls it at exit);
it never reaches the next collective, and the other ranks wait for it forever
(MPICH's ranks busy-poll: the hung job burns its cores until someone kills
it). ``mpiexec`` only cleans up when a rank ends abnormally, so the job must
be ended explicitly: ``MPI_Abort`` tells the launcher to kill every rank.

Two ways to get that:

* ``jss.mpi.abort_on_error()`` at the start of the script (this module): an
  uncaught exception in the main thread (``sys.excepthook``) or in any
  ``threading.Thread`` (``threading.excepthook``) prints its traceback as
  before, with the rank, and then calls ``MPI_Abort``.
* ``mpiexec -n P python -m mpi4py script.py``: mpi4py's own runner does the
  same for the main thread, and also aborts on ``sys.exit(nonzero)`` (which
  no excepthook sees).

A rank killed by a signal (``SIGKILL``, the OOM killer, a segfault) needs
neither: MPICH's hydra ``mpiexec`` sees the abnormal end and kills the other
ranks itself (docs/semantics.md, "Failing ranks").
"""

from __future__ import annotations

import sys
import threading
import time

from mpi4py import MPI

from jax_sparse_sync.mpi.comm import check_mpi_comm

__all__ = ["abort_on_error"]

#: What the installed hooks abort: set by the last ``abort_on_error`` call.
_settings: dict = {"comm": None, "exit_code": 1}
#: Marks our hooks, so a second call (or a call after someone restored the
#: original hooks) can tell whether they are installed.
_MARK = "_jss_abort_on_error"

#: Seconds between flushing this rank's output and MPI_Abort. The launcher's proxy
#: forwards a rank's stdout/stderr asynchronously and MPI_Abort kills it at once: without
#: the pause the traceback (the one thing the user needs) was sometimes lost (seen in CI).
FORWARD_GRACE_S = 0.3


def _rank() -> str:
    try:
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return f"rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}"
    except Exception:  # noqa: BLE001 - a hook must never raise
        pass
    return "rank ?"


def _say(text: str) -> None:
    stream = sys.stderr or sys.__stderr__
    if stream is None:
        return
    try:
        stream.write(text + "\n")
        stream.flush()
    except Exception:  # noqa: BLE001
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _abort(comm, exit_code: int) -> None:
    """``MPI_Abort`` (a separate function so tests can replace it)."""
    comm.Abort(exit_code)


def _abort_now(what: str) -> None:
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return  # no MPI any more (e.g. an error at interpreter exit): nothing can hang
    comm = _settings["comm"] if _settings["comm"] is not None else MPI.COMM_WORLD
    code = _settings["exit_code"]
    _say(f"jax_sparse_sync.mpi.abort_on_error: {_rank()}: {what}; calling MPI_Abort(exit code "
         f"{code}) so that the other ranks do not wait for this one forever.")
    _flush()
    time.sleep(FORWARD_GRACE_S)
    _abort(comm, code)


def _make_excepthook(previous):
    def excepthook(exc_type, exc_value, exc_traceback):
        try:
            _say(f"jax_sparse_sync.mpi.abort_on_error: {_rank()}: uncaught "
                 f"{getattr(exc_type, '__name__', exc_type)}; traceback follows.")
            previous(exc_type, exc_value, exc_traceback)
        except Exception:  # noqa: BLE001 - abort even if the chained hook fails
            pass
        finally:
            _abort_now(f"uncaught {getattr(exc_type, '__name__', exc_type)}: {exc_value}")

    setattr(excepthook, _MARK, True)
    excepthook.previous = previous
    return excepthook


def _make_threading_excepthook(previous):
    def threading_excepthook(args):
        if args.exc_type is SystemExit:  # threading ignores SystemExit in a thread: so do we
            previous(args)
            return
        name = args.thread.name if args.thread is not None else "?"
        try:
            _say(f"jax_sparse_sync.mpi.abort_on_error: {_rank()}: uncaught "
                 f"{args.exc_type.__name__} in thread {name!r}; traceback follows.")
            previous(args)
        except Exception:  # noqa: BLE001
            pass
        finally:
            _abort_now(f"uncaught {args.exc_type.__name__} in thread {name!r}: {args.exc_value}")

    setattr(threading_excepthook, _MARK, True)
    threading_excepthook.previous = previous
    return threading_excepthook


def _installed(hook) -> bool:
    """True if ``hook`` is ours or chains (through our hooks) to ours."""
    while hook is not None:
        if getattr(hook, _MARK, False):
            return True
        hook = getattr(hook, "previous", None)
    return False


def abort_on_error(comm=None, exit_code: int = 1) -> None:
    """Abort the whole MPI job when this rank dies of an uncaught exception.

    Why: MPI jobs where one rank dies must end, not hang. Without this, a rank
    that raises prints its traceback and stops, while the other ranks wait for
    it forever inside the next collective (a ``jss.sparse_allreduce``, a
    ``topk_sync`` step, a barrier): the job never ends and its ranks keep
    their cores busy. ``mpiexec`` only kills the other ranks when a rank ends
    abnormally, and ``MPI_Abort`` is how a rank says so.

    Installs a ``sys.excepthook`` (uncaught exceptions in the main thread) and
    a ``threading.excepthook`` (in any ``threading.Thread``; ``SystemExit`` in
    a thread is ignored, as Python does). Each one chains to the hook it
    replaces, so the traceback is printed as before, preceded by a line that
    names the rank; both streams are flushed, then ``comm.Abort(exit_code)``
    ends every rank of the job and ``mpiexec`` exits non-zero.

    Call it once at the start of the script, on every rank (it is local: no
    communication). It is idempotent: a second call installs nothing more
    and only updates ``comm`` and ``exit_code``.

    Not covered: ``sys.exit(nonzero)`` on one rank (no hook sees it) and
    exceptions caught by your own code. The alternative that needs no code,
    and also aborts on ``sys.exit(nonzero)``, is mpi4py's runner::

        mpiexec -n 4 python -m mpi4py script.py

    A rank killed by a signal (``SIGKILL``, the OOM killer, a segfault)
    needs neither: MPICH's ``mpiexec`` (hydra) kills the other ranks itself.

    Args:
      comm: the mpi4py communicator to abort; ``None`` (default) aborts
        ``MPI.COMM_WORLD`` (MPICH ends the whole job for any communicator).
      exit_code: the exit status ``MPI_Abort`` passes to ``mpiexec``.

    Raises:
      TypeError: ``comm`` is not an mpi4py communicator (a mesh axis has no
        MPI job to abort).
    """
    if comm is not None and not isinstance(comm, MPI.Comm):
        raise TypeError(
            f"`comm` must be an mpi4py communicator or None (MPI.COMM_WORLD), got "
            f"{type(comm).__name__}; a mesh axis has no MPI job to abort.")
    if comm is not None:
        comm = check_mpi_comm(comm)
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise TypeError(f"`exit_code` must be an int, got {type(exit_code).__name__}")
    _settings["comm"] = comm
    _settings["exit_code"] = exit_code
    if not _installed(sys.excepthook):
        sys.excepthook = _make_excepthook(sys.excepthook)
    if not _installed(threading.excepthook):
        threading.excepthook = _make_threading_excepthook(threading.excepthook)
