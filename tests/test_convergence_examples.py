"""The convergence examples (examples/train.py --model lm|resnet: train_lm.py,
train_resnet.py): short runs under mpiexec -n 2 on tiny configurations, and the LM
corpus split."""

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from test_multirank import ROOT, run_under_mpiexec


def _load(name):
    path = os.path.join(ROOT, "examples", f"{name}.py")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        spec = importlib.util.spec_from_file_location(f"_example_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    return module


@pytest.fixture(scope="module")
def train_lm():
    return _load("train_lm")


# --------------------------------------------------------------------------- corpus


def test_split_files_disjoint_and_capped(train_lm):
    files = [f"f{i:03d}.py" for i in range(100)]
    sizes = [10] * 100
    train, val = train_lm.split_files(files, sizes, max_bytes=455, val_every=20)
    assert not set(train) & set(val)
    assert len(train) + len(val) == 45                    # 45 files of 10 bytes fit in 455
    assert val == ["f000.py", "f020.py", "f040.py"]       # every 20th file taken
    assert train == [f for f in files[:45] if f not in val]
    assert train_lm.split_files(files, sizes, max_bytes=455, val_every=20) == (train, val)


def test_stdlib_corpus_deterministic_and_disjoint(train_lm):
    files = train_lm.stdlib_sources()
    assert files == sorted(files) and len(files) > 100
    assert not any("site-packages" in f or "__pycache__" in f for f in files)
    root = train_lm.sysconfig.get_paths()["stdlib"]
    sizes = [os.path.getsize(os.path.join(root, f)) for f in files]
    train, val = train_lm.split_files(files, sizes, max_bytes=2_000_000, val_every=20)
    assert train and val and not set(train) & set(val)
    assert sum(sizes[files.index(f)] for f in train + val) <= 2_000_000
    a_train, a_val, info = train_lm.build_corpus(2_000_000, 20)
    b_train, b_val, info_b = train_lm.build_corpus(2_000_000, 20)
    assert info == info_b and np.array_equal(a_train, b_train) and np.array_equal(a_val, b_val)
    assert info["train_files"] == len(train) and info["val_files"] == len(val)
    assert a_train.dtype == np.uint8 and a_train.size + a_val.size <= 2_000_000


def test_batches_seeded(train_lm):
    text = np.arange(1000, dtype=np.int64).astype(np.uint8)
    x1, y1 = train_lm.train_batch(text, seed=3, step=5, rank=1, batch=4, seq=16)
    x2, y2 = train_lm.train_batch(text, seed=3, step=5, rank=1, batch=4, seq=16)
    x3, _ = train_lm.train_batch(text, seed=3, step=5, rank=0, batch=4, seq=16)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2) and not np.array_equal(x1, x3)
    assert x1.shape == (4, 16) and np.array_equal(x1[:, 1:], y1[:, :-1])  # next-byte targets


# --------------------------------------------------------------------------- runs


def _run(tmp_path, script, args):
    out = tmp_path / "metrics.json"
    proc = run_under_mpiexec(
        2, ["-m", "mpi4py", os.path.join("examples", script), *args, "--json", str(out)],
        timeout=300)  # < 60 s each on an idle machine; generous when it is shared
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]   # non-zero when the replicas differ
    assert "parameters bitwise identical on all ranks: yes" in log, log[-4000:]
    metrics = json.loads(out.read_text())
    assert metrics["ranks"] == 2 and metrics["final"]["replicas_identical"]
    return metrics


@pytest.mark.parametrize("sync", [
    # with a dense flush of the residuals every 10th step
    ["--sync", "topk", "--density", "0.05", "--flush-every", "10"],
    # Ok-Topk on each rank's Adam direction with momentum masking, after 10 dense steps
    ["--sync", "oktopk", "--density", "0.05", "--sync-what", "adam_direction",
     "--mask-momentum", "restart", "--dense-warmup", "10"],
    # the rate before the sync, the small leaves (biases, LayerNorm) synced densely
    ["--sync", "topk", "--density", "0.05", "--sync-what", "adam_direction",
     "--mask-momentum", "restart", "--lr-before-sync", "--dense-below", "100"],
    # index-free Top-k: a sparse exchange every 2nd step, a dense allreduce of k between
    ["--sync", "shared_support", "--density", "0.05", "--refresh-every", "2"]])
