"""The step-timeline helpers of benchmarks/grouping.py: HLO op classes, XLA op
extraction from a ``jax.profiler`` trace on the monotonic clock, the summary and
the plot. One process, no MPI; the trace tests skip if the profiler cannot run."""

import glob
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import grouping as G  # noqa: E402

HLO = """HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation.1 (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %mul.1 = f32[8]{0} multiply(%param_0, %param_0), metadata={op_name="jit(step)/transpose(jvp(f))/mul"}
}

%fused_computation.2 (param_0.1: f32[8]) -> f32[8] {
  %param_0.1 = f32[8]{0} parameter(0)
  ROOT %tanh.1 = f32[8]{0} tanh(%param_0.1), metadata={op_name="jit(step)/jvp(f)/tanh"}
}

ENTRY %main.9 (Arg_0.1: f32[8]) -> f32[8] {
  %Arg_0.1 = f32[8]{0} parameter(0)
  %tanh_fusion = f32[8]{0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(step)/jvp(f)/tanh"}
  %multiply_fusion.3 = f32[8]{0} fusion(%tanh_fusion), kind=kLoop, calls=%fused_computation.1
  %ffi_call.7 = (f32[1]{0}, s32[1]{0}) custom-call(%multiply_fusion.3), custom_call_target="jss_topk", metadata={op_name="jit(step)/ffi_call"}
  %jss_sparse_allreduce_start.8 = (token[], s32[]) custom-call(%multiply_fusion.3), custom_call_target="jss_sparse_allreduce_start", custom_call_has_side_effect=true
  ROOT %add.4 = f32[8]{0} add(%multiply_fusion.3, %Arg_0.1), metadata={op_name="jit(step)/sub"}
}
"""


def test_hlo_op_classes():
    c = G.hlo_op_classes(HLO)
    assert c["tanh_fusion"] == "forward"
    assert c["multiply_fusion.3"] == "backward"  # from the computation it calls
    assert c["ffi_call.7"] == "sync"
    assert c["jss_sparse_allreduce_start.8"] == "sync"
    assert c["add.4"] == "other"
    assert c["Arg_0.1"] == "other"  # no metadata, calls nothing
    assert c["mul.1"] == "backward" and c["tanh.1"] == "forward"


def _group(start, wb, we, done):
    return {"start": start, "checked": start, "wire_begin": wb, "wire_end": we, "done": done,
            "done_exit": done + 0.001, "group": 0, "kind": "normal", "leaves": 1}


def synthetic_run():
    ranks = []
    for r in range(2):
        ops = [["f.1", "forward", 0.001, 0.010, "t"], ["b.1", "backward", 0.011, 0.030, "t"],
               ["b.2", "backward", 0.031, 0.050 + 0.002 * r, "t"],
               ["o.1", "other", 0.051, 0.060, "t"]]
        groups = [_group(0.020, 0.021, 0.025, 0.061), _group(0.040, 0.045, 0.055, 0.062),
                  _group(0.056, 0.057, 0.058, 0.063)]
        ranks.append({"rank": r, "step_s": 0.07, "ops": ops, "groups": groups})
    return {"model": "cnn", "link": "1000", "P": 2, "density": 0.01,
            "step_timeline": {"plan": "wfbp", "groups": 3, "compute_source": "jax.profiler",
                              "ranks": ranks}}


def test_summary_and_plot(tmp_path):
    run = synthetic_run()
    s = G.timeline_summary(run["step_timeline"]["ranks"][1])
    assert s["backward_end_s"] == pytest.approx(0.052)
    assert (s["started_before"], s["wire_began_before"], s["wire_ended_before"]) == (2, 2, 1)
    assert s["first_start_s"] == pytest.approx(0.020)
    path = tmp_path / "tl.png"
    G.plot_step_timeline([run, run], path)
    assert path.stat().st_size > 10_000
    # the fallback (no profiler): ready-time marks and a profiled backward end
    rr = run["step_timeline"]["ranks"][0]
    rr.update(ops=[], marks=[[0.01, "a"], [0.02, "b"]], backward_end_s=0.03)
    run["step_timeline"]["compute_source"] = "profile_backward ready times"
    assert G.timeline_summary(rr)["started_before"] == 1
    G.plot_step_timeline([run], tmp_path / "fallback.png")
    assert (tmp_path / "fallback.png").exists()


class _Plan:
    def __init__(self, n):
        self.groups = [object()] * n


def test_pick_timeline_plan():
    plans = {"ungrouped": None, "asc": _Plan(1), "wfbp": _Plan(80), "mg": _Plan(28)}
    assert G.pick_timeline_plan(plans, "most") == "wfbp"
    assert G.pick_timeline_plan(plans, None) == "wfbp"
    assert G.pick_timeline_plan(plans, "mg") == "mg"
    assert G.pick_timeline_plan(plans, "bucket") is None
    assert G.pick_timeline_plan({"ungrouped": None}, "most") is None
    # auto kept one group (the ungrouped sync): the fastest predicted grouped plan instead
    assert G.pick_timeline_plan({"auto": None, "asc_wfbp": _Plan(2)}, "auto") == "asc_wfbp"
    assert G.pick_timeline_plan({"auto": None}, "auto") is None


def test_trace_alignment_and_window(tmp_path):
    jax = pytest.importorskip("jax")
    # the timeline reads the host's XLA ops (the emulated-network benchmark runs
    # on CPU); on a GPU the step's ops are in the device's trace plane instead
    with jax.default_device(jax.devices("cpu")[0]):
        trace_alignment_and_window(jax, tmp_path)


def trace_alignment_and_window(jax, tmp_path):
    import jax.numpy as jnp

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    step = jax.jit(lambda w, x: w - 0.1 * jax.grad(loss)(w, x))
    w = jnp.ones((192, 192)) * 0.01
    x = jnp.ones((64, 192))
    classes = G.hlo_op_classes(step.lower(w, x).compile().as_text())
    assert "forward" in classes.values() and "backward" in classes.values()
    step(w, x).block_until_ready()
    try:
        jax.profiler.start_trace(str(tmp_path))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"jax.profiler.start_trace failed: {e}")
    try:
        step(w, x).block_until_ready()  # before the window: must be dropped
        offset = time.time_ns() - time.monotonic_ns()
        t0 = time.monotonic_ns()
        with jax.profiler.TraceAnnotation(G.STEP_ANNOTATION):
            step(w, x).block_until_ready()
        t1 = time.monotonic_ns()
        step(w, x).block_until_ready()  # after the window: dropped
    finally:
        jax.profiler.stop_trace()
    files = glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)
    if not files:
        pytest.skip("the profiler wrote no xplane.pb")
    pdata = jax.profiler.ProfileData.from_file(files[0])
    every = G.profile_events(pdata)
    ops, ann = G.aligned_ops(pdata, wall_minus_mono_ns=offset, step_start_mono_ns=t0,
                             step_end_mono_ns=t1, classes=classes)
    window = (t1 - t0) * 1e-9
    assert ops, "no XLA op inside the step"
    assert all(0.0 <= o[2] <= o[3] <= window for o in ops)
    # three calls were traced; only the one inside the window is kept
    names = [o[0] for o in ops]
    assert len(every) >= 3 * len(ops) and len(set(names)) == len(names)
    assert {o[1] for o in ops} >= {"forward", "backward"}
    # the clocks agree: the annotation opens right after t0 and closes right before t1
    assert ann is not None
    assert 0.0 <= ann[0] < 0.002 and window - 0.002 < ann[1] <= window + 1e-4
