"""The README's main job, shortened: examples/train_flax.py under mpiexec -n 2."""

import json
import os
import re

import pytest
from test_multirank import run_under_mpiexec


def test_train_flax_two_ranks(tmp_path):
    out = tmp_path / "metrics.json"
    proc = run_under_mpiexec(
        2, [os.path.join("examples", "train_flax.py"), "--epochs", "3", "--no-check",
            "--json", str(out)], timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]  # non-zero if replicas differ
    assert log.count("parameters bitwise identical on all ranks: yes") == 2, log[-4000:]
    metrics = json.loads(out.read_text())
    for mode in ("dense", "sparse"):
        losses = [epoch["train_loss"] for epoch in metrics["history"][mode]]
        assert losses[-1] < 0.6 * losses[0], (mode, losses)
    summary = metrics["summary"]
    # 1% density: ~49x fewer bytes than the dense allreduce at P = 2
    assert summary["bytes_ratio"] > 20, summary
    assert summary["dense_accuracy"] > 80, summary
    # the measured times say where they were measured, the projection that it is one
    assert "measured on this job's MPI transport" in log, log[-4000:]
    assert "NOT a measurement" in log, log[-4000:]
    projection = summary["projection"]
    one, ten = projection["links"]
    assert (one["link_mbit"], ten["link_mbit"]) == (1000.0, 10000.0), projection
    for row in (one, ten):  # the cost model's step: compute + local work + wire
        assert row["dense_ms"] == pytest.approx(
            projection["compute_ms"] + projection["dense_local_ms"] + row["dense_wire_ms"])
        assert row["sparse_ms"] == pytest.approx(
            projection["compute_ms"] + projection["sparse_local_ms"] + row["sparse_wire_ms"])
        assert row["sparse_wire_ms"] < row["dense_wire_ms"] / 5, row  # k = N / 100
    # 153 kB a step at P = 2: ten times the rate, a tenth of the bytes' time (the
    # latency of the messages stays)
    assert 5 < one["dense_wire_ms"] / ten["dense_wire_ms"] < 10, projection
    assert projection["compute_ms"] > 0, projection


def test_train_flax_link_asks_for_one_process():
    # --link starts its own ranks on the emulated network: inside mpiexec it says how to run it
    proc = run_under_mpiexec(2, [os.path.join("examples", "train_flax.py"), "--link", "1000"],
                             timeout=120)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2, log[-4000:]
    assert "--link starts its own --procs ranks" in log and "without mpiexec" in log, log[-4000:]


def test_embedding_block_sync_two_ranks():
    proc = run_under_mpiexec(
        2, [os.path.join("examples", "embedding_block_sync.py"), "--steps", "15",
            "--vocab", "5000"], timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]  # identical replicas, same as dense, fewer bytes
    assert "block replicas bitwise identical on all ranks: yes" in log


def test_readme_quick_start_is_examples_quickstart():
    # the README shows the file the test below runs, verbatim
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    script = open(os.path.join(root, "examples", "quickstart.py"), encoding="utf-8").read()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == script
    assert len(script.splitlines()) <= 30


def test_quickstart_two_ranks():
    # The README's quick start (examples/quickstart.py), as a user runs it.
    proc = run_under_mpiexec(2, ["-m", "mpi4py", os.path.join("examples", "quickstart.py")],
                             timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # The ranks' lines reach mpiexec's output in any order and may share a line: match
    # each record wherever it is instead of parsing line by line.
    # (a float.hex(): the next rank's record may follow it with no space between)
    checksums = re.findall(r"rank \d params checksum (-?0x[0-9a-f.]+p[+-]\d+)", log)
    assert len(checksums) == 2 and checksums[0] == checksums[1], log[-4000:]  # same replicas
    records = re.findall(r"rank (\d) step (\d+) loss ([\d.]+) bytes sent (\d+)", log)
    for rank in (0, 1):
        mine = sorted((int(i), float(loss), int(b)) for r, i, loss, b in records if int(r) == rank)
        losses = [loss for _, loss, _ in mine]
        sent = [b for _, _, b in mine]
        assert [i for i, _, _ in mine] == [0, 100, 200, 299], (rank, mine, log[-4000:])
        assert losses[-1] < 0.5 * losses[0], (rank, losses)
        assert 0 < sent[-1] < 10_000, sent  # 1 % of 19,210 parameters; dense sends 76,840 B