def test_train_lm_two_ranks(tmp_path, sync):
    m = _run(tmp_path, "train_lm.py",
             [*sync, "--steps", "30", "--dim", "32", "--layers", "1", "--heads", "2",
              "--seq", "32", "--batch-size", "4", "--corpus-mb", "1", "--val-windows", "16",
              "--log-every", "10", "--lr", "3e-3", "--warmup-steps", "5"])
    hist = m["history"]
    assert [h["step"] for h in hist] == [0, 10, 20, 30]
    assert hist[-1]["val_loss"] < 0.8 * hist[0]["val_loss"], hist
    assert hist[-1]["train_loss"] < hist[1]["train_loss"], hist
    assert len(m["per_step"]["train_loss"]) == 30
    sent = [b[0] for b in m["per_step"]["bytes_sent"]]
    assert all(len(b) == 2 and b[0] > 0 for b in m["per_step"]["bytes_sent"])
    if "--dense-below" in sync:   # the sparse part's bytes plus the small leaves' dense ones
        assert sent[0] > 0 and len(set(sent)) == 1, sent
    if "--flush-every" in sync:   # steps 10, 20, 30 (the 10th, 20th, 30th) send densely
        flushes = [sent[i] for i in (9, 19, 29)]
        assert len(set(flushes)) == 1 and flushes[0] > 4 * max(sent[:9] + sent[10:19]), sent
    if "--refresh-every" in sync:  # steps 1, 3, ... refresh (the allgather of index-value
        # pairs), steps 2, 4, ... a dense allreduce of the same k values: no indices
        refresh, shared = sent[0::2], sent[1::2]
        assert len(set(refresh)) == 1 and len(set(shared)) == 1, sent
        assert shared[0] < refresh[0], sent
        assert m["sync"] == "shared_support 5% refresh_every=2"
    if "--dense-warmup" in sync:   # dense for steps 1..10, then sparse: far fewer bytes
        assert len(set(sent[:10])) == 1 and max(sent[10:]) < sent[0] / 2, sent
        assert m["warmup_phases"] == [[10, 1.0]]
    else:
        assert m["warmup_phases"] == []


def test_dense_small_leaves_partitions_by_size_and_stats_sum_over_syncs(train_lm):
    import types

    import jax.numpy as jnp
    import optax

    import jax_sparse_sync as jss
    models = train_lm.models  # examples/models.py, as the scripts import it
    args = types.SimpleNamespace(sync="topk", dense_below=10)
    tx = models.dense_small_leaves(args, jss.topk_sync(k=2), lambda s: s)
    params = {"b": jnp.zeros(4), "w": jnp.zeros((4, 5))}
    state = tx.init(params)
    inner = state.inner_states
    assert isinstance(inner["small"].inner_state, jss.DenseSyncState)
    assert isinstance(inner["large"].inner_state, jss.TopkSyncState)
    assert inner["large"].inner_state.residual.shape == (20,)  # only w's entries
    args.dense_below = 0  # off: the sync itself
    assert isinstance(models.dense_small_leaves(args, jss.topk_sync(k=2)).init(params),
                      jss.TopkSyncState)
    # stats: the largest sender's vector, bytes and messages summed over the syncs
    fields = jss.SyncStats._fields

    def stats(sent, received, nnz):
        v = [0] * len(fields)
        v[fields.index("bytes_sent")], v[fields.index("bytes_received")] = sent, received
        v[fields.index("messages")], v[fields.index("result_nnz")] = 1, nnz
        return types.SimpleNamespace(last_stats=jnp.array(v, jss.stats.stats_dtype()))
    nested = (optax.EmptyState(), {"a": (stats(100, 90, 7),), "b": stats(40, 30, 3)})
    got = jss.SyncStats.from_vector(models.sync_stats(nested))
    assert (got.bytes_sent, got.bytes_received, got.messages, got.result_nnz) == (140, 120, 2, 7)
    one = stats(5, 6, 1)
    assert models.sync_stats((one,)) is one.last_stats
    with pytest.raises(ValueError, match="no sync state"):
        models.sync_stats((optax.EmptyState(),))
    # a list and an AdamDirectionSyncState (its sync's stats, counted once)
    adam = jss.adam_direction_sync(jss.topk_sync(k=2)).init(params)
    got = jss.SyncStats.from_vector(jss.last_stats([adam, stats(3, 4, 1)]))
    assert (got.bytes_sent, got.messages) == (3, 1)


