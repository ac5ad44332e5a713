"""Layer grouping (ASC-WFBP) end to end: measured step time of each plan next to
the planner's prediction, on the emulated network, with one step's timeline.

Per (model, sync, link, P), one MPI job: ``jss.planning.calibrate(local=...,
contention=True)`` on that link; ``jss.planning.auto_grouping`` profiles the backward
pass (with ``--fit-group-cost``, also fits the per-group cost from the model's step);
the plans of ``--plans`` (``ungrouped``, ``wfbp``, ``mg_wfbp``, ``asc_wfbp`` of
``jss.planning.plan_grouping``, and ``auto``; equal plans timed once) and the step
without sync are timed in ``--rounds`` interleaved rounds of ``--steps`` steps (each
after a barrier, the slowest rank's time); then one traced step of ``--timeline-plan``:
its XLA ops from ``jax.profiler`` and each group's start, wire and done from
``jss.planning.nonblocking_timeline()`` (``step_timeline``; ``--timeline-only``: only
calibration, profile and this step).

Syncs (``--syncs``): ``topk`` (at ``--density``) and ``dense`` (grouped:
``grouped_topk_sync(plan, density=1.0, algorithm="dense")``). A plan's prediction
(:func:`predict_plans`) is the planner's simulated end of the backward pass or of the
last group's wire time plus the step's tail (the no-sync step minus the profiled
gradient); a stale profile is scaled first (:func:`stale_profile_scale`).
``--repredict FILE`` applies the current rules to a recorded run. Records: one per plan
(``measured_s``, ``predicted_s``, ``error``, ``groups``, ...) and ``goals`` (:func:`goals`).

Models: ``step_timing/models.py``'s ``cnn``, ``mlp`` and ``transformer``. With one core
per rank (``--pin-cores``; root, for the emulated links)::

    python benchmarks/grouping.py --models transformer --syncs dense --links 200 \\
        --procs 2 --pin-cores --rank-env XLA_FLAGS="--xla_cpu_multi_thread_eigen=false \\
        intra_op_parallelism_threads=1" MPIR_CVAR_ENABLE_HEAVY_YIELD=1 --tag lm_dense_200mbit_p2

Writes ``results/grouping_<tag>.{json,png}`` and ``results/grouping_timeline_<tag>.png``;
the results: docs/topics/scheduling.md and benchmarks/README.md ("grouping.py").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (add_bind_option, bind_args, launch_worker, machine_info,  # noqa: E402
                      pyplot, save_figure, write_fragment, write_record)
from step_time import DEFAULT_MPI_ENV, MALLOC_ENV, fresh, make_step, probe_link  # noqa: E402
from step_timing.models import setup  # noqa: E402

RESULTS = HERE / "results"
MODEL_CFG = {
    "cnn": {"widths": [32, 64, 128], "blocks": 3, "image": 32, "classes": 10, "batch": 16},
    "mlp": {"input": 256, "hidden": 1536, "layers": 4, "classes": 10, "batch": 32},
    # examples/models.py's LM_CONFIG
    "transformer": {"vocab": 256, "dim": 384, "heads": 6, "layers": 6, "mlp_ratio": 4,
                    "seq": 128, "batch": 32},
}
PLANS = ("ungrouped", "wfbp", "mg_wfbp", "asc_wfbp", "auto")


# --------------------------------------------------------------------------- step timeline
# One measured step with its XLA compute ops (jax.profiler) and each group's
# non-blocking allreduce (jss.planning.nonblocking_timeline), on one clock per rank.
#
# Clocks: the records are C++ std::chrono::steady_clock (CLOCK_MONOTONIC on Linux,
# ffi/collectives/nonblocking_ffi.cc), as time.monotonic_ns(). The profiler's XSpace stores event
# times relative to the session's start, whose wall-clock time (ns since the epoch) is
# the "profile_start_time" stat of its "Task Environment" plane; an event's monotonic
# time is then profile_start_time + start_ns - (time.time_ns() - time.monotonic_ns()).
# The step is wrapped in a TraceAnnotation whose aligned begin is checked against the
# Python timestamp taken just before it (``alignment_error_s`` in the results).

STEP_ANNOTATION = "jss_grouping_timeline_step"
OP_CLASSES = ("forward", "backward", "sync", "other")


def hlo_op_classes(hlo_text: str) -> dict:
    """``{instruction name: class}`` for the instructions of a compiled module's text.

    Classes: ``"sync"`` (custom calls of jax_sparse_sync: top-k, the allreduce's
    start/done), ``"backward"`` (JAX's ``op_name`` metadata has ``transpose(``: the
    VJP), ``"forward"`` (``jvp(`` without ``transpose(``), ``"other"`` (optimizer,
    residual update, copies). A fusion without metadata takes the most common class
    of the instructions it calls (ignoring ``"other"`` when there is any other).
    """
    import re
    instr_re = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
    comp_re = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
    calls_re = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
    meta_re = re.compile(r'op_name="([^"]*)"')
    target_re = re.compile(r'custom_call_target="([^"]*)"')

    def direct(line):
        t = target_re.search(line)
        if t and t.group(1).startswith("jss_"):
            return "sync"
        m = meta_re.search(line)
        if not m:
            return None
        name = m.group(1)
        if "transpose(" in name:
            return "backward"
        if "jvp(" in name:
            return "forward"
        return "other"

    comps, instr = {}, {}
    current = None
    for line in hlo_text.splitlines():
        m = instr_re.match(line)
        if m and current is not None:
            name = m.group(1)
            cls = direct(line)
            callee = calls_re.findall(line)
            instr[name] = (cls, callee)
            comps[current].append(name)
            continue
        c = comp_re.match(line)
        if c and "=" not in line.split("(")[0]:
            current = c.group(1)
            comps.setdefault(current, [])

    memo = {}

    def classify(name, depth=0):
        if name in memo:
            return memo[name]
        cls, callees = instr.get(name, (None, []))
        if cls is None and depth < 8:
            votes = {}
            for comp in callees:
                for sub in comps.get(comp, ()):
                    v = classify(sub, depth + 1)
                    votes[v] = votes.get(v, 0) + 1
            real = {k: v for k, v in votes.items() if k not in ("other", None)}
            pick = real or votes
            cls = max(pick, key=lambda k: (pick[k], k or "")) if pick else None
        memo[name] = cls or "other"
        return memo[name]

    return {name: classify(name) for name in instr}


def profile_start_ns(profile) -> int | None:
    """Wall-clock ns of the profiler session's start (the base of its events' times)."""
    for plane in profile.planes:
        if plane.name == "Task Environment":
            for k, v in plane.stats:
                if k == "profile_start_time":
                    return int(v)
    return None


def profile_events(profile, *, with_stat: str | None = "hlo_op"):
    """``[(name, start_ns, end_ns, line name)]`` of the host CPU plane's events (times
    relative to the session's start); only those carrying ``with_stat`` when given
    (``"hlo_op"``: XLA's compute ops, on whichever thread ran them)."""
    out = []
    for plane in profile.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for e in line.events:
                if with_stat is None or any(k == with_stat for k, _ in e.stats):
                    out.append((e.name, float(e.start_ns), float(e.end_ns), line.name))
    return out


def aligned_ops(profile, *, wall_minus_mono_ns: int, step_start_mono_ns: int,
                step_end_mono_ns: int, classes: dict | None = None, slack_s: float = 0.0):
    """The XLA ops of one traced step on the monotonic clock, relative to its start:
    ``(ops, annotation_s)``, ``ops`` = ``[[name, class, t0_s, t1_s, thread]]`` inside
    ``[0, step end + slack]`` sorted by t0, ``annotation_s`` the ``(begin, end)`` of the
    :data:`STEP_ANNOTATION` event (None when not traced; begin just after 0)."""
    base = profile_start_ns(profile)
    if base is None:
        raise ValueError("the trace has no profile_start_time (Task Environment plane)")
    shift = base - wall_minus_mono_ns - step_start_mono_ns  # event ns -> ns from step start
    end_s = (step_end_mono_ns - step_start_mono_ns) * 1e-9 + slack_s
    classes = classes or {}
    ops = []
    for name, s, e, line in profile_events(profile):
        t0, t1 = (s + shift) * 1e-9, (e + shift) * 1e-9
        if t0 >= 0.0 and t1 <= end_s:
            ops.append([name, classes.get(name, "other"), t0, t1, line])
    ops.sort(key=lambda o: o[2])
    ann = [(s, e) for name, s, e, _ in profile_events(profile, with_stat=None)
           if name == STEP_ANNOTATION]
    annotation = ((ann[0][0] + shift) * 1e-9, (ann[0][1] + shift) * 1e-9) if ann else None
    return ops, annotation


def timeline_summary(rank_rec: dict) -> dict:
    """Per rank: end of the last backward op, and how many groups were started / on
    the wire / finished before it (times in s from the step's start)."""
    back = [o[3] for o in rank_rec.get("ops", ()) if o[1] == "backward"]
    bwd_end = max(back) if back else rank_rec.get("backward_end_s")
    groups = rank_rec["groups"]
    if bwd_end is None:
        return {"backward_end_s": None, "groups": len(groups)}
    return {"backward_end_s": bwd_end, "groups": len(groups),
            "started_before": sum(g["start"] < bwd_end for g in groups),
            "wire_began_before": sum(g["wire_begin"] < bwd_end for g in groups),
            "wire_ended_before": sum(g["wire_end"] < bwd_end for g in groups),
            "first_start_s": min((g["start"] for g in groups), default=None),
            "last_done_exit_s": max((g["done_exit"] for g in groups), default=None),
            "step_s": rank_rec.get("step_s")}


def plot_step_timeline(runs: list, path) -> None:
    """One panel per run; per rank a band: compute ops (thin rows by class), each
    group's start -> done (grey) and wire interval (coloured), the end of the last
    backward op (red line)."""
    plt = pyplot()

    colors = {"forward": "tab:blue", "backward": "tab:orange", "sync": "tab:purple",
              "other": "0.6"}
    wire_colors = ("tab:green", "tab:olive", "tab:cyan", "tab:brown", "darkgreen", "teal")
    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 2.2 + 1.9 * sum(
        len(r["step_timeline"]["ranks"]) for r in runs) / max(1, len(runs)) * 1.0),
        squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        tl = run["step_timeline"]
        band = 1.0
        labelled = set()

        def lab(key):
            if key in labelled:
                return None
            labelled.add(key)
            return key
        for rr in tl["ranks"]:
            y0 = rr["rank"] * band * 1.25
            ops = rr.get("ops") or []
            for row, cls in enumerate(("forward", "backward", "other", "sync")):
                segs = [(o[2] * 1e3, max((o[3] - o[2]) * 1e3, 0.05)) for o in ops if o[1] == cls]
                if segs:
                    ax.broken_barh(segs, (y0 + row * 0.09, 0.08), color=colors[cls],
                                   label=lab(f"XLA op: {cls}"))
            for (t, name) in rr.get("marks", ()):  # fallback: profiled ready times
                ax.plot([t * 1e3] * 2, [y0, y0 + 0.35], color="tab:orange", lw=0.6)
            ng = max(1, len(rr["groups"]))
            rows = min(ng, 8)
            for j, g in enumerate(rr["groups"]):
                yy = y0 + 0.42 + (j % rows) * (0.5 / rows)
                h = 0.5 / rows * 0.8
                ax.broken_barh([(g["start"] * 1e3, max((g["done_exit"] - g["start"]) * 1e3,
                                                       0.05))],
                               (yy + h * 0.35, h * 0.3), color="0.75",
                               label=lab("group: start -> done returned"))
                ax.broken_barh([(g["wire_begin"] * 1e3,
                                 max((g["wire_end"] - g["wire_begin"]) * 1e3, 0.05))],
                               (yy, h), color=wire_colors[j % len(wire_colors)],
                               label=lab("group: on the wire"))
                ax.plot([g["start"] * 1e3], [yy + h / 2], "k|", ms=4,
                        label=lab("group: start"))
            s = timeline_summary(rr)
            if s.get("backward_end_s") is not None:
                ax.plot([s["backward_end_s"] * 1e3] * 2, [y0 - 0.05, y0 + band], "r-", lw=1.5,
                        label=lab("end of the last backward op"))
            if rr.get("step_s"):
                ax.plot([rr["step_s"] * 1e3], [y0 + 0.5], "kx",
                        label=lab("step returned"))
        ranks = [rr["rank"] for rr in tl["ranks"]]
        ax.set_yticks([r * band * 1.25 + 0.45 for r in ranks], [f"rank {r}" for r in ranks])
        ax.set_xlabel("ms from the step's start (each rank's own clock)")
        link = "shared memory" if run["link"] == "shm" else f"{run['link']} Mbit/s"
        ax.set_title(f"{run['model']}, {link}, P={run['P']}: one step of the "
                     f"{tl['plan']!r} plan ({tl['groups']} groups), topk {run['density']:.1%}"
                     + ("" if tl["compute_source"] == "jax.profiler" else
                        f"; compute marks: {tl['compute_source']} (profiler unavailable)"),
                     fontsize=10)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=8)
    save_figure(fig, path)


