"""Runs the multi-rank suite (tests/mpi) under ``mpiexec -n N``.

Each run has a wall-clock limit and each test inside it a per-test timeout that
kills the rank (and with it the job), so a deadlock fails in seconds instead of
hanging CI. The same files also run in this process as a world of one rank.
"""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def mpiexec() -> str:
    # the mpiexec of the `mpich` wheel sits next to this Python
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = local if os.path.exists(local) else shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec found (install the `mpich` wheel)")
    return found


def run_under_mpiexec(nranks: int, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    cmd = [mpiexec(), "-n", str(nranks), sys.executable, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"mpiexec -n {nranks} timed out after {timeout}s (deadlock?)\n{out[-4000:]}")


# 8 ranks oversubscribe CI's 2 cores 4x: run the collectives' suite there, not the training one.
SUITES = {n: ["tests/mpi"] for n in (2, 3, 4, 5)}
SUITES[8] = ["tests/mpi/test_sparse_allreduce_mpi.py", "tests/mpi/test_nonblocking_mpi.py",
             "tests/mpi/test_oktopk_mpi.py", "tests/mpi/test_block_allreduce_mpi.py"]


@pytest.mark.parametrize("nranks", sorted(SUITES))
def test_mpi_suite(nranks):
    proc = run_under_mpiexec(
        nranks,
        ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=120",
         "--timeout-method=thread", *SUITES[nranks]],
        timeout=900,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nranks} failed:\n{tail}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail
