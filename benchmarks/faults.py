"""Network faults on the emulated network: every collective of the library under each
fault kind, results checked bitwise against the fault-free run.

One MPI job per fault kind of ``FAULTS`` on ``emulated_network.EmulatedNetwork(P, rate)``
(root). Every step calls each operation of ``OPERATIONS`` once on inputs that depend only
on (seed, rank, step) and hashes each result. Once every rank has compiled, the driver
waits ``--pre`` s, injects the fault on rank ``--fault-rank``'s link or the rank
(``EmulatedNetwork.inject``), waits ``--post`` s and tells the ranks to stop;
``link_dead`` must end through the watchdog (``jss.mpi.set_timeout``) with a message
naming the operation (``where_it_waits``). A fault-free reference job runs as many
steps as the longest. Checked per operation, step and rank: the digest equals the
reference's (``wrong``) and every rank's (``replicas_differ``); a job past
``--job-timeout`` is a hang. Slowdown: the mean time in the steps that overlap the fault
over the median of all fault-free steps (never step 0).

    python benchmarks/faults.py                       # P = 4, 1000 Mbit/s, every kind
    python benchmarks/faults.py --kinds loss link_dead --out /tmp/x.json
    python benchmarks/faults.py --kinds link_dead --update   # rerun one kind in the record

Writes ``results/reliability.{json,png}`` (results: docs/topics/reliability.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (add_quiet_options, add_record_options, cpu_busy, load_record,  # noqa: E402
                      loadavg, machine_info, pyplot, quiet_before, save_figure, write_record)

RESULTS = HERE / "results"
SPARSE_ALGORITHMS = ("dense", "allgather", "recursive_doubling", "split_allgather",
                     "dsar_split_allgather", "hash_partition")
OPERATIONS = (*(f"sparse_allreduce:{a}" for a in SPARSE_ALGORITHMS),
              "sparse_allreduce_start/done", "oktopk_allreduce", "block_allreduce",
              "dense_allreduce", "topk_sync", "oktopk_sync", "dense_sync")
# name: (EmulatedNetwork.inject kind, duration in s, parameters)
FAULTS = {
    "link_flap_0.5s": ("link_flap", 0.5, {}),
    "link_flap_5s": ("link_flap", 5.0, {}),
    # TCP's retries back off while the link is down: a 15 s outage stalls longer
    "link_flap_15s": ("link_flap", 15.0, {"watchdog_s": 60.0}),
    "bandwidth_collapse": ("bandwidth_collapse", 3.0, {}),
    "jitter": ("jitter", 3.0, {}),
    "loss_2pct": ("loss", 3.0, {"probability": 0.02}),
    "loss_10pct": ("loss", 3.0, {"probability": 0.10}),
    "duplication_5pct": ("duplication", 3.0, {"probability": 0.05}),
    "reordering_10pct": ("reordering", 3.0, {"probability": 0.10}),
    "pause_3s": ("pause", 3.0, {}),
    "straggler_10x": ("straggler", 3.0, {}),
    "link_dead": ("link_dead", None, {}),
}
RANK_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",   # 4 ranks on 2 cores: yield while waiting
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


# --------------------------------------------------------------------------- worker


def worker(args) -> int:
    import hashlib

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import jax_sparse_sync as jss

    jss.mpi.abort_on_error()
    comm = jss.mpi.default_comm()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    ctl = Path(args.control)
    n, k = args.size, args.k

    def inputs(step):
        rng = np.random.default_rng([args.seed, rank, step])
        idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int32)
        idx[::9] = -1  # some padding
        vals = rng.standard_normal(k).astype(np.float32)
        grad = rng.standard_normal(n).astype(np.float32)
        return vals, idx, grad

    ops = {}
    for algorithm in SPARSE_ALGORITHMS:
        ops[f"sparse_allreduce:{algorithm}"] = jax.jit(
            lambda v, i, a=algorithm: jss.sparse_allreduce(v, i, size=n, algorithm=a))

    def nonblocking(v, i):
        return jss.sparse_allreduce_done(jss.sparse_allreduce_start(v, i, size=n))

    ops["sparse_allreduce_start/done"] = nonblocking
    ops["oktopk_allreduce"] = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=n, k=k).sum)
    ops["block_allreduce"] = jax.jit(lambda g: jss.block_allreduce(
        jnp.where(jnp.abs(g) > 2.0, g, 0.0), block_size=64))
    ops["dense_allreduce"] = jax.jit(lambda g: jss.dense_allreduce(g))

    transforms = {"topk_sync": jss.topk_sync(k=k), "oktopk_sync": jss.oktopk_sync(k=k),
                  "dense_sync": jss.dense_sync()}
    states = {}
    for name, sync in transforms.items():
        tx = optax.chain(sync, optax.sgd(0.05))
        params = jnp.zeros(n, jnp.float32)

        def step_fn(params, state, grad, tx=tx):
            updates, state = tx.update(grad, state, params)
            return optax.apply_updates(params, updates), state

        states[name] = [params, tx.init(params), jax.jit(step_fn)]

    def run_transform(name, grad):
        st = states[name]
        st[0], st[1] = st[2](st[0], st[1], grad)
        return st[0]

    # the rank's own compute, deterministic and discarded: a straggler does it 10 times
    work_a = jnp.asarray(np.random.default_rng(1).standard_normal((512, 512)), jnp.float32)
    compute = jax.jit(lambda a: jnp.tanh(a @ a.T * 0.01).sum())

    chains = {name: hashlib.sha256() for name in OPERATIONS}
    digests = {name: [] for name in OPERATIONS}
    times = {name: [] for name in OPERATIONS}
    step_t0, step_t1, compute_s = [], [], []
    stop_agreed_at = None
    straggling_steps = 0
    step = 0
    while step < args.max_steps:
        t_step = time.time()
        t0 = time.perf_counter()
        repeats = 1
        if rank == args.fault_rank and (ctl / "straggle").exists():
            repeats, straggling_steps = args.straggle_factor, straggling_steps + 1
        for _ in range(repeats):
            jax.block_until_ready(compute(work_a))
        vals, idx, grad = inputs(step)
        compute_s.append(time.perf_counter() - t0)
        for name in OPERATIONS:
            t0 = time.perf_counter()
            if name in transforms:
                out = run_transform(name, grad)
            elif name in ("block_allreduce", "dense_allreduce"):
                out = ops[name](grad)
            else:
                out = ops[name](vals, idx)
            out = np.asarray(jax.block_until_ready(out))
            times[name].append(time.perf_counter() - t0)
            chains[name].update(out.tobytes())
            digests[name].append(chains[name].hexdigest()[:16])
        step_t0.append(t_step)
        step_t1.append(time.time())
        if step == 0:
            # compiled: from here on a collective stuck for timeout_s ends the job
            jss.mpi.set_timeout(args.watchdog_timeout)
            (ctl / f"ready{rank}").write_text(str(time.time()))
        seen = float((ctl / "over").exists())
        anyone = float(np.asarray(jss.dense_allreduce(jnp.asarray([seen], jnp.float32)))[0])
        step += 1
        if anyone > 0 and step >= args.min_steps:
            stop_agreed_at = step
        # after every step (a job the watchdog ends keeps the steps it completed)
        record = {"rank": rank, "P": nranks, "steps": step,
                  "stopped_by_agreement": stop_agreed_at, "digests": digests, "op_s": times,
                  "step_t0": step_t0, "step_t1": step_t1, "compute_s": compute_s,
                  "straggling_steps": straggling_steps}
        (ctl / f"rank{rank}.tmp").write_text(json.dumps(record))
        os.replace(ctl / f"rank{rank}.tmp", ctl / f"rank{rank}.json")
        if stop_agreed_at:
            break
    jss.mpi.set_timeout(None)
    return 0


# --------------------------------------------------------------------------- driver


def run_job(net, name: str, args, min_steps: int) -> dict:
    """One MPI job under fault ``name`` (or "none"); the fault injected from a thread."""
    from emulated_network import NetworkError

    kind, duration, params = FAULTS.get(name, ("none", 0.0, {}))
    params = dict(params)
    watchdog_s = params.pop("watchdog_s", args.watchdog_timeout)
    with tempfile.TemporaryDirectory(prefix="jss_faults") as tmp:
        ctl = Path(tmp)
        os.chmod(tmp, 0o777)
        cancel = threading.Event()
        fault: dict = {}

        def injector():
            deadline = time.monotonic() + args.job_timeout
            while not all((ctl / f"ready{r}").exists() for r in range(args.procs)):
                if cancel.is_set() or time.monotonic() > deadline:
                    return
                time.sleep(0.05)
            if kind == "none":
                (ctl / "over").touch()
                return
            time.sleep(args.pre)
            try:
                if kind == "straggler":
                    (ctl / "straggle").touch()
                    fault["t_applied"] = time.time()
                    fault.update(net.inject(kind, args.fault_rank, duration, **params))
                    (ctl / "straggle").unlink()
                else:
                    fault.update(net.inject(kind, args.fault_rank, duration, **params))
            except Exception as e:  # recorded; the job's outcome says the rest
                fault["error"] = repr(e)
            fault.setdefault("t_applied", fault.get("t_start"))
            if kind == "link_dead":
                return
            time.sleep(args.post)
            (ctl / "over").touch()

        thread = threading.Thread(target=injector, daemon=True)
        thread.start()
        wargs = ["-m", "mpi4py", str(Path(__file__).resolve()), "--worker", "--control", tmp,
                 "--size", str(args.size), "--k", str(args.k), "--seed", str(args.seed),
                 "--fault-rank", str(args.fault_rank), "--min-steps", str(min_steps),
                 "--max-steps", str(args.max_steps), "--watchdog-timeout",
                 str(watchdog_s), "--straggle-factor", str(args.straggle_factor)]
        t_launch, load_before = time.time(), loadavg()
        hang, output, rc = False, "", None
        try:
            proc = net.launch(wargs, timeout=args.job_timeout, env=RANK_ENV, cwd=str(HERE.parent))
            output, rc = proc.stdout, proc.returncode
        except NetworkError as e:
            hang, output = True, str(e)
        t_exit = time.time()
        cancel.set()
        thread.join(timeout=30)
        if kind == "link_dead":
            net.clear_faults(args.fault_rank)
        ranks = {}
        for r in range(args.procs):
            f = ctl / f"rank{r}.json"
            if f.exists():
                ranks[r] = json.loads(f.read_text())
    print(f"# {name}: rc={rc} hang={hang} steps={[ranks[r]['steps'] for r in sorted(ranks)]} "
          f"{time.time() - t_launch:.1f} s", flush=True)
    return {"name": name, "kind": kind, "duration_s": duration, "params": params, "rc": rc,
            "watchdog_s": watchdog_s, "loadavg_before": load_before, "loadavg_after": loadavg(),
            "hang": hang, "fault": fault, "t_launch": t_launch, "t_exit": t_exit,
            "output_tail": output[-6000:], "ranks": ranks}


def watchdog_report(job: dict, timeout: float) -> dict:
    """How the link_dead job ended: the watchdog's message, the op, the time it took."""
    text = job["output_tail"]
    lines = [ln for ln in text.splitlines() if "jax_sparse_sync watchdog:" in ln]
    m = re.search(r"watchdog: rank (\d+) \(pid \d+\): `([^`]+)` #(\d+)", text)
    t_down = job["fault"].get("t_applied")
    ended_after = (job["t_exit"] - t_down) if t_down else None
    detail = re.findall(r"^\s+(ranks [^\n]*|rank \d+: last entered[^\n]*)$", text, re.M)
    # where the reporting rank's threads wait: the peer behind the dead link, where the
    # operation was in a point-to-point phase when the link died
    waits = re.findall(rf"^  (rank {m.group(1)} waits [^\n]*)$", text, re.M) if m else []
    return {"watchdog_fired": bool(lines), "first_message": lines[0] if lines else None,
            "reporting_rank": int(m.group(1)) if m else None,
            "where_it_waits": waits,
            "operation": m.group(2) if m else None,
            "sequence": int(m.group(3)) if m else None, "detail": detail[:8],
            "exit_code": job["rc"], "watchdog_timeout_s": timeout,
            "job_ended_s_after_link_down": ended_after,
            "within_timeout_plus_5s": ended_after is not None and ended_after <= timeout + 5,
            "hang": job["hang"]}