@pytest.mark.parametrize("extra", [[], ["--dense-below", "10"], ["--lr-before-sync"]],
                         ids=["folded", "dense_below", "lr_before_sync"])
def test_lm_optimizer_clips_inside_the_adam_pass_as_the_chain_did(train_lm, extra):
    # make_optimizer folds clip_by_global_norm(1) into adam_direction_sync (the fused
    # pass clips each entry as it reads it; with --dense-below, two Adam passes, the
    # chain's clip stays): the steps are chain(clip_by_global_norm(1), ...)'s bit for bit
    import jax
    import jax.numpy as jnp
    import optax

    models = train_lm.models
    args = train_lm.parse_args(["--sync", "topk", "--density", "0.1", "--sync-what",
                                "adam_direction", "--mask-momentum", "restart", "--steps",
                                "20", *extra])
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.lr, warmup_steps=min(args.warmup_steps, args.steps),
        decay_steps=max(args.steps, args.warmup_steps + 1), end_value=args.lr / 10)
    ours = train_lm.make_optimizer(args, models.make_sync(args))
    theirs = optax.chain(optax.clip_by_global_norm(1.0), *models.adam_then_sync(
        args, models.make_sync(args), schedule, args.weight_decay))
    rng = np.random.default_rng(0)
    params = {"b": jnp.zeros(4), "w": jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)}
    results = []
    for tx in (ours, theirs):
        p, state = params, tx.init(params)
        update = jax.jit(tx.update)
        for t in range(6):  # the norm about 0.6 t: clipped from step 2 on
            g = jax.tree_util.tree_map(
                lambda x, t=t: jnp.asarray(np.random.default_rng([t, x.size]).standard_normal(
                    x.shape) * 0.1 * t, jnp.float32), params)
            u, state = update(g, state, p)
            p = optax.apply_updates(p, u)
        results.append(p)
    for name in params:
        assert np.asarray(results[0][name]).tobytes() == np.asarray(results[1][name]).tobytes()
    assert not np.array_equal(np.asarray(results[0]["w"]), np.asarray(params["w"]))


def test_make_sync_shared_support_and_its_unsupported_flags(train_lm):
    import argparse

    import jax.numpy as jnp

    import jax_sparse_sync as jss
    models = train_lm.models
    parser = argparse.ArgumentParser()
    models.add_sync_arguments(parser)
    models.add_warmup_argument(parser)
    args = parser.parse_args(["--sync", "shared_support", "--density", "0.25",
                              "--refresh-every", "3"])
    tx = models.make_sync(args)
    state = tx.init({"w": jnp.zeros(8)})
    assert isinstance(state, jss.SharedSupportSyncState) and state.support.shape == (2,)
    assert models.sync_label(args) == "shared_support 25% refresh_every=3"
    for extra in (["--selection", "union"], ["--wire-dtype", "bfloat16"],
                  ["--density-ramp", "10"], ["--residual-decay", "0.9"]):
        bad = parser.parse_args(["--sync", "shared_support", *extra])
        with pytest.raises(SystemExit, match=extra[0]):
            models.make_sync(bad)


def _convergence_module():
    path = os.path.join(ROOT, "benchmarks", "convergence.py")
    spec = importlib.util.spec_from_file_location("_convergence", path)
    convergence = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convergence)
    return convergence


def test_convergence_step_times_later_files_override_and_missing_ones_are_skipped(tmp_path):
    convergence = _convergence_module()

    def rec(mode, step_s, model="transformer", link="1000", procs=4):
        return {"mode": mode, "step_s": step_s, "model": model, "link": link, "P": procs}
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"records": [rec("dense", 1.0), rec("topk_1pct_auto", 0.4),
                                           rec("dense", 9.0, procs=8)]}))
    new.write_text(json.dumps({"records": [rec("dense", 1.5), rec("adamdir_1pct", 0.6),
                                           rec("dense", 7.0, model="cnn")]}))
    times = convergence.load_step_times(
        convergence.read_step_time_files([old, new, tmp_path / "missing.json"]),
        "transformer", "1000", 4)
    assert {m: r["step_s"] for m, r in times.items()} == {
        "dense": 1.5, "topk_1pct_auto": 0.4, "adamdir_1pct": 0.6}
    assert times["dense"]["_source"].endswith("new.json")
    assert times["topk_1pct_auto"]["_source"].endswith("old.json")
    # the masked Adam-direction modes are timed as step_time's adamdir_* modes, and
    # fall back (flagged) to their sync's own time where those were not measured
    assert convergence.MODES["topk_1pct_adamdir_mask_ramp"][1:] == ("adamdir_1pct", False)
    assert convergence.STEP_TIME_FALLBACK["adamdir_1pct"] == "topk_1pct_auto"