#: the plans of the measured comparison, as the records name them: the ungrouped
#: transform, the planner's methods, and ``auto`` (``jss.planning.auto_grouping``'s
#: choice: it profiles and plans with the installed calibration on its own)
RECORD_PLANS = {"ungrouped": None, "wfbp": "wfbp", "mg_wfbp": "mg", "asc_wfbp": "asc",
                "none": "none", "bucket": "bucket", "auto": "auto"}
SYNCS = ("topk", "dense")


def sync_settings(cfg: dict) -> tuple[float, str]:
    """``(density, algorithm)`` of the grouped transform: ``topk`` at ``cfg["density"]``
    with the cost model's algorithm, or ``dense`` (every entry kept, the dense
    allreduce: ``grouped_topk_sync(plan, density=1.0, algorithm="dense")``)."""
    return (1.0, "dense") if cfg.get("sync", "topk") == "dense" else (cfg["density"], "auto")


def pin_to_core() -> int | None:
    """Pins this process (and the threads it starts later: XLA's, MPI's, the
    non-blocking worker) to core ``rank mod cores``, as ``taskset -c`` would; the
    rank from the process manager's environment (MPICH's Hydra: ``PMI_RANK``)."""
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    if rank is None or not hasattr(os, "sched_setaffinity"):
        return None
    core = sorted(os.sched_getaffinity(0))[int(rank) % len(os.sched_getaffinity(0))]
    os.sched_setaffinity(0, {core})
    return core


