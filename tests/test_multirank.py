"""Runs the multi-rank suite (tests/mpi) under ``mpiexec -n N``.

Each run has a wall-clock limit and each test inside it a per-test timeout that
kills the rank (and with it the job), so a deadlock fails in seconds instead of
hanging CI. The same files also run in this process as a world of one rank.
"""

import os
import shutil
import signal
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


# MPICH's progress throttle: where the ranks outnumber the cores, a rank waiting in a
# collective (or in the outcome agreement of tests/mpi/conftest.py) polls less often
# instead of spinning on a core that a rank still compiling or computing needs. Only the
# waiting changes, never a message or a result. The heavy yield (tests/conftest.py's
# CONTENDED_MPI_ENV, set for the whole session) is turned off where 4 or more ranks run
# tests/mpi/test_nonblocking_mpi.py: with it, measured at P = 5 and 8 on 2 cores, 20
# non-blocking starts behind a late rank took 0.9-4.8 s instead of returning at once
# (test_starts_beyond_the_slots_do_not_wait_for_a_late_rank), which the suite must catch
# (at P = 3 and 4 with it: 8-10 s for the file, every run passed).
OVERSUBSCRIBED_ENV = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"}

#: XLA's elemental IR emitter for fusions instead of its MLIR fusion emitters, in the jobs
#: of the multi-rank suite and the 8-device processes (``with_fast_emitters``; on top of
#: tests/conftest.py's FAST_COMPILE_FLAG): most of what was left of a compile. One 8-device
#: Ok-Topk program of tests/axis/axis_oktopk_block_cases.py took 6.5-7.0 s of backend compile
#: with them and 2.7-3.0 s without, its P = 3 twin 5.0 -> 2.0 s (XLA's HLO passes: 0.7 s
#: of it, by TF_CPP_VMODULE=hlo_pass_pipeline=1). Measured over the suite, one run after
#: the other with the flag everywhere: test_mpi_suite[3] 242 -> 111 s, the two 8-device
#: axis processes 166 / 157 -> 58 / 53 s, the whole suite 1018 -> 693 s. Not in the
#: suite's own processes nor sharded_sync's MPI file (DEFAULT_EMITTERS): with it the
#: grouped steps' buffers (tests/test_grouped_phases.py's in-place checks) and one of
#: sharded_sync's results against its single-process reference (bit for bit, another
#: program) came out differently. Like the compile level it can move the last bits of
#: XLA's own float results; every other comparison in these jobs is between ranks or
#: devices running one program, or against NumPy with a tolerance.
FAST_EMITTER_FLAG = "--xla_cpu_use_fusion_emitters=false"


def with_fast_emitters(env: dict) -> dict:
    """``env`` with FAST_EMITTER_FLAG in ``XLA_FLAGS`` (not where JSS_TEST_FAST_COMPILE=0
    or ``XLA_FLAGS`` chooses the emitters itself)."""
    flags = env.get("XLA_FLAGS", "")
    if env.get("JSS_TEST_FAST_COMPILE", "1") != "0" and "use_fusion_emitters" not in flags:
        env["XLA_FLAGS"] = f"{flags} {FAST_EMITTER_FLAG}".strip()
    return env


