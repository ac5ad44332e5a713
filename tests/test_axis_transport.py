"""The JAX-collective transport (comm=jss.axis(...)) under shard_map and pmap.

JAX fixes the number of host CPU devices when it starts, so everything here
runs in subprocesses with XLA_FLAGS set first (like test_multirank.py does for
MPI):

1. ``mpiexec -n P tests/axis/mpi_results.py`` for P = 3 and 8: the MPI
   transport's results on the shared inputs of tests/axis/common.py;
2. ``pytest tests/axis/axis_cases.py tests/axis/axis_oktopk_block_cases.py``
   in one process with 8 host devices: every algorithm (Ok-Topk and
   block-sparse included) against the NumPy reference and the MPI results,
   bitwise identity across devices, byte counts, the capacity fallbacks,
   errors, check_vma, pmap, and topk_sync / dense_sync / oktopk_sync /
   block_sync in shard_map-ped and pmap-ped train steps; chunked_topk_sync's
   steps against its NumPy reference (axis_chunked_topk_cases.py);
3. ``tests/axis/multiprocess.py`` as 2 processes x 4 CPU devices with
   ``jax.distributed`` (coordinator 127.0.0.1): every collective the algorithms
   use (Ok-Topk and block-sparse included) and a topk_sync step across process
   boundaries.
"""

import os
import re
import socket
import subprocess
import sys

import pytest
from shared_directory import shared_directory
from test_multirank import ROOT, run_under_mpiexec, with_fast_emitters



def _axis_common():
    """tests/axis/common.py (loaded by path: "common" is no package name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_axis_common", os.path.join(os.path.dirname(os.path.abspath(__file__)), "axis",
                                     "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


AXIS_CASE_ALGORITHMS = _axis_common().ALGORITHMS
CROSS_PROCESS_ALGORITHMS = _axis_common().CROSS_PROCESS_ALGORITHMS

HERE = os.path.dirname(os.path.abspath(__file__))
MPI_SIZES = (3, 8)


def env_with_devices(n: int, fast_emitters: bool = False, **extra) -> dict:
    """A CPU JAX process's environment with `n` host devices (and XLA's fast fusion
    emitters where `fast_emitters`: tests/test_multirank.py, FAST_EMITTER_FLAG)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **extra)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    return with_fast_emitters(env) if fast_emitters else env


@pytest.fixture(scope="module")
def mpi_results_dir(tmp_path_factory):
    def produce(out):
        for p in MPI_SIZES:
            proc = run_under_mpiexec(p, [os.path.join(HERE, "axis", "mpi_results.py"),
                                         str(out / f"mpi{p}.npz")], timeout=600,
                                     fast_emitters=True)  # as the axis processes compile
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
            assert (out / f"mpi{p}.npz").exists()

    return shared_directory(tmp_path_factory, "axis_mpi", produce)


# One process per file, so that parallel workers run them side by side (diloco_cases.py:
# jss.diloco's outer steps on the axis, ~25 s)
@pytest.mark.parametrize("cases", ["axis_cases.py", "axis_oktopk_block_cases.py",
                                   "diloco_cases.py", "axis_chunked_topk_cases.py"])
def test_axis_cases_on_eight_host_devices(mpi_results_dir, cases):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=300",
           "--timeout-method=thread", os.path.join("tests", "axis", cases)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                              env=env_with_devices(8, fast_emitters=True,
                                                   JSS_AXIS_MPI_DIR=str(mpi_results_dir)))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"axis cases timed out (deadlock?)\n{str(e.stdout)[-4000:]}")
    tail = (proc.stdout + proc.stderr)[-8000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "failed" not in proc.stdout and "skipped" not in \
        proc.stdout, tail


def test_two_processes_of_four_devices_with_jax_distributed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = os.path.join(HERE, "axis", "multiprocess.py")
    procs = [subprocess.Popen([sys.executable, script, str(i), "2", str(port), "4"], cwd=ROOT,
                              env=env_with_devices(4, fast_emitters=True), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=600)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("jax.distributed job timed out (deadlock?)")
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"process {i}:\n{out[-4000:]}"
        # one line per cross-process algorithm (tests/axis/common.py), then Ok-Topk,
        # block-sparse and topk_sync
        assert out.count(f"OK process {i}:") == len(CROSS_PROCESS_ALGORITHMS) + 3, out[-4000:]
        assert "over 8 devices in 2 processes" in out