def set_autogroup_nice(nice: int) -> bool:
    """Sets the nice value of this process's scheduling autogroup (Linux's autogroups: a
    process's nice only ranks it within its own session; negative, as root, the measured
    ranks get their cores over other sessions' niced jobs). Returns whether it was set."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(int(nice)))
        return True
    except OSError:
        return False


def interleaved_medians(runs: dict, *, rounds: int, steps: int, world) -> dict:
    """Times ``runs`` (``{name: [step, params, state, batch]}``, warmed up) in interleaved
    rounds of ``steps`` steps each, the order reversed every other round; each step after
    a barrier, the slowest rank's time. ``{name: {"median_s", "samples_s",
    "round_medians_s", "q25_s", "q75_s"}}``, equal on every rank."""
    import jax
    import numpy as np
    from mpi4py import MPI

    samples = {name: [] for name in runs}
    per_round = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            step, params, state, batch = runs[name]
            mine = []
            for _ in range(steps):
                world.Barrier()
                t0 = time.perf_counter()
                params, state = jax.block_until_ready(step(params, state, batch))
                mine.append(time.perf_counter() - t0)
            runs[name][1], runs[name][2] = params, state
            slowest = [world.allreduce(t, op=MPI.MAX) for t in mine]
            samples[name] += slowest
            per_round[name].append(float(np.median(slowest)))
    return {name: {"median_s": float(np.median(s)), "samples_s": s,
                   "round_medians_s": per_round[name],
                   "q25_s": float(np.percentile(s, 25)), "q75_s": float(np.percentile(s, 75))}
            for name, s in samples.items()}


def worker(cfg: dict) -> int:
    core = pin_to_core() if cfg.get("pin_cores") else None
    autogroup = (set_autogroup_nice(cfg["autogroup_nice"])
                 if cfg.get("autogroup_nice") is not None else None)
    import jax
    import numpy as np
    import optax
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from jax_sparse_sync.planning.calibration import fit_group_fixed

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    jss.mpi.abort_on_error()
    jss.mpi.tune_host_allocator()
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    t_start = time.monotonic()
    sync = cfg.get("sync", "topk")
    density, algorithm = sync_settings(cfg)
    tag = f"[{cfg['model']} {cfg['link']} P={p} {sync}]"

    def say(msg):
        if rank == 0:
            print(f"{tag} {msg} [t+{time.monotonic() - t_start:.0f}s]", flush=True)

    cores = world.allgather(core)
    say(f"cores per rank: {cores}; autogroup nice set: {world.allgather(autogroup)}")
    model_cfg = cfg.get("model_cfg") or MODEL_CFG[cfg["model"]]
    _, loss_fn, make_batch, params0, n, _ = setup(dict(cfg, model_cfg=model_cfg))
    batch = jax.device_put(make_batch(np.random.default_rng([cfg["seed"], rank]),
                                      model_cfg["batch"]))
    kinds = (("dense_sync", "dense_sync_group") if sync == "dense"
             else ("topk_sync", "topk_sync_group"))
    cal_path = Path(tempfile.mkdtemp(prefix="jss_calibration_")) / "calibration.json"
    ab = jss.planning.calibrate(local=kinds, contention=True, repeats=3, path=str(cal_path),
                                local_sizes=(max(n // 8, 4096), n), density=cfg["density"],
                                group_cost=True, burst_bytes=cfg.get("burst_bytes", 0))
    calibration_raw = json.loads(cal_path.read_text()) if rank == 0 else None
    say(f"N={n:,}; calibrated alpha {ab.alpha * 1e6:.1f} us, beta {ab.beta * 1e9:.2f} ns/B, "
        f"gamma {ab.gamma:.2f}, local {ab.local}")
    if cfg.get("timeline_only"):
        prof = jss.planning.profile_backward(loss_fn, params0, batch, comm=world, repeats=3)
        return timeline_only(cfg, world, prof, ab, n, loss_fn, params0, batch, say)
    # auto_grouping profiles the backward pass (every rank at once) and plans: its
    # saved profile is the one every other plan is made from (one profile, one cost model)
    saved = Path(tempfile.mkdtemp(prefix="jss_auto_grouping_")) / "grouping.json"
    saved = Path(world.bcast(str(saved), root=0))
    auto_plan = jss.planning.auto_grouping(loss_fn, params0, batch, density=density,
                                           algorithm=algorithm, repeats=3, cost_params=ab,
                                           path=str(saved),
                                           fit_group_cost=cfg.get("fit_group_cost", False))
    world.Barrier()
    prof, _, auto_settings = jss.planning.load_grouping(str(saved))
    # every plan and prediction of the run on the cost model auto planned with (with
    # --fit-group-cost: plus the per-group cost auto_grouping fitted from the model's step)
    group_cost = auto_settings["group_cost"]
    if group_cost is not None:
        ab = fit_group_fixed(ab, group_cost["kind"], [1], [group_cost["per_group_s"]], [0.0])
        say(f"per-group cost fitted from the step: {group_cost['per_group_s'] * 1e3:.3f} ms "
            f"({group_cost})")
    from jax_sparse_sync.planning.plan_grouping import planner_min_gain
    margin = planner_min_gain(prof)
    say(f"profiled {len(prof.names)} leaves: gradient {prof.compute_s * 1e3:.1f} ms; timing "
        f"spread {prof.timing_spread}, the planner's margin min_gain {margin:.3f}; auto: "
        f"{len(auto_plan.groups)} groups")

    plans = {}
    for name in cfg["plans"]:
        method = RECORD_PLANS.get(name, name)
        if method is None:
            plans[name] = None
        elif method == "auto":
            # one group: the planner found no gain beyond its margin; the step to run
            # is the ungrouped sync (auto_grouping's doc)
            plans[name] = auto_plan if len(auto_plan.groups) > 1 else None
        else:
            # asc_wfbp: the fastest predicted plan (min_gain 0), next to auto's margin
            plans[name] = jss.planning.plan_grouping(
                method, prof, nranks=p, density=density, algorithm=algorithm, params=ab,
                min_gain=0.0 if method == "asc" else None)
    ungrouped_model = jss.planning.plan_grouping("none", prof, nranks=p, density=density,
                                                 algorithm=algorithm, params=ab)

    def tx_of(name):
        plan = plans.get(name)
        if name == "no_sync":
            return optax.chain(optax.identity(), optax.sgd(0.01))
        if plan is None:
            sync_tx = jss.dense_sync() if sync == "dense" else jss.topk_sync(density=density)
        else:
            sync_tx = jss.grouped_topk_sync(plan, density=density, algorithm=algorithm)
        return optax.chain(sync_tx, optax.sgd(0.01))

    # one timed variant per distinct plan (auto usually equals asc_wfbp: timed once)
    same_as = {}
    for name, plan in plans.items():
        for other in list(plans)[:list(plans).index(name)]:
            if other in same_as:
                continue
            if plan is None and plans[other] is None:  # both the ungrouped sync
                same_as[name] = other
                break
            if (plan is not None and plans[other] is not None
                    and plans[other].leaf_groups() == plan.leaf_groups()
                    and [g.kind for g in plans[other].groups] == [g.kind for g in plan.groups]):
                same_as[name] = other
                break
    runs = {}
    for name in ["no_sync", *[x for x in plans if x not in same_as]]:
        tx = tx_of(name)
        params = fresh(params0)
        state = tx.init(params)
        step = make_step(loss_fn, tx)
        t0 = time.perf_counter()
        for _ in range(1 + cfg["warmup"]):
            params, state = jax.block_until_ready(step(params, state, batch))
        world.Barrier()
        runs[name] = [step, params, state, batch]
        say(f"compiled and warmed up {name} ({time.perf_counter() - t0:.1f} s)")
    timing = interleaved_medians(runs, rounds=cfg["rounds"], steps=cfg["steps"], world=world)
    none_s = timing["no_sync"]["median_s"]
    scale = stale_profile_scale(prof.compute_s, none_s)
    tail = max(0.0, none_s - prof.compute_s)
    say(f"no sync {none_s * 1e3:.1f} ms (tail after the gradient {tail * 1e3:.1f} ms"
        + (f"; the profile, {prof.compute_s * 1e3:.1f} ms, scaled by {scale:.3f})"
           if scale < 1 else ")"))
    groups_of = {name: plan_groups(plan) for name, plan in plans.items()}
    predicted = predict_plans(prof, groups_of, nranks=p, size=n, density=density, sync=sync,
                              algorithm=algorithm, params=ab, none_s=none_s)
    unscaled = predicted if scale == 1.0 else predict_plans(
        prof, groups_of, nranks=p, size=n, density=density, sync=sync, algorithm=algorithm,
        params=ab, none_s=none_s, scale=1.0)
    base = {"model": cfg["model"], "link": cfg["link"], "P": p, "sync": sync,
            "density": density, "algorithm": algorithm}
    records = [dict(base, plan="no_sync", measured_s=none_s, predicted_s=None,
                    **{k: v for k, v in timing["no_sync"].items() if k != "median_s"})]
    for name, plan in plans.items():
        t = timing[same_as.get(name, name)]
        pred_plan = plan or ungrouped_model
        pred = predicted[name]
        rec = dict(base, plan=name, measured_s=t["median_s"], predicted_s=pred,
                   error=(pred - t["median_s"]) / t["median_s"],
                   predicted_unscaled_s=unscaled[name],
                   groups=len(pred_plan.groups) if plan is not None else 1,
                   simultaneous=sum(g.kind == "simultaneous" for g in pred_plan.groups)
                   if plan is not None else 0,
                   planner_predicted_sync_end_s=pred_plan.predicted_s,
                   same_plan_as=same_as.get(name),
                   **{k: v for k, v in t.items() if k != "median_s"})
        if plan is not None:
            rec["plan_json"] = plan.to_json()
        records.append(rec)
        say(f"{name:>9}: {t['median_s'] * 1e3:8.1f} ms measured (IQR "
            f"{t['q25_s'] * 1e3:.1f}-{t['q75_s'] * 1e3:.1f}), {pred * 1e3:8.1f} ms predicted, "
            f"{rec['groups']} groups ({rec['simultaneous']} simultaneous)"
            + (f", the plan of {same_as[name]}" if name in same_as else ""))
    if rank == 0 and plans.get("asc_wfbp") is not None:
        print(plans["asc_wfbp"], flush=True)
    step_tl = traced_step(cfg, world, prof, plans, loss_fn, params0, batch, say, tx_of)
    if rank == 0:
        write_fragment({"model": cfg["model"], "link": cfg["link"], "P": p, "N": n, "sync": sync,
                        "leaves": len(prof.names), "density": density, "cores": cores,
                        "calibration": {"alpha_s": ab.alpha, "beta_s_per_byte": ab.beta,
                                        "gamma": ab.gamma, "local": list(ab.local),
                                        "burst_bytes": ab.burst_bytes},
                        "calibration_raw": calibration_raw,
                        "planner_min_gain": margin, "auto_plan": auto_plan.to_json(),
                        "profile_scale": scale,
                        "step_group_cost": group_cost,
                        "profile": prof.to_json(), "records": records,
                        "step_timeline": step_tl,
                        "worker_wall_s": round(time.monotonic() - t_start, 1)}, cfg["fragment"])
    return 0



def pick_timeline_plan(plans: dict, wanted: str | None) -> str | None:
    """The plan of the traced step: ``wanted``, or the one with the most groups. A wanted
    plan that is the ungrouped sync (``auto`` when the planner kept one group) has no
    groups to trace: then ``asc_wfbp`` (the fastest predicted grouped plan) if grouped."""
    if wanted and wanted != "most":
        if wanted in plans and plans[wanted] is None and plans.get("asc_wfbp") is not None:
            return "asc_wfbp"
        return wanted if wanted in plans and plans[wanted] is not None else None
    grouped = {k: v for k, v in plans.items() if v is not None}
    if not grouped:
        return None
    return max(grouped, key=lambda k: (len(grouped[k].groups), k))


def traced_step(cfg, world, prof, plans, loss_fn, params0, batch, say, tx_of=None):
    """One step of a multi-group plan with its XLA ops (``jax.profiler``) and the
    groups' non-blocking timeline, on every rank; gathered on rank 0 (else None)."""
    import jax
    import optax

    import jax_sparse_sync as jss

    name = pick_timeline_plan(plans, cfg.get("timeline_plan"))
    if name is None:
        return None
    plan = plans[name]
    rank = world.Get_rank()
    if tx_of is not None:
        tx = tx_of(name)
    else:
        density, algorithm = sync_settings(cfg)
        tx = optax.chain(jss.topk_sync(density=density) if plan is None
                         else jss.grouped_topk_sync(plan, density=density, algorithm=algorithm),
                         optax.sgd(0.01))
    params = fresh(params0)
    state = tx.init(params)
    compiled = make_step(loss_fn, tx)
    # the op names of the executable the step runs (the same compilation: XLA is
    # deterministic; a Compiled object cannot be called here, it lacks the ordered
    # effect's token argument)
    classes = hlo_op_classes(compiled.lower(params, state, batch).compile().as_text())
    for _ in range(3):
        params, state = jax.block_until_ready(compiled(params, state, batch))
    source, err = "jax.profiler", None
    tmp = tempfile.mkdtemp(prefix=f"jss_trace_r{rank}_")
    try:
        jax.profiler.start_trace(tmp)
    except Exception as e:  # noqa: BLE001 - record why, fall back to the profile
        source, err = "profile_backward ready times", f"{type(e).__name__}: {e}"
    world.Barrier()
    jss.planning.nonblocking_timeline()
    offset = time.time_ns() - time.monotonic_ns()
    t0 = time.monotonic_ns()
    with jax.profiler.TraceAnnotation(STEP_ANNOTATION):
        params, state = jax.block_until_ready(compiled(params, state, batch))
    t1 = time.monotonic_ns()
    offset2 = time.time_ns() - time.monotonic_ns()
    recs = jss.planning.nonblocking_timeline()
    mine = {"rank": rank, "step_s": (t1 - t0) * 1e-9,
            "wall_minus_monotonic_drift_ns": offset2 - offset,
            # CLOCK_MONOTONIC is one clock per host: ranks of one host compare through this
            "step_start_monotonic_ns": t0}
    if source == "jax.profiler":
        try:
            jax.profiler.stop_trace()
            import glob
            files = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
            pdata = jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime))
            ops, ann = aligned_ops(pdata, wall_minus_mono_ns=offset, step_start_mono_ns=t0,
                                   step_end_mono_ns=t1, classes=classes, slack_s=0.0)
            mine["ops"] = ops
            mine["annotation_s"] = ann
            mine["alignment_error_s"] = ann[0] if ann else None
        except Exception as e:  # noqa: BLE001
            source, err = "profile_backward ready times", f"{type(e).__name__}: {e}"
    if source != "jax.profiler":
        mine["ops"] = []
        mine["marks"] = [[float(prof.ready_s[i]), prof.names[i]] for i in prof.order]
        mine["backward_end_s"] = float(prof.compute_s)
    shutil.rmtree(tmp, ignore_errors=True)
    keys = ("start", "checked", "wire_begin", "wire_end", "done", "done_exit")
    mine["groups"] = [dict({k: v - t0 * 1e-9 if k in keys else v
                            for k, v in r._asdict().items()},
                           group=j, kind=plan.groups[j].kind if j < len(plan.groups) else None,
                           leaves=len(plan.groups[j].leaves) if j < len(plan.groups) else None)
                      for j, r in enumerate(recs)]
    mine["summary"] = timeline_summary(mine)
    sources = world.allgather((source, err))
    ranks = world.gather(mine, root=0)
    if rank != 0:
        return None
    s = [r["summary"] for r in ranks]
    say(f"traced one step of {name!r} ({len(plan.groups)} groups): backward ends at "
        + ", ".join(f"{x['backward_end_s'] * 1e3:.0f}" for x in s) + " ms; groups started "
        "before it: " + ", ".join(f"{x.get('started_before')}/{x['groups']}" for x in s)
        + "; wire began before it: " + ", ".join(str(x.get("wire_began_before")) for x in s))
    return {"plan": name, "groups": len(plan.groups), "kinds": [g.kind for g in plan.groups],
            "leaves_per_group": [len(g.leaves) for g in plan.groups],
            "compute_source": sources[0][0] if all(x == sources[0] for x in sources)
            else "mixed: " + "; ".join(f"{i}: {x[0]}" for i, x in enumerate(sources)),
            "profiler_errors": [x[1] for x in sources], "ranks": ranks,
            "clock": "ops: jax.profiler events, wall clock (Task Environment profile_start_time "
                     "+ start_ns) minus (time.time_ns() - time.monotonic_ns()); groups: "
                     "jss.planning.nonblocking_timeline (steady_clock = CLOCK_MONOTONIC); both in s from "
                     "time.monotonic_ns() just before the step's call on that rank"}


