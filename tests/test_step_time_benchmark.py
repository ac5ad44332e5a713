"""benchmarks/step_time.py's bookkeeping (the timing itself runs under mpiexec, not here)."""

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _step_time_module():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    path = os.path.join(ROOT, "benchmarks", "step_time.py")
    spec = importlib.util.spec_from_file_location("_step_time", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeats_keep_the_median_job_whole():
    median_records = _step_time_module().median_records

    def run(mode, step_s, local, repeat, p=4):
        return {"model": "cnn", "link": "1000", "P": p, "mode": mode, "step_s": step_s,
                "local_step_s": local, "repeat": repeat}
    runs = [run("topk", 0.30, 0.20, 0), run("none", 0.10, None, 0),
            run("topk", 0.12, 0.11, 1), run("none", 0.11, None, 1),
            run("topk", 0.15, 0.13, 2), run("none", 0.50, None, 2), run("topk", 0.9, 0.1, 0, p=8)]
    recs = {(r["mode"], r["P"]): r for r in median_records(runs)}
    assert len(recs) == 3
    topk = recs[("topk", 4)]
    # the median repeat's record, its local time from the same job (not a mix)
    assert (topk["step_s"], topk["local_step_s"], topk["repeat"]) == (0.15, 0.13, 2)
    assert topk["repeats_step_s"] == [0.30, 0.12, 0.15]
    assert recs[("none", 4)]["step_s"] == 0.11 and recs[("topk", 8)]["repeats_step_s"] == [0.9]
    assert "repeats_step_s" not in runs[0]  # the raw runs are left as they were


def test_each_repeat_is_predicted_against_its_own_jobs_compute_step():
    st = _step_time_module()
    local = [["topk_sync", 1e-3, 2e-9, 0.0]]

    def run(mode, step_s, repeat, local_step=None):
        kind = st.parse_mode(mode)
        return {"model": "mlp", "link": "1000", "P": 4, "mode": mode, **kind, "N": 1_000_000,
                "k": st.mode_k(mode, 1_000_000) if kind["density"] else None,
                "step_s": step_s, "local_step_s": local_step, "repeat": repeat,
                "bytes_sent": [100] * 4 if kind["density"] else None,
                "local_work_calibrated": local}
    # repeat 1's whole job ran twice as slow (the machine was busy): its sparse step is
    # judged against its own slow compute step, not against repeat 0's
    runs = [run("none", 0.100, 0), run("topk_1pct_allgather", 0.110, 0, 0.105),
            run("none", 0.200, 1), run("topk_1pct_allgather", 0.220, 1, 0.210),
            run("none", 0.100, 2), run("topk_1pct_allgather", 0.130, 2, 0.120)]
    data = {"links": [{"name": "1000", "rate_mbit": 1000.0, "alpha_s": 1e-4}], "runs": runs}
    st.finish(data)
    sparse = [r for r in runs if r["mode"] != "none"]
    wire = st.predict_sync_time("topk_1pct_allgather", 4, 1_000_000, 10_000,
                                st.link_alpha_beta(data["links"][0]))
    for r, c in zip(sparse, (0.1, 0.2, 0.1)):
        assert r["compute_s"] == c
        assert r["predicted_s"] == pytest.approx(c + 1e-3 + 2e-9 * 1_000_000 + wire)
        assert r["measured_over_predicted"] == pytest.approx(r["step_s"] / r["predicted_s"])
    rec = next(r for r in data["records"] if r["mode"] != "none")
    assert rec["repeat"] == 2 and rec["compute_s"] == 0.1  # the median job, whole
    ratios = [r["measured_over_predicted"] for r in sparse]
    assert rec["repeats_measured_over_predicted"] == ratios
    assert rec["measured_over_predicted_median"] == pytest.approx(sorted(ratios)[1])
    st.finish(data)  # idempotent (--plot-only runs it again)
    assert next(r for r in data["records"] if r["mode"] != "none")["repeats_measured_over_predicted"] == ratios


def test_timed_steps_take_the_batches_in_turn():
    st = _step_time_module()
    seen = []

    def step(params, opt_state, batch):
        seen.append(batch)
        return params + 1, opt_state
    res, _ = st.time_steps(step, 0, None, ["a", "b", "c"], warmup=2, steps=4, max_seconds=100)
    assert len(res["times_s"]) == 4
    assert seen == ["a", "b", "c", "a", "b", "c", "a"]  # compile, 2 warm-up, 4 timed


def test_heavy_yield_is_added_only_where_the_ranks_outnumber_the_cores(monkeypatch):
    st = _step_time_module()
    monkeypatch.setattr(st.os, "cpu_count", lambda: 2)
    args = st.argparse.Namespace(rank_env=["A=1"], heavy_yield="auto")
    key = "MPIR_CVAR_ENABLE_HEAVY_YIELD"
    assert key not in st.rank_env(args, 2) and st.rank_env(args, 4)[key] == "1"
    assert key not in st.rank_env(args)  # the part common to every job
    assert st.rank_env(args, 4)["A"] == "1" and st.rank_env(args, 4)["JAX_PLATFORMS"] == "cpu"
    args.heavy_yield = "off"
    assert key not in st.rank_env(args, 8)
    args.heavy_yield = "on"
    assert st.rank_env(args, 1)[key] == "1"


def test_split_allgather_is_predicted_with_its_typical_bytes_and_psum_jss_dense_with_local_work(monkeypatch):
    st = _step_time_module()
    from jax_sparse_sync.planning import cost_model

    n, p = 4_000_000, 4
    calibrated = [["dense_sync", 2e-3, 10e-9, 0.0], ["topk_sync", 1e-3, 2e-9, 0.0]]

    def run(mode, step_s, link="shm", local_work=()):
        kind = st.parse_mode(mode)
        return {"model": "mlp", "link": link, "P": p, "mode": mode, **kind, "N": n,
                "k": st.mode_k(mode, n) if kind["density"] else None, "step_s": step_s,
                "local_step_s": None, "repeat": 0, "bytes_sent": None,
                "local_work_calibrated": list(local_work)}
    runs = [run("none", 0.1, local_work=calibrated),
            run("topk_1pct_split_allgather", 0.2, local_work=calibrated),
            run("psum_none", 0.05), run("psum_jss_dense", 0.3)]
    ab = cost_model.AlphaBeta(alpha=1e-5, beta=1e-9)
    data = {"links": [{"name": "shm", "rate_mbit": None, "alpha_s": ab.alpha,
                       "beta_s_per_byte": ab.beta}], "runs": runs}
    # the shm link's parameters, fixed for the test (finish reads them in step_timing.report)
    monkeypatch.setattr(sys.modules["step_timing.report"], "link_alpha_beta",
                        lambda link: ab)
    st.finish(data)
    split, psum_dense = runs[1], runs[3]
    vol = cost_model.wire_volume("split_allgather", nranks=p, size=n, k=40_000)
    assert split["predicted_bytes_typical"] == vol.bytes_typical < vol.bytes_max
    assert split["predicted_s"] == pytest.approx(
        0.1 + 1e-3 + 2e-9 * n + vol.messages * ab.alpha + vol.bytes_typical * ab.beta)
    assert split["predicted_worst_case_s"] == pytest.approx(
        split["predicted_s"] + (vol.bytes_max - vol.bytes_typical) * ab.beta)
    # the psum job does not calibrate: dense_sync's term comes from the MPI job
    assert psum_dense["compute_s"] == 0.05
    assert psum_dense["predicted_local_s"] == pytest.approx(2e-3 + 10e-9 * n)
    dense_wire = cost_model.sync_wire_time("dense_sync", nranks=p, size=n, k=n, params=ab)
    assert psum_dense["predicted_s"] == pytest.approx(0.05 + 2e-3 + 10e-9 * n + dense_wire)


def test_dense_bf16_is_the_dense_sync_on_a_16_bit_wire_priced_at_half_the_bytes():
    st = _step_time_module()
    from jax_sparse_sync.planning import cost_model

    assert "dense_bf16" in st.ALL_MODES and "dense_bf16" in st.PLOT_ORDER
    assert st.parse_mode("dense_bf16") == {"kind": "dense_bf16", "density": None,
                                           "algorithm": "dense"}
    assert st.mode_k("dense_bf16", 1000) is None and st.wire_dtype_index("dense") == 0
    n, p = 7_492_616, 4   # N divisible by P: the 16-bit payload is exactly half
    f32, bf16 = (st.predicted_volume(m, p, n, None) for m in ("dense", "dense_bf16"))
    header = cost_model.HEADER_BYTES * (p - 1)
    assert bf16.bytes_max - header == (f32.bytes_max - header) // 2
    ab = cost_model.AlphaBeta(alpha=0.0, beta=1e-9)
    assert st.predict_sync_time("dense_bf16", p, n, None, ab) == pytest.approx(
        bf16.bytes_typical * 1e-9)
    assert st.LOCAL_KIND["dense_bf16"] == "dense_sync"
    # the library's dense_sync with the bf16 wire: 1 + 2^-10 arrives rounded to 1
    import jax.numpy as jnp
    g = {"w": jnp.array([1 + 2 ** -10, 3.0], jnp.float32)}
    for mode, first in (("dense", -(1 + 2 ** -10) * st.LR), ("dense_bf16", -st.LR)):
        tx = st.make_tx(mode)
        updates, _ = tx.update(g, tx.init(g), g)
        assert updates["w"].tolist() == pytest.approx([first, -3 * st.LR], rel=1e-6)