def test_convergence_plot_styles_follow_the_mode_name():
    style = _convergence_module().plot_style
    assert style("dense")["color"] == "black" and style("dense")["ls"] == "-"
    assert style("topk_1pct_reuse")["ls"] == "--"
    assert style("topk_0.1pct_adamdir")["ls"] == ":"
    assert style("topk_1pct_adamdir_mask")["ls"] == (0, (5, 1, 1, 1))
    assert "marker" not in style("topk_1pct_adamdir_mask")
    assert style("topk_1pct_adamdir_mask_ramp")["marker"] == "o"
    assert style("topk_1pct_adamdir_mask_ramp10")["marker"] == "^"
    assert style("topk_1pct_ramp")["ls"] == "-." and style("oktopk_1pct")["color"] == "tab:red"
    assert style("topk_1pct_adamdir_ramp")["color"] == style("topk_1pct")["color"]
    assert style("topk_1pct_adamdir_mask_ramp_union")["color"] == "tab:green"
    assert style("topk_2pct_adamdir_mask_ramp")["color"] == "tab:purple"
    assert style("topk_1pct_adamdir_mask_ramp_meanvwarm_decay99")["ls"] == (0, (6, 2))


def test_convergence_plot_has_a_gap_to_dense_panel(tmp_path):
    convergence = _convergence_module()

    def series(vals):
        return {"history": [{"step": 25 * i, "val_loss": v} for i, v in enumerate(vals)],
                "emulated_step_s": 1.0}
    result = {"model": "lm", "metric": "val_loss", "num_params": 10, "procs": 8,
              "time_axis": {"link_mbit": 1000},
              "table": [{"mode": "dense", "final_val_loss": 2.0}],
              "series": {"dense": series([6.0, 3.0, 2.0]),
                         "topk_1pct_adamdir_mask_ramp": series([6.0, 3.5, 2.25])}}
    axes = convergence.plot(result, tmp_path / "c.png")
    assert axes.shape == (1, 3) and (tmp_path / "c.png").stat().st_size > 0
    (line,) = axes[0][2].get_lines()[:1]  # the mode's gap (dense has none), then y = 0
    assert list(line.get_xdata()) == [25, 50] and list(line.get_ydata()) == [0.5, 0.25]


def test_convergence_charges_the_reported_warmup_steps():
    convergence = _convergence_module()
    run = {"sync": "topk 1% exact", "config": {"density_ramp": 25},
           "warmup_phases": [[10, 1.0], [25, 0.25], [25, 0.0625]]}
    assert convergence.run_warmup_phases(run) == [[10, 1.0], [25, 0.25], [25, 0.0625]]
    assert convergence.elapsed(100, 0.5, [(60, 2.0)]) == 60 * 2.0 + 40 * 0.5
    assert convergence.run_warmup_phases({"sync": "dense", "config": {}}) == []
    with pytest.raises(ValueError, match="re-run this mode"):
        convergence.run_warmup_phases({"sync": "topk", "config": {"density_ramp": 25}})


def test_train_resnet_two_ranks(tmp_path):
    # the shared loop's own entry point (train_resnet.py ... is train.py --model resnet ...)
    m = _run(tmp_path, "train.py",
             ["--model", "resnet", "--sync", "topk", "--density", "0.05", "--steps", "40", "--widths", "8", "16",
              "--blocks", "1", "--batch-size", "32", "--lr", "3e-3", "--log-every", "20",
              "--warmup-steps", "5"])
    hist = m["history"]
    assert [h["step"] for h in hist] == [0, 20, 40]
    assert hist[-1]["train_loss"] < hist[1]["train_loss"] or \
        hist[-1]["test_loss"] < hist[0]["test_loss"], hist
    assert hist[-1]["test_loss"] < hist[0]["test_loss"], hist
    assert m["leaves"] == 22 and m["k"] == round(0.05 * m["num_params"])


