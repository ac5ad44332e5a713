"""Every benchmark script runs end to end at a tiny size, writing to a temporary
directory (never to benchmarks/results/), so a script that breaks fails the suite.

Scripts tested elsewhere: selection.py (test_selection_benchmark.py), step_time.py
(test_step_time_benchmark.py), emulated_network.py (test_emulated_network.py),
convergence.py (test_convergence_examples.py), grouping.py, step_time.py and gpu_step.py
(the device campaign's dry run, test_gpu_campaign.py), asc_wfbp_table4.py and
grouping_projection.py (test_asc_wfbp_table4.py), hash_partition_balance.py
(test_hash_partition_balance.py); the others are here.
"""

import json
import os
import subprocess
import sys

import pytest

from test_multirank import mpiexec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd: list[str], timeout: float, **env) -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **env)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s\n{out[-4000:]}")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log


def script(name: str) -> str:
    return os.path.join("benchmarks", name)


def written(path) -> dict:
    assert path.exists() and path.with_suffix(".png").exists(), sorted(os.listdir(path.parent))
    return json.loads(path.read_text())


def test_update_profile_smoke(tmp_path):
    out = tmp_path / "update_profile.json"
    run([sys.executable, script("update_profile.py"), "--sizes", "64K", "--densities", "0.01",
         "--repeats", "1", "--out", str(out)], timeout=240)
    data = written(out)
    (record,) = data["records"]
    assert record["size"] == 65536 and record["k"] == 655
    assert set(record["transform_ms"]) >= {"topk_sync", "dense_sync", "oktopk_sync"}
    assert all(ms > 0 for ms in record["transform_ms"].values())
    assert data["machine"]["commit"] and data["machine"]["command"]


def test_shard_map_bench_smoke(tmp_path):
    out = tmp_path / "shard_map.json"
    run([sys.executable, script("shard_map_bench.py"), "--devices", "2", "--sizes", "64K",
         "--densities", "0.01", "--overlaps", "0", "--repeats", "1", "--warmup", "1",
         "--algorithms", "allgather", "oktopk", "--out", str(out)], timeout=300)
    data = written(out)
    (point,) = data["points"]
    assert set(point["algorithms"]) == {"allgather", "oktopk", "oktopk_reuse"}
    # checked against NumPy inside the script; allgather's bytes are the model's exactly
    allgather = point["algorithms"]["allgather"]
    assert allgather["identical_on_all_devices"]
    assert allgather["bytes_sent_per_device"][0] == allgather["model_bytes_max"]


def test_sparcml_fig3_smoke(tmp_path):
    out = tmp_path / "fig3.json"
    run([sys.executable, script("sparcml_fig3.py"), "--size", "64K", "--procs", "2",
         "--density-p", "2", "--densities", "0.01", "--speedup-density", "0.01",
         "--rates", "--repeats", "1", "--warmup", "0", "--quiet-wait", "0",
         "--timeout", "200", "--out", str(out)], timeout=300)
    data = written(out)
    (shm,) = data["transports"]
    algorithms = {r["algorithm"] for r in shm["records"]}
    assert {"dense", "allgather", "recursive_doubling"} <= algorithms, algorithms
    assert all(r["correct"] and r["bytes_within_predicted"] for r in shm["records"])


def test_oktopk_threshold_drift_smoke(tmp_path):
    out = tmp_path / "drift.json"
    run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", script("oktopk_threshold_drift.py"),
         "--epochs", "1", "--policies", "threshold_reuse", "--baselines", "--out", str(out)],
        timeout=300)
    data = written(out)
    run_ = data["runs"]["threshold_reuse"]
    assert run_["replicas_identical"] and run_["per_rank_steps"], run_.keys()
    assert data["machine"]["commit"] and data["summary"]["threshold_reuse"]["steps"] > 0


def test_second_moment_bias_smoke(tmp_path):
    out = tmp_path / "bias.json"
    run([sys.executable, script("second_moment_bias.py"), "--procs", "2", "--steps", "3",
         "--every", "1", "--corpus-mb", "0.2", "--lm", "dim=32", "heads=2", "layers=1",
         "seq=16", "--out", str(out)], timeout=240)
    data = written(out)
    assert [r["step"] for r in data["records"]] == [1, 2, 3]
    assert data["lm_config"]["dim"] == 32
    # the oracle's ratio is finite and positive from the first step
    assert all(0 < r["oracle"]["quantiles"][2] < 100 for r in data["records"])


def test_compression_smoke(tmp_path):
    out = tmp_path / "compression.json"
    run([sys.executable, script("compression.py"), "--sizes", "64K", "--repeats", "1",
         "--out", str(out)], timeout=240)
    data = written(out)
    (check,) = data["correctness"]
    assert check["block_masks_equal_xla"] and check["qsgd_within_one_step"], check
    assert {r["method"] for r in data["records"]} >= {"block_scan_sparse", "qsgd_quantize"}