def timeline_only(cfg, world, prof, ab, n, loss_fn, params0, batch, say) -> int:
    """``--timeline-only``: the plans and the traced step, no step timings."""
    import jax_sparse_sync as jss

    p = world.Get_size()
    density, algorithm = sync_settings(cfg)
    plans = {name: (None if RECORD_PLANS.get(name, name) is None else jss.planning.plan_grouping(
        "asc" if name == "auto" else RECORD_PLANS.get(name, name), prof, nranks=p,
        density=density, algorithm=algorithm, params=ab)) for name in cfg["plans"]}
    step_tl = traced_step(cfg, world, prof, plans, loss_fn, params0, batch, say)
    if world.Get_rank() == 0:
        write_fragment({"model": cfg["model"], "link": cfg["link"], "P": p, "N": n,
                        "leaves": len(prof.names), "density": cfg["density"],
                        "calibration": {"alpha_s": ab.alpha, "beta_s_per_byte": ab.beta,
                                        "gamma": ab.gamma, "local": list(ab.local),
                                        "burst_bytes": ab.burst_bytes},
                        "profile": prof.to_json(), "records": [],
                        "plans": {k: (v.to_json() if v else None) for k, v in plans.items()},
                        "timeline": None, "step_timeline": step_tl}, cfg["fragment"])
    return 0


