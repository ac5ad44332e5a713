"""The fuzz targets' committed inputs (seeds and every past finding) replayed once.

fuzz/ holds libFuzzer targets over the real C++ collectives, linked with a fake
MPI whose peers are the fuzzer (fuzz/fake_mpi.h); fuzz/corpus/<target>/ holds
their seeds and, named regression-*, each input that crashed the library before
its fix (a corrupted or truncated peer message that wrote out of bounds). The
targets are built with clang (libFuzzer, ASan, UBSan) by `bash scripts/fuzz.sh
build`, which these tests run first wherever a clang++ is installed (scripts/setup.sh
installs clang-19 as root; the build is incremental and locked, so CI's own build
before pytest makes it a no-op). Without clang they use an existing build, else skip.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["fuzz_sparse_stream", "fuzz_sparse_allreduce", "fuzz_oktopk", "fuzz_block_dense"]
CLANGS = ["clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15"]


@pytest.fixture(scope="module")
def fuzz_build():
    """build/fuzz/, built from this tree when a clang is installed."""
    out = os.path.join(ROOT, "build", "fuzz")
    if any(shutil.which(c) for c in CLANGS):
        run = subprocess.run(["bash", "scripts/fuzz.sh", "build"], cwd=ROOT, capture_output=True,
                             text=True, timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    elif not all(os.path.exists(os.path.join(out, t)) for t in TARGETS):
        pytest.skip("no clang++ and no fuzz build: `bash scripts/fuzz.sh install` (root) "
                    "and `bash scripts/fuzz.sh build`")
    return out


def test_every_target_has_a_corpus_and_the_findings_are_kept():
    for target in TARGETS:
        assert os.path.exists(os.path.join(ROOT, "fuzz", f"{target}.cc"))
        assert os.listdir(os.path.join(ROOT, "fuzz", "corpus", target)), target
    kept = [f for t in TARGETS for f in os.listdir(os.path.join(ROOT, "fuzz", "corpus", t))
            if f.startswith("regression-")]
    assert len(kept) >= 13  # the findings on the collectives (docs/topics/test_suite.md)


@pytest.mark.parametrize("target", TARGETS)
def test_committed_inputs_run_clean_under_asan_and_ubsan(fuzz_build, target):
    binary = os.path.join(fuzz_build, target)
    corpus = os.path.join(ROOT, "fuzz", "corpus", target)
    run = subprocess.run([binary, "-runs=0", corpus], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "INITED" in run.stderr and "Done" in run.stderr, run.stderr[-3000:]


def test_the_record_reads_the_sanitizers_from_the_build_and_names_its_command(fuzz_build,
                                                                              tmp_path):
    """`fuzz.sh measure` writes the record alone: the command as run, and sanitizers
    probed in the binaries and objects (a target built without UBSan would lose
    "undefined"), not a constant."""
    out = tmp_path / "fuzz_runs.json"
    env = {**os.environ, "JSS_FUZZ_TARGETS": "fuzz_sparse_stream", "JSS_FUZZ_RECORD": str(out)}
    run = subprocess.run(["bash", "scripts/fuzz.sh", "measure", "300", "1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["machine"]["command"] == (
        f"JSS_FUZZ_TARGETS='fuzz_sparse_stream' JSS_FUZZ_RECORD='{out}' "
        "bash scripts/fuzz.sh measure 300 1")
    [only] = record["runs"]
    assert only["target"] == "fuzz_sparse_stream" and only["executions"] >= 300
    assert only["sanitizers"] == ["address", "undefined", "fuzzer"]
    assert "-fsanitize=address,undefined" in record["build"]["command"]
    assert "clang" in record["build"]["compiler"]
    # the probe itself: an object built without sanitizers is seen as such
    plain = tmp_path / "plain.o"
    (tmp_path / "plain.cc").write_text("int twice(int x) { return 2 * x; }\n")
    cxx = next(shutil.which(c) for c in CLANGS if shutil.which(c)) if any(
        shutil.which(c) for c in CLANGS) else pytest.skip("no clang++ to build a plain object")
    subprocess.run([cxx, "-c", str(tmp_path / "plain.cc"), "-o", str(plain)], check=True)
    sys.path.insert(0, os.path.join(ROOT, "fuzz"))
    try:
        import record_runs
    finally:
        sys.path.pop(0)
    binary = os.path.join(fuzz_build, "fuzz_sparse_stream")
    assert record_runs.sanitizers_of(binary, [plain]) == []
