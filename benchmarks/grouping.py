"""Layer grouping (ASC-WFBP) end to end: measured step time of each plan next to
the planner's prediction, on the emulated network, with one step's timeline.

Per (model, link, P), one MPI job:

1. ``jss.calibrate(local=("topk_sync",), contention=True)`` on that link: alpha,
   beta (neighbour exchange), the local work of ``topk_sync`` and the contention
   factor gamma (one vs two simultaneous non-blocking allreduces);
2. ``jss.profile_backward``: when each gradient leaf (module) is ready in the
   jitted step (all ranks at once, median over ranks: the same on every rank);
3. the step with no sync (``optax.identity``) and with ``dense_sync``;
4. ``topk_sync(density)`` ungrouped (``grouping=None``: one selection and one
   allreduce after the backward pass) and with each plan of ``jss.GROUPINGS``
   made by ``jss.plan_grouping`` from 1 and 2; the median step time of each;
5. one more step of the ASC plan with ``jss.nonblocking_timeline()``: when each
   group was started, on the wire and waited for, on every rank.

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
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import machine_info, run_fragment, find_mpiexec, write_fragment  # noqa: E402
from step_time import (DEFAULT_MPI_ENV, MALLOC_ENV, build_model, fresh, init_params,  # noqa: E402
                       make_step, probe_link, time_steps)

RESULTS = HERE / "results"
MODEL_CFG = {
    "cnn": {"widths": [32, 64, 128], "blocks": 3, "image": 32, "classes": 10, "batch": 16},
    "mlp": {"input": 256, "hidden": 1536, "layers": 4, "classes": 10, "batch": 32},
}
PLANS = ("ungrouped", "none", "wfbp", "mg", "bucket", "asc")


def worker(cfg: dict) -> int:
    import jax
    import numpy as np
    import optax
    from mpi4py import MPI

    import jax_sparse_sync as jss

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    jss.abort_on_error()
    jss.tune_host_allocator()
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    t_start = time.monotonic()
    tag = f"[{cfg['model']} {cfg['link']} P={p}]"

    def say(msg):
        if rank == 0:
            print(f"{tag} {msg} [t+{time.monotonic() - t_start:.0f}s]", flush=True)

    module, loss_fn, make_batch = build_model(cfg["model"], MODEL_CFG[cfg["model"]])
    params0 = init_params(module, make_batch, cfg["seed"])
    n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params0))
    batch = jax.device_put(make_batch(np.random.default_rng([cfg["seed"], rank]),
                                      MODEL_CFG[cfg["model"]]["batch"]))
    ab = jss.calibrate(local=("topk_sync",), contention=True, repeats=3,
                       local_sizes=(max(n // 8, 4096), n), density=cfg["density"])
    say(f"N={n:,}; calibrated alpha {ab.alpha * 1e6:.1f} us, beta {ab.beta * 1e9:.2f} ns/B, "
        f"gamma {ab.gamma:.2f}, local {ab.local}")
    prof = jss.profile_backward(loss_fn, params0, batch, comm=world, repeats=3)
    say(f"profiled {len(prof.names)} leaves: gradient {prof.compute_s * 1e3:.1f} ms")

    def agree(x):
        return world.allreduce(x, op=MPI.MAX)

    def timed(tx):
        params = fresh(params0)
        state = tx.init(params)
        world.Barrier()
        res, state = time_steps(make_step(loss_fn, tx), params, state, batch,
                                warmup=cfg["warmup"], steps=cfg["steps"],
                                max_seconds=cfg["max_seconds"], agree=agree,
                                lockstep=world.Barrier)
        med = statistics.median(res["times_s"])
        return float(np.median(world.allgather(med))), state, params

    sgd = optax.sgd(0.01)
    none_s, _, _ = timed(optax.chain(optax.identity(), sgd))
    tail = max(0.0, none_s - prof.compute_s)
    say(f"no sync {none_s * 1e3:.1f} ms (tail after the gradient {tail * 1e3:.1f} ms)")
    dense_s, _, _ = timed(optax.chain(jss.dense_sync(), sgd))
    say(f"dense_sync {dense_s * 1e3:.1f} ms")
    records = [{"plan": "no_sync", "step_s": none_s}, {"plan": "dense", "step_s": dense_s}]
    plans = {}
    for name in cfg["plans"]:
        plan = None if name == "ungrouped" else jss.plan_grouping(
            name, prof, nranks=p, density=cfg["density"], params=ab)
        plans[name] = plan
        # the ungrouped transform: predicted as one group after the backward pass
        pred_plan = plan or jss.plan_grouping("none", prof, nranks=p, density=cfg["density"],
                                              params=ab)
        step_s, state, _ = timed(optax.chain(
            jss.topk_sync(density=cfg["density"], grouping=plan), sgd))
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
        tx = optax.chain(jss.topk_sync(density=cfg["density"], grouping=plans["asc"]), sgd)
        step = make_step(loss_fn, tx)
        params = fresh(params0)
        state = tx.init(params)
        for _ in range(3):
            params, state = jax.block_until_ready(step(params, state, batch))
        world.Barrier()
        jss.nonblocking_timeline()
        t0 = time.monotonic()
        params, state = jax.block_until_ready(step(params, state, batch))
        t1 = time.monotonic()
        mine = {"rank": rank, "step_s": t1 - t0,
                "groups": [{k: (v - t0 if k in ("start", "checked", "wire_begin", "wire_end",
                                                "done", "done_exit") else v)
                            for k, v in r._asdict().items()} for r in jss.nonblocking_timeline()]}
        timeline = world.gather(mine, root=0)
    if rank == 0:
        write_fragment({"model": cfg["model"], "link": cfg["link"], "P": p, "N": n,
                        "leaves": len(prof.names), "density": cfg["density"],
                        "calibration": {"alpha_s": ab.alpha, "beta_s_per_byte": ab.beta,
                                        "gamma": ab.gamma, "local": list(ab.local)},
                        "profile": prof.to_json(), "records": records,
                        "asc_plan": plans["asc"].to_json() if plans.get("asc") else None,
                        "timeline": timeline,
                        "worker_wall_s": round(time.monotonic() - t_start, 1)}, cfg["fragment"])
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
            return run_fragment([find_mpiexec(), "-n", str(nranks), sys.executable, *wargs],
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
    ap.add_argument("--rank-env", nargs="*",
                    default=[*DEFAULT_MPI_ENV, *(f"{k}={v}" for k, v in MALLOC_ENV.items())])
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))
    from emulated_network import EmulatedNetwork

    out = RESULTS / f"grouping_{args.tag}.json"
    data = {"benchmark": "grouping", "machine": machine_info(), "command": sys.argv,
            "runs": [], "failures": []}
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
                    cfg = {"model": model, "link": link, "plans": args.plans,
                           "density": args.density, "steps": args.steps, "warmup": args.warmup,
                           "max_seconds": args.max_seconds, "seed": args.seed}
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
    if data["runs"]:
        plot(data, out.with_suffix(".png"))
    print(f"# wrote {out}")
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
