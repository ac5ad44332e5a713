"""Host memory: keep freed blocks for reuse, so a training step does not page-fault.

On the CPU, XLA allocates its output and temporary buffers with ``malloc`` on
every execution of a jitted step and frees them at the end. glibc serves a
block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
returns it to the kernel on ``free``, so the next step touches new zero pages:
one page fault per 4 KiB, every step. For a model of N parameters the sync
transforms' N-float buffers (the accumulator, the dense sum), and XLA's own
for the gradient, cross that threshold from N = 8M on, and below it
whether they fault depends on the process's allocation history. The faults
cost more than the collective itself: ``jss.sparse_allreduce`` of 10K entries
into 10M took 3.5x the plain mpi4py + NumPy equivalent untuned, ``dense_sync``
2.2-2.9x a plain ``Allreduce`` (docs/performance.md).

**Tuned by default.** ``import jax_sparse_sync`` tells glibc to serve every
block from its heap (``M_MMAP_MAX = 0``), to keep freed memory instead of
trimming it (``M_TRIM_THRESHOLD`` at its maximum), and to serve every thread
from that one heap (``M_ARENA_MAX = 1``), so each step reuses the previous
step's pages. The last one matters because XLA:CPU runs a step's thunks (its
fusions and the custom calls of this library) on its worker threads, and glibc
gives each thread an arena of its own, made of 64 MiB mmapped heaps. The
package applies them first thing at import, before it imports ``mpi4py``
(whose MPI initialization starts a thread that makes an arena) or JAX starts
its threads, so in a script that imports ``jax_sparse_sync`` at the top every
thread shares the one heap. :func:`default_tuning` says what the import applied.

What it changes: the whole process (every library in it), for memory allocated
from then on. Freed memory stays in the process: the resident size stays at
the peak of what the process has used, and a process that allocates a lot once
(a dataset loaded and dropped) keeps it. One arena means one lock for every
thread's ``malloc``; a training step's allocations are few and large.

**Opting out.** ``JSS_TUNE_HOST_ALLOCATOR=0`` in the environment leaves glibc as it
is. A setting the environment already makes is left as the environment makes it:
``MALLOC_ARENA_MAX``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_MAX_`` or
``MALLOC_MMAP_THRESHOLD_`` (glibc reads those at process start; the mmap
threshold counts as a choice about ``mmap``, so then ``M_MMAP_MAX`` is not touched
either), or their ``GLIBC_TUNABLES=glibc.malloc.*`` names. Other C libraries
(musl, macOS) have no ``mallopt``: nothing is changed there.

:func:`tune_host_allocator` applies the three settings whatever the environment
says, for a process that opted out of the default, and warns, once, when glibc
already has more than one arena (``malloc_info``): threads that allocated before
the limit keep their own. ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647
MALLOC_ARENA_MAX=1`` in the launch command (for example ``mpiexec``'s) do the same
from process start, before any thread exists: the most thorough way.

Measurements: docs/performance.md, docs/results.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import tempfile
import warnings

__all__ = ["tune_host_allocator", "default_tuning", "malloc_arena_count", "OPT_OUT_VARIABLE"]

# glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_INT_MAX = 2**31 - 1

#: The environment variable that turns the import-time tuning off (``0``, ``false``,
#: ``no`` or ``off``).
OPT_OUT_VARIABLE = "JSS_TUNE_HOST_ALLOCATOR"

#: The settings: name -> (mallopt parameter, value, the environment variables and
#: GLIBC_TUNABLES names that, when set, mean the user chose this setting already).
_SETTINGS = {
    "mmap_max": (_M_MMAP_MAX, 0, ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_"),
                 ("glibc.malloc.mmap_max", "glibc.malloc.mmap_threshold")),
    "trim_threshold": (_M_TRIM_THRESHOLD, _INT_MAX, ("MALLOC_TRIM_THRESHOLD_",),
                       ("glibc.malloc.trim_threshold",)),
    "arena_max": (_M_ARENA_MAX, 1, ("MALLOC_ARENA_MAX",), ("glibc.malloc.arena_max",)),
}


def tune_host_allocator() -> bool:
    """Keep freed host memory for reuse (glibc): no per-step page faults on big buffers.

    ``import jax_sparse_sync`` already does this unless the environment opts out
    (``JSS_TUNE_HOST_ALLOCATOR=0``, see the module docstring); this function applies
    the three settings whatever the environment says. Call it early (before the first
    training step, so that XLA's worker threads are created after it and share the
    one arena), on every rank. It affects the step with and without sparse sync
    alike, so compare modes with the same setting.

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
    ok = all(_mallopt(param, value) for param, value, _, _ in _SETTINGS.values())
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
_default: dict[str, int] | None = None


def apply_default_tuning(environ=None) -> dict[str, int]:
    """The import-time tuning (called by ``jax_sparse_sync/__init__.py``, once).

    Applies each setting the environment does not make itself, unless
    ``JSS_TUNE_HOST_ALLOCATOR`` says no. Returns what it applied (see
    :func:`default_tuning`); no warning (an import should not warn about the
    order of the user's imports).
    """
    global _default
    environ = os.environ if environ is None else environ
    applied: dict[str, int] = {}
    if environ.get(OPT_OUT_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off"):
        tunables = environ.get("GLIBC_TUNABLES", "")
        for name, (param, value, variables, tunable_names) in _SETTINGS.items():
            chosen = (any(v in environ for v in variables)
                      or any(t + "=" in tunables for t in tunable_names))
            if not chosen and _mallopt(param, value):
                applied[name] = value
    _default = applied
    return dict(applied)


def default_tuning() -> dict[str, int]:
    """The allocator settings ``import jax_sparse_sync`` applied in this process.

    Returns:
      A dict of the settings applied (``mmap_max``, ``trim_threshold``,
      ``arena_max``) and their values: all three by default; those the environment
      did not set itself; ``{}`` under ``JSS_TUNE_HOST_ALLOCATOR=0`` or on a C
      library without ``mallopt``.

    Example:
      >>> from jax_sparse_sync.host_allocator import default_tuning
      >>> set(default_tuning()) <= {"mmap_max", "trim_threshold", "arena_max"}
      True
    """
    return dict(_default or {})


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False where it failed or does not exist."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(param, value))  # 1 on success, 0 on error


@functools.lru_cache(maxsize=None)
def _libc() -> "ctypes.CDLL | None":
    """The process's C library (looked up once), or None where it cannot be loaded.

    ``CDLL(None)`` is the process's own symbol table, libc's included, found without
    ``find_library``'s ``ldconfig`` subprocess (this runs at import, maybe under MPI).
    """
    for find in (lambda: None, lambda: ctypes.util.find_library("c")):
        try:
            lib = ctypes.CDLL(find())
        except (OSError, TypeError):
            continue
        if hasattr(lib, "malloc"):
            return lib
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
