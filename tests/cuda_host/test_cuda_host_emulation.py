"""Host emulation of the CUDA kernels against the CPU kernels, without a GPU.

tests/cuda_host/emulate_kernels.cu runs the CUDA kernels' __host__ __device__
pieces (digit plan, k-th-bin search, per-thread compaction, threshold key, float
conversions, QSGD codes) in the kernels' thread/tile arrangement and compares
every result bit for bit with the CPU kernels in kernels/*.h. It needs nvcc
(not a GPU); the test is skipped where nvcc is missing.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "cuda_host", "emulate_kernels.cu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
def test_cuda_kernel_emulation_matches_cpu_kernels(tmp_path):
    binary = tmp_path / "emulate_kernels"
    build = subprocess.run(
        ["nvcc", "-std=c++17", "-O1", "-diag-suppress", "1675", "-I", ROOT, SOURCE, "-o",
         str(binary)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith(" 0 failures"), run.stdout
