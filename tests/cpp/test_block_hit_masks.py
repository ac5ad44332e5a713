"""The CPU kernels' SIMD hit masks against their definition, SIMD and plain builds.

tests/cpp/block_hit_masks.cc checks kernels/topk_select.h's block_hits_at_least
and block_hits_in (used by topk, threshold_select, kth_magnitude and bucket_topk)
entry by entry on random blocks of each key width. It is built with the SSE2
path and with -DJSS_NO_SIMD, the plain loops that CPUs without SSE2 compile,
which this machine would otherwise never run.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "cpp", "block_hit_masks.cc")
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("flags", [[], ["-DJSS_NO_SIMD"]], ids=["simd", "plain"])
def test_block_hit_masks_match_their_definition(tmp_path, flags):
    binary = tmp_path / "block_hit_masks"
    build = subprocess.run([CXX, "-std=c++17", "-O2", *flags, "-I", ROOT, SOURCE, "-o", str(binary)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "float32 0 bfloat16 0 float16 0" in run.stdout
