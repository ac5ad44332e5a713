"""A watchdog for stuck collectives: :func:`set_timeout` and :func:`sync_timeout`.

Why: an MPI collective waits for every rank of its communicator. A rank that
stops calling (stuck in its input pipeline, a debugger, a deadlock of its own,
a link that went down) leaves the others waiting forever, burning their cores.
PyTorch's process groups answer this with a timeout; this is the same for the
library's MPI collectives (``sparse_allreduce`` blocking and non-blocking,
``oktopk_allreduce``, ``block_allreduce``, and every ``*_sync`` transform that
calls them).

With a timeout set, every collective this rank enters is timed from its entry
(for the non-blocking pair: from ``sparse_allreduce_start`` until its
background transfer finishes). One that has not completed ``timeout`` seconds
later ends the whole job (``MPI_Abort`` on ``COMM_WORLD``) after printing, on
standard error, the operation's name, its sequence number on its
communicator (the n-th library collective on it; equal on every rank for the
same call), this rank, which ranks of the communicator had not entered it, and
what each rank last entered. The watchdog checks every ``timeout / 20``
(between 10 ms and 0.5 s), so it fires within about ``1.05 * timeout``.

How the other ranks are known without asking them through MPI (a stuck rank
answers nothing): while the watchdog is on, each rank's watcher thread rewrites
a small record file (what it last entered, per communicator, and whether that
completed) whenever it changed, at most once per poll, in ``$JSS_WATCHDOG_DIR`` or, by
default, ``/dev/shm/jss-<job id>`` (the job id from Slurm, PMIx or PBS, else
the ``mpiexec`` proxy's process id, which is shared by the ranks of one node).
On several nodes, set ``JSS_WATCHDOG_DIR`` to a directory the whole job shares
(and that is unique to the job); otherwise the report names only the ranks on
this rank's node and says which ranks left no record.

Settable three ways: ``JSS_TIMEOUT_S=<seconds>`` in the environment (read when
``jax_sparse_sync`` is imported, so a launcher can set it for a script it did
not write), :func:`set_timeout` and the :func:`sync_timeout` context manager.
The timeout applies to the collectives that *start* while it is set: JAX runs
jitted steps asynchronously, so a step dispatched inside ``sync_timeout`` may
run its collectives after the block has been left.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os

from jax_sparse_sync import _ext

__all__ = ["set_timeout", "get_timeout", "sync_timeout", "ENV_TIMEOUT"]

#: The environment variable read at import: seconds, a positive number.
ENV_TIMEOUT = "JSS_TIMEOUT_S"


def _modules():
    mods = [_ext.cpu_module]
    if _ext.cuda_module is not None and hasattr(_ext.cuda_module, "watchdog_set_timeout_ns"):
        mods.append(_ext.cuda_module)
    return mods


def _check_seconds(seconds, what: str) -> float | None:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None (off), got "
                        f"{type(seconds).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0 (0 or None turns the "
                         f"watchdog off), got {seconds!r}")
    return float(seconds) if seconds > 0 else None


def set_timeout(seconds: float | None, *, exit_code: int = 1) -> None:
    """Sets the watchdog's timeout for this rank's collectives (``None`` or 0: off).

    Call it on every rank (it is local: no communication). Collectives that
    start from now on and have not completed ``seconds`` after they started
    end the job with ``MPI_Abort(COMM_WORLD, exit_code)`` and a message naming
    the operation, its sequence number, this rank and the ranks that had not
    arrived. Pick a timeout well above your slowest step (including the first,
    compiling one, if that compiles while other ranks already wait in a
    collective).

    Args:
      seconds: the timeout, a positive number of seconds; ``None`` or 0 turns
        the watchdog off (the default, unless ``JSS_TIMEOUT_S`` is set).
      exit_code: the exit status passed to ``MPI_Abort``.

    Raises:
      TypeError: ``seconds`` is not a number, or ``exit_code`` is not an int.
      ValueError: ``seconds`` is negative, NaN or infinite.

    Example::

        jss.mpi.set_timeout(300)      # a sync stuck for 5 minutes ends the job
        jss.mpi.set_timeout(None)     # off again
    """
    seconds = _check_seconds(seconds, "`seconds`")
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise TypeError(f"`exit_code` must be an int, got {type(exit_code).__name__}")
    ns = 0 if seconds is None else max(1, int(round(seconds * 1e9)))
    for m in _modules():
        m.watchdog_set_exit_code(exit_code)
        m.watchdog_set_timeout_ns(ns)


def get_timeout() -> float | None:
    """The watchdog's current timeout in seconds, or ``None`` when it is off."""
    ns = _ext.cpu_module.watchdog_timeout_ns()
    return ns / 1e9 if ns > 0 else None


@contextlib.contextmanager
def sync_timeout(seconds: float | None):
    """Context manager: :func:`set_timeout` inside the block, the previous timeout after.

    Example::

        with jss.mpi.sync_timeout(60):
            state = train_step(state, batch)
            jax.block_until_ready(state)   # the collectives ran inside the block
    """
    previous = get_timeout()
    set_timeout(seconds)
    try:
        yield
    finally:
        set_timeout(previous)


def watchdog_directory() -> str:
    """Where this rank's record file goes (``$JSS_WATCHDOG_DIR`` or ``/dev/shm/jss-<job>``)."""
    return _ext.cpu_module.watchdog_directory()


def _timeout_from_environment() -> None:
    text = os.environ.get(ENV_TIMEOUT, "").strip()
    if not text:
        return
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{ENV_TIMEOUT}={text!r} is not a number: set it to the watchdog's timeout in "
            f"seconds (e.g. {ENV_TIMEOUT}=300), or unset it to leave the watchdog off.") from None
    set_timeout(_check_seconds(value, f"{ENV_TIMEOUT}"))


def _remove_records() -> None:
    for m in _modules():
        m.watchdog_remove_record()


_timeout_from_environment()
# A clean exit removes this rank's record file; an aborted job leaves its records behind
# (in /dev/shm, until reboot, or in $JSS_WATCHDOG_DIR) for a post-mortem.
atexit.register(_remove_records)