def launch(cfg: dict, nranks: int, args, net) -> dict:
    env = {**dict(kv.split("=", 1) for kv in args.rank_env), "JAX_PLATFORMS": "cpu",
           "PYTHONUNBUFFERED": "1"}
    return launch_worker(Path(__file__).resolve(), nranks, cfg, args.timeout, net=net, env=env,
                         mpiexec_args=bind_args(args), catch=False)


def plot(data: dict, path: Path) -> None:
    """Per run: measured (median, IQR whiskers) and predicted step time of each plan."""
    plt = pyplot()

    runs = [r for r in data["runs"] if r["records"]]
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.5), squeeze=False)
    for ax, run in zip(axes[0], runs):
        recs = run["records"]
        x = range(len(recs))
        ms = [r["measured_s"] * 1e3 for r in recs]
        err = [[m - r["q25_s"] * 1e3 for m, r in zip(ms, recs)],
               [r["q75_s"] * 1e3 - m for m, r in zip(ms, recs)]]
        ax.bar([i - 0.2 for i in x], ms, 0.4, yerr=err, capsize=3,
               label="measured (median, IQR)")
        ax.bar([i + 0.2 for i in x], [(r.get("predicted_s") or 0) * 1e3 for r in recs], 0.4,
               label="predicted")
        ax.set_xticks(list(x), [f"{r['plan']}\n({r.get('groups', '-')} gr)" if r["plan"] != "no_sync"
                                else "no sync" for r in recs], fontsize=8)
        ax.set_ylabel("step time (ms)")
        link = "shm" if run["link"] == "shm" else f"{run['link']} Mbit/s"
        sync = "dense" if run.get("sync") == "dense" else f"topk {run['density']:.1%}"
        ax.set_title(f"{run['model']} ({run['leaves']} leaves), {link}, P={run['P']}, {sync}",
                     fontsize=10)
        ax.legend(fontsize=8)
    save_figure(fig, path, dpi=100)


