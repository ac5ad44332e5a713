"""The device-resident sparse exchange's protocol, checked where there is no GPU.

The CUDA module's sparse allreduce (ffi/cuda/device_exchange_cuda.cu) runs the protocol
of ffi/collectives/device_exchange.h: the input checked and compacted on the device,
one O(k) copy to pinned memory, MPI between pinned buffers, the peers' runs copied
back once and summed on the device in rank order. ``JSS_TEST_DEVICE_PROTOCOL=compare``
makes the CPU handler run that same protocol through host stand-ins of the copies and
kernels (ffi/collectives/device_exchange_host.h, the kernels' per-slot and per-entry
functions called in loops) and then the CPU path, failing the call unless both
outputs and statistics are equal bit for bit. Here at 2 ranks (tests/test_multirank.py's
seam job runs it at 3, with the whole sparse allreduce file), and at 1 rank in this
process's own world (where nothing leaves the "device" on the allgather path).
"""

import pytest

from test_multirank import run_under_mpiexec

CASE = "tests/mpi/device_protocol_case.py"


# At one rank only the allgather cases (its path keeps every entry on the "device"; the
# other algorithms' host path is the same at one rank as at two): one program to compile.
@pytest.mark.parametrize("nranks,select",
                         [(1, "equals_the_cpu_path and allgather and not split"), (2, "")])
def test_device_protocol_equals_the_cpu_path_bit_for_bit(nranks, select):
    proc = run_under_mpiexec(
        nranks,
        ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=120",
         "--timeout-method=thread", CASE, *(["-k", select] if select else [])],
        timeout=300, extra_env={"JSS_TEST_DEVICE_PROTOCOL": "compare"},
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nranks} failed:\n{tail}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail
    assert "skipped" not in proc.stdout, tail  # the case file ran under the seam
