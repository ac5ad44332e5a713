"""The fuzz targets' committed inputs (seeds and every past finding) replayed once.

fuzz/ holds libFuzzer targets over the real C++ collectives, linked with a fake
MPI whose peers are the fuzzer (fuzz/fake_mpi.h); fuzz/corpus/<target>/ holds
their seeds and, named regression-*, each input that crashed the library before
its fix (a corrupted or truncated peer message that wrote out of bounds). The
targets are built with clang (libFuzzer, ASan, UBSan) by `bash scripts/fuzz.sh
build`; this test runs where that build exists (CI builds it when clang is
installed) and is skipped otherwise.
"""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["fuzz_sparse_stream", "fuzz_sparse_allreduce", "fuzz_oktopk", "fuzz_block_dense"]


def test_every_target_has_a_corpus_and_the_findings_are_kept():
    for target in TARGETS:
        assert os.path.exists(os.path.join(ROOT, "fuzz", f"{target}.cc"))
        assert os.listdir(os.path.join(ROOT, "fuzz", "corpus", target)), target
    kept = [f for t in TARGETS for f in os.listdir(os.path.join(ROOT, "fuzz", "corpus", t))
            if f.startswith("regression-")]
    assert len(kept) >= 13  # the findings on the collectives (docs/topics/test_suite.md)


@pytest.mark.parametrize("target", TARGETS)
def test_committed_inputs_run_clean_under_asan_and_ubsan(target):
    binary = os.path.join(ROOT, "build", "fuzz", target)
    if not os.path.exists(binary):
        pytest.skip("fuzz build absent: `bash scripts/fuzz.sh build` (needs clang with libFuzzer)")
    corpus = os.path.join(ROOT, "fuzz", "corpus", target)
    run = subprocess.run([binary, "-runs=0", corpus], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "INITED" in run.stderr and "Done" in run.stderr, run.stderr[-3000:]
