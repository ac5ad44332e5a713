"""kernels/dense_fill.h's zero_fill (the dense output's fill) against its definition.

tests/cpp/dense_fill.cc zeroes buffers on both sides of the streaming threshold at
every 4-byte start offset of a 16-byte line and checks every word, guards included.
Built with the streaming (SSE2) path and with -DJSS_NO_SIMD (std::fill), which the
sparse allreduce's tests at their small sizes would not reach.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "cpp", "dense_fill.cc")
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("flags", [[], ["-DJSS_NO_SIMD"]], ids=["streaming", "plain"])
def test_zero_fill_writes_exactly_its_range(tmp_path, flags):
    binary = tmp_path / "dense_fill"
    build = subprocess.run([CXX, "-std=c++17", "-O2", *flags, "-I", ROOT, SOURCE, "-o",
                            str(binary)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cases 52 bad 0" in run.stdout
