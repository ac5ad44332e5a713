"""benchmarks/time_to_accuracy.py's parts: the timed step's arguments, the join of a
run's steps with its phases' step times, the records and their arithmetic (a tiny
fake run; no training, no timing)."""

import json
import os
import sys
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import time_to_accuracy as tta  # noqa: E402
import models  # noqa: E402

RAMP = [[25, 0.25], [25, 0.0625], [25, 0.015625]]


def run(history, final=None, phases=(), steps=100):
    """A fake example run: [(step, val_loss), ...]."""
    hist = [{"step": s, "val_loss": v} for s, v in history]
    return {"config": {"steps": steps}, "sync": "x", "k": None,
            "warmup_phases": [list(p) for p in phases],
            "history": hist, "final": {"val_loss": final if final is not None else hist[-1]
                                       ["val_loss"], "replicas_identical": True}}


def timed(*step_s, densities=None):
    densities = densities or [1.0] * len(step_s)
    return {"phases": [{"density": d, "step_s": s} for d, s in zip(densities, step_s)]}


@pytest.fixture
def fake():
    runs = {
        "dense": run([(0, 5.0), (50, 3.0), (100, 2.0)]),
        "dense_bf16": run([(0, 5.0), (50, 3.0), (100, 2.02)]),
        "topk_1pct_adamdir_mask_ramp": run([(0, 5.0), (50, 2.5), (100, 1.9)], phases=[[20, 0.25]]),
        "topk_1pct": run([(0, 5.0), (50, 4.0), (100, 3.0)]),
    }
    timing = {"none": timed(0.5), "dense": timed(2.0), "dense_bf16": timed(1.25),
              "topk_1pct_adamdir_mask_ramp": timed(1.0, 0.6, densities=[0.25, 0.01]),
              "topk_1pct": timed(0.6, densities=[0.01])}
    return runs, timing


def test_record_fields_and_fraction_of_ideal(fake):
    runs, timing = fake
    result = tta.build_result("lm", 1000.0, 4, runs, timing)
    assert result["link"] == "1gbit" and result["P"] == 4
    recs = {r["mode"]: r for r in result["records"]}
    for r in recs.values():
        for field in ("model", "link", "P", "mode", "steps_to_target", "time_to_target_s",
                      "dense_time_s", "ideal_time_s", "fraction_of_ideal",
                      "time_to_target_bf16_s", "dense_time_bf16_s", "ideal_time_bf16_s",
                      "fraction_of_ideal_bf16", "speedup_over_dense_bf16"):
            assert field in r, field
        assert r["model"] == "lm" and r["link"] == "1gbit" and r["P"] == 4
    dense = recs["dense"]
    # dense reaches its own final (2.0) at step 100: 100 x 2.0 s; ideal 100 x 0.5 s
    assert dense["steps_to_target"] == 100
    assert dense["dense_time_s"] == pytest.approx(200.0)
    assert dense["ideal_time_s"] == pytest.approx(50.0)
    assert dense["fraction_of_ideal"] == pytest.approx(0.25)
    assert dense["ideal_speedup_over_dense"] == pytest.approx(4.0)
    # the ramp mode: first at or below 2.0 at step 100: 20 steps at 1.0 s, 80 at 0.6 s
    ramp = recs["topk_1pct_adamdir_mask_ramp"]
    assert ramp["steps_to_target"] == 100
    assert ramp["time_to_target_s"] == pytest.approx(20 * 1.0 + 80 * 0.6)
    assert ramp["fraction_of_ideal"] == pytest.approx(50.0 / 68.0)
    assert ramp["speedup_over_dense"] == pytest.approx(200.0 / 68.0)
    # fraction of ideal = speed-up over dense / the free sync's speed-up over dense
    assert ramp["fraction_of_ideal"] == pytest.approx(
        ramp["speedup_over_dense"] / ramp["ideal_speedup_over_dense"])
    assert ramp["gap_to_dense"] == pytest.approx((1.9 - 2.0) / 2.0)
    # against the bf16 baseline: its own final (2.02) as the target, its own time
    assert ramp["target_bf16"] == pytest.approx(2.02)
    assert ramp["dense_time_bf16_s"] == pytest.approx(125.0)
    assert ramp["ideal_time_bf16_s"] == pytest.approx(50.0)
    assert ramp["speedup_over_dense_bf16"] == pytest.approx(125.0 / 68.0)
    # a mode that never reaches the target has no time and no fraction
    never = recs["topk_1pct"]
    assert never["steps_to_target"] is None and never["time_to_target_s"] is None
    assert never["fraction_of_ideal"] is None
    json.dumps(result)  # the record is JSON


