"""benchmarks/outer_step.py's join, run as a command on a work dir as its training and
timing leave it (``--join-only``: nothing trained, no emulated link, no root)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import outer_step  # noqa: E402


def test_outer_time_charges_the_outer_step_every_h_steps():
    # 25 steps at H = 10: 23 inner steps at the no-sync step, 2 outer steps
    assert outer_step.outer_time(25, 10, 0.1, 2.0) == 23 * 0.1 + 2 * 2.0
    assert outer_step.outer_time(None, 10, 0.1, 2.0) is None


def _run(losses, every=0, bytes_per_rank=1000.0):
    return {"history": [{"step": 10 * (i + 1), "val_loss": v} for i, v in enumerate(losses)],
            "config": {"steps": 10 * len(losses)}, "every": every, "fragments": 1,
            "final": {"val_loss": losses[-1], "bytes_per_rank": bytes_per_rank,
                      "replicas_identical": True}}


def test_join_only_smoke(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    runs = {"dense": _run([3.0, 2.5, 2.0], bytes_per_rank=4e8),
            "diloco_h10_dense": _run([3.0, 2.4, 2.1], 10, 4e7),
            "diloco_h10_chunked_topk": _run([3.0, 2.02, 1.9], 10, 2e5)}
    for mode, run in runs.items():
        (work / f"lm_P2_{mode}.json").write_text(json.dumps(run))
    one = [{"density": 1.0, "step_s": 0.5, "repeats_step_s": [0.5]}]
    timing = {"none": {"phases": [dict(one[0], step_s=0.1)]}, "dense": {"phases": one},
              "outer_dense": {"phases": one},
              "outer_chunked_topk": {"phases": [dict(one[0], density=0.02, step_s=0.2)]}}
    (work / "timing_outer_lm_1gbit_p2.json").write_text(json.dumps(
        {"timing": timing, "link": {"achieved_mbit": 950.0}, "machine": {"host": "x"}}))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "outer_step.py"), "--join-only",
                    "--links", "1000", "--every", "10", "--ddp-modes", "dense",
                    "--outer-syncs", "dense", "chunked_topk", "--work-dir", str(work),
                    "--out-dir", str(out)], check=True, timeout=120, cwd=ROOT)
    data = json.loads((out / "outer_step_lm_1gbit_p2.json").read_text())
    assert (out / "outer_step_lm_1gbit_p2.png").stat().st_size > 0
    recs = {r["mode"]: r for r in data["records"]}
    dense, sparse = recs["dense"], recs["diloco_h10_chunked_topk"]
    # DDP dense reaches its own final (2.0) at step 30: 30 x 0.5 s; ideal 30 x 0.1 s
    assert dense["steps_to_target"] == 30 and dense["time_to_target_s"] == 15.0
    assert dense["ideal_time_s"] == 3.0
    # the sparse outer step reaches 2.0 at step 30: 27 inner steps + 3 outer steps
    assert sparse["steps_to_target"] == 30 and sparse["every"] == 10
    assert abs(sparse["time_to_target_s"] - (27 * 0.1 + 3 * 0.2)) < 1e-9
    assert abs(sparse["fraction_of_ideal"] - 3.0 / 3.3) < 1e-9
    assert sparse["bytes_fewer_than_ddp_dense"] == 2000.0
    assert sparse["bytes_fewer_than_diloco_dense"] == 200.0
    # dense DiLoCo ends at 2.1: never reaches the target
    assert recs["diloco_h10_dense"]["time_to_target_s"] is None
    # within 1 % of 2.0 (2.02): DDP dense at step 30 (ideal 3 s), the sparse outer step
    # at step 20 (18 inner steps + 2 outer steps), dense DiLoCo never (2.1)
    assert dense["target_within_1pct"] == 2.0 * 1.01 and dense["steps_to_within_1pct"] == 30
    assert sparse["steps_to_within_1pct"] == 20
    assert abs(sparse["time_to_within_1pct_s"] - (18 * 0.1 + 2 * 0.2)) < 1e-9
    assert abs(sparse["fraction_of_ideal_within_1pct"] - 3.0 / 2.2) < 1e-9
    assert abs(sparse["speedup_over_dense_within_1pct"] - 15.0 / 2.2) < 1e-9
    assert recs["diloco_h10_dense"]["fraction_of_ideal_within_1pct"] is None
    assert data["rtt_ms"] == 0.0 and data["P"] == 2
    # --tag: the same join under another record name
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "outer_step.py"), "--join-only",
                    "--links", "1000", "--every", "10", "--ddp-modes", "dense",
                    "--outer-syncs", "chunked_topk", "--work-dir", str(work),
                    "--out-dir", str(out), "--tag", "h10sparse"], check=True, timeout=120, cwd=ROOT)
    tagged = json.loads((out / "outer_step_lm_1gbit_p2_h10sparse.json").read_text())
    assert [r["mode"] for r in tagged["records"]] == ["dense", "diloco_h10_chunked_topk"]


def test_worker_times_the_outer_step_at_every_1(tmp_path):
    """The timing job (time_to_accuracy's worker) under mpiexec -n 2, a tiny transformer:
    an outer-step mode's timed step is jss.diloco at --every 1, its bytes nonzero."""
    from test_multirank import run_under_mpiexec

    args = outer_step.parse_args(["--steps-per-phase", "1"])
    argvs = outer_step.timing_argvs(args)
    frag = tmp_path / "frag.json"
    cfg = {"model": "lm", "example": "examples/train_lm.py", "step_time_model": "transformer",
           "model_cfg": {"vocab": 256, "dim": 16, "heads": 2, "layers": 1, "mlp_ratio": 2,
                         "seq": 8, "batch": 2},
           "modes": {"outer_chunked_topk": argvs["outer_chunked_topk"]},  # one compile
           "repeats": 1, "steps_per_phase": 1, "seed": 0, "fragment": str(frag)}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    proc = run_under_mpiexec(2, ["-m", "mpi4py", "benchmarks/time_to_accuracy.py", "--worker",
                                 str(tmp_path / "cfg.json")], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    timing = json.loads(frag.read_text())["timing"]
    outer = timing["outer_chunked_topk"]
    assert [p["density"] for p in outer["phases"]] == [0.02]
    assert outer["argv"][:2] == ["--every", "1"]
    assert all(b and b > 0 for b in outer["bytes_sent_last_step"])


def test_modeled_rtt_is_added_to_every_synchronizing_step_only():
    timing = {"none": {"phases": [{"step_s": 0.1}]},
              "dense": {"phases": [{"step_s": 0.5}]},
              "outer_chunked_topk": {"phases": [{"step_s": 0.2}, {"step_s": 0.3}]}}
    out = outer_step.with_modeled_rtt(timing, 0.05)
    assert out["none"]["phases"][0]["step_s"] == 0.1  # no exchange, no round trip
    assert out["dense"]["phases"][0]["step_s"] == 0.55
    assert [ph["step_s"] for ph in out["outer_chunked_topk"]["phases"]] == [0.25, 0.35]
    assert out["dense"]["phases"][0]["measured_step_s"] == 0.5
    assert timing["dense"]["phases"][0]["step_s"] == 0.5  # the measured timing untouched
    assert outer_step.with_modeled_rtt(timing, 0.0) == timing


def test_sweep_join_only_ranks_outer_optimizers_against_ddp_dense(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    runs = {"dense": _run([3.0, 2.5, 2.0]),
            "sweep_h10_dense_lr1_m0": _run([3.0, 2.4, 2.02], 10),
            "sweep_h10_dense_lr0.7_m0.9": _run([3.0, 2.6, 2.2], 10),
            "sweep_h10_chunked_topk_lr2_m0_ef0.9": _run([3.0, 2.4, 2.1], 10)}
    for mode, run in runs.items():
        (work / f"lm_P2_{mode}.json").write_text(json.dumps(run))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "outer_step.py"), "--join-only",
                    "--every", "10", "--sweep", "dense:1:0", "dense:0.7:0.9",
                    "chunked_topk:2:0:0.9", "--work-dir", str(work), "--out-dir", str(out)],
                   check=True, timeout=120, cwd=ROOT)
    data = json.loads((out / "outer_step_sweep_lm_p2.json").read_text())
    assert (out / "outer_step_sweep_lm_p2.png").stat().st_size > 0
    assert data["target"] == 2.0
    assert [r["mode"] for r in data["records"]] == [
        "sweep_h10_dense_lr1_m0", "sweep_h10_chunked_topk_lr2_m0_ef0.9",
        "sweep_h10_dense_lr0.7_m0.9"]
    best = data["records"][0]
    assert abs(best["gap_to_dense"] - 0.01) < 1e-12 and best["outer_lr"] == 1.0
    paper = data["records"][-1]
    assert paper["outer_momentum"] == 0.9 and paper["ef_decay"] is None
    assert paper["example_args"][-4:] == ["--outer-lr", "0.7", "--outer-momentum", "0.9"]
    sparse = data["records"][1]["example_args"]
    assert sparse[sparse.index("--outer-ef-decay") + 1] == "0.9"


def test_sweep_refuses_a_malformed_spec(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "outer_step.py"),
                           "--join-only", "--sweep", "topk:1", "--work-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and "SYNC:LR:MOMENTUM[:EF]" in proc.stderr
