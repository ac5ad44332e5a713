"""Host memory: keep freed blocks for reuse, so a training step does not page-fault.

On the CPU, XLA allocates its output and temporary buffers with ``malloc`` on
every execution of a jitted step and frees them at the end. glibc serves a
block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
returns it to the kernel on ``free``, so the next step touches new zero pages:
one page fault per 4 KiB, every step. For a model of N parameters the sync
transforms' N-float buffers (the accumulator, the dense sum), and XLA's own
for the gradient, cross that threshold from N = 8M on, and below it
whether they fault depends on the process's allocation history. Measured
here (2-core VM, one rank, N = 8M, ``topk_sync`` + SGD step): 8,200 faults
(one N-float buffer) and 68 ms per step by default, 1,000 faults and 30 ms
after :func:`tune_host_allocator`.

:func:`tune_host_allocator` tells glibc to serve every block from its heap
(``M_MMAP_MAX = 0``) and to keep freed memory instead of trimming it
(``M_TRIM_THRESHOLD`` at its maximum), so each step reuses the previous
step's pages. It changes nothing for memory already allocated, affects the
whole process (every library in it), and raises the resident size to the
peak of what the steps use; the environment variables
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647`` do the same from
process start (for example in the ``mpiexec`` command line). Other C
libraries (musl, macOS) have no ``mallopt``: there it returns False and does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["tune_host_allocator"]

# glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_INT_MAX = 2**31 - 1


def tune_host_allocator() -> bool:
    """Keep freed host memory for reuse (glibc): no per-step page faults on big buffers.

    Call it once per process, early (before the first training step), on every
    rank. See the module docstring for what it changes and why; it affects the
    step with and without sparse sync alike, so compare modes with the same
    setting.

    Returns:
      True when glibc accepted both settings; False on C libraries without
      ``mallopt`` (nothing changed).

    Example:
      >>> import jax_sparse_sync as jss
      >>> jss.mpi.tune_host_allocator() in (True, False)
      True
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX))
