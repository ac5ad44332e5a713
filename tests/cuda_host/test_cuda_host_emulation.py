"""The CUDA kernels' logic against the CPU kernels, bit for bit; with nvcc, no GPU needed.

tests/cuda_host/emulate_kernels.cu runs the CUDA kernels' __host__ __device__
pieces (digit plan, k-th-bin search, per-thread compaction, threshold predicate
and bounded writer, float conversions, QSGD codes, scatter-add sort keys, and the
fused accumulator and Adam passes' per-entry arithmetic, leaf walk, hint list and
its decision: tests/cuda_host/fused_checks.cuh) in the kernels' thread/tile
arrangement and compares every result bit for bit with the CPU kernels in
kernels/*.h. Skipped where nvcc is missing.

On a machine with a GPU the same checks also run the real CUDA launchers
(built with -DJSS_DEVICE_RUN, run with --device): the kernels without JAX/XLA.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "cuda_host", "emulate_kernels.cu")
NVCC = shutil.which("nvcc")


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    probe = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return probe.returncode == 0 and "GPU" in probe.stdout


def _build_and_run(tmp_path, extra_flags, run_args):
    binary = tmp_path / "emulate_kernels"
    build = subprocess.run(
        [NVCC, "-std=c++17", "-O1", "-diag-suppress", "1675", *extra_flags, "-I", ROOT, SOURCE,
         "-o", str(binary)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(binary), *run_args], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith(" 0 failures"), run.stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_cuda_kernel_emulation_matches_cpu_kernels(tmp_path):
    _build_and_run(tmp_path, [], [])


@pytest.mark.skipif(NVCC is None or not _has_gpu(), reason="needs nvcc and a GPU")
def test_cuda_kernels_on_the_gpu_match_cpu_kernels(tmp_path):
    _build_and_run(tmp_path, ["-arch=native", "-DJSS_DEVICE_RUN"], ["--device"])