def test_convergence_retime_recomputes_the_time_axis_from_other_step_times(tmp_path):
    convergence = _convergence_module()
    result = json.loads(open(os.path.join(
        ROOT, "benchmarks", "results", "convergence_lm_seeds.json")).read())
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"optimizer": "adamw", "records": [
        {"mode": m, "step_s": s, "model": "transformer", "link": "1000", "P": 4}
        for m, s in (("dense", 2.0), ("adamdir_1pct", 1.0))]}))
    out = convergence.retime(result, [times])
    rows = {r["mode"]: r for r in out["table"]}
    assert rows["dense"]["time_to_dense_final_s"] == 300 * 2.0
    ramp = rows["topk_1pct_adamdir_mask_ramp"]  # 75 warm-up steps charged dense's step
    assert ramp["steps_to_dense_final"] == 300 and ramp["warmup_steps_at_dense_time"] == 75
    assert ramp["time_to_dense_final_s"] == 75 * 2.0 + 225 * 1.0
    assert ramp["speedup_to_dense_final"] == 600 / 375
    assert ramp["step_time_source"].endswith("times.json")
    assert rows["topk_0.1pct_adamdir_mask_ramp"]["emulated_step_s"] is None  # not measured
    assert out["time_axis"]["step_time_optimizer"] == {ramp["step_time_source"]: "adamw"}
    assert out["time_axis"]["retimed_from_runs_of"] == result["time_axis"]["source"]
    assert result["table"][1]["time_to_dense_final_s"] != 375  # the input is not modified


def test_convergence_warmup_phases_are_charged_their_own_step_time(tmp_path):
    convergence = _convergence_module()
    assert convergence.mode_warmup_phases("topk_1pct_adamdir_mask_ramp") == [
        (25, 0.25), (25, 0.0625), (25, 0.015625)]
    assert convergence.mode_warmup_phases("topk_1pct_adamdir_mask") == []
    assert convergence.phase_step_time_mode("adamdir_1pct", 0.0625) == "adamdir_6.25pct"
    assert convergence.phase_step_time_mode("topk_0.1pct_auto", 0.25) == "topk_25pct_auto"
    assert convergence.phase_step_time_mode("adamdir_1pct", 1.0) == "dense"
    result = json.loads(open(os.path.join(
        ROOT, "benchmarks", "results", "convergence_lm_seeds.json")).read())
    times = tmp_path / "times.json"
    measured = (("dense", 2.0), ("adamdir_1pct", 1.0), ("adamdir_25pct", 1.5),
                ("adamdir_6.25pct", 1.2))  # the 1.5625 % stage not measured: dense's
    times.write_text(json.dumps({"records": [
        {"mode": m, "step_s": s, "model": "transformer", "link": "1000", "P": 4}
        for m, s in measured]}))
    ramp = {r["mode"]: r for r in convergence.retime(result, [times])["table"]}[
        "topk_1pct_adamdir_mask_ramp"]
    assert ramp["time_to_dense_final_s"] == 25 * 1.5 + 25 * 1.2 + 25 * 2.0 + 225 * 1.0
    assert ramp["warmup_steps_at_dense_time"] == 25
    assert [m for _, _, m in ramp["warmup_phase_step_s"]] == [
        "adamdir_25pct", "adamdir_6.25pct", "dense"]
    assert convergence.elapsed(10, 1.0, [(5, 3.0)]) == 5 * 3.0 + 5 * 1.0
    assert convergence.elapsed(3, 1.0, [(5, 3.0)]) == 9.0
    assert convergence.elapsed(10, 1.0, [(5, None)]) is None


@pytest.mark.parametrize("sync", ["dense", "oktopk"])
def test_residual_decay_is_refused_outside_topk(train_lm, sync):
    import types

    args = types.SimpleNamespace(sync=sync, residual_decay=0.99, residual_decay_steps=0,
                                 density=0.01, tau=32, selection=None, flush_every=0)
    with pytest.raises(SystemExit, match="--residual-decay applies to --sync topk"):
        train_lm.models.make_sync(args)
    args.residual_decay = 1.0
    assert train_lm.models.make_sync(args) is not None


