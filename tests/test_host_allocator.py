"""The host allocator: tuned at import by default (opt-out, the environment's own settings), and jss.mpi.tune_host_allocator; freed big blocks are reused instead of page-faulted anew."""

import json
import os
import subprocess
import sys
import warnings

import pytest

import jax_sparse_sync as jss
from jax_sparse_sync import host_allocator

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


def clean_env(**extra) -> dict:
    """This process's environment without malloc settings of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "JSS_TUNE_HOST_ALLOCATOR"}
    return {**env, **extra}


def faults(mode: str, where: str = "main") -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, where], capture_output=True,
                         text=True, timeout=120, check=True, env=clean_env())
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
    # opted out of the import-time tuning, which would keep the thread from making an arena
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["JSS_TUNE_HOST_ALLOCATOR"] = "0"
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


# A process that imports the library and never calls tune_host_allocator: the same
# rounds as PROBE's on a thread started after the import (as XLA's workers are), then
# XLA's CPU client started; prints the faults, what the import applied and the arenas.
IMPORT_PROBE = r"""
import json, resource, threading, numpy as np
try:
    np._core.multiarray._set_madvise_hugepage(False)
except AttributeError:
    pass
import jax_sparse_sync
from jax_sparse_sync.host_allocator import default_tuning, malloc_arena_count
out = []
def rounds():
    for i in range(20):
        if i == 10:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.empty(16 << 20, np.float32)
        a.fill(1.0)
        del a
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
t = threading.Thread(target=rounds)
t.start()
t.join()
import jax.numpy as jnp
jnp.ones(8).block_until_ready()
print(json.dumps([out[0], default_tuning(), malloc_arena_count()]))
"""


def run_import_probe(env_extra: dict) -> tuple[int, list[str], int]:
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True,
                         timeout=120, check=True, env=clean_env(**env_extra))
    count, applied, arenas = json.loads(out.stdout.strip().splitlines()[-1])
    return count, sorted(applied), arenas


def test_importing_the_library_tunes_the_allocator_unless_opted_out():
    imported, applied, arenas = run_import_probe({})
    opted_out, none_applied, many = run_import_probe({"JSS_TUNE_HOST_ALLOCATOR": "0"})
    assert applied == ["arena_max", "mmap_max", "trim_threshold"] and none_applied == []
    # tuned at import: the thread reuses the heap, and XLA's threads share the one arena
    assert opted_out > 1000
    assert imported * 20 < opted_out
    assert arenas == 1 and many > 1


@pytest.mark.parametrize("environ, applied", [
    ({}, {"mmap_max", "trim_threshold", "arena_max"}),
    ({"JSS_TUNE_HOST_ALLOCATOR": "off"}, set()),
    ({"JSS_TUNE_HOST_ALLOCATOR": "1"}, {"mmap_max", "trim_threshold", "arena_max"}),
    ({"MALLOC_MMAP_THRESHOLD_": "33554432"}, {"trim_threshold", "arena_max"}),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, {"mmap_max", "arena_max"}),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_max=7"}, {"trim_threshold"}),
])
def test_the_environment_s_own_settings_win(monkeypatch, environ, applied):
    # Which settings the import applies, by environment (mallopt recorded, not called: this
    # process keeps its own settings).
    calls = []
    monkeypatch.setattr(host_allocator, "_mallopt", lambda p, v: calls.append((p, v)) or True)
    monkeypatch.setattr(host_allocator, "_default", host_allocator._default)
    assert set(host_allocator.apply_default_tuning(environ)) == applied
    assert set(host_allocator.default_tuning()) == applied
    assert len(calls) == len(applied)