def fault_free_steps(job: dict) -> dict[int, list[int]]:
    """Per rank, the steps of a job that ran with no fault: all of the reference's, the
    ones of a faulted job that ended before the fault began; never step 0 (it compiles)."""
    t_on = job["fault"].get("t_applied")
    out = {}
    for r, d in job["ranks"].items():
        out[r] = [s for s, b in enumerate(d["step_t1"])
                  if s and (job["kind"] == "none" or (t_on is not None and b < t_on))]
    return out


def analyse(jobs: list[dict], reference: dict, args) -> dict:
    """Digests against the reference's; slowdowns against the fault-free steps of all
    jobs (the reference's and those before each fault), pooled: a baseline from one job
    alone moves with the load that other users put on this machine."""
    ref = reference["ranks"]
    pooled = {name: [] for name in OPERATIONS}
    pooled_step = []
    for job in [reference, *jobs]:
        for r, steps in fault_free_steps(job).items():
            d = job["ranks"][r]
            for name in OPERATIONS:
                pooled[name] += [d["op_s"][name][s] for s in steps]
            pooled_step += [d["step_t1"][s] - d["step_t0"][s] for s in steps]
    ref_med = {name: statistics.median(v) for name, v in pooled.items()}
    ref_step = statistics.median(pooled_step)
    out = {}
    for job in jobs:
        rec = {"kind": job["kind"], "duration_s": job["duration_s"], "params": job["params"],
               "watchdog_timeout_s": job["watchdog_s"],
               # other users' load slows the CPU-bound steps (the slowdowns are ratios to
               # fault-free steps under the same load) and stretches a job's wall time
               "loadavg_1min": [job.get("loadavg_before"), job.get("loadavg_after")],
               "exit_code": job["rc"], "hang": job["hang"],
               "ranks_reporting": sorted(job["ranks"]), "fault": {
                   k: v for k, v in job["fault"].items() if k not in ("pids",)}}
        wrong, compared, replicas_differ = 0, 0, 0
        steps = {r: d["steps"] for r, d in job["ranks"].items()}
        rec["steps"] = steps
        for name in OPERATIONS:
            for r, d in job["ranks"].items():
                got = d["digests"][name]
                want = ref[r]["digests"][name] if r in ref else []
                m = min(len(got), len(want))
                compared += m
                wrong += sum(1 for a, b in zip(got[:m], want[:m]) if a != b)
                if len(got) > len(want):
                    rec.setdefault("uncompared_steps", 0)
                    rec["uncompared_steps"] += len(got) - len(want)
            per_rank = [tuple(d["digests"][name]) for d in job["ranks"].values()]
            if per_rank:
                m = min(len(x) for x in per_rank)
                replicas_differ += sum(1 for s in range(m) if len({x[s] for x in per_rank}) > 1)
        rec.update(compared=compared, wrong=wrong, replicas_differ=replicas_differ)
        t_on = job["fault"].get("t_applied")
        t_off = job["fault"].get("t_end")
        if t_on and t_off and job["ranks"]:
            slow, in_window = {}, 0
            step_times = []
            for name in OPERATIONS:
                vals = []
                for d in job["ranks"].values():
                    for s, (a, b) in enumerate(zip(d["step_t0"], d["step_t1"])):
                        if s and b >= t_on and a <= t_off:
                            vals.append(d["op_s"][name][s])
                            if name == OPERATIONS[0]:
                                step_times.append(b - a)
                if vals:
                    slow[name] = statistics.fmean(vals) / ref_med[name]
            in_window = len(step_times) / max(1, len(job["ranks"]))
            rec["steps_in_fault_window"] = in_window
            rec["longest_step_in_window_s"] = max(step_times) if step_times else None
            rec["slowdown"] = slow
            rec["step_slowdown"] = (statistics.fmean(step_times) / ref_step) if step_times else None
        if job["kind"] == "straggler":
            rec["straggling_steps"] = {r: d["straggling_steps"] for r, d in job["ranks"].items()}
            comp = job["ranks"].get(args.fault_rank, {}).get("compute_s", [])
            if comp:
                rec["straggler_compute_s"] = {"normal_median": statistics.median(comp[1:4]),
                                              "straggling_max": max(comp)}
        if job["kind"] == "link_dead":
            rec["watchdog"] = watchdog_report(job, job["watchdog_s"])
            rec["output_tail"] = job["output_tail"][-3000:]
        elif job["rc"] != 0 or job["hang"]:
            rec["output_tail"] = job["output_tail"][-3000:]
        out[job["name"]] = rec
    return {"reference": {"steps": {r: d["steps"] for r, d in ref.items()},
                          "baseline": "medians over the fault-free steps of every job, pooled",
                          "fault_free_steps_pooled": len(pooled_step),
                          "median_op_s": ref_med, "median_step_s": ref_step,
                          "exit_code": reference["rc"], "hang": reference["hang"]},
            "faults": out}


