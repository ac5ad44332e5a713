"""jss.mpi.tune_host_allocator: freed big blocks are reused instead of page-faulted anew."""

import subprocess
import sys

import jax_sparse_sync as jss

# Allocates and frees a 64 MiB block 20 times, touching every page, and prints the
# minor page faults of the last 10 rounds (numpy's large arrays come from malloc).
PROBE = r"""
import resource, sys, numpy as np
if sys.argv[1] == "tuned":
    from jax_sparse_sync.host_allocator import tune_host_allocator
    assert tune_host_allocator()
n = 16 << 20
for i in range(20):
    if i == 10:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(n, np.float32)
    a.fill(1.0)
    del a
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_tuned_allocator_reuses_freed_blocks():
    # By default every round maps a fresh block: its pages fault again (16,384 4-KiB
    # pages a round, or ~550 faults with numpy's transparent huge pages); tuned,
    # the rounds reuse the heap pages touched already.
    default, tuned = faults("default"), faults("tuned")
    assert default > 1000
    assert tuned * 20 < default


def test_returns_a_bool():
    assert jss.mpi.tune_host_allocator() in (True, False)
