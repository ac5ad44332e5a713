"""A failing rank must end the whole MPI job, not leave the others waiting forever.

Small scripts run under ``mpiexec -n 3``: rank 1 fails (uncaught exception,
with ``jss.mpi.abort_on_error()`` or under ``python -m mpi4py``; or SIGKILL) while
ranks 0 and 2 wait in a collective. Each job must end within seconds with a
non-zero status. Without either remedy the same job hangs (checked by hand:
killed by ``timeout`` after 25 s), so that case is not run here.

Every job runs with a 60 s limit. The ranks write their pids, and whatever is
still alive afterwards (a timed-out job) is killed by pid: hydra puts each rank
in its own session, so killing ``mpiexec`` alone could leave ranks behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mpi4py import MPI
from test_multirank import ROOT, mpiexec

import jax_sparse_sync as jss
from jax_sparse_sync.mpi import abort as abort_module

TIMEOUT = 60.0  # the job's wall-clock limit
WELL_UNDER = 30.0  # what a job that ends by abort must stay below

CHILD = r'''
import os, signal, sys, threading, time
mode, piddir = sys.argv[1], sys.argv[2]
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
with open(os.path.join(piddir, f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
import jax.numpy as jnp
import jax_sparse_sync as jss
if mode.startswith("hook"):
    jss.mpi.abort_on_error(exit_code=7)
    jss.mpi.abort_on_error(exit_code=7)  # idempotent
MPI.COMM_WORLD.Barrier()             # everyone is up: now rank 1 fails, the others wait
if rank == 1:
    time.sleep(1.0)                  # the others are inside the collective by now
    with open(os.path.join(piddir, "fail_at"), "w") as f:
        f.write(f"{time.time():.3f}")  # a file: MPI_Abort may cut off the forwarded stdout
    print(f"FAIL_AT {time.time():.3f}", flush=True)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hook-thread":
        threading.Thread(target=lambda: 1 / 0, name="worker").start()
        time.sleep(50)               # the thread's hook must abort the job meanwhile
    raise RuntimeError("rank 1 fails on purpose")
print(f"rank {rank} waits in the collective", flush=True)
if mode == "kill":
    jss.mpi.default_comm().Barrier()
else:
    x = jss.sparse_allreduce(jnp.ones(4, jnp.float32), jnp.arange(4, dtype=jnp.int32), size=16)
    x.block_until_ready()
print(f"rank {rank} LEFT THE COLLECTIVE", flush=True)
'''


def _kill_leftovers(piddir: Path, script: Path) -> None:
    """SIGKILL every rank of this job that is still alive (by pid, after checking its cmdline)."""
    for f in piddir.glob("*.pid"):
        pid = int(f.read_text())
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if str(script).encode() in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_job(tmp_path: Path, mode: str, python_args: tuple[str, ...] = ()):
    """Runs CHILD under ``mpiexec -n 3``; returns (exit status, output, seconds, kill-to-end s)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    cmd = [mpiexec(), "-n", "3", sys.executable, *python_args, str(script), mode, str(piddir)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.terminate()  # hydra forwards SIGTERM to the ranks and cleans up
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            pytest.fail(f"mode {mode}: the job still ran after {TIMEOUT} s (a rank hangs)\n"
                        f"{out[-3000:]}")
        end = time.time()
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_leftovers(piddir, script)
    fail_at = piddir / "fail_at"
    after_failure = end - float(fail_at.read_text()) if fail_at.exists() else None
    return proc.returncode, out, elapsed, after_failure


def _check_waited(out: str) -> None:
    # ranks 0 and 2 reached the collective and never got out of it
    assert "rank 0 waits in the collective" in out and "rank 2 waits in the collective" in out, out
    assert "LEFT THE COLLECTIVE" not in out, out


@pytest.mark.parametrize("mode", ["hook", "hook-thread"])
def test_abort_on_error_ends_the_job(tmp_path, mode):
    rc, out, elapsed, after = run_job(tmp_path, mode)
    assert after is not None, f"rank 1 never reached its failure point\n{out[-3000:]}"
    print(f"{mode}: exit {rc}, job ended after {elapsed:.1f} s, {after:.2f} s after rank 1 failed")
    _check_waited(out)
    assert rc == 7, f"exit status {rc} (want abort_on_error's exit_code 7)\n{out[-3000:]}"
    assert elapsed < WELL_UNDER and after < 10, (elapsed, after)
    if mode == "hook":
        assert "RuntimeError: rank 1 fails on purpose" in out, out
        assert "rank 1 of 3: uncaught RuntimeError" in out, out
    else:
        assert "ZeroDivisionError" in out and "in thread 'worker'" in out, out
    assert "MPI_Abort" in out, out


def test_mpi4py_runner_ends_the_job(tmp_path):
    rc, out, elapsed, after = run_job(tmp_path, "plain", ("-m", "mpi4py"))
    print(f"python -m mpi4py: exit {rc}, job ended after {elapsed:.1f} s, {after:.2f} s after "
          "rank 1 failed")
    _check_waited(out)
    assert rc != 0, out[-3000:]
    assert "RuntimeError: rank 1 fails on purpose" in out, out
    assert elapsed < WELL_UNDER and after < 10, (elapsed, after)


def test_sigkilled_rank_ends_the_job(tmp_path):
    # No hook can run in a SIGKILLed process: hydra (mpiexec) must end the others.
    rc, out, elapsed, after = run_job(tmp_path, "kill")
    print(f"SIGKILL: exit {rc}, job ended after {elapsed:.1f} s, {after:.2f} s after rank 1 was "
          "killed")
    _check_waited(out)
    assert rc != 0, out[-3000:]
    assert elapsed < WELL_UNDER and after < 10, (elapsed, after)


# --------------------------------------------------------------------------- #
# The hooks themselves, in this process (MPI_Abort replaced by a recorder)
# --------------------------------------------------------------------------- #
@pytest.fixture
def hooks(monkeypatch):
    """Fresh previous hooks that record their calls, and a recording MPI_Abort."""
    calls = {"previous": [], "previous_thread": [], "abort": []}
    monkeypatch.setattr(sys, "excepthook", lambda *a: calls["previous"].append(a))
    monkeypatch.setattr(threading, "excepthook", lambda a: calls["previous_thread"].append(a))
    monkeypatch.setattr(abort_module, "_abort", lambda comm, code: calls["abort"].append(
        (comm, code)))
    monkeypatch.setitem(abort_module._settings, "comm", None)
    monkeypatch.setitem(abort_module._settings, "exit_code", 1)
    return calls


def test_hook_is_installed_once_and_chains(hooks, capsys):
    previous, previous_thread = sys.excepthook, threading.excepthook
    jss.mpi.abort_on_error()
    first, first_thread = sys.excepthook, threading.excepthook
    assert first is not previous and first.previous is previous
    assert first_thread is not previous_thread and first_thread.previous is previous_thread
    jss.mpi.abort_on_error(exit_code=5)  # idempotent: the same hooks, new exit code
    assert sys.excepthook is first and threading.excepthook is first_thread

    try:
        raise ValueError("boom")
    except ValueError as e:
        info = (type(e), e, e.__traceback__)
    sys.excepthook(*info)
    assert hooks["previous"] == [info]  # chained exactly once: the traceback is still printed
    assert hooks["abort"] == [(MPI.COMM_WORLD, 5)]
    err = capsys.readouterr().err
    assert f"rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}" in err, err
    assert "ValueError: boom" in err and "MPI_Abort" in err, err

    thread = threading.Thread(target=lambda: None, name="worker")
    args = threading.ExceptHookArgs([ZeroDivisionError, ZeroDivisionError("z"), None, thread])
    threading.excepthook(args)
    assert hooks["previous_thread"] == [args]
    assert hooks["abort"][-1] == (MPI.COMM_WORLD, 5) and len(hooks["abort"]) == 2
    assert "in thread 'worker'" in capsys.readouterr().err

    # SystemExit in a thread is ignored by Python, and so by the hook
    exit_args = threading.ExceptHookArgs([SystemExit, SystemExit(0), None, thread])
    threading.excepthook(exit_args)
    assert hooks["previous_thread"][-1] is exit_args and len(hooks["abort"]) == 2


def test_hook_aborts_the_given_comm(hooks):
    comm = jss.mpi.default_comm()
    jss.mpi.abort_on_error(comm=comm, exit_code=3)
    sys.excepthook(RuntimeError, RuntimeError("x"), None)
    assert hooks["abort"] == [(comm, 3)]


def test_hook_reinstalls_after_the_hooks_were_restored(hooks):
    original = sys.excepthook
    jss.mpi.abort_on_error()
    assert sys.excepthook is not original
    sys.excepthook = original  # e.g. a framework restored its own hook
    jss.mpi.abort_on_error()
    assert sys.excepthook.previous is original


def test_bad_arguments(hooks):
    with pytest.raises(TypeError, match="mpi4py communicator"):
        jss.mpi.abort_on_error(comm=jss.axis("data"))
    with pytest.raises(TypeError, match="exit_code"):
        jss.mpi.abort_on_error(exit_code="1")


def test_real_abort_in_a_world_of_one(tmp_path):
    # No monkeypatching: a plain python process (a world of one rank) with a
    # previous hook of its own; the hook must chain to it once and MPI_Abort
    # must end the process with the exit code.
    script = tmp_path / "one.py"
    script.write_text(
        "import sys\n"
        "sys.excepthook = lambda t, v, tb: print('PREVIOUS HOOK', t.__name__, v, flush=True)\n"
        "import jax_sparse_sync as jss\n"
        "jss.mpi.abort_on_error(exit_code=5)\n"
        "jss.mpi.abort_on_error(exit_code=5)\n"
        "jss.mpi.default_comm()\n"
        "raise KeyError('gone')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          check=False, text=True, timeout=TIMEOUT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out
    assert out.count("PREVIOUS HOOK KeyError 'gone'") == 1, out
    assert "rank 0 of 1" in out, out