def mpi_env(nranks: int, heavy_yield: bool = True, fast_emitters: bool = False,
            **extra) -> dict:
    """The ranks' environment: CPU JAX, unbuffered output, throttled polling past the cores
    (and MPICH's heavy yield, as the session sets it, unless `heavy_yield` is False; XLA's
    fast fusion emitters where `fast_emitters`)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    if fast_emitters:
        with_fast_emitters(env)
    if nranks > (os.cpu_count() or 1):
        env.update(OVERSUBSCRIBED_ENV)
    if not heavy_yield:
        env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "0"
    env.update(extra)
    return env


def run_under_mpiexec(nranks: int, args: list[str], timeout: float,
                      extra_env: dict | None = None, heavy_yield: bool = True,
                      fast_emitters: bool = False) -> subprocess.CompletedProcess:
    """Runs ``mpiexec -n nranks python ARGS``; past `timeout` seconds the test fails.

    The job runs in its own session (process group), and on a timeout the whole
    group is ended (SIGTERM, then SIGKILL), the ranks included, as
    tests/test_mpi_abort.py and benchmarks/_harness.py end theirs: nothing of the
    job outlives the test, whatever mpiexec does with its ranks when it is killed.
    """
    env = mpi_env(nranks, heavy_yield, fast_emitters, **(extra_env or {}))
    cmd = [mpiexec(), "-n", str(nranks), sys.executable, *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):  # hydra forwards SIGTERM to the ranks
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        pytest.fail(f"mpiexec -n {nranks} timed out after {timeout}s (deadlock?)\n"
                    f"{(out + err)[-4000:]}")
    finally:
        if proc.poll() is None:  # a failure above, not the timeout: end the group too
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# The collectives (every algorithm's rank arithmetic: pairs, rounds, remainders of
# non-powers of two) run at 2, 3, 4 and 8 ranks: one round and several (recursive
# doubling, the split ranges), the fold of a non-power of two (3 = 2 + 1), and the
# paths only past 4 ranks (Ok-Topk's balancing step: largest region over 4x the mean)
# at 8. 5 ranks took 36 s of the suite on two cores and reached no code that 3 and 8
# do not: its fold is 3's (one extra rank, 4 + 1), its rounds 4's, its balancing 8's
# (the axis transport runs recursive doubling and split ranges at 6 devices, a fold of
# two). The transforms built on them (training steps against NumPy, checkpoints,
# grouping, calibration, wire formats) at 3 ranks: their own code is rank-count
# independent (every P in their tests is P == 1 against P > 1; P enters as a divisor,
# inexact at 3, where replicas that rounded differently would show) and the collectives
# they call run at every count here. At 2 ranks (the most common job) the same
# transforms train end to end in the examples' two-rank runs, replicas compared bit for
# bit (test_example.py, test_convergence_examples.py: topk_sync, adam_direction_sync,
# momentum masking, warm-up, flushes, shared support, block sync; test_reshard.py
# restores at 2), so the files are not run a second time at 2 (about 100 CPU-s of CI's
# time). 4 ranks took 2.4x the CPU seconds of 2 (228 against 96 s, these files) on CI's
# 2 cores. 8 ranks oversubscribe CI's 2
# cores 4x: the collectives that have a path only past 4 ranks or more rounds there
# (the sparse algorithms and Ok-Topk); the non-blocking starts, the block and the dense
# allreduce have none (their rank arithmetic is the sparse algorithms' at 2, 3 and 4:
# pairs, the fold, the split ranges) and took 93 of the 301 CPU-s of the 8 ranks.
COLLECTIVES = ["tests/mpi/test_sparse_allreduce_mpi.py", "tests/mpi/test_nonblocking_mpi.py",
               "tests/mpi/test_oktopk_mpi.py", "tests/mpi/test_block_allreduce_mpi.py",
               "tests/mpi/test_dense_allreduce_mpi.py"]
TRANSFORMS = ["tests/mpi/test_topk_sync_mpi.py", "tests/mpi/test_oktopk_sync_mpi.py",
              "tests/mpi/test_shared_support_sync_mpi.py",
              "tests/mpi/test_grouped_sync_mpi.py", "tests/mpi/test_grouped_phases_mpi.py",
              "tests/mpi/test_adam_direction_sync_mpi.py",
              # sharded state: its reduce to the owners and gather at 3 (2: the restore
              # job of tests/test_sharded_sync.py, bit for bit the reference at P = 2)
              "tests/mpi/test_sharded_sync_mpi.py",
              "tests/mpi/test_calibration_mpi.py",
              # the watchdog's bookkeeping is rank-count independent: at 2 and 3 like these
              "tests/mpi/test_watchdog_mpi.py",
              # the wire formats reuse the algorithms' rank arithmetic (covered above at
              # every count): at one odd count (recursive doubling's fold) and a power of two
              "tests/mpi/test_wire_format_mpi.py",
              # DiLoCo's outer steps over dense_sync / topk_sync (replicas, bytes, resume)
              "tests/mpi/test_diloco_mpi.py"]
PAST_FOUR_RANKS = ["tests/mpi/test_sparse_allreduce_mpi.py", "tests/mpi/test_oktopk_mpi.py"]
# what recovery from an MPI error asks of the ranks (communicators handed over in an
# order of each rank's own): at 2 ranks and at an odd count
RECOVERY = ["tests/mpi/test_mpi_error_recovery_mpi.py"]
# chunked_topk_sync brings its own collective (an allgather of fixed-size byte payloads,
# ffi/collectives/allgather_bytes.cc): its transform file runs at 2 ranks and at an odd
# count, where the division by P is inexact
BYTE_ALLGATHER = ["tests/mpi/test_chunked_topk_sync_mpi.py"]
NONBLOCKING = "tests/mpi/test_nonblocking_mpi.py"
# sharded_sync's file compares its results bit for bit with a single-process reference,
# another program: its own job, with XLA's default fusion emitters (FAST_EMITTER_FLAG)
DEFAULT_EMITTERS = ["tests/mpi/test_sharded_sync_mpi.py"]
SUITES = {n: COLLECTIVES + RECOVERY + BYTE_ALLGATHER
          + ([f for f in TRANSFORMS if f not in DEFAULT_EMITTERS] if n == 3 else [])
          for n in (2, 3)}
# The non-blocking file's own code (slots, worker threads, deferred checks) is
# rank-count independent and the algorithms it starts run at 4 in the sparse file;
# without it the 4 ranks can use the heavy yield (see OVERSUBSCRIBED_ENV's comment).
SUITES[4] = [f for f in COLLECTIVES if f != NONBLOCKING]
SUITES[8] = PAST_FOUR_RANKS


def test_every_mpi_test_file_runs_under_mpiexec():
    # a new file in tests/mpi must be put in one of the lists above
    files = sorted(f"tests/mpi/{f}" for f in os.listdir(os.path.join(HERE, "mpi"))
                   if f.startswith("test_") and f.endswith(".py"))
    assert sorted(COLLECTIVES + TRANSFORMS + RECOVERY + BYTE_ALLGATHER) == files


def run_files(nranks: int, files: list[str], fast_emitters: bool) -> None:
    """``pytest files`` under ``mpiexec -n nranks``; fails with the job's output."""
    proc = run_under_mpiexec(
        nranks,
        ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=120",
         "--timeout-method=thread", *files],
        timeout=900, fast_emitters=fast_emitters,
        heavy_yield=nranks < 4 or NONBLOCKING not in files,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nranks} failed:\n{tail}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail


@pytest.mark.parametrize("nranks", sorted(SUITES))
def test_mpi_suite(nranks):
    run_files(nranks, SUITES[nranks], fast_emitters=True)


@pytest.mark.parametrize("nranks", [3])
def test_mpi_files_with_default_emitters(nranks):
    run_files(nranks, DEFAULT_EMITTERS, fast_emitters=False)


@pytest.mark.parametrize("nranks", [3])
def test_sparse_results_given_as_entries_match_bit_for_bit(nranks):
    # The CUDA handlers take a sparse result as its entries and write them on the
    # device (ffi/cuda/mpi_cuda.cc); JSS_TEST_SPARSE_RESULT=1 makes the CPU handlers take
    # the same path (entries, then zeros and stores), so every algorithm's entries,
    # Ok-Topk's included, are checked against the reference here, where CI runs.
    # JSS_TEST_DEVICE_PROTOCOL=compare: the CUDA sparse allreduce's device-resident
    # exchange (ffi/collectives/device_exchange.h) through its host stand-ins, each call
    # then compared bit for bit with the CPU path's (every pattern and error of the file;
    # tests/mpi/device_protocol_case.py adds the rounding cases, as at 2 ranks in
    # tests/test_device_protocol.py).
    proc = run_under_mpiexec(
        nranks,
        ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=120",
         "--timeout-method=thread", "tests/mpi/test_sparse_allreduce_mpi.py",
         "tests/mpi/test_oktopk_mpi.py", "tests/mpi/device_protocol_case.py"],
        timeout=600, extra_env={"JSS_TEST_SPARSE_RESULT": "1",
                                "JSS_TEST_DEVICE_PROTOCOL": "compare"}, fast_emitters=True,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nranks} failed:\n{tail}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail


@pytest.mark.parametrize("nranks", [3])
def test_a_test_failing_on_one_rank_fails_on_every_rank_instead_of_hanging(nranks, tmp_path):
    # tests/mpi/conftest.py agrees on every test's outcome; without it the ranks that
    # passed would wait in the next test's barrier until the per-test timeout (30 s
    # here, which kills the job: "Timeout" in its output). Each rank writes its own
    # report ($PMI_RANK, expanded by pytest): the ranks' terminal output interleaves.
    proc = run_under_mpiexec(
        nranks,
        ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=30",
         "--timeout-method=thread", f"--junitxml={tmp_path}/rank$PMI_RANK.xml",
         "tests/mpi/one_rank_fails_case.py"],
        timeout=120,
    )
    out = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode != 0, out
    assert "Timeout" not in out, out
    import xml.etree.ElementTree as ET
    for rank in range(nranks):
        cases = list(ET.parse(tmp_path / f"rank{rank}.xml").getroot().iter("testcase"))
        # -x stopped every rank at the planted failure: the barrier test never ran
        assert [c.get("name") for c in cases] == ["test_fails_on_the_last_rank_only"], rank
        failure = cases[0].find("failure")
        assert failure is not None, (rank, "the test passed here")
        message = failure.get("message")
        # every rank names the failing rank and what failed there
        assert "planted failure" in message, (rank, message)
        if rank != nranks - 1:
            assert f"call failed on rank(s) [{nranks - 1}]" in message, message
            assert f"rank {nranks - 1}: AssertionError: planted failure" in message, message


def test_an_mpi_error_mid_exchange_leaves_no_receive_pending(tmp_path):
    # tests/mpi/pending_request_case.py at P = 3: an LD_PRELOAD shim fails every rank's
    # MPI_Isend of one exchange (the argument check, the counts, each algorithm's data
    # messages, a non-blocking operation's) after the call posted its receives; the call
    # must raise and cancel them, or the next call's message matches one and the next
    # call hangs (seen for every case without the cancel: the timeout). Then a failure
    # after a send was posted, whose message (eager or above the eager size) reaches a
    # rank that already gave up: the calls after it, on new data, must still return the
    # NumPy sum (without jss.mpi.reset_after_mpi_error's fresh communicator: a wrong
    # sum on rank 0), and rank 0 must find that message waiting on the retired
    # communicator (or, where its receive took it first, the case fails again)
    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if not os.path.exists(mpicc):
        pytest.skip("no mpicc next to this Python (the `mpich` wheel's) to build the shim")
    shim = str(tmp_path / "libfail_isend.so")
    subprocess.run([mpicc, "-shared", "-fPIC", "-O1", "-o", shim,
                    os.path.join(HERE, "mpi", "fail_isend_shim.c")], check=True, timeout=120)
    proc = run_under_mpiexec(3, ["-m", "mpi4py", "tests/mpi/pending_request_case.py"],
                             timeout=300, extra_env={"LD_PRELOAD": shim})
    out = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0 and "PENDING OK" in proc.stdout, out
