"""jss.mpi.tune_host_allocator: freed big blocks are reused instead of page-faulted anew."""

import os
import subprocess
import sys
import warnings

import jax_sparse_sync as jss

# Allocates and frees a 64 MiB block 20 times, touching every page, and prints the
# minor page faults of the last 10 rounds (numpy's large arrays come from malloc).
# "thread": the rounds run on a thread started after the call (as XLA's workers are).
PROBE = r"""
import resource, sys, threading, numpy as np
try:  # 4-KiB pages: numpy's transparent huge pages would make the counts small and variable
    np._core.multiarray._set_madvise_hugepage(False)
except AttributeError:
    pass
if sys.argv[1] == "tuned":
    from jax_sparse_sync.host_allocator import tune_host_allocator
    assert tune_host_allocator()
elif sys.argv[1] == "heap_only":  # the two settings before M_ARENA_MAX was added
    import ctypes
    libc = ctypes.CDLL(None)
    assert libc.mallopt(-4, 0) and libc.mallopt(-1, 2**31 - 1)
n = 16 << 20
out = []
def rounds():
    for i in range(20):
        if i == 10:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.empty(n, np.float32)
        a.fill(1.0)
        del a
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
if sys.argv[2] == "thread":
    t = threading.Thread(target=rounds)
    t.start()
    t.join()
else:
    rounds()
print(out[0])
"""


def faults(mode: str, where: str = "main") -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, where], capture_output=True,
                         text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_tuned_allocator_reuses_freed_blocks():
    # By default every round maps a fresh block: its pages fault again (16,384 4-KiB
    # pages a round, or ~550 faults with numpy's transparent huge pages); tuned,
    # the rounds reuse the heap pages touched already.
    default, tuned = faults("default"), faults("tuned")
    assert default > 1000
    assert tuned * 20 < default


def test_tuned_allocator_covers_threads_started_after_it():
    # A thread's own arena is made of 64 MiB heaps that glibc unmaps when they empty,
    # whatever the trim threshold: with the heap settings alone a thread's 64 MiB
    # blocks faulted every round (16,384 faults a round); with
    # M_ARENA_MAX = 1 the thread allocates from the main heap and reuses it.
    heap_only, tuned = faults("heap_only", "thread"), faults("tuned", "thread")
    assert heap_only > 1000
    assert tuned * 20 < heap_only


WARN_PROBE = r"""
import threading, warnings
import numpy as np
import jax_sparse_sync as jss
from jax_sparse_sync.host_allocator import malloc_arena_count
def alloc():  # a thread's first malloc makes it an arena (unless MALLOC_ARENA_MAX=1)
    np.ones(1 << 20).sum()
t = threading.Thread(target=alloc)
t.start()
t.join()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert jss.mpi.tune_host_allocator()
    assert jss.mpi.tune_host_allocator()  # told once
print(malloc_arena_count(), len(caught), caught[0].message if caught else "", sep="|")
"""


def run_warn_probe(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", WARN_PROBE], capture_output=True, text=True,
                         timeout=120, check=True, env={**env, **env_extra})
    return out.stdout.strip().splitlines()[-1].split("|", 2)


def test_warns_once_when_arenas_exist_already():
    arenas, warned, message = run_warn_probe({})
    assert int(arenas) > 1
    assert warned == "1"
    assert "MALLOC_ARENA_MAX=1" in message and "page-fault" in message


def test_no_warning_when_launched_with_one_arena():
    arenas, warned, _ = run_warn_probe({"MALLOC_ARENA_MAX": "1"})
    assert (arenas, warned) == ("1", "0")


def test_returns_a_bool():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # this process has its arenas
        assert jss.mpi.tune_host_allocator() in (True, False)
