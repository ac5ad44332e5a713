"""The watchdog for stuck collectives (jss.mpi.set_timeout / JSS_TIMEOUT_S).

Jobs under ``mpiexec -n P`` (P = 2, 3; the blocking, the non-blocking and the
Ok-Topk collective) where the last rank stops calling (it
sleeps for a minute before its third collective) while the others enter it:
with a 2 s timeout the job must end within timeout + 5 s of the moment the
sleeper stopped, with a message that names the operation, its sequence number,
the rank that reported and the rank that had not arrived. Every job has a
wall-clock limit, and leftover ranks are killed by pid, so a watchdog that
never fires fails the test instead of hanging it.

And jobs where every rank enters the operation and the last one then stops
itself inside it (SIGSTOP through the test hook JSS_TEST_FREEZE_AT, as a peer
behind a dead link looks): the report must say that every rank entered it and
name the peer the reporting rank waits for, with the algorithm's phase.

That the watchdog changes no result (bitwise) is tested under mpiexec in
tests/mpi/test_watchdog_mpi.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_mpi_abort import _kill_leftovers
from test_multirank import ROOT, mpiexec

import jax_sparse_sync as jss

TIMEOUT_S = 2.0
JOB_LIMIT_S = 90.0

CHILD = r'''
import os, sys, time
op, piddir = sys.argv[1], sys.argv[2]
from mpi4py import MPI
rank, nranks = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
with open(os.path.join(piddir, f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
import jax, jax.numpy as jnp
import jax_sparse_sync as jss

values = jnp.arange(1, 5, dtype=jnp.float32) * (rank + 1)
indices = jnp.arange(4, dtype=jnp.int32) * (rank + 1)

def collective():
    if op == "sparse_allreduce":
        return jss.sparse_allreduce(values, indices, size=64)
    if op == "sparse_allreduce_start":
        return jss.sparse_allreduce_done(jss.sparse_allreduce_start(values, indices, size=64))
    if op == "oktopk_allreduce":
        return jss.oktopk_allreduce(values, indices, size=64, k=4).sum
    if op == "dense_allreduce":
        return jss.dense_allreduce(values)
    raise ValueError(op)

# Two collectives (#1, #2) with the watchdog off: their compilation must not count.
for _ in range(2):
    jax.block_until_ready(collective())
MPI.COMM_WORLD.Barrier()
jss.mpi.set_timeout(float(os.environ["WATCHDOG_TEST_TIMEOUT"]))
if rank == nranks - 1:
    with open(os.path.join(piddir, "stopped_at"), "w") as f:
        f.write(f"{time.time():.3f}")
    time.sleep(60)                    # stops calling: the others wait in #3
jax.block_until_ready(collective())   # #3
print(f"rank {rank} LEFT THE COLLECTIVE", flush=True)
'''


def _run_watched_job(tmp_path: Path, child: str, nranks: int, arg: str, **extra_env):
    """Runs `child` on `nranks` ranks with the watchdog's test timeout; returns the
    finished process, the time it ended and the folder where the ranks wrote their pids."""
    script = tmp_path / "child.py"
    script.write_text(child)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
               WATCHDOG_TEST_TIMEOUT=str(TIMEOUT_S), JSS_WATCHDOG_DIR=str(tmp_path / "records"),
               **extra_env)
    env.pop("JSS_TIMEOUT_S", None)
    cmd = [mpiexec(), "-n", str(nranks), sys.executable, str(script), arg, str(piddir)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=JOB_LIMIT_S)
        ended = time.time()
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the watchdog did not end the job within {JOB_LIMIT_S} s:\n{out[-3000:]}")
    finally:
        _kill_leftovers(piddir, script)
    return proc, ended, piddir


def _run_stuck_job(tmp_path: Path, nranks: int, op: str):
    proc, ended, piddir = _run_watched_job(tmp_path, CHILD, nranks, op)
    stopped = float((piddir / "stopped_at").read_text())
    return proc, ended - stopped


@pytest.mark.parametrize("nranks,op", [(2, "sparse_allreduce"), (3, "sparse_allreduce_start"),
                                       (3, "oktopk_allreduce"), (2, "dense_allreduce")])
def test_a_rank_that_stops_calling_ends_the_job_with_a_message_naming_it(tmp_path, nranks, op):
    proc, latency = _run_stuck_job(tmp_path, nranks, op)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "LEFT THE COLLECTIVE" not in out, out[-3000:]
    # ended by the watchdog, within timeout + 5 s of the moment the rank stopped
    assert latency < TIMEOUT_S + 5.0, (latency, out[-3000:])
    stuck = nranks - 1
    report = re.search(rf"jax_sparse_sync watchdog: rank (\d+) \(pid \d+\): `{op}` #3 on the "
                       rf"communicator of world ranks ([\d, ]+) has not completed", out)
    assert report, out[-3000:]
    assert int(report.group(1)) != stuck
    assert report.group(2) == ", ".join(str(r) for r in range(nranks))
    assert f"ranks that have not entered #3: {stuck} " in out, out[-3000:]
    # what the missing rank last entered: the op before, completed
    assert re.search(rf"rank {stuck}: last entered `{op}` #2 on this communicator \(completed\); "
                     rf"its last entry of all: `{op}` #2 on this communicator, completed", out), \
        out[-3000:]
    assert "MPI_Abort(MPI_COMM_WORLD, 1)" in out


FROZEN_CHILD = r'''
import os, sys, time
case, piddir = sys.argv[1], sys.argv[2]
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
with open(os.path.join(piddir, f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
import jax, jax.numpy as jnp
import jax_sparse_sync as jss

N = 4096
values = jnp.arange(1, 257, dtype=jnp.float32) * (rank + 1)
indices = (jnp.arange(256, dtype=jnp.int32) * (16 * rank + 15)) % N  # spread over every owner

def collective():
    if case == "nonblocking":
        return jss.sparse_allreduce_done(jss.sparse_allreduce_start(
            values, indices, size=N, algorithm="recursive_doubling"))
    if case == "oktopk":
        return jss.oktopk_allreduce(values, indices, size=N, k=64).sum
    if case == "block":
        return jss.block_allreduce(jnp.zeros(N, jnp.float32).at[indices].add(values),
                                   block_size=16)
    return jss.sparse_allreduce(values, indices, size=N,
                                algorithm=case.removesuffix("_counts").removesuffix("_header"))

for _ in range(2):  # #1, #2: compiled, with the watchdog off (the hook is inert while off)
    jax.block_until_ready(collective())
MPI.COMM_WORLD.Barrier()
jss.mpi.set_timeout(float(os.environ["WATCHDOG_TEST_TIMEOUT"]))
with open(os.path.join(piddir, f"entered{rank}"), "w") as f:
    f.write(f"{time.time():.3f}")
jax.block_until_ready(collective())   # #3: the frozen rank stops inside it
print(f"rank {rank} LEFT THE COLLECTIVE", flush=True)
'''

# (case, ranks, where the last rank stops itself, the op, what another rank then waits in,
#  how it names the wait after "waits for a message from rank <the last> ("): each a rank
#  that entered the operation and stops inside it, as a peer behind a dead link looks to
#  the others.
FROZEN_CASES = [
    ("recursive_doubling", 2, "recursive_doubling round", "sparse_allreduce",
     r"recursive_doubling round 1, MPI_Sendrecv \(message length\): 8 B expected, 8 B sent "
     r"to it\)"),
    ("split_allgather", 3, "split_allgather MPI_Isend (slice)", "sparse_allreduce",
     r"[\d,]+ B\) \(split-allgather phase 1, MPI_Waitall"),
    # the slice sizes before it: the library's own all-to-all, point to point (a peer
    # stuck there was "one of every other rank" from inside MPI_Alltoall)
    ("split_allgather_counts", 3, "split_allgather MPI_Isend (counts)", "sparse_allreduce",
     r"8 B\) \(split_allgather, MPI_Waitall \(slice sizes\)\)"),
    # the argument check every operation begins with: Bruck's allgather of the headers,
    # point to point (from inside MPI_Allgather a stuck rank could only name "every rank
    # of its communicator")
    ("allgather_header", 3, "MPI_Isend (argument check)", "sparse_allreduce",
     r"56 B\) \(.*MPI_Waitall \(argument check\)\)"),
    ("nonblocking", 2, "recursive_doubling round", "sparse_allreduce_start",
     r"recursive_doubling round 1, MPI_Sendrecv"),
    ("oktopk", 3, "oktopk MPI_Isend (bucket)", "oktopk_allreduce",
     r"[\d,]+ B\) \(oktopk split-and-reduce bucket 1, MPI_Waitall"),
]
# (Checked by hand the same way, not run here to keep the suite short: block, hash_partition
# and dense_allreduce.)


@pytest.mark.parametrize("case,nranks,freeze_at,op,waits", FROZEN_CASES,
                         ids=[c[0] for c in FROZEN_CASES])
def test_a_rank_stopped_inside_the_operation_is_named_as_the_peer_waited_for(
        tmp_path, case, nranks, freeze_at, op, waits):
    """Every rank enters #3, then the last one stops itself (SIGSTOP, through the test hook
    JSS_TEST_FREEZE_AT) before the MPI call `freeze_at`: the others wait for it inside the
    operation, as behind a dead link. The report must name the op and the peer waited for,
    within timeout + 5 s."""
    frozen = nranks - 1
    proc, ended, piddir = _run_watched_job(tmp_path, FROZEN_CHILD, nranks, case,
                                           JSS_TEST_FREEZE_AT=f"{frozen}:{freeze_at}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "LEFT THE COLLECTIVE" not in out, out[-3000:]
    assert f"JSS_TEST_FREEZE_AT: rank {frozen} stops itself (SIGSTOP)" in out, out[-3000:]
    entered = max(float((piddir / f"entered{r}").read_text()) for r in range(nranks))
    assert ended - entered < TIMEOUT_S + 5.0, (ended - entered, out[-3000:])
    report = re.search(rf"jax_sparse_sync watchdog: rank (\d+) \(pid \d+\): `{op}` #3 on the "
                       rf"communicator of world ranks [\d, ]+ has not completed", out)
    assert report, out[-3000:]
    reporter = int(report.group(1))
    assert reporter != frozen
    # every rank entered #3 (the frozen one published its record before stopping)
    assert "every rank entered #3: it is stuck inside the operation" in out, out[-3000:]
    assert re.search(rf"  rank {reporter} waits for a message from rank {frozen} \({waits}", out), \
        out[-3000:]


def _python(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **env_extra)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_environment_variable_sets_the_timeout():
    proc = _python("import jax_sparse_sync as jss; print('TIMEOUT', jss.mpi.get_timeout())",
                   JSS_TIMEOUT_S="7.5")
    assert "TIMEOUT 7.5" in proc.stdout, proc.stderr[-2000:]


def test_a_bad_environment_value_is_a_clear_error():
    proc = _python("import jax_sparse_sync", JSS_TIMEOUT_S="five minutes")
    assert proc.returncode != 0
    assert "JSS_TIMEOUT_S='five minutes' is not a number" in proc.stderr, proc.stderr[-2000:]


def test_set_timeout_and_the_context_manager():
    before = jss.mpi.get_timeout()
    try:
        jss.mpi.set_timeout(None)
        assert jss.mpi.get_timeout() is None
        with jss.mpi.sync_timeout(30):
            assert jss.mpi.get_timeout() == 30.0
            with jss.mpi.sync_timeout(0.5):
                assert jss.mpi.get_timeout() == 0.5
            assert jss.mpi.get_timeout() == 30.0
        assert jss.mpi.get_timeout() is None
        jss.mpi.set_timeout(0)
        assert jss.mpi.get_timeout() is None
    finally:
        jss.mpi.set_timeout(before)


@pytest.mark.parametrize("bad,error", [(-1, ValueError), (float("nan"), ValueError),
                                       (float("inf"), ValueError), ("60", TypeError),
                                       (True, TypeError)])
def test_bad_timeouts_are_rejected(bad, error):
    with pytest.raises(error, match="seconds"):
        jss.mpi.set_timeout(bad)
