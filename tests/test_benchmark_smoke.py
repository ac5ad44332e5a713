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


def test_shard_map_example_smoke(tmp_path):
    # the example's record, stamped: one epoch, two devices, dense and Top-k
    out = tmp_path / "sub" / "shard_map_example.json"
    run([sys.executable, script("shard_map_example.py"), "--out", str(out), "--", "--epochs",
         "1", "--devices", "2", "--modes", "dense", "topk", "--no-check"], timeout=240)
    data = written(out)
    assert data["machine"]["commit"] and data["machine"]["command"].startswith(
        "shard_map_example.py --out")
    assert data["devices"] == 2 and data["config"]["modes"] == ["dense", "topk"]
    dense, topk = data["summary"]["dense"], data["summary"]["topk"]
    assert topk["bytes_per_step_per_device"] < dense["bytes_per_step_per_device"] / 10
    assert 0 < topk["final_test_accuracy"] <= 100


def test_shard_map_example_refuses_its_own_outputs(tmp_path):
    proc = subprocess.run([sys.executable, script("shard_map_example.py"), "--out",
                           str(tmp_path / "x.json"), "--", "--json", "y.json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--json is this script's --out" in proc.stderr


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


def test_wire_formats_smoke(tmp_path):
    out = tmp_path / "wire_formats_p2"
    run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", script("wire_formats.py"),
         "--size", "64K", "--out", str(out)], timeout=120)
    data = written(out.with_suffix(".json"))
    cfg = data["config"]
    assert cfg["size"] == 65536 and cfg["nranks"] == 2 and data["machine"]["commit"]
    assert len(data["records"]) == len(cfg["densities"]) * len(cfg["algorithms"])
    for r in data["records"]:
        assert set(r["bytes_sent"]) == {"int32/float32", "int32/bfloat16", "auto/float32",
                                        "auto/bfloat16"}, r
        assert all(b > 0 for b in r["bytes_sent"].values()), r
        # bfloat16 values never cost more bytes than float32 ones
        assert r["bytes_sent"]["int32/bfloat16"] < r["bytes_sent"]["int32/float32"], r
        if r["algorithm"] == "allgather":  # the encoded message is the smallest encoding
            assert r["message_over_smallest"] == 1.0, r
            assert r["value_bytes_float32"] == 2 * r["value_bytes_bfloat16"] > 0, r


def test_hash_partition_time_smoke(tmp_path):
    out = tmp_path / "hash_partition_time"
    run([sys.executable, script("hash_partition_time.py"), "--nranks", "2", "--size", "64K",
         "--workloads", "uniform", "zipf", "--repeats", "1", "--warmup", "1",
         "--timeout", "100", "--out", str(out)], timeout=150)
    data = written(out.with_suffix(".json"))
    assert data["config"]["nranks"] == [2] and data["machine"]["commit"]
    assert [r["workload"] for r in data["records"]] == ["uniform", "zipf"]
    for r in data["records"]:
        assert r["nranks"] == 2 and r["size"] == 65536 and r["k"] == 655, r
        assert set(r["methods"]) == set(data["config"]["methods"]), r["methods"].keys()
        for name, m in r["methods"].items():
            assert m["median_s"] > 0 and len(m["times_s"]) == 1, (name, m)
            assert m["rank0_bytes_sent"] > 0, (name, m)
    # --plot-only redraws the figure from the record
    out.with_suffix(".png").unlink()
    run([sys.executable, script("hash_partition_time.py"), "--plot-only", "--out", str(out)],
        timeout=60)
    assert out.with_suffix(".png").exists()


