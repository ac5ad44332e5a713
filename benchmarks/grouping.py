"""Layer grouping (ASC-WFBP) end to end: measured step time of each plan next to
the planner's prediction, on the emulated network, with one step's timeline.

Per (model, link, P), one MPI job:

1. ``jss.planning.calibrate(local=("topk_sync", "topk_sync_group"), contention=True)`` on that
   link: alpha, beta (neighbour exchange), the local work of ``topk_sync`` (and of
   one group of a grouped ``topk_sync``, which the planner charges) and the contention
   factor gamma (one vs two simultaneous non-blocking allreduces);
2. ``jss.planning.profile_backward``: when each gradient leaf (module) is ready in the
   jitted step (all ranks at once, median over ranks: the same on every rank);
3. the step with no sync (``optax.identity``) and with ``dense_sync``;
4. ``topk_sync(density)`` ungrouped (``grouping=None``: one selection and one
   allreduce after the backward pass) and with each plan of ``jss.planning.GROUPINGS``
   made by ``jss.planning.plan_grouping`` from 1 and 2; the median step time of each;
5. one more step of the ASC plan with ``jss.planning.nonblocking_timeline()``: when each
   group was started, on the wire and waited for, on every rank;
6. one traced step of a multi-group plan (``--timeline-plan``, default the plan
   with the most groups): its XLA compute ops from ``jax.profiler`` (classed
   forward / backward / sync / other from the compiled HLO's metadata) and each
   group's start, wire and done from ``jss.planning.nonblocking_timeline()``, on one clock
   per rank, relative to the step's start (``step_timeline`` in the JSON, plot
   ``results/grouping_timeline_<tag>.png``). ``--timeline-only`` runs 1, 2 and 6.

Prediction of a plan's step = the planner's ``predicted_s`` (end of the backward
pass with local work, or of the last group's wire time) + the step's tail (the
optimizer's apply: the no-sync step minus the profiled gradient time).

Models (``step_time.build_model``): ``cnn`` (ResNet-style, 1.09M parameters in
80 leaves) and ``mlp`` (input 256, 4 x 1536, 10 leaves). Run (root, for the
emulated links)::

    python benchmarks/grouping.py --models cnn mlp --links 1000 --procs 4

Writes ``results/grouping_<tag>.json`` and ``.png`` (step time per plan,
measured and predicted; the ASC timeline).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (add_bind_option, bind_args, find_mpiexec, machine_info,  # noqa: E402
                      run_fragment, write_fragment)
from step_time import (DEFAULT_MPI_ENV, MALLOC_ENV, build_model, fresh, init_params,  # noqa: E402
                       make_step, probe_link, time_steps)

RESULTS = HERE / "results"
MODEL_CFG = {
    "cnn": {"widths": [32, 64, 128], "blocks": 3, "image": 32, "classes": 10, "batch": 16},
    "mlp": {"input": 256, "hidden": 1536, "layers": 4, "classes": 10, "batch": 32},
}
PLANS = ("ungrouped", "none", "wfbp", "mg", "bucket", "asc")


# --------------------------------------------------------------------------- step timeline
# One measured step with its XLA compute ops (jax.profiler) and each group's
# non-blocking allreduce (jss.planning.nonblocking_timeline), on one clock per rank.
#
# Clocks: the records are C++ std::chrono::steady_clock (CLOCK_MONOTONIC on Linux,
# ffi/nonblocking_ffi.cc), as time.monotonic_ns(). The profiler's XSpace stores event
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
    """The XLA ops of one traced step on the monotonic clock, relative to its start.

    Returns ``(ops, annotation_s)``: ``ops`` = ``[[name, class, t0_s, t1_s, thread]]``
    sorted by t0, only those inside ``[0, step end + slack]``; ``annotation_s`` =
    ``(begin, end)`` of the :data:`STEP_ANNOTATION` event on that clock (``None``
    when it is not in the trace): its begin should be just after 0.
    """
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def worker(cfg: dict) -> int:
    import jax
    import numpy as np
    import optax
    from mpi4py import MPI

    import jax_sparse_sync as jss

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    jss.mpi.abort_on_error()
    jss.mpi.tune_host_allocator()
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    t_start = time.monotonic()
    tag = f"[{cfg['model']} {cfg['link']} P={p}]"

    def say(msg):
        if rank == 0:
            print(f"{tag} {msg} [t+{time.monotonic() - t_start:.0f}s]", flush=True)

    model_cfg = cfg.get("model_cfg") or MODEL_CFG[cfg["model"]]
    module, loss_fn, make_batch = build_model(cfg["model"], model_cfg)
    params0 = init_params(module, make_batch, cfg["seed"])
    n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params0))
    batch = jax.device_put(make_batch(np.random.default_rng([cfg["seed"], rank]),
                                      model_cfg["batch"]))
    ab = jss.planning.calibrate(local=("topk_sync", "topk_sync_group"), contention=True, repeats=3,
                       local_sizes=(max(n // 8, 4096), n), density=cfg["density"])
    say(f"N={n:,}; calibrated alpha {ab.alpha * 1e6:.1f} us, beta {ab.beta * 1e9:.2f} ns/B, "
        f"gamma {ab.gamma:.2f}, local {ab.local}")
    prof = jss.planning.profile_backward(loss_fn, params0, batch, comm=world, repeats=3)
    say(f"profiled {len(prof.names)} leaves: gradient {prof.compute_s * 1e3:.1f} ms")

    def agree(x):
        return world.allreduce(x, op=MPI.MAX)

    def timed(tx):
        params = fresh(params0)
        state = tx.init(params)
        world.Barrier()
        res, state = time_steps(make_step(loss_fn, tx), params, state, [batch],
                                warmup=cfg["warmup"], steps=cfg["steps"],
                                max_seconds=cfg["max_seconds"], agree=agree,
                                lockstep=world.Barrier)
        med = statistics.median(res["times_s"])
        return float(np.median(world.allgather(med))), state, params

    sgd = optax.sgd(0.01)
    if cfg.get("timeline_only"):
        return timeline_only(cfg, world, prof, ab, n, loss_fn, params0, batch, say)
    none_s, _, _ = timed(optax.chain(optax.identity(), sgd))
    tail = max(0.0, none_s - prof.compute_s)
    say(f"no sync {none_s * 1e3:.1f} ms (tail after the gradient {tail * 1e3:.1f} ms)")
    dense_s, _, _ = timed(optax.chain(jss.dense_sync(), sgd))
    say(f"dense_sync {dense_s * 1e3:.1f} ms")
    records = [{"plan": "no_sync", "step_s": none_s}, {"plan": "dense", "step_s": dense_s}]
    plans = {}
    for name in cfg["plans"]:
        plan = None if name == "ungrouped" else jss.planning.plan_grouping(
            name, prof, nranks=p, density=cfg["density"], params=ab)
        plans[name] = plan
        # the ungrouped transform: predicted as one group after the backward pass
        pred_plan = plan or jss.planning.plan_grouping("none", prof, nranks=p, density=cfg["density"],
                                              params=ab)
        step_s, state, _ = timed(optax.chain(
            jss.topk_sync(density=cfg["density"]) if plan is None
            else jss.grouped_topk_sync(plan, density=cfg["density"]), sgd))
        stats = jss.SyncStats.from_vector(state[0].last_stats).as_dict()
        rec = {"plan": name, "step_s": step_s, "predicted_s": pred_plan.predicted_s + tail,
               "planner_predicted_sync_end_s": pred_plan.predicted_s,
               "groups": len(pred_plan.groups),
               "kinds": [g.kind for g in pred_plan.groups],
               "bytes_sent": stats["bytes_sent"], "table": str(pred_plan)}
        records.append(rec)
        say(f"{name:>9}: {step_s * 1e3:8.1f} ms measured, {rec['predicted_s'] * 1e3:8.1f} ms "
            f"predicted, {len(pred_plan.groups)} groups")
        if rank == 0 and name == "asc":
            print(pred_plan, flush=True)
    # one measured step of the ASC plan, with its timeline
    timeline = None
    if "asc" in plans:
        tx = optax.chain(jss.grouped_topk_sync(plans["asc"], density=cfg["density"]), sgd)
        step = make_step(loss_fn, tx)
        params = fresh(params0)
        state = tx.init(params)
        for _ in range(3):
            params, state = jax.block_until_ready(step(params, state, batch))
        world.Barrier()
        jss.planning.nonblocking_timeline()
        t0 = time.monotonic()
        params, state = jax.block_until_ready(step(params, state, batch))
        t1 = time.monotonic()
        mine = {"rank": rank, "step_s": t1 - t0,
                "groups": [{k: (v - t0 if k in ("start", "checked", "wire_begin", "wire_end",
                                                "done", "done_exit") else v)
                            for k, v in r._asdict().items()} for r in jss.planning.nonblocking_timeline()]}
        timeline = world.gather(mine, root=0)
    step_tl = traced_step(cfg, world, prof, plans, loss_fn, params0, batch, say)
    if rank == 0:
        write_fragment({"model": cfg["model"], "link": cfg["link"], "P": p, "N": n,
                        "leaves": len(prof.names), "density": cfg["density"],
                        "calibration": {"alpha_s": ab.alpha, "beta_s_per_byte": ab.beta,
                                        "gamma": ab.gamma, "local": list(ab.local)},
                        "profile": prof.to_json(), "records": records,
                        "asc_plan": plans["asc"].to_json() if plans.get("asc") else None,
                        "timeline": timeline, "step_timeline": step_tl,
                        "worker_wall_s": round(time.monotonic() - t_start, 1)}, cfg["fragment"])
    return 0



def pick_timeline_plan(plans: dict, wanted: str | None) -> str | None:
    """The plan of the traced step: ``wanted``, or the one with the most groups."""
    if wanted and wanted != "most":
        return wanted if wanted in plans else None
    grouped = {k: v for k, v in plans.items() if v is not None}
    if not grouped:
        return None
    return max(grouped, key=lambda k: (len(grouped[k].groups), k))


def traced_step(cfg, world, prof, plans, loss_fn, params0, batch, say):
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
    tx = optax.chain(jss.topk_sync(density=cfg["density"]) if plan is None
                     else jss.grouped_topk_sync(plan, density=cfg["density"]), optax.sgd(0.01))
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
    plans = {name: (None if name == "ungrouped" else jss.planning.plan_grouping(
        name, prof, nranks=p, density=cfg["density"], params=ab)) for name in cfg["plans"]}
    step_tl = traced_step(cfg, world, prof, plans, loss_fn, params0, batch, say)
    if world.Get_rank() == 0:
        write_fragment({"model": cfg["model"], "link": cfg["link"], "P": p, "N": n,
                        "leaves": len(prof.names), "density": cfg["density"],
                        "calibration": {"alpha_s": ab.alpha, "beta_s_per_byte": ab.beta,
                                        "gamma": ab.gamma, "local": list(ab.local)},
                        "profile": prof.to_json(), "records": [],
                        "plans": {k: (v.to_json() if v else None) for k, v in plans.items()},
                        "timeline": None, "step_timeline": step_tl}, cfg["fragment"])
    return 0


def launch(cfg: dict, nranks: int, args, net) -> dict:
    with tempfile.TemporaryDirectory(prefix="jss_grouping") as tmp:
        os.chmod(tmp, 0o755)
        frag = Path(tmp) / "fragment.json"
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(dict(cfg, fragment=str(frag))))
        env = {**dict(kv.split("=", 1) for kv in args.rank_env), "JAX_PLATFORMS": "cpu",
               "PYTHONUNBUFFERED": "1"}
        wargs = ["-m", "mpi4py", str(Path(__file__).resolve()), "--worker", str(cfg_path)]
        if net is None:
            return run_fragment([find_mpiexec(), *bind_args(args), "-n", str(nranks),
                                 sys.executable, *wargs],
                                frag, args.timeout, env={**os.environ, **env})
        proc = net.launch(wargs, timeout=args.timeout, nranks=nranks, env=env, capture=False,
                          stream=True)
        if proc.returncode != 0 or not frag.exists():
            return {"error": f"mpiexec exited with {proc.returncode}"}
        return json.loads(frag.read_text())


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(6 * (len(runs) + 1), 4.5))
    for ax, run in zip(axes, runs):
        recs = run["records"]
        names = [r["plan"] for r in recs]
        x = range(len(recs))
        ax.bar([i - 0.2 for i in x], [r["step_s"] * 1e3 for r in recs], 0.4, label="measured")
        ax.bar([i + 0.2 for i in x], [(r.get("predicted_s") or 0) * 1e3 for r in recs], 0.4,
               label="predicted")
        ax.set_xticks(list(x), names, rotation=30)
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{run['model']} ({run['leaves']} leaves), {run['link']} Mbit/s, "
                     f"P={run['P']}, topk {run['density']:.1%}")
        ax.legend()
    ax = axes[-1]
    run = next((r for r in runs if r.get("timeline")), None)
    if run:
        prof = run["profile"]
        for rank_rec in run["timeline"]:
            y = rank_rec["rank"]
            ax.barh(y, prof["compute_s"] * 1e3, left=0, height=0.8, color="0.85",
                    label="gradient (profiled)" if y == 0 else None)
            for j, g in enumerate(rank_rec["groups"]):
                yy = y + (j % 4) * 0.18 - 0.3
                ax.plot([g["wire_begin"] * 1e3, g["wire_end"] * 1e3], [yy, yy], lw=3,
                        color=f"C{j % 10}")
                ax.plot([g["start"] * 1e3], [yy], "k|")
            ax.plot([rank_rec["step_s"] * 1e3], [y], "rx",
                    label="step end" if y == 0 else None)
        ax.set_xlabel("ms from the step's start")
        ax.set_ylabel("rank")
        ax.set_title(f"ASC timeline: {run['model']} {run['link']} P={run['P']} "
                     "(| start, bar: on the wire)")
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=sorted(MODEL_CFG))
    ap.add_argument("--links", nargs="+", default=["1000"], help="Mbit/s, or shm")
    ap.add_argument("--procs", nargs="+", type=int, default=[4])
    ap.add_argument("--plans", nargs="+", default=list(PLANS))
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=6.0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--timeline-plan", default="most",
                    help="plan of the traced step (XLA ops + each group's timeline, every "
                         "rank): a name of --plans, or 'most' (the one with the most groups)")
    ap.add_argument("--timeline-only", action="store_true",
                    help="calibrate, profile, plan and trace one step; no step timings")
    ap.add_argument("--rank-env", nargs="*",
                    default=[*DEFAULT_MPI_ENV, *(f"{k}={v}" for k, v in MALLOC_ENV.items())])
    add_bind_option(ap)
    ap.add_argument("--mlp-hidden", type=int, default=None,
                    help=f"the MLP's hidden width (default {MODEL_CFG['mlp']['hidden']})")
    ap.add_argument("--out-dir", type=Path, default=RESULTS,
                    help="where the JSON and plots go (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))
    from emulated_network import EmulatedNetwork

    out = args.out_dir / f"grouping_{args.tag}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": "grouping", "machine": machine_info(), "command": sys.argv,
            "bind_to": args.bind_to, "runs": [], "failures": []}
    t0 = time.monotonic()
    for link in args.links:
        rate = None if link == "shm" else float(link)
        for p in args.procs:
            net = EmulatedNetwork(p, rate, delay_ms=0.0) if rate else None
            try:
                if net is not None:
                    net.__enter__()
                    probe = probe_link(net)
                for model in args.models:
                    model_cfg = dict(MODEL_CFG[model])
                    if model == "mlp" and args.mlp_hidden:
                        model_cfg["hidden"] = args.mlp_hidden
                    cfg = {"model": model, "model_cfg": model_cfg, "link": link,
                           "plans": args.plans,
                           "density": args.density, "steps": args.steps, "warmup": args.warmup,
                           "max_seconds": args.max_seconds, "seed": args.seed,
                           "timeline_plan": args.timeline_plan,
                           "timeline_only": args.timeline_only}
                    print(f"[{time.strftime('%H:%M:%S')}] {model} link {link} P={p}", flush=True)
                    frag = launch(cfg, p, args, net)
                    if frag.get("error"):
                        data["failures"].append({"model": model, "link": link, "P": p,
                                                 "error": frag["error"]})
                        continue
                    frag["link_probe"] = probe if net is not None else None
                    data["runs"].append(frag)
                    data["wall_s"] = round(time.monotonic() - t0, 1)
                    out.write_text(json.dumps(data, indent=1) + "\n")
            finally:
                if net is not None:
                    net.__exit__(None, None, None)
    out.write_text(json.dumps(data, indent=1) + "\n")
    for run in data["runs"]:
        print(f"\n{run['model']} link {run['link']} P={run['P']}:")
        for r in run["records"]:
            pred = r.get("predicted_s")
            err = f"{(pred - r['step_s']) / r['step_s']:+.0%}" if pred else ""
            print(f"  {r['plan']:>9}: {r['step_s'] * 1e3:8.1f} ms  predicted "
                  f"{(pred or 0) * 1e3:8.1f} ms {err}")
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