def link_burst_bytes(link: str, nranks: int) -> int:
    """The burst of a ``--links`` entry: the emulated link's ``tc tbf`` bucket
    (``EmulatedNetwork.burst_bytes``: 256 KiB at these rates), 0 on shared memory."""
    from emulated_network import EmulatedNetwork
    return 0 if link == "shm" else EmulatedNetwork(nranks, float(link)).burst_bytes()


def run_params(run: dict, *, current: bool = True):
    """The cost model of a measured run: with ``current=False`` the one it planned with;
    by default its calibration under the current rules (its link's burst,
    :func:`link_burst_bytes`, where not recorded; gamma fitted again,
    ``calibration.fit_gamma``)."""
    from jax_sparse_sync.model import cost_model
    from jax_sparse_sync.planning.calibration import fit_gamma
    c = run["calibration"]
    burst, gamma = c.get("burst_bytes"), c["gamma"]
    if current:
        if burst is None:
            burst = link_burst_bytes(run["link"], run["P"])
        contention = (run.get("calibration_raw") or {}).get("contention") or {}
        if contention.get("sizes"):
            gamma = fit_gamma(contention["sizes"], contention["one_s"], contention["two_s"])
    return cost_model.AlphaBeta(alpha=c["alpha_s"], beta=c["beta_s_per_byte"], gamma=gamma,
                                local=tuple(tuple(x) for x in c["local"]),
                                burst_bytes=float(burst or 0.0))


def stale_profile_scale(compute_s: float, none_s: float) -> float:
    """The factor a run's profile times are scaled by before predicting its timed steps:
    ``none_s / compute_s`` where the profiled gradient (``compute_s``) took longer than
    the whole step without a sync timed in the same run (``none_s``), else 1: such a
    profile is stale (the machine's speed moved). It keeps its shape; only its clock is
    the timing's."""
    return min(1.0, none_s / compute_s) if compute_s > 0 and none_s > 0 else 1.0


def plan_groups(plan) -> list | None:
    """A plan's ``[(leaves, kind), ...]`` (``None``: the ungrouped sync)."""
    return None if plan is None else [(tuple(g.leaves), g.kind) for g in plan.groups]