def test_shared_support_time_smoke(tmp_path):
    # the axis transport on 2 host devices, then --merge of its fragment into the record
    frag = tmp_path / "fragment_axis_p2.json"
    run([sys.executable, script("shared_support_time.py"), "--transport", "axis", "--size",
         "64K", "--repeats", "1", "--warmup", "1", "--fragment", str(frag)], timeout=120,
        XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = tmp_path / "shared_support_time"
    run([sys.executable, script("shared_support_time.py"), "--merge", "--fragments", str(frag),
         "--out", str(out)], timeout=60)
    data = written(out.with_suffix(".json"))
    (rec,) = data["records"]
    assert rec["transport"] == "axis" and rec["nranks"] == 2 and rec["size"] == 65536
    assert rec["k"] == 655 and rec["refresh_every"] == 2
    assert set(rec["methods"]) == {"topk_sync", "shared_support_sync"}, rec["methods"].keys()
    for m in rec["methods"].values():
        assert m["median_step_s"] > 0 and len(m["cycle_means_s"]) == 1, m
    shared = rec["methods"]["shared_support_sync"]
    assert shared["median_refresh_step_s"] > 0 and shared["median_shared_step_s"] > 0
    assert rec["shared_over_topk"] > 0 and data["machine"]["commit"]


def test_adam_fused_smoke(tmp_path):
    # the script has no --out: its RESULTS folder is pointed at tmp_path; the pass part
    # only (the step part compiles the 6-layer LM four times: minutes on 2 cores)
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); "
            "import adam_fused; adam_fused.RESULTS = Path(sys.argv[1]); "
            "adam_fused.main(sys.argv[2:])")
    run([sys.executable, "-c", code, str(tmp_path), "--parts", "pass", "--rounds", "1",
         "--pass-steps", "1", "--warmup", "1", "--tag", "smoke"], timeout=120)
    data = json.loads((tmp_path / "adam_fused_smoke.json").read_text())
    assert data["size"] > 1_000_000 and data["leaves"] > 1 and data["machine"]["commit"]
    assert "step" not in data
    assert set(data["pass"]) == {"adamw", "accumulate_topk", "adam+accumulate_topk unfused",
                                 "adam_accumulate fused"}, data["pass"].keys()
    for name, r in data["pass"].items():
        assert r["median_s"] > 0 and r["cpu_median_s"] > 0 and len(r["rounds_s"]) == 1, name
    assert set(data["ratios"]) == {f"pass_{r}_{c}" for c in ("wall", "cpu")
                                   for r in ("fused_over_unfused",
                                             "fused_over_adamw_plus_accumulate_topk")}
    assert all(v > 0 for v in data["ratios"].values()), data["ratios"]


def test_calibration_stability_smoke(tmp_path):
    # the emulated link needs root: the worker alone, under mpiexec on shared memory, one
    # calibration; then the script's summary and figure from its fragment
    frag = tmp_path / "fragment.json"
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"calibrations": 1, "repeats": 1, "contention": False,
                               "pin_cores": False, "autogroup_nice": None,
                               "fragment": str(frag)}))
    run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
         script("calibration_stability.py"), "--worker", str(cfg)], timeout=120)
    (cal,) = json.loads(frag.read_text())["calibrations"]
    assert cal["calibration"] == 0 and cal["wall_s"] >= 0
    assert len(cal["sizes"]) == len(cal["median_s"]) >= 2 and cal["sizes"][0] == 8
    assert all(t > 0 for t in cal["median_s"]), cal["median_s"]
    for fit in ("old", "new_2mib", "new"):
        assert cal["fits"][fit]["beta_s_per_byte"] > 0 and cal["fits"][fit]["alpha_s"] >= 0
    out = tmp_path / "calibration_stability.json"
    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); "
            "import calibration_stability as c; "
            "data = {'link': 200.0, 'P': 2, 'link_beta_s_per_byte': 8.0 / 200e6, "
            "'calibrations': json.loads(Path(sys.argv[1]).read_text())['calibrations']}; "
            "data['summary'] = c.summarize(data['calibrations'], data['link_beta_s_per_byte']); "
            "out = Path(sys.argv[2]); c.write_record(data, out); "
            "c.plot(data, out.with_suffix('.png'))")
    run([sys.executable, "-c", code, str(frag), str(out)], timeout=60)
    data = written(out)
    for fit in ("old", "new_2mib", "new"):
        s = data["summary"][fit]
        assert len(s["beta_ns_per_byte"]) == 1 and s["spread"] == 0.0, s
        assert s["max_abs_error_vs_link"] >= 0, s
    assert data["summary"]["wall_s"] == [cal["wall_s"]]