def test_join_rejects_timing_of_other_phases(fake):
    runs, timing = fake
    timing["topk_1pct_adamdir_mask_ramp"] = timed(1.0, 0.6, densities=[0.0625, 0.01])
    with pytest.raises(ValueError, match="not the trained warm-up"):
        tta.build_result("lm", 1000.0, 4, runs, timing)
    timing["topk_1pct_adamdir_mask_ramp"] = timed(0.6, densities=[0.01])
    with pytest.raises(ValueError, match="re-run the timing"):
        tta.build_result("lm", 1000.0, 4, runs, timing)


def test_missing_baselines(fake):
    runs, timing = fake
    del runs["dense_bf16"]
    # timed, not trained: dense's convergence at the bf16 step time, flagged
    recs = {r["mode"]: r for r in tta.build_result("lm", 200.0, 4, runs, timing)["records"]}
    ramp = recs["topk_1pct_adamdir_mask_ramp"]
    assert ramp["link"] == "200mbit"
    assert "assumed" in ramp["baseline_bf16_convergence"]
    assert ramp["target_bf16"] == pytest.approx(2.0)
    assert ramp["dense_time_bf16_s"] == pytest.approx(100 * 1.25)
    assert ramp["baseline_convergence"] == "dense"
    del timing["dense_bf16"]
    recs = tta.build_result("lm", 200.0, 4, runs, timing)["records"]
    assert all(r["fraction_of_ideal_bf16"] is None for r in recs)
    with pytest.raises(ValueError, match="no timing of 'none'"):
        tta.build_result("lm", 200.0, 4, runs, {k: v for k, v in timing.items() if k != "none"})
    with pytest.raises(ValueError, match="add `dense`"):
        tta.build_result("lm", 200.0, 4, {k: v for k, v in runs.items() if k != "dense"}, timing)


def test_accuracy_metric_higher_is_better():
    runs = {"dense": {**run([(0, 10.0), (50, 90.0), (100, 95.0)]), "history": [
        {"step": 0, "test_accuracy": 10.0}, {"step": 50, "test_accuracy": 90.0},
        {"step": 100, "test_accuracy": 95.0}], "final": {"test_accuracy": 95.0}},
        "topk_1pct": {**run([(0, 0.0)]), "history": [{"step": 0, "test_accuracy": 10.0},
                                             {"step": 50, "test_accuracy": 96.0},
                                             {"step": 100, "test_accuracy": 97.0}],
                      "final": {"test_accuracy": 97.0}}}
    timing = {"none": timed(0.1), "dense": timed(0.4), "topk_1pct": timed(0.2, densities=[0.01])}
    recs = {r["mode"]: r for r in tta.build_result("cnn", 1000.0, 4, runs, timing)["records"]}
    assert recs["topk_1pct"]["steps_to_target"] == 50
    assert recs["topk_1pct"]["time_to_target_s"] == pytest.approx(10.0)
    assert recs["topk_1pct"]["fraction_of_ideal"] == pytest.approx(10.0 / 10.0)
    assert recs["topk_1pct"]["gap_to_dense"] == pytest.approx(2.0)  # points


def test_timing_argv_shortens_the_warmup_and_keeps_the_rest():
    argv = tta.timing_argv("topk_1pct_adamdir_mask_ramp_bf16", 3)
    assert argv[argv.index("--density-ramp") + 1] == "3"
    assert argv[argv.index("--wire-dtype") + 1] == "bfloat16"
    assert argv[argv.index("--mask-momentum") + 1] == "restart"
    # the no-sync step is dense's optimizer (the sync itself replaced in the worker)
    assert tta.timing_argv("none", 3)[:2] == ["--sync", "dense"]
    with pytest.raises(ValueError, match="steps-per-phase"):
        tta.timing_argv("dense", 0)