def predict_plans(prof, groups_of: dict, *, nranks: int, size: int, density: float,
                  sync: str, algorithm: str, params, none_s: float,
                  scale: float | None = None) -> dict:
    """``{plan: predicted step seconds}``: each plan's groups (``None``: the ungrouped
    sync) simulated on the profile (scaled by ``scale``, default
    :func:`stale_profile_scale`) under the cost model ``params``, plus the step's
    tail; the ungrouped ``dense_sync``: the no-sync step, its local work and the dense
    allreduce's wire time. The one rule of the worker and of :func:`repredict`."""
    import dataclasses

    from jax_sparse_sync.base.transform_arguments import resolve_k
    from jax_sparse_sync.model import cost_model
    from jax_sparse_sync.model import grouping as gp
    from jax_sparse_sync.planning.plan_grouping import layer_times, sparse_link

    if scale is None:
        scale = stale_profile_scale(prof.compute_s, none_s)
    if scale != 1.0:
        prof = dataclasses.replace(prof, ready_s=tuple(r * scale for r in prof.ready_s),
                                   compute_s=prof.compute_s * scale)
    k = resolve_k(size=size, density=density, k=None)
    link, message_bytes, local_s = sparse_link(nranks=nranks, size=size, k=k,
                                               algorithm=algorithm, params=params)
    layers = layer_times(prof)
    tail = max(0.0, none_s - prof.compute_s)
    out = {}
    for name, groups in groups_of.items():
        if groups is None and sync == "dense":
            # the dense allreduce after the backward pass: the link's burst passes at once
            sent = cost_model.wire_volume("dense", nranks=nranks, size=size, k=size).bytes_max
            out[name] = (none_s + cost_model.local_work_time("dense_sync", size=size, params=params)
                         + cost_model.sync_wire_time("dense_sync", nranks=nranks, size=size,
                                                     k=size, params=params)
                         - params.beta * min(params.burst_bytes, sent))
            continue
        groups = groups if groups is not None else [(layers.leaves, "normal")]
        out[name] = gp.simulate(layers, groups, link, message_bytes, local_s).predicted_s + tail
    return out


def repredict(run: dict, params=None, *, scale: float | None = None) -> dict:
    """``{plan: predicted step seconds}`` of a recorded run's plans under ``params``
    (default: its own calibration) with :func:`predict_plans`'s rules (a ``topk`` run
    keeps the algorithm its calibration chose)."""
    from jax_sparse_sync.base.transform_arguments import resolve_k
    from jax_sparse_sync.model import cost_model
    from jax_sparse_sync.planning.profile import BackwardProfile

    own = run_params(run, current=False)
    params = params or run_params(run)
    prof = BackwardProfile.from_json(run["profile"])
    p, n, density = run["P"], run["N"], run["density"]
    sync = run.get("sync", "topk")
    algorithm = "dense" if sync == "dense" else cost_model.choose_algorithm(
        nranks=p, size=n, k=resolve_k(size=n, density=density, k=None), params=own)
    recs = {r["plan"]: r for r in run["records"]}
    groups_of = {name: ([(tuple(g["leaves"]), g["kind"]) for g in r["plan_json"]["groups"]]
                        if r.get("plan_json") else None)
                 for name, r in recs.items() if name != "no_sync"}
    return predict_plans(prof, groups_of, nranks=p, size=n, density=density, sync=sync,
                         algorithm=algorithm, params=params,
                         none_s=recs["no_sync"]["measured_s"], scale=scale)


def repredict_file(path: Path, stamp: dict | None = None) -> dict:
    """Rewrites a recorded ``grouping_*.json``'s predictions with :func:`predict_plans`
    (the old ones kept as ``predicted_at_run_s``), recomputes ``goals`` and stamps the
    file (``repredicted``); returns the new goals."""
    data = json.loads(Path(path).read_text())
    for run in data["runs"]:
        pred = repredict(run)
        unscaled = repredict(run, scale=1.0)
        prof_s = run["profile"]["compute_s"]
        none_s = next(r["measured_s"] for r in run["records"] if r["plan"] == "no_sync")
        run["profile_scale"] = stale_profile_scale(prof_s, none_s)
        for r in run["records"]:
            if r["plan"] not in pred:
                continue
            r.setdefault("predicted_at_run_s", r["predicted_s"])
            r["predicted_s"] = pred[r["plan"]]
            r["predicted_unscaled_s"] = unscaled[r["plan"]]
            r["error"] = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    data["records"] = [r for run in data["runs"] for r in run["records"]]
    data["goals"] = [goals(run) for run in data["runs"]]
    data["repredicted"] = stamp or {k: v for k, v in machine_info().items()
                                    if k in ("date", "commit", "command")}
    write_record(data, Path(path))
    return data["goals"]