def test_allreduce_sweep_smoke(tmp_path):
    out = tmp_path / "allreduce.json"
    run([sys.executable, script("allreduce.py"), "--sweep", "--procs", "2", "--size", "64K",
         "--densities", "0.01", "--repeats", "2", "--warmup", "1", "--timeout", "200",
         "--out", str(out)], timeout=300)
    data = written(out)
    assert not data.get("failures"), data["failures"]
    assert data["records"] and all(
        r["correct"] and r["identical_across_ranks"] and r["measured_within_predicted"]
        for r in data["records"]), data["records"]


def test_oktopk_volume_sweep_smoke(tmp_path):
    out = tmp_path / "oktopk_volume.json"
    run([sys.executable, script("oktopk_volume.py"), "--sweep", "--procs", "2", "--size", "64K",
         "--repeats", "1", "--warmup", "1", "--timeout", "200", "--out", str(out)], timeout=300)
    data = written(out)
    assert not data["failures"] and data["records"], data["failures"]
    oktopk = [r for r in data["records"] if "check" in r]
    assert oktopk and all(r["check"]["identical_across_ranks"] for r in oktopk)


def test_index_encoding_sizes_smoke(tmp_path):
    out = tmp_path / "index_encoding_sizes"
    run([sys.executable, script("index_encoding_sizes.py"), "--size", "64K", "--nranks", "2",
         "--out", str(out)], timeout=240)
    data = written(out.with_suffix(".json"))
    assert data["records"] and data["machine"]["commit"]
    for r in data["records"]:  # the chosen encoding is the smallest of the three
        assert r["bytes"][r["chosen"]] == min(r["bytes"].values()), r


def test_dense_allreduce_smoke(tmp_path):
    out = tmp_path / "dense_allreduce.json"
    run([sys.executable, script("dense_allreduce.py"), "--sweep", "--procs", "2", "--rounds", "1",
         "--repeats", "1", "--warmup", "1", "--size", "64K", "--methods", "mpi4py_inplace",
         "dense_sync", "dense_allreduce", "--timeout", "240", "--out", str(out)], timeout=300)
    data = written(out)
    methods = {r["method"] for r in data["records"]}
    assert {"mpi4py_inplace", "dense_sync", "dense_allreduce"} <= methods, methods
    assert all(r["P"] == 2 for r in data["records"])


def test_watchdog_benchmark_smoke(tmp_path):
    out = tmp_path / "watchdog.json"
    run([sys.executable, script("watchdog.py"), "--ranks", "2", "--runs", "1", "--pairs", "200",
         "--calls", "5", "--blocks", "1", "--out", str(out)], timeout=300)
    data = written(out)
    (cost,) = [c for c in data["cost"] if "ranks" in c]
    assert cost["ranks"] == 2 and cost["pair_cost_ns"]["on"] > 0
    (detection,) = data["detection"]
    # the stuck job ended within the watchdog's timeout + 5 s
    assert detection["seconds_from_stop_to_job_end"] < data["timeout_s"] + 5.0, detection


def test_blocked_on_cost_smoke(tmp_path):
    out = tmp_path / "blocked_on_cost.json"
    run([sys.executable, script("blocked_on_cost.py"), "--jobs", "1", "--calls", "5",
         "--blocks", "1", "--pairs", "1000", "--out", str(out)], timeout=300)
    data = written(out)
    assert data["pair_cost_ns"] > 0
    assert set(data["us_per_call_median"]["with"]) == {"recursive_doubling", "split_allgather",
                                                      "allgather"}


def test_wire_codec_time_smoke(tmp_path):
    out = tmp_path / "wire_codec_time"
    run([sys.executable, script("wire_codec_time.py"), "--n", "100000", "--densities", "0.01",
         "0.25", "--repeats", "1", "--out", str(out)], timeout=240)
    data = written(out.with_suffix(".json"))
    assert data["machine"]["commit"]
    assert [r["m"] for r in data["records"]] == [1000, 25000]
    for r in data["records"]:  # the message is the encoding the codec picks, and was timed
        assert r["kind"] in ("list", "delta", "bitmap") and r["bytes"] > 0, r
        assert r["pack_ms"] > 0 and r["unpack_ms"] > 0, r


def test_adam_pass_time_smoke(tmp_path):
    # HEAD's kernels/ from git beside this tree's, each built with its own age type
    out = tmp_path / "adam_pass_time"
    run([sys.executable, script("adam_pass_time.py"), "--base", "HEAD", "--n", "20000",
         "--rounds", "2", "--calls", "2", "--out", str(out)], timeout=240)
    data = written(out.with_suffix(".json"))
    assert [r["kernel"] for r in data["records"]][1] == "this tree"
    assert {r["age_type"] for r in data["records"]} <= {"int16_t", "float"}
    assert data["records"][1]["age_type"] == "int16_t"
    for r in data["records"]:
        assert len(r["round_medians_ms"]) == 2 and r["min_ms"] > 0, r
    assert len(data["paired_ratios"]) == 2 and data["paired_ratio_median"] > 0
