"""Step time of ``shared_support_sync`` (index-free Top-k) against ``topk_sync`` with
the same k, on both transports.

Issue 35's goal: "Index-free Top-k: time per step at most that of topk_sync with the
same k on both transports". One flat parameter vector of N entries, a fixed random
gradient per rank, the jitted ``tx.update`` of ``jss.topk_sync(k=k)`` and of
``jss.shared_support_sync(k=k, refresh_every=R)`` (its time per step: the mean over whole
cycles of R steps; the shared and refresh steps also alone), state donated, interleaved
cycle by cycle; medians over repeats. ``--transport mpi`` (the max over ranks, after a
barrier) or ``axis`` (one process, 8 host devices, ``comm=jss.axis("data")``).
``--shared-support-from FILE`` loads an older ``shared_support_sync.py`` instead;
``--before-after`` merges alternated invocations into one record.

    mpiexec -n 4 python -m mpi4py benchmarks/shared_support_time.py --transport mpi
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python benchmarks/shared_support_time.py --transport axis
    python benchmarks/shared_support_time.py --merge   # the two fragments -> results JSON + PNG

Results: docs/topics/shared_support.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (file_sha1, fmt_size, machine_info, parse_size, pyplot,  # noqa: E402
                      save_figure, write_record)

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "shared_support_time"  # results: shared_support_time_1M (pass --out for another size)


def build(args, comm, per_device_shape):
    import jax_sparse_sync as jss

    n = parse_size(args.size)
    k = max(1, int(args.density * n))
    shared_support_sync = jss.shared_support_sync if args.shared_support_from is None \
        else module_from(args.shared_support_from).shared_support_sync
    txs = {"topk_sync": jss.topk_sync(k=k, algorithm=args.algorithm, comm=comm),
           "shared_support_sync": shared_support_sync(k=k, refresh_every=args.refresh,
                                                      algorithm=args.algorithm, comm=comm)}
    if args.random_fraction:
        txs[random_name(args)] = shared_support_sync(
            k=k, refresh_every=args.refresh, algorithm=args.algorithm, comm=comm,
            random_fraction=args.random_fraction)
    return n, k, txs


def module_from(path: str):
    """The module in ``path`` (another version of ``shared_support_sync.py``: it imports
    the installed package's helpers as the installed module does)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("shared_support_sync_from_file", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_name(args) -> str:
    return f"shared_support_sync(random_fraction={args.random_fraction})"


def is_shared(name: str) -> bool:
    return name.startswith("shared_support_sync")


def run_mpi(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss

    comm = jss.mpi.default_comm()
    rank, p = comm.Get_rank(), comm.Get_size()
    n, k, txs = build(args, None, None)
    grad = {"w": jnp.asarray(np.random.default_rng(rank).standard_normal(n).astype(np.float32))}
    steps, states = {}, {}
    for name, tx in txs.items():
        steps[name] = jax.jit(lambda g, s, tx=tx: tx.update(g, s)[1], donate_argnums=(1,))
        states[name] = tx.init(grad)

    def one(name):
        comm.Barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        states[name] = steps[name](grad, states[name])
        jax.block_until_ready(states[name])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return comm.allreduce(wall, op=MPI.MAX), comm.allreduce(cpu, op=MPI.MAX)

    return measure(args, one, list(txs), dict(transport="mpi", nranks=p, size=n, k=k),
                   rank == 0)


def run_axis(args) -> dict:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_sparse_sync as jss

    p = len(jax.devices())
    mesh = jax.make_mesh((p,), ("data",))
    n, k, txs = build(args, jss.axis("data"), None)
    rows = np.random.default_rng(0).standard_normal((p, n)).astype(np.float32)
    grad = jax.device_put(rows, NamedSharding(mesh, P("data")))
    steps, states = {}, {}
    for name, tx in txs.items():
        def init(g, tx=tx):
            s = tx.init({"w": g[0]})
            return jax.tree_util.tree_map(lambda x: x[None], s)

        def update(g, s, tx=tx):
            s = jax.tree_util.tree_map(lambda x: x[0], s)
            _, s = tx.update({"w": g[0]}, s)
            return jax.tree_util.tree_map(lambda x: x[None], s)

        smap = dict(mesh=mesh, check_vma=False)
        states[name] = jax.jit(jax.shard_map(init, in_specs=P("data"), out_specs=P("data"),
                                             **smap))(grad)
        steps[name] = jax.jit(jax.shard_map(update, in_specs=(P("data"), P("data")),
                                            out_specs=P("data"), **smap), donate_argnums=(1,))

    def one(name):
        c0, t0 = time.process_time(), time.perf_counter()
        states[name] = steps[name](grad, states[name])
        jax.block_until_ready(states[name])
        return time.perf_counter() - t0, time.process_time() - c0

    return measure(args, one, list(txs), dict(transport="axis", nranks=p, size=n, k=k), True)


def measure(args, one, names, rec, report) -> dict:
    r = args.refresh
    for name in names:  # compile both branches (refresh and shared) and warm up
        for _ in range(max(2, args.warmup) * r):
            one(name)
    # per repeat: one cycle of R steps of each method (the shared support's cycle
    # starts with its refresh step: the step counts stay aligned to R)
    cycle = {name: [] for name in names}
    cycle_cpu = {name: [] for name in names}
    per_step = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            ts = [one(name) for _ in range(r)]
            cycle[name].append(sum(w for w, _ in ts) / r)
            cycle_cpu[name].append(sum(c for _, c in ts) / r)
            per_step[name].append(ts)
    rec = dict(rec, refresh_every=r, algorithm=args.algorithm, methods={},
               shared_support_from=None if args.shared_support_from is None else {
                   "path": args.shared_support_from,
                   "sha1": file_sha1(args.shared_support_from)},
               cpu_note="cpu: the process's CPU time per step (all its threads; MPI: the "
                        "largest over ranks, polling included), median over repeats")
    for name in names:
        m = {"median_step_s": statistics.median(cycle[name]), "cycle_means_s": cycle[name],
             "median_step_cpu_s": statistics.median(cycle_cpu[name])}
        if is_shared(name):
            for key, at in (("refresh", slice(0, 1)), ("shared", slice(1, None))):
                m[f"median_{key}_step_s"] = statistics.median(
                    w for ts in per_step[name] for w, _ in ts[at])
                m[f"median_{key}_step_cpu_s"] = statistics.median(
                    c for ts in per_step[name] for _, c in ts[at])
        rec["methods"][name] = m
    t, s = (rec["methods"][x]["median_step_s"] for x in ("topk_sync", "shared_support_sync"))
    rec["shared_over_topk"] = s / t
    tc, sc = (rec["methods"][x]["median_step_cpu_s"] for x in ("topk_sync", "shared_support_sync"))
    rec["shared_over_topk_cpu"] = sc / tc
    if args.random_fraction:
        rec["random_over_topk"] = rec["methods"][random_name(args)]["median_step_s"] / t
    if report:
        print(f"# {rec['transport']} P={rec['nranks']} N={fmt_size(rec['size'])} k={rec['k']}: "
              f"topk_sync {1e3 * t:.2f} ms, shared_support_sync {1e3 * s:.2f} ms "
              f"({s / t:.2f}x; refresh {1e3 * rec['methods']['shared_support_sync']['median_refresh_step_s']:.2f}"
              f", shared {1e3 * rec['methods']['shared_support_sync']['median_shared_step_s']:.2f} ms)"
              f"; CPU {1e3 * tc:.2f} / {1e3 * sc:.2f} ms ({sc / tc:.2f}x)", flush=True)
    return rec


def plot(data, path):
    plt = pyplot()
    import numpy as np

    recs = data["records"]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(recs))
    bars = [("topk_sync", "median_step_s"), ("shared_support_sync", "median_step_s"),
            ("shared_support_sync", "median_refresh_step_s"),
            ("shared_support_sync", "median_shared_step_s")]
    labels = ["topk_sync", "shared_support_sync (per step)", "  its refresh step",
              "  its shared step"]
    w = 0.8 / len(bars)
    for j, ((m, key), lab) in enumerate(zip(bars, labels)):
        ax.bar(x + (j - 1.5) * w, [1e3 * r["methods"][m][key] for r in recs], w, label=lab)
    ax.set_xticks(x, [f"{r['transport']} P={r['nranks']}\nN={fmt_size(r['size'])}, k={r['k']}"
                      for r in recs])
    ax.set_ylabel("median step time (ms)")
    ax.set_title("Index-free Top-k vs topk_sync, same k (CPU, 2 shared cores)", fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def before_after(frags) -> dict:
    """Fragments of alternated invocations -> one record: per invocation the ratios to
    ``topk_sync`` (a module loaded by ``--shared-support-from``: "before"), and their
    medians per version and world size."""
    rows = []
    for f in frags:
        rec, ms = f["record"], f["record"]["methods"]
        topk, shared = ms["topk_sync"], ms["shared_support_sync"]
        rows.append({
            "version": "after" if rec.get("shared_support_from") is None else "before",
            "nranks": rec["nranks"], "load": f["load"]["loadavg_1min"],
            "topk_ms": 1e3 * topk["median_step_s"], "shared_ms": 1e3 * shared["median_step_s"],
            "ratio": rec["shared_over_topk"], "ratio_cpu": rec["shared_over_topk_cpu"],
            **{f"{key}_over_topk{cpu}": shared[f"median_{key}_step{cpu}_s"]
               / topk[f"median_step{cpu}_s"]
               for key in ("refresh", "shared") for cpu in ("", "_cpu")},
            "shared_support_from": rec.get("shared_support_from"),
            "command": f["machine"]["command"], "commit": f["machine"]["commit"],
            "date": f["machine"]["date"]})
    medians = {}
    for p in sorted({r["nranks"] for r in rows}):
        for version in ("before", "after"):
            mine = [r for r in rows if r["nranks"] == p and r["version"] == version]
            if mine:
                medians[f"p{p}_{version}"] = {
                    key: statistics.median(r[key] for r in mine) for key in rows[0]
                    if key.startswith("ratio") or key.endswith(("over_topk", "over_topk_cpu"))}
                medians[f"p{p}_{version}"]["invocations"] = len(mine)
    return {"rows": rows, "medians": medians}


def plot_before_after(data, path):
    plt = pyplot()

    keys = [("ratio", "per step"), ("refresh_over_topk", "refresh step"),
            ("shared_over_topk", "shared step")]
    sizes = sorted({r["nranks"] for r in data["rows"]})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.8), squeeze=False)
    for ax, p in zip(axes[0], sizes):
        for j, (key, label) in enumerate(keys):
            for cpu, marker in (("", "o"), ("_cpu", "x")):
                for version, color in (("before", "tab:gray"), ("after", "tab:blue")):
                    ys = [r[key + cpu] for r in data["rows"]
                          if r["nranks"] == p and r["version"] == version]
                    dx = (0.15 if version == "after" else -0.15) + (0.05 if cpu else -0.05)
                    ax.scatter([j + dx] * len(ys), ys, color=color, marker=marker, s=18,
                               label=f"{version}, {'CPU' if cpu else 'wall'}" if j == 0 else None)
        ax.axhline(1.0, color="k", lw=0.5)
        ax.set_xticks(range(len(keys)), [label for _, label in keys])
        ax.set_ylabel("time / topk_sync's step (same invocation)")
        ax.set_title(f"shared_support_sync, MPI P={p}: each invocation", fontsize=10)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def fragment_path(transport: str, nranks: int) -> str:
    """Where a run leaves its record for ``--merge``."""
    return f"/tmp/{STEM}_{transport}_p{nranks}.json"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", choices=("mpi", "axis"))
    ap.add_argument("--size", default="1M")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--refresh", type=int, default=2)
    ap.add_argument("--algorithm", default="allgather")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--random-fraction", type=float, default=0.0,
                    help="also time shared_support_sync(random_fraction=F)")
    ap.add_argument("--shared-support-from", metavar="FILE",
                    help="time the shared_support_sync of this file (another version of "
                         "jax_sparse_sync/transforms/shared_support_sync.py) in place of the "
                         "installed one")
    ap.add_argument("--fragment", help="where the run leaves its record (default: "
                                       "/tmp/shared_support_time_{transport}_p{P}.json)")
    ap.add_argument("--merge", action="store_true", help="fragments -> results JSON + PNG")
    ap.add_argument("--before-after", action="store_true",
                    help="--fragments of alternated invocations (--shared-support-from: "
                         "before) -> one before/after record + PNG at --out")
    ap.add_argument("--fragments", nargs="+",
                    default=[fragment_path("mpi", 4), fragment_path("axis", 8)],
                    help="with --merge: the runs' fragments, in the order of the records")
    ap.add_argument("--out", default=str(RESULTS / STEM))
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.before_after:
        frags = [json.loads(Path(f).read_text()) for f in args.fragments]
        data = {"benchmark": f"{STEM}_before_after", **before_after(frags),
                "machine": frags[-1]["machine"],
                "note": "invocations alternated before/after (before: the module given by "
                        "--shared-support-from, sha1 in each row); CPU, 2 cores shared with "
                        "other jobs, load in each row; ratios of medians within an "
                        "invocation"}
        write_record(data, out.with_suffix(".json"))
        plot_before_after(data, out.with_suffix(".png"))
        return
    if args.merge:
        frags = [json.loads(Path(f).read_text()) for f in args.fragments]
        data = {"benchmark": STEM, "records": [f["record"] for f in frags],
                "machines": [f["machine"] for f in frags], "machine": frags[0]["machine"],
                "load": [f["load"] for f in frags],
                "note": "CPU, MPICH over shared memory / 8 host devices on one 2-core host "
                        "shared with other jobs; medians of interleaved repeats"}
        write_record(data, out.with_suffix(".json"))
        plot(data, out.with_suffix(".png"))
        return
    rec = run_mpi(args) if args.transport == "mpi" else run_axis(args)
    is_root = args.transport == "axis" or int(os.environ.get("PMI_RANK", "0")) == 0
    if is_root:
        frag = {"record": rec, "machine": machine_info(mpi=args.transport == "mpi"),
                "load": {"loadavg_1min": os.getloadavg()[0], "cpu_count": os.cpu_count()}}
        Path(args.fragment or fragment_path(args.transport, rec["nranks"])).write_text(
            json.dumps(frag, indent=1) + "\n")


if __name__ == "__main__":
    main()
