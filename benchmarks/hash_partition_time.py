"""Allreduce time of ``hash_partition`` beside Ok-Topk and the top-k allgather, on
skewed and uniform supports (MPI over shared memory, one host).

The timing half of issue 35's hash-partition goal (the balance half:
``hash_partition_balance.py``, whose ``support()`` draws the same supports). With random
normal values, interleaved repeat by repeat: ``hash_partition``
(``jss.sparse_allreduce(algorithm="hash_partition")``); ``oktopk_exact`` (regions and
threshold recomputed), ``oktopk_reuse`` (reused, each owner's count in ``region_band``),
``oktopk_stale`` (regions from a uniform step), ``oktopk_hash_exact`` /
``oktopk_hash_reuse`` (``partition="hash"``); ``allgather``. ``shares``: the largest
owner's share of the exact step's selection over the mean. A repeat is one call of each
after a barrier, its time the max over ranks; the median is reported, with the bytes
rank 0 sent.

    mpiexec -n 4 python -m mpi4py benchmarks/hash_partition_time.py --worker --out /tmp/p4.json
    python benchmarks/hash_partition_time.py              # P = 4 and 8, JSON + PNG in results/
    python benchmarks/hash_partition_time.py --bind-to core:2   # each rank its own cores

Writes ``benchmarks/results/hash_partition_time_<N>.{json,png}`` (results:
docs/topics/wire_formats.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (add_bind_option, add_timing_options, bind_args, driver_machine,  # noqa: E402
                      find_mpiexec, fmt_size, grouped_bars, load_record, machine_info,
                      parse_size, pyplot, run_fragment, save_figure, time_rounds, timing_args,
                      write_record)
from hash_partition_balance import WORKLOADS, oktopk_boundaries, support  # noqa: E402
from jax_sparse_sync.mesh.hash_partition import hash_owner_np  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("hash_partition", "oktopk_exact", "oktopk_reuse", "oktopk_stale", "oktopk_hash_exact",
           "oktopk_hash_reuse", "allgather")


def worker(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_sparse_sync as jss

    comm = jss.mpi.default_comm()
    rank, p = comm.Get_rank(), comm.Get_size()
    n = parse_size(args.size)
    k = max(1, int(args.density * n))
    band = (-(-k // (2 * p)), (2 * k) // p)  # oktopk_sync's region_band (0.5, 2.0)
    records = []
    for workload in args.workloads:
        supports = [support(workload, n, k, r, args.seed) for r in range(p)]
        uniform = [support("uniform", n, k, r, args.seed + 1) for r in range(p)]
        stale = jnp.asarray(oktopk_boundaries(uniform, n, p), jnp.int32)
        idx = jnp.asarray(supports[rank], jnp.int32)
        val = jnp.asarray(np.random.default_rng([args.seed, rank, 7]).standard_normal(k)
                          .astype(np.float32))

        hash_fn = jax.jit(lambda v, i: jss.sparse_allreduce(
            v, i, size=n, algorithm="hash_partition", return_stats="vector"))
        gather_fn = jax.jit(lambda v, i: jss.sparse_allreduce(
            v, i, size=n, algorithm="allgather", return_stats="vector"))
        exact_fn = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=n, k=k))
        reuse_fn = jax.jit(lambda v, i, b, t: jss.oktopk_allreduce(
            v, i, size=n, k=k, boundaries=b, global_threshold=t, recompute_boundaries=False,
            recompute_threshold=False, region_counts=band))
        hash_exact_fn = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=n, k=k,
                                                                  partition="hash"))
        hash_reuse_fn = jax.jit(lambda v, i, t: jss.oktopk_allreduce(
            v, i, size=n, k=k, global_threshold=t, recompute_threshold=False,
            region_counts=band, partition="hash"))
        first = exact_fn(val, idx)
        bounds, thr = first.boundaries, first.threshold
        hash_first = hash_exact_fn(val, idx)
        hash_thr = hash_first.threshold
        # each owner's share of the exact step's selection (the same entries either way)
        kept = np.flatnonzero(np.asarray(first.sum))
        owners = {"regions": np.searchsorted(np.asarray(bounds), kept, side="right") - 1,
                  "stale_regions": np.searchsorted(np.asarray(stale), kept, side="right") - 1,
                  "hash": hash_owner_np(kept, p)}
        shares = {name: float(np.bincount(o, minlength=p).max() * p / max(kept.size, 1))
                  for name, o in owners.items()}

        def stats_of(r):
            return r[1] if isinstance(r, tuple) and not hasattr(r, "sum") else jnp.stack(r.stats)

        calls = {
            "hash_partition": lambda: hash_fn(val, idx),
            "oktopk_exact": lambda: exact_fn(val, idx),
            "oktopk_reuse": lambda: reuse_fn(val, idx, bounds, thr),
            "oktopk_stale": lambda: reuse_fn(val, idx, stale, thr),
            "oktopk_hash_exact": lambda: hash_exact_fn(val, idx),
            "oktopk_hash_reuse": lambda: hash_reuse_fn(val, idx, hash_thr),
            "allgather": lambda: gather_fn(val, idx),
        }
        sent = {}
        for name, call in calls.items():  # compile and warm up
            for _ in range(args.warmup):
                out = call()
            jax.block_until_ready(out)
            sent[name] = int(np.asarray(stats_of(out))[0])
        times = time_rounds(calls, args.repeats, comm, slowest=True)  # every method, same load
        rec = {"workload": workload, "nranks": p, "size": n, "k": k,
               "union": int(len(np.unique(np.concatenate(supports)))),
               "selected": int(kept.size), "shares": shares,
               "methods": {name: {"median_s": statistics.median(t), "times_s": t,
                                  "rank0_bytes_sent": sent[name]} for name, t in times.items()}}
        records.append(rec)
        if rank == 0:
            h = rec["methods"]["hash_partition"]["median_s"]
            print(f"# P={p} {workload:15s} " + "  ".join(
                f"{m} {1e3 * rec['methods'][m]['median_s']:.2f} ms ({rec['methods'][m]['median_s'] / h:.2f}x)"
                for m in METHODS), flush=True)
    if rank == 0:
        out = {"records": records, "machine": machine_info(),
               "load": {"loadavg_1min": os.getloadavg()[0], "cpu_count": os.cpu_count()}}
        write_record(out, args.out)


def plot(data: dict, path: Path) -> None:
    rows = data["records"]
    fig, ax = pyplot().subplots(figsize=(10, 4.2))
    grouped_bars(ax, [f"{r['workload']}\nP={r['nranks']}" for r in rows],
                 {m: [1e3 * r["methods"][m]["median_s"] for r in rows] for m in METHODS})
    ax.set_ylabel("median time per call (ms, max over ranks)")
    cfg = data["config"]
    ax.set_title(f"hash_partition vs Ok-Topk vs allgather, N = {fmt_size(cfg['size'])}, "
                 f"{100 * cfg['density']:g} % per rank (MPI, shared memory, "
                 f"{data['runs'][0]['load']['cpu_count']} cores"
                 f"{', bound ' + cfg['bind_to'] if cfg.get('bind_to') else ''})", fontsize=10)
    ax.set_ylim(top=1.3 * ax.get_ylim()[1])  # room for the legend above the bars
    ax.legend(fontsize=8, ncol=4, loc="upper center")
    save_figure(fig, path)


def note(args, runs) -> str:
    cores = runs[0]["load"]["cpu_count"]
    most = max(args.nranks)
    how = (f"each rank bound to its own cores (mpiexec -bind-to {args.bind_to})" if args.bind_to
           else "ranks not bound" + (f"; P = {most} oversubscribed {most / cores:g}x"
                                     if most > cores else ""))
    return (f"MPICH over shared memory on one {cores}-core host, {how}; "
            "medians of interleaved repeats")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="one P, under mpiexec")
    ap.add_argument("--size", default="4M")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--nranks", type=int, nargs="+", default=[4, 8])
    add_timing_options(ap, repeats=15)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--out", default=None)
    add_bind_option(ap)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    out = Path(args.out or RESULTS / f"hash_partition_time_{fmt_size(parse_size(args.size))}")
    json_path = out.with_suffix(".json")
    if args.plot_only:
        plot(load_record(json_path), out.with_suffix(".png"))
        return
    records, runs = [], []
    for p in args.nranks:
        frag = Path(f"/tmp/hash_partition_time_P{p}_{os.getpid()}.json")
        data = run_fragment([find_mpiexec(), *bind_args(args), "-n", p, sys.executable, "-m",
                             "mpi4py", __file__, "--worker", "--size", args.size, "--density",
                             args.density, *timing_args(args), "--out", frag, "--workloads",
                             *args.workloads], frag, args.timeout)
        if data.get("error"):
            raise SystemExit(f"P={p}: {data['error']}")
        records += data["records"]
        runs.append({"nranks": p, "machine": data["machine"], "load": data["load"],
                     "wall_s": data.get("wall_s")})
    result = {"benchmark": "hash_partition_time",
              "config": {"size": parse_size(args.size), "density": args.density,
                         "seed": args.seed, "repeats": args.repeats, "nranks": args.nranks,
                         "workloads": args.workloads, "methods": list(METHODS),
                         "bind_to": args.bind_to, "note": note(args, runs)},
              "machine": driver_machine(runs[0]["machine"]), "runs": runs, "records": records}
    write_record(result, json_path)
    plot(result, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