def test_decay_steps_ends_the_cosine_sooner_and_holds_its_end_value(train_lm):
    """``--decay-steps``: the default is the old schedule bit for bit; a shorter one
    reaches lr / 10 at its step and holds it."""
    import optax

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import models
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    args = train_lm.parse_args(["--steps", "300"])
    assert args.decay_steps is None
    old = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup_steps=30, decay_steps=300,
                                             end_value=args.lr / 10)
    default = models.lr_schedule(args, end_value=args.lr / 10)
    for step in (0, 10, 30, 100, 250, 299, 300, 400):
        assert float(default(step)) == float(old(step))
    short = models.lr_schedule(train_lm.parse_args(["--steps", "300", "--decay-steps", "250"]),
                               end_value=args.lr / 10)
    assert float(short(30)) == pytest.approx(args.lr)
    assert float(short(200)) < float(default(200))
    for step in (250, 275, 300):
        assert float(short(step)) == pytest.approx(args.lr / 10)
    with pytest.raises(ValueError, match="--decay-steps"):
        models.lr_schedule(train_lm.parse_args(["--decay-steps", "0"]), end_value=0.0)


# --------------------------------------------------------------------------- DiLoCo


def test_train_lm_two_ranks_diloco_sparse_outer_step_in_two_fragments(tmp_path):
    # --every 5 --fragments 2: fragment 0's outer step after steps 2, 7, 12, ...,
    # fragment 1's after 5, 10, ...; nothing is sent on the other steps
    m = _run(tmp_path, "train_lm.py",
             ["--every", "5", "--outer-sync", "topk", "--outer-density", "0.05",
              "--fragments", "2", "--steps", "30", "--dim", "32", "--layers", "1",
              "--heads", "2", "--seq", "32", "--batch-size", "4", "--corpus-mb", "1",
              "--val-windows", "16", "--log-every", "10", "--lr", "3e-3",
              "--warmup-steps", "5"])
    hist = m["history"]
    assert hist[-1]["val_loss"] < 0.8 * hist[0]["val_loss"], hist
    sent = np.asarray(m["per_step"]["bytes_sent"])  # (steps, ranks)
    outer = [t for t in range(1, 31) if t % 5 in (0, 2)]
    assert [t for t in range(1, 31) if sent[t - 1].all()] == outer, sent[:, 0]
    assert not sent[[t - 1 for t in range(1, 31) if t not in outer]].any()
    assert m["final"]["bytes_per_rank"] == pytest.approx(sent.sum(axis=0).mean())
    assert (m["every"], m["fragments"]) == (5, 2)
    assert m["sync"] == "diloco H=5 topk 5% F=2" and m["warmup_phases"] == []


def test_outer_step_options_build_the_transform_and_refuse_per_step_ones(train_lm):
    import optax

    import jax_sparse_sync as jss

    models = train_lm.models
    args = train_lm.parse_args(["--every", "30", "--outer-sync", "dense_bf16"])
    tx = models.make_diloco(args, optax.adamw(1e-3))
    assert isinstance(tx.init({"w": np.zeros(3, np.float32)}), jss.DiLoCoState)
    assert models.outer_sync_label(args) == "diloco H=30 dense_bf16"
    # DiLoCo's outer Nesterov step for dense, SparseLoCo's plain SGD at 1 for the sparse ones
    for sync, lr, momentum in (("dense", 0.7, 0.9), ("topk", 1.0, 0.0)):
        outer = models.outer_optimizer(train_lm.parse_args(["--every", "3", "--outer-sync",
                                                            sync]))
        g = {"w": np.ones(2, np.float32)}
        first, state = outer.update(g, outer.init(g))
        second, _ = outer.update(g, state)
        assert float(first["w"][0]) == pytest.approx(-lr * (1 + momentum))
        assert float(second["w"][0]) == pytest.approx(-lr * (1 + momentum + momentum ** 2))
    for extra in (["--dense-below", "100"], ["--sync-what", "adam_direction"]):
        with pytest.raises(SystemExit, match="not of --every"):
            models.make_diloco(train_lm.parse_args(["--every", "3", *extra]), optax.sgd(0.1))
    with pytest.raises(SystemExit, match="--outer-ef-decay applies to"):
        models.make_outer_sync(train_lm.parse_args(["--every", "3", "--outer-ef-decay", "0.9"]))
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--every", "-1"])
    args = train_lm.parse_args(["--every", "3", "--outer-sync", "chunked_topk",
                                "--outer-chunk", "64", "--outer-bits", "2"])
    state = models.make_diloco(args, optax.sgd(0.1)).init({"w": np.zeros(256, np.float32)})
    assert isinstance(state.sync[0], jss.ChunkedTopkSyncState)
    assert models.outer_sync_label(args) == "diloco H=3 chunked_topk 1% 2-bit chunk 64"