def test_warmup_wire_stages_smoke(tmp_path):
    # nothing is measured: a work dir as time_to_accuracy.py leaves it, one link timed
    work = tmp_path / "runs"
    (work / "out").mkdir(parents=True)
    ramp = "topk_1pct_adamdir_mask_ramp_warmbf16_enc"
    timing = {"dense": {"phases": [{"density": 1.0, "step_s": 0.5}]},
              ramp: {"phases": [{"density": 0.25, "step_s": 0.3, "repeats_step_s": [0.3]},
                                {"density": 0.01, "step_s": 0.1, "repeats_step_s": [0.1]}]}}
    (work / "timing_lm_1gbit_p2.json").write_text(json.dumps(
        {"timing": timing, "link": {"achieved_mbit": 950.0}, "machine": {"host": "x"}}))
    (work / "out" / "time_to_accuracy_lm_1gbit_p2.json").write_text(json.dumps(
        {"records": [{"mode": ramp, "steps_to_target": 20, "time_to_target_s": 2.0}]}))

    def training(losses):
        return {"history": [{"step": 10 * i, "val_loss": v, "bytes_sent_per_step": 100}
                            for i, v in enumerate(losses)],
                "final": {"val_loss": losses[-1], "replicas_identical": True}}
    (work / "lm_P2_dense.json").write_text(json.dumps(training([5.0, 3.0, 2.0])))
    (work / f"lm_P2_{ramp}.json").write_text(json.dumps(training([5.0, 2.5, 1.9, 1.8])))
    out = tmp_path / "warmup_wire_stages.json"
    run([sys.executable, script("warmup_wire_stages.py"), "--work-dir", str(work), "--out",
         str(out), "--note", "smoke"], timeout=60)
    data = written(out)
    assert data["P"] == 2 and data["dense_final_val_loss"] == 2.0 and data["note"] == "smoke"
    assert set(data["links"]) == {"1gbit"}  # the 200 Mbit/s timing is absent: left out
    link = data["links"]["1gbit"]
    assert link["link_mbit"] == 1000.0 and link["achieved_mbit"] == 950.0
    assert [s["density"] for s in link["stages"][ramp]] == [0.25, 0.01]
    assert link["time_to_accuracy"][ramp]["steps_to_target"] == 20
    assert set(data["runs"]) == {"dense", ramp}
    # the first evaluation at or below dense's final loss (2.0): step 20 (2.5 is above)
    assert data["runs"][ramp]["steps_to_dense_final"] == 20
    assert data["runs"]["dense"]["steps_to_dense_final"] == 20


def test_sharded_state_smoke(tmp_path):
    # one mode (the sharded 1 %) for 3 steps of a tiny LM: the record and its figure; the
    # goals' ratios on rows of both modes
    argv = [sys.executable, script("sharded_state.py"), "--procs", "2", "--steps", "3", "--dim",
            "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch-size", "2",
            "--modes", "sharded_topk", "sharded_topk_1pct_change", "--repeats", "1",
            "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "runs")]
    run(argv, timeout=600)
    data = written(tmp_path / "sharded_state_p2.json")
    for mode in ("sharded_topk", "sharded_topk_1pct_change"):
        row = data["rows"][mode]
        assert row["replicas_identical"] and row["runs"] == 1 and row["bytes_per_step"] > 0
        assert row["state_bytes_by_part"]["moments"] == row["adamw_state_bytes"] > 0
        # the bytes a rank sent, within the model's range for this mode's change budget
        assert row["model_bytes"]["min"] <= row["bytes_per_step"] <= row["model_bytes"]["max"]
    assert data["machine"]["commit"] and data["machine"]["command"]
    # --resume: the finished runs reused, nothing trained again, the same rows
    out = run(argv + ["--resume"], timeout=300)
    assert "reused" in out and "$ " not in out, out[-2000:]
    again = written(tmp_path / "sharded_state_p2.json")
    assert again["rows"] == data["rows"]
    # each run names the commit it trained at, and the reuse keeps it
    assert set(data["trained_at"]) == {"sharded_topk_r0", "sharded_topk_1pct_change_r0"}
    assert again["trained_at"] == data["trained_at"] and all(data["trained_at"].values())
    row = data["rows"]["sharded_topk"]
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import sharded_state

    base = dict(row, val_loss=2.0, step_s=1.0, bytes_per_step=100.0, adamw_state_bytes=800,
                state_bytes_per_rank=1600)
    ours = dict(row, val_loss=2.01, step_s=1.05, bytes_per_step=150.0, adamw_state_bytes=200,
                state_bytes_per_rank=700)
    goals = sharded_state.goals({"replicated_adamdir": base, "sharded_topk": ours}, 4)
    assert goals["loss_ratio"] == pytest.approx(1.005) and goals["adamw_state_ratio"] == 0.25
    assert goals["targets"]["adamw_state_ratio"] == pytest.approx(0.26)