def goals(run: dict) -> dict:
    """The issue's checks on one measured run: every prediction within 20 % of its
    measurement; ``auto`` no slower than the best of ungrouped / WFBP / MG-WFBP by more
    than the run's noise (the larger relative half-IQR of the two); and where the
    model predicts ``auto`` at least 1.2x faster than ungrouped, measured at least 1.15x."""
    recs = {r["plan"]: r for r in run["records"]}

    def noise(r):
        return (r["q75_s"] - r["q25_s"]) / 2 / r["measured_s"]
    out = {"max_abs_error": max((abs(r["error"]) for r in run["records"]
                                 if r.get("predicted_s")), default=None)}
    out["all_within_20pct"] = out["max_abs_error"] is not None and out["max_abs_error"] <= 0.2
    auto = recs.get("auto")
    base = [recs[k] for k in ("ungrouped", "wfbp", "mg_wfbp") if k in recs]
    if auto and base:
        best = min(base, key=lambda r: r["measured_s"])
        tol = max(noise(auto), noise(best))
        out.update(auto_s=auto["measured_s"], best_baseline=best["plan"],
                   best_baseline_s=best["measured_s"], noise=tol,
                   auto_not_slower=auto["measured_s"] <= best["measured_s"] * (1 + tol))
    if auto and "ungrouped" in recs:
        ung = recs["ungrouped"]
        pred = ung["predicted_s"] / auto["predicted_s"]
        meas = ung["measured_s"] / auto["measured_s"]
        out.update(predicted_speedup=pred, measured_speedup=meas,
                   speedup_goal=None if pred < 1.2 else meas >= 1.15)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=sorted(MODEL_CFG))
    ap.add_argument("--links", nargs="+", default=["1000"], help="Mbit/s, or shm")
    ap.add_argument("--procs", nargs="+", type=int, default=[4])
    ap.add_argument("--plans", nargs="+", default=list(PLANS),
                    help=f"of {sorted(RECORD_PLANS)}; auto: jss.planning.auto_grouping's plan")
    ap.add_argument("--syncs", nargs="+", default=["topk"], choices=SYNCS,
                    help="topk: topk_sync at --density; dense: dense_sync ungrouped, the "
                         "grouped plans as grouped_topk_sync(density=1, algorithm='dense')")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per variant and round")
    ap.add_argument("--rounds", type=int, default=6,
                    help="interleaved rounds (each runs --steps steps of every variant)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pin-cores", action="store_true",
                    help="pin each rank to core rank mod cores (as taskset -c), with its threads")
    ap.add_argument("--autogroup-nice", type=int, default=None,
                    help="each rank sets its session's autogroup nice (see set_autogroup_nice; "
                         "e.g. -19 on a machine whose other sessions run niced)")
    ap.add_argument("--batch", type=int, default=None, help="the model's batch per rank")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--timeline-plan", default="auto",
                    help="plan of the traced step (XLA ops + each group's timeline, every "
                         "rank): a name of --plans, or 'most' (the one with the most groups)")
    ap.add_argument("--fit-group-cost", action=argparse.BooleanOptionalAction, default=True,
                    help="auto_grouping(fit_group_cost=True): fit the per-group cost from the "
                         "model's step with one group and with WFBP, timed in turns, before "
                         "planning (default; --no-fit-group-cost: the calibration's synthetic "
                         "per-group cost only)")
    ap.add_argument("--timeline-only", action="store_true",
                    help="calibrate, profile, plan and trace one step; no step timings")
    ap.add_argument("--rank-env", nargs="*",
                    default=[*DEFAULT_MPI_ENV, *(f"{k}={v}" for k, v in MALLOC_ENV.items())])
    add_bind_option(ap)
    ap.add_argument("--mlp-hidden", type=int, default=None,
                    help=f"the MLP's hidden width (default {MODEL_CFG['mlp']['hidden']})")
    ap.add_argument("--out-dir", type=Path, default=RESULTS,
                    help="where the JSON and plots go (default benchmarks/results)")
    ap.add_argument("--repredict", type=Path, nargs="+", default=None, metavar="FILE",
                    help="rewrite recorded grouping_*.json files' predictions with the current "
                         "rules (measurements untouched; the old ones kept as "
                         "predicted_at_run_s) and redraw their plots; no run")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))
    if args.repredict:
        # one stamp for every file, taken before the first is rewritten (clean tree)
        stamp = {k: v for k, v in machine_info().items() if k in ("date", "commit", "command")}
        for path in args.repredict:
            for g in repredict_file(path, stamp):
                print(f"{path.name}: {json.dumps(g)}")
            plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return 0
    from emulated_network import EmulatedNetwork

    out = args.out_dir / f"grouping_{args.tag}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": "grouping", "machine": machine_info(), "command": sys.argv,
            "bind_to": args.bind_to, "runs": [], "failures": []}
    t0 = time.monotonic()
    for link in args.links:
        rate = None if link == "shm" else float(link)
        for p in args.procs:
            with EmulatedNetwork(p, rate, delay_ms=0.0) if rate else nullcontext() as net:
                probe = probe_link(net) if net is not None else None
                for model, sync in ((m, s) for m in args.models for s in args.syncs):
                    model_cfg = dict(MODEL_CFG[model])
                    if model == "mlp" and args.mlp_hidden:
                        model_cfg["hidden"] = args.mlp_hidden
                    if args.batch:
                        model_cfg["batch"] = args.batch
                    cfg = {"model": model, "model_cfg": model_cfg, "link": link,
                           "plans": args.plans, "sync": sync, "rounds": args.rounds,
                           "density": args.density, "steps": args.steps, "warmup": args.warmup,
                           "seed": args.seed, "pin_cores": args.pin_cores,
                           "autogroup_nice": args.autogroup_nice,
                           "timeline_plan": args.timeline_plan,
                           "timeline_only": args.timeline_only,
                           "fit_group_cost": args.fit_group_cost,
                           "burst_bytes": link_burst_bytes(link, p)}
                    print(f"[{time.strftime('%H:%M:%S')}] {model} {sync} link {link} P={p}",
                          flush=True)
                    frag = launch(cfg, p, args, net)
                    if frag.get("error"):
                        data["failures"].append({"model": model, "link": link, "P": p,
                                                 "sync": sync, "error": frag["error"]})
                        continue
                    frag["link_probe"] = probe
                    data["runs"].append(frag)
                    data["records"] = [r for run in data["runs"] for r in run["records"]]
                    data["goals"] = [goals(run) for run in data["runs"] if run["records"]]
                    data["wall_s"] = round(time.monotonic() - t0, 1)
                    write_record(data, out)
    write_record(data, out)
    for run in data["runs"]:
        print(f"\n{run['model']} {run.get('sync')} link {run['link']} P={run['P']}:")
        for r in run["records"]:
            pred = r.get("predicted_s")
            err = f"{(pred - r['measured_s']) / r['measured_s']:+.0%}" if pred else ""
            print(f"  {r['plan']:>9}: {r['measured_s'] * 1e3:8.1f} ms  predicted "
                  f"{(pred or 0) * 1e3:8.1f} ms {err}")
        if run["records"]:
            print("  goals:", json.dumps(goals(run)))
    if any(run["records"] for run in data["runs"]):
        plot(data, out.with_suffix(".png"))
    traced = [run for run in data["runs"] if run.get("step_timeline")]
    if traced:
        tl_path = args.out_dir / f"grouping_timeline_{args.tag.removeprefix('timeline_')}.png"
        plot_step_timeline(traced, tl_path)
        print(f"# wrote {tl_path}")
        for run in traced:
            tl = run["step_timeline"]
            print(f"\n{run['model']} link {run['link']} P={run['P']}: one step of {tl['plan']!r} "
                  f"({tl['groups']} groups; compute: {tl['compute_source']})")
            for rr in tl["ranks"]:
                s = rr["summary"]
                print(f"  rank {rr['rank']}: step {rr['step_s'] * 1e3:.1f} ms, backward ends "
                      f"{s['backward_end_s'] * 1e3:.1f} ms; before it {s['started_before']} "
                      f"started, {s['wire_began_before']} on the wire, "
                      f"{s['wire_ended_before']} off the wire; first start "
                      f"{s['first_start_s'] * 1e3:.1f} ms")
    print(f"# wrote {out}")
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