def test_warmup_wire_mode_builds_the_ramp_on_a_16bit_wire():
    # _warmbf16_enc: the ramp's stages on bfloat16, the 1 % steps float32, indices encoded
    argv = tta.timing_argv("topk_1pct_adamdir_mask_ramp_warmbf16_enc", 3)
    assert argv[argv.index("--warmup-wire-dtype") + 1] == "bfloat16"
    assert argv[argv.index("--index-encoding") + 1] == "auto"
    assert "--wire-dtype" not in argv
    args = SimpleNamespace(sync="topk", density=0.01, dense_warmup=0, ramp_start=1.0,
                           density_ramp=3, warmup_wire_dtype="bfloat16", algorithm="auto",
                           selection=None, tau=32)
    assert models.warmup_wire_dtype(args) is not None
    assert "warm-up on a bfloat16 wire" in models.sync_label(args)
    models.make_sync(args)  # builds
    args.density_ramp = 0  # no warm-up: the option has nothing to apply to
    with pytest.raises(SystemExit, match="--warmup-wire-dtype"):
        models.make_sync(args)


def test_timed_phases_are_the_trained_ones():
    """The worker builds the phases from the shortened arguments the way the example
    does; their densities must be the trained run's, phase for phase."""
    for mode, trained in (("topk_1pct_adamdir_mask_ramp", RAMP),
                          ("topk_1pct_adamdir_mask_ramp_start6_bf16", RAMP[1:]),
                          ("topk_1pct_adamdir_mask_ramp10_bf16",
                           [[10, d] for _, d in RAMP])):
        args = SimpleNamespace(sync="topk", density=0.01, dense_warmup=0, ramp_start=1.0)
        argv = tta.convergence.MODES[mode][0]
        for flag, name, cast in (("--density-ramp", "density_ramp", int),
                                 ("--ramp-start", "ramp_start", float)):
            if flag in argv:
                setattr(args, name, cast(argv[argv.index(flag) + 1]))
        assert [list(p) for p in models.warmup_phases(args)] == trained, mode
        short = tta.timing_argv(mode, 2)
        args.density_ramp = int(short[short.index("--density-ramp") + 1])
        assert [d for _, d in models.warmup_phases(args)] == [d for _, d in trained]


def test_link_names_and_paths(tmp_path):
    assert tta.link_name(1000) == "1gbit" and tta.link_name(200) == "200mbit"
    assert tta.result_base(tmp_path, "lm", 1000.0, 4).name == "time_to_accuracy_lm_1gbit_p4"


