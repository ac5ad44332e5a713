"""The device-resident exchange's kernels, emulated on the host against the CPU path.

tests/cuda_host/emulate_exchange.cu runs the per-slot and per-entry functions of the
exchange's kernels (ffi/collectives/exchange_steps.h) in the kernels' grid-stride
arrangement with shuffled thread orders and emulated atomics, and compares the slot
report, the compacted and rounded entries, the rank-order sums with their nonzero count,
the first faulty peer entry and the wire rounding bit for bit with the CPU path's code
(prepare_call's scan, stream_from_coo, round_entries, the allgather's loop,
check_peer_entries, round_to_wire). Compiled with nvcc; skipped where nvcc is missing.
"""

import os
import shutil
import subprocess

import jax.ffi
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "cuda_host", "emulate_exchange.cu")
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_exchange_kernels_emulated_match_the_cpu_path(tmp_path):
    binary = tmp_path / "emulate_exchange"
    build = subprocess.run(
        [NVCC, "-std=c++17", "-O1", "-I", ROOT, "-isystem", jax.ffi.include_dir(), SOURCE,
         "-o", str(binary)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith(" 0 failures"), run.stdout
