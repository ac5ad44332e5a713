"""Host memory: keep freed blocks for reuse, so a training step does not page-fault.

On the CPU, XLA allocates its output and temporary buffers with ``malloc`` on
every execution of a jitted step and frees them at the end. glibc serves a
block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
returns it to the kernel on ``free``, so the next step touches new zero pages:
one page fault per 4 KiB, every step. For a model of N parameters the sync
transforms' N-float buffers (the accumulator, the dense sum), and XLA's own
for the gradient, cross that threshold from N = 8M on, and below it
whether they fault depends on the process's allocation history.

:func:`tune_host_allocator` tells glibc to serve every block from its heap
(``M_MMAP_MAX = 0``), to keep freed memory instead of trimming it
(``M_TRIM_THRESHOLD`` at its maximum), and to serve every thread from that one
heap (``M_ARENA_MAX = 1``), so each step reuses the previous step's pages.
The last one matters because XLA:CPU runs a step's thunks (its fusions and
the custom calls of this library) on its worker threads, and glibc gives
each thread an arena of its own, made of 64 MiB mmapped heaps that it
shrinks on ``free`` whatever the trim threshold: without it, the first two
settings still leave the big buffers faulting every step.

Cost: it changes nothing for memory already allocated, affects the whole
process (every library in it), and raises the resident size to the peak of
what the steps use. One arena means one lock for every thread's ``malloc``;
a training step's allocations are few and large.

The environment variables ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647
MALLOC_ARENA_MAX=1`` do the same from process start (for example in the
``mpiexec`` command line). That is the reliable way: an arena already made
stays, and threads started later share it; importing ``mpi4py`` (which
``jax_sparse_sync`` does) initializes MPI, which starts a thread that makes
one before any user code runs, and a call made after that leaves that arena's
faults in place. So the function warns, once, when it finds more than one arena
(glibc's ``malloc_info``), naming that variable. Other C libraries (musl,
macOS) have no ``mallopt``: there it returns False and does nothing.

Measurements: docs/results.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import tempfile
import warnings

__all__ = ["tune_host_allocator", "malloc_arena_count"]

# glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_INT_MAX = 2**31 - 1


def tune_host_allocator() -> bool:
    """Keep freed host memory for reuse (glibc): no per-step page faults on big buffers.

    Call it once per process, early (before the first training step, so that
    XLA's worker threads are created after it and share the one arena), on
    every rank. See the module docstring for what it changes and why; it affects the
    step with and without sparse sync alike, so compare modes with the same
    setting.

    Returns:
      True when glibc accepted the three settings; False on C libraries without
      ``mallopt`` (nothing changed).

    Example:
      >>> import warnings
      >>> import jax_sparse_sync as jss
      >>> with warnings.catch_warnings():  # a process that already has arenas warns once
      ...     warnings.simplefilter("ignore", RuntimeWarning)
      ...     ok = jss.mpi.tune_host_allocator()
      >>> ok in (True, False)
      True
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error
    ok = all([bool(mallopt(_M_MMAP_MAX, 0)), bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX)),
              bool(mallopt(_M_ARENA_MAX, 1))])
    arenas = malloc_arena_count()
    global _warned
    if ok and arenas is not None and arenas > 1 and not _warned:
        _warned = True
        warnings.warn(
            f"jax_sparse_sync.mpi.tune_host_allocator: glibc already has {arenas} malloc "
            "arenas (threads that allocated before this call, e.g. the one MPI starts at "
            "import); XLA's worker threads will share them, and their big buffers still "
            "page-fault every step (measured on a 10.9M-parameter LM: 21,000 faults a "
            "step). Launch every rank "
            "with MALLOC_ARENA_MAX=1 in its environment (e.g. `MALLOC_ARENA_MAX=1 mpiexec "
            "-n 2 python train.py`): then there is one arena from the start.",
            RuntimeWarning, stacklevel=2)
    return ok


_warned = False


@functools.lru_cache(maxsize=None)
def _libc() -> "ctypes.CDLL | None":
    """The process's C library (looked up once), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def malloc_arena_count() -> int | None:
    """glibc's malloc arenas in this process (``malloc_info``'s heaps); None where unknown.

    One after :func:`tune_host_allocator` in a process launched with
    ``MALLOC_ARENA_MAX=1``; more where threads allocated before the limit was set.
    """
    try:
        libc = _libc()
        malloc_info, fopen, fclose = libc.malloc_info, libc.fopen, libc.fclose
    except AttributeError:  # no C library found (None), or one without malloc_info
        return None
    fopen.argtypes, fopen.restype = (ctypes.c_char_p, ctypes.c_char_p), ctypes.c_void_p
    malloc_info.argtypes, malloc_info.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_int
    fclose.argtypes = (ctypes.c_void_p,)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "malloc_info.xml")
        fp = fopen(path.encode(), b"w")
        if not fp:
            return None
        status = malloc_info(0, fp)
        fclose(fp)
        if status != 0:
            return None
        with open(path) as f:
            return len(re.findall(r'<heap nr="\d+">', f.read()))