def test_worker_times_every_phase_of_the_trained_step(tmp_path):
    """The timing job under mpiexec -n 2 on shared memory, a tiny transformer: one
    record per mode, the warm-up phases at the trained densities, then the mode's own."""
    from test_multirank import run_under_mpiexec

    frag = tmp_path / "frag.json"
    cfg = {"model": "lm", "example": "examples/train_lm.py", "step_time_model": "transformer",
           "model_cfg": {"vocab": 256, "dim": 16, "heads": 2, "layers": 1, "mlp_ratio": 2,
                         "seq": 8, "batch": 2},
           "modes": {m: tta.timing_argv(m, 1) for m in
                     ("none", "topk_1pct_adamdir_mask_ramp_start6_bf16")},
           "repeats": 1, "steps_per_phase": 1, "seed": 0, "fragment": str(frag)}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    proc = run_under_mpiexec(2, ["-m", "mpi4py", "benchmarks/time_to_accuracy.py", "--worker",
                                 str(tmp_path / "cfg.json")], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    timing = json.loads(frag.read_text())["timing"]
    assert [p["density"] for p in timing["none"]["phases"]] == [1.0]
    ramp = timing["topk_1pct_adamdir_mask_ramp_start6_bf16"]
    assert [p["density"] for p in ramp["phases"]] == [0.0625, 0.015625, 0.01]
    assert all(p["step_s"] > 0 and len(p["rank0_times_s"]) == 1 for p in ramp["phases"])
    assert all(b and b > 0 for b in ramp["bytes_sent_last_step"])


def test_runs_from_an_earlier_convergence_record(tmp_path):
    hist = [{"step": 0, "val_loss": 5.0}, {"step": 100, "val_loss": 1.9}]
    data = {"model": "lm", "procs": 4, "metric": "val_loss", "provenance": {
        "recorded_by_commit": "abc1234"},
        "table": [{"mode": "topk_1pct_adamdir_mask_ramp", "steps": 100, "sync": "topk 1%",
                   "k": 7, "final_val_loss": 1.9, "replicas_identical": True}],
        "series": {"topk_1pct_adamdir_mask_ramp": {"history": hist}},
        "commands": {"topk_1pct_adamdir_mask_ramp": ["-n", "4"]}}
    path = tmp_path / "convergence_lm_x.json"
    path.write_text(json.dumps(data))
    run = tta.runs_from([str(path)], "lm", 4)["topk_1pct_adamdir_mask_ramp"]
    # the warm-up of a record that predates rows carrying it: the mode's own arguments
    assert run["warmup_phases"] == RAMP
    assert run["history"] == hist and run["final"]["val_loss"] == 1.9
    assert "abc1234" in run["run_source"]
    with pytest.raises(ValueError, match="not lm at P = 8"):
        tta.runs_from([str(path)], "lm", 8)
    # the encoded-indices mode trains the same run bit for bit
    # (tests/mpi/test_wire_format_mpi.py::test_encoded_indices_give_the_int32_result_bit_for_bit):
    # it reuses the run, saying whose it is; a mode that differs in more does not
    runs = tta.runs_from([str(path)], "lm", 4)
    enc = runs["topk_1pct_adamdir_mask_ramp_enc"]
    assert enc["history"] == hist and enc["warmup_phases"] == RAMP
    assert "the run of topk_1pct_adamdir_mask_ramp" in enc["run_source"]
    assert "topk_1pct_adamdir_mask_ramp_warmbf16_enc" not in runs
    assert tta.same_run_as("topk_1pct_adamdir_mask_ramp_warmbf16_enc") == \
        "topk_1pct_adamdir_mask_ramp_warmbf16"
    assert tta.same_run_as("topk_1pct_adamdir_mask_ramp") is None


def test_a_finer_evaluation_grid_finds_the_crossing_and_mixed_grids_are_refused(fake):
    runs, timing = fake
    # the same curves evaluated every 10 steps: the ramp mode (2.5 at 50, 1.9 at 100)
    # crosses dense's final (2.0) between them, at step 90 on this grid
    fine = {
        "dense": run(list(zip(range(0, 101, 10),
                              (5.0, 4.5, 4.0, 3.6, 3.3, 3.0, 2.7, 2.5, 2.3, 2.1, 2.0)))),
        "topk_1pct_adamdir_mask_ramp": run(
            list(zip(range(0, 101, 10),
                     (5.0, 4.0, 3.5, 3.0, 2.7, 2.5, 2.3, 2.15, 2.05, 1.95, 1.9))),
            phases=[[20, 0.25]]),
    }
    result = tta.build_result("lm", 1000.0, 4, fine, timing)
    recs = {r["mode"]: r for r in result["records"]}
    assert tta.eval_grid(fine["dense"]["history"], "val_loss") == 10
    assert recs["dense"]["eval_every"] == 10
    assert recs["topk_1pct_adamdir_mask_ramp"]["steps_to_target"] == 90
    assert recs["topk_1pct_adamdir_mask_ramp"]["time_to_target_s"] == pytest.approx(
        20 * 1.0 + 70 * 0.6)
    # a run on the coarse grid beside runs on the fine one: refused, naming the option
    mixed = dict(fine, topk_1pct=runs["topk_1pct"])
    with pytest.raises(ValueError, match="--eval-every"):
        tta.build_result("lm", 1000.0, 4, mixed, timing)


def test_eval_every_reaches_the_example_as_its_log_every():
    assert tta.eval_argv(None) == []
    assert tta.eval_argv(5) == ["--log-every", "5"]
    with pytest.raises(SystemExit):
        tta.parse_args(["--model", "lm", "--link", "1000", "--eval-every", "0"])


def test_fraction_paired_by_repeat_compares_modes_timed_in_the_same_state(fake):
    runs, timing = fake
    # two repeats: the machine 2x slower in the second, for every mode alike
    rep = {"none": [[0.5, 1.0]], "dense": [[2.0, 4.0]], "dense_bf16": [[1.25, 2.5]],
           "topk_1pct_adamdir_mask_ramp": [[1.0, 2.0], [0.6, 1.2]], "topk_1pct": [[0.6, 1.2]]}
    for mode, per_phase in rep.items():
        for p, r in zip(timing[mode]["phases"], per_phase):
            p["repeats_step_s"] = r
    recs = {r["mode"]: r for r in tta.build_result("lm", 1000.0, 4, runs, timing)["records"]}
    ramp = recs["topk_1pct_adamdir_mask_ramp"]
    # each repeat: ideal 100 x none / (20 x stage + 80 x own): 50/68 in both
    assert ramp["fraction_of_ideal_per_repeat"] == pytest.approx([50 / 68, 100 / 136])
    assert ramp["fraction_of_ideal_paired"] == pytest.approx(50 / 68)
    assert ramp["speedup_over_dense_paired"] == pytest.approx(200 / 68)
    assert ramp["timing_repeats_paired"] == 2
    # the no-sync step fast in repeat 1 only, the sparse step slow in repeat 1 only: the
    # medians of medians pair numbers from different states; the paired ratio does not
    timing["none"]["phases"][0]["repeats_step_s"] = [0.5, 1.0]
    for p, r in zip(timing["topk_1pct_adamdir_mask_ramp"]["phases"], ([2.0, 1.0], [1.2, 0.6])):
        p["repeats_step_s"] = r
    rec = {r["mode"]: r for r in tta.build_result("lm", 1000.0, 4, runs, timing)["records"]}
    ramp = rec["topk_1pct_adamdir_mask_ramp"]
    assert ramp["fraction_of_ideal_per_repeat"] == pytest.approx([50 / 136, 100 / 68])
    assert rec["topk_1pct"]["fraction_of_ideal_paired"] is None  # never reaches the target
    # timings without repeats (older files): no paired figure
    for t in timing.values():
        for p in t["phases"]:
            p.pop("repeats_step_s", None)
    rec = {r["mode"]: r for r in tta.build_result("lm", 1000.0, 4, runs, timing)["records"]}
    assert rec["dense"]["fraction_of_ideal_paired"] is None
    assert "paired by repeat" in tta.markdown_table(tta.build_result("lm", 1000.0, 4, runs,
                                                                     timing))


def test_a_smoothed_target_reads_the_mean_of_the_last_evaluations():
    # accuracy that swings between evaluations: dense touches its final (95) at step 20
    # and falls back; a mode swings higher early but its 3-evaluation mean reaches
    # dense's last 3-evaluation mean (95.0) later. The single-evaluation fields
    # stay as they are; the *_smoothed ones read the means.
    def acc_run(points):
        hist = [{"step": s, "test_accuracy": v} for s, v in points]
        return {"config": {"steps": 60}, "sync": "x", "k": None, "warmup_phases": [],
                "history": hist, "final": {"test_accuracy": points[-1][1],
                                           "replicas_identical": True}}

    runs = {"dense": acc_run([(0, 10.0), (10, 90.0), (20, 95.0), (30, 93.0), (40, 95.0),
                              (50, 95.0), (60, 95.0)]),
            "topk_1pct": acc_run([(0, 10.0), (10, 96.0), (20, 80.0), (30, 94.0), (40, 94.0),
                                  (50, 96.0), (60, 96.0)])}
    timing = {"none": timed(0.1), "dense": timed(0.4), "topk_1pct": timed(0.2, densities=[0.01])}
    assert tta.smoothed_history(runs["dense"]["history"], "test_accuracy", 3) == [
        {"step": 30, "test_accuracy": pytest.approx(278 / 3)},
        {"step": 40, "test_accuracy": pytest.approx(283 / 3)},
        {"step": 50, "test_accuracy": pytest.approx(283 / 3)},
        {"step": 60, "test_accuracy": pytest.approx(95.0)}]
    result = tta.build_result("cnn", 200.0, 4, runs, timing, smooth=3)
    recs = {r["mode"]: r for r in result["records"]}
    sparse = recs["topk_1pct"]
    assert sparse["steps_to_target"] == 10  # one evaluation: 96 >= 95 at step 10
    assert sparse["target_smoothed"] == pytest.approx(95.0)
    # means 90, 89.33, 94.67, 95.33 at steps 30-60: reached at 60; dense's own at 60
    assert sparse["steps_to_target_smoothed"] == 60
    assert recs["dense"]["steps_to_target_smoothed"] == 60
    assert sparse["time_to_target_smoothed_s"] == pytest.approx(60 * 0.2)
    assert sparse["fraction_of_ideal_smoothed"] == pytest.approx(60 * 0.1 / (60 * 0.2))
    assert sparse["gap_to_dense_smoothed"] == pytest.approx(286 / 3 - 95.0)
    assert sparse["smooth_evaluations"] == 3
    assert "mean of its last 3 evaluations" in tta.markdown_table(result)
    # without --smooth no *_smoothed field; more evaluations than a run has: an error
    assert "target_smoothed" not in tta.build_result("cnn", 200.0, 4, runs, timing)["records"][0]
    with pytest.raises(ValueError, match="--smooth 9 needs at least 9 evaluations"):
        tta.build_result("cnn", 200.0, 4, runs, timing, smooth=9)


def test_a_shorter_schedule_is_timed_as_its_base_and_joined_with_its_own_run(fake):
    """``<mode>_sched<D>`` trains with ``--decay-steps D`` and is charged its base
    mode's step times (the same compiled step), measured once."""
    import convergence

    base = "topk_1pct_adamdir_mask_ramp_warmbf16_enc"
    mode = f"{base}_sched260"
    assert convergence.schedule_base(mode) == base
    assert convergence.schedule_base("dense_sched270") == "dense"
    assert convergence.schedule_base(base) is None
    assert convergence.schedule_base("topk_1pct_adamdir_mask_ramp_meanvwarm_decay99") is None
    args = convergence.MODES[mode][0]
    assert args[:-2] == convergence.MODES[base][0] and args[-2:] == ["--decay-steps", "260"]
    # timed once, as the base
    assert tta.timed_modes([mode, "dense_sched270"]) == ["none", "dense", "dense_bf16", base]
    runs, timing = fake
    ramp = "topk_1pct_adamdir_mask_ramp_enc"
    timing[ramp] = timing["topk_1pct_adamdir_mask_ramp"]
    # a run that reaches dense's final (2.0) at step 50, with the ramp's phase
    runs[f"{ramp}_sched260"] = run([(0, 5.0), (50, 1.95), (100, 1.8)], phases=[[20, 0.25]])
    joined = tta.with_schedule_timings(timing, [f"{ramp}_sched260"])
    assert joined[f"{ramp}_sched260"] is timing[ramp]
    recs = {r["mode"]: r for r in tta.build_result("lm", 1000.0, 4, runs, joined)["records"]}
    short = recs[f"{ramp}_sched260"]
    assert short["timed_as"] == ramp and recs["dense"]["timed_as"] == "dense"
    assert short["example_args"][-2:] == ["--decay-steps", "260"]
    assert short["steps_to_target"] == 50
    assert short["time_to_target_s"] == pytest.approx(20 * 1.0 + 30 * 0.6)
    assert short["fraction_of_ideal"] == pytest.approx(50.0 / 38.0)


def test_runs_from_an_earlier_time_to_accuracy_record(tmp_path, fake):
    """A record's runs re-join to the same records: a re-timing needs no retraining."""
    runs, timing = fake
    result = tta.build_result("lm", 1000.0, 4, runs, timing)
    result.update({"machine": {"commit": "abc1234"}, "commands": {m: ["-n", "4"] for m in runs}})
    path = tmp_path / "time_to_accuracy_lm_1gbit_p4.json"
    path.write_text(json.dumps(result))
    again = tta.runs_from([str(path)], "lm", 4)
    assert set(again) >= set(runs)
    ramp = again["topk_1pct_adamdir_mask_ramp"]
    assert ramp["warmup_phases"] == [[20, 0.25]] and "abc1234" in ramp["run_source"]
    assert ramp["history"] == runs["topk_1pct_adamdir_mask_ramp"]["history"]
    rejoined = tta.build_result("lm", 1000.0, 4, {m: again[m] for m in runs}, timing)
    for old, new in zip(result["records"], rejoined["records"]):
        for field in ("steps_to_target", "time_to_target_s", "fraction_of_ideal",
                      "final_metric", "warmup_phases"):
            assert new[field] == old[field], (old["mode"], field)
    with pytest.raises(ValueError, match="not lm at P = 2"):
        tta.runs_from([str(path)], "lm", 2)


def test_a_larger_batch_reaches_training_and_timing_and_mixed_batches_are_refused(fake):
    assert tta.batch_argv(None) == [] and tta.batch_argv(4) == ["--batch-size", "4"]
    args = tta.parse_args(["--model", "lm", "--batch-size", "4"])
    assert args.batch_size == 4
    with pytest.raises(SystemExit):
        tta.parse_args(["--batch-size", "0"])
    runs, _ = fake
    tta.check_batches(runs, 2)  # runs that do not record a batch: the examples' default
    runs["dense"]["config"]["batch_size"] = 4
    tta.check_batches(runs, 4)
    with pytest.raises(ValueError, match="trained with 4 samples a rank a step, the timed "
                                         "step takes 2"):
        tta.check_batches(runs, 2)