def summary(analysis: dict) -> dict:
    faults = analysis["faults"]
    survivable = {k: v for k, v in faults.items() if v["kind"] != "link_dead"}
    dead = [v for v in faults.values() if v["kind"] == "link_dead"]
    return {
        "fault_kinds_injected": len(faults),
        "operations": len(OPERATIONS),
        "kinds_every_operation_ran_under": sorted(
            k for k, v in survivable.items()
            if len(v.get("slowdown", {})) == len(OPERATIONS) and v["exit_code"] == 0),
        "wrong_results": sum(v["wrong"] for v in faults.values()),
        "replicas_differ": sum(v["replicas_differ"] for v in faults.values()),
        "digests_compared": sum(v["compared"] for v in faults.values()),
        "hangs": sum(bool(v["hang"]) for v in faults.values()) + bool(analysis["reference"]["hang"]),
        "jobs_failed": sorted(k for k, v in survivable.items() if v["exit_code"] != 0),
        "dead_link_ended_by_watchdog_within_timeout_plus_5s": all(
            v["watchdog"]["watchdog_fired"] and v["watchdog"]["within_timeout_plus_5s"]
            for v in dead) if dead else None,
    }


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    faults = {k: v for k, v in data["faults"].items() if v.get("slowdown")}
    kinds = list(faults)
    fig, (top, ax) = plt.subplots(2, 1, figsize=(max(11, 1.4 * len(kinds)), 9),
                                  height_ratios=[1, 1.6])
    steps = [faults[k].get("step_slowdown") or float("nan") for k in kinds]
    bars = top.bar(range(len(kinds)), steps, 0.6, color="tab:gray")
    for b, k in zip(bars, kinds):
        top.annotate(f"{faults[k]['step_slowdown']:.2f}x\nlongest "
                     f"{faults[k]['longest_step_in_window_s']:.1f} s",
                     (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                     va="bottom", fontsize=7)
    top.axhline(1.0, color="k", lw=0.8)
    top.set_yscale("log")
    top.set_ylim(0.5, 4 * max([x for x in steps if x == x] + [1.0]))
    top.set_xticks(range(len(kinds)), kinds)
    top.set_ylabel("step time in the fault\nwindow / fault-free median")
    s = data["summary"]
    top.set_title(f"P = {data['config']['procs']}, {data['config']['rate_mbit']:g} Mbit/s links, "
                  f"fault on rank {data['config']['fault_rank']}, {len(OPERATIONS)} operations "
                  f"per step: wrong results {s['wrong_results']}, hangs {s['hangs']}, dead "
                  f"link ended by the watchdog: "
                  f"{s['dead_link_ended_by_watchdog_within_timeout_plus_5s']}", fontsize=10)
    width = 0.8 / len(OPERATIONS)
    cmap = plt.get_cmap("tab20")
    for j, name in enumerate(OPERATIONS):
        ys = [faults[k]["slowdown"].get(name, float("nan")) for k in kinds]
        ax.bar([i + (j - len(OPERATIONS) / 2) * width for i in range(len(kinds))], ys, width,
               label=name, color=cmap(j))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(kinds)), kinds, rotation=15)
    ax.set_ylabel("op time in the fault window\n/ fault-free median (mean)")
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    save_figure(fig, path)
    print(f"# wrote {path}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--control", help=argparse.SUPPRESS)
    ap.add_argument("--min-steps", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per link direction")
    ap.add_argument("--size", type=int, default=1 << 15, help="dense length N")
    ap.add_argument("--k", type=int, default=256, help="nonzeros per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--kinds", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    ap.add_argument("--pre", type=float, default=1.5, help="s of steps before the fault")
    ap.add_argument("--post", type=float, default=2.0, help="s of steps after it")
    ap.add_argument("--max-steps", type=int, default=2000)
    ap.add_argument("--watchdog-timeout", type=float, default=20.0)
    ap.add_argument("--straggle-factor", type=int, default=10)
    ap.add_argument("--job-timeout", type=float, default=300.0)
    add_quiet_options(ap)
    add_record_options(ap, RESULTS / "reliability.json", png=False)
    ap.add_argument("--update", action="store_true",
                    help="replace only the --kinds entries of the existing --out record (each "
                         "with its rerun's machine record and reference), keep the rest")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.plot_only:
        plot(load_record(args.out), Path(args.out).with_suffix(".png"))
        return 0

    from emulated_network import EmulatedNetwork, supported_faults, usable

    ok, why = usable()
    if not ok:
        print(f"emulated network not usable: {why}", file=sys.stderr)
        return 1
    mechanisms = supported_faults()
    busy, waited = quiet_before(args.quiet_wait, args.quiet_busy)
    load = {"cpu_busy_before": busy, "quiet_waited_s": waited, "loadavg_1min_before": loadavg()}
    t0 = time.time()
    jobs = []
    with EmulatedNetwork(args.procs, args.rate) as net:
        for name in args.kinds:
            jobs.append(run_job(net, name, args, min_steps=1))
        most = max([max((d["steps"] for d in j["ranks"].values()), default=1) for j in jobs] + [5])
        reference = run_job(net, "none", args, min_steps=most)
        config = {"procs": args.procs, "rate_mbit": args.rate, "size": args.size, "k": args.k,
                  "seed": args.seed, "fault_rank": args.fault_rank, "pre_s": args.pre,
                  "post_s": args.post, "watchdog_timeout_s": args.watchdog_timeout,
                  "straggle_factor": args.straggle_factor, "job_timeout_s": args.job_timeout,
                  "rank_env": RANK_ENV, "network": net.describe(),
                  "faults": {k: {"kind": v[0], "duration_s": v[1], **v[2]}
                             for k, v in FAULTS.items() if k in args.kinds}}
    analysis = analyse(jobs, reference, args)
    load.update(cpu_busy_after=cpu_busy(0.5), loadavg_1min_after=loadavg())
    data = {"benchmark": "faults", "machine": machine_info(), "config": config,
            "operations": list(OPERATIONS), "mechanisms": mechanisms, **analysis,
            "load": load, "wall_s": time.time() - t0}
    data["summary"] = summary(analysis)
    out = Path(args.out)
    if args.update and out.exists():
        old = load_record(out)
        for name in args.kinds:
            old["faults"][name] = {**analysis["faults"][name],
                                   "rerun": {"machine": data["machine"],
                                             "reference": analysis["reference"],
                                             "wall_s": data["wall_s"]}}
        old["summary"] = summary(old)
        data = old
    write_record(data, out)
    print(json.dumps(data["summary"], indent=1))
    plot(data, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
