"""Sparse allreduce benchmark over MPI (shared memory, one host).

Every rank picks k = density * N distinct random indices (its own set) with random
normal values; for each algorithm (dense, allgather, recursive_doubling) the jitted
``jss.sparse_allreduce`` is warmed up, checked against a NumPy reference and across
ranks (bitwise), then timed over ``--repeats`` calls after a barrier (a repeat's time
is the max over ranks; the median is reported). The bytes each rank sends (the C++
statistics) are compared with ``cost_model.wire_volume``. Over shared memory the bytes
saved cost much less than on a real interconnect (``emulated_network.py`` for links).

    mpiexec -n 4 python benchmarks/allreduce.py --size 4M --densities 0.01 0.001   # one P
    python benchmarks/allreduce.py --sweep --procs 2 3 4     # one mpiexec job per P

A worker's rank 0 writes a JSON fragment (default
``benchmarks/results/allreduce_shm_P<P>.json.tmp``); the sweep writes
``benchmarks/results/allreduce_shm.{json,png}`` (results: benchmarks/README.md);
``--plot-only`` redraws them from that JSON.
"""

from __future__ import annotations

import hashlib
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from _harness import (add_launch_options, add_quiet_options, add_record_options,  # noqa: E402
                      add_timing_options, driver_or_worker, fmt_bytes, fmt_size, launch, loadavg,
                      machine_info, parse_size, parser, plain_ticks, print_header, pyplot,
                      record_or_replot, save_figure, shade_oversubscribed, sweep_fields,
                      timing_args, write_fragment)

RESULTS = Path(__file__).resolve().parent / "results"
ALGORITHMS = ("dense", "allgather", "recursive_doubling")
# glibc malloc: buffers of up to 32 MiB recycled from the heap instead of mmap'ed and
# page-faulted anew on every call (docs/performance.md, "The host allocator")
TUNED_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
NOTE = ("MPICH over shared memory on one host (no real network; an emulated network "
        "comes later). P > cpu_count ranks are oversubscribed.")


# --------------------------------------------------------------------------- worker


def random_sparse(n: int, density: float, seed: int, rank: int):
    """This rank's input: k = density * N distinct random indices (sorted; each rank its
    own set) with standard normal values. Returns (k, indices, values)."""
    import numpy as np

    k = max(1, int(round(n * density)))
    rng = np.random.default_rng([seed, rank, int(round(density * 1e9))])
    idx = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int32)
    return k, idx, rng.standard_normal(k).astype(np.float32)


def gather_volumes(comm, algo: str, times: list, stats: dict, n: int, k: int, **mine):
    """One algorithm's timings and byte counters from every rank, beside the bytes
    ``cost_model.wire_volume`` bounds them by (``mine``: more of this rank's, gathered
    too). On rank 0 a dict of lists (one entry a rank; ``times_s``: each repeat's slowest
    rank), None elsewhere."""
    from jax_sparse_sync.planning import cost_model

    pred = cost_model.wire_volume(algo, nranks=comm.Get_size(), size=n, k=k, rank=comm.Get_rank())
    allr = comm.gather({"times": times, "stats": stats, **mine,
                        "pred": [pred.bytes_min, pred.bytes_max, pred.messages]}, root=0)
    if allr is None:
        return None
    return {"times_s": [max(ts) for ts in zip(*(r["times"] for r in allr))], "ranks": allr,
            **{key: [r["stats"][key] for r in allr]
               for key in ("bytes_sent", "bytes_received", "messages")},
            **{key: [r["pred"][j] for r in allr] for j, key in enumerate(
                ("predicted_bytes_min", "predicted_bytes_max", "predicted_messages"))}}


def worker(args) -> int:
    import jax
    import numpy as np

    import jax_sparse_sync as jss
    from jax_sparse_sync import host_allocator
    from jax_sparse_sync.planning import cost_model

    comm = jss.mpi.default_comm()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    n = parse_size(args.size)
    ncpu = os.cpu_count()
    info = machine_info() if rank == 0 else None
    if rank == 0:
        print(f"# allreduce benchmark P={nranks} N={fmt_size(n)} "
              f"({'oversubscribed: ' if nranks > ncpu else ''}{nranks} ranks on {ncpu} cores; "
              f"shared memory, one host)", flush=True)

    records = []
    for density in args.densities:
        k, idx, vals = random_sparse(n, density, args.seed, rank)
        # NumPy reference: every rank's input, summed in float64.
        everything = comm.allgather((idx, vals))
        ref = np.zeros(n, np.float64)
        for ri, rv in everything:
            np.add.at(ref, ri, rv.astype(np.float64))
        union = len(np.unique(np.concatenate([ri for ri, _ in everything])))
        del everything

        v_dev, i_dev = jax.device_put(vals), jax.device_put(idx)
        # compile, warm up and check every algorithm first, then time them interleaved
        fns, checked = {}, {}
        for algo in args.algorithms:
            f = jax.jit(lambda v, i, algo=algo: jss.sparse_allreduce(
                v, i, size=n, algorithm=algo, return_stats=True))
            out = stats = None
            for _ in range(args.warmup):
                comm.Barrier()
                out, stats = jax.block_until_ready(f(v_dev, i_dev))
            out_np = np.asarray(out)
            ok = bool(np.allclose(out_np, ref, rtol=1e-5, atol=1e-6))
            max_err = float(np.max(np.abs(out_np - ref)))
            digest = hashlib.sha1(out_np.tobytes()).hexdigest()
            digests = comm.allgather(digest)
            oks = comm.allgather(ok)
            assert all(oks), (f"P={nranks} {algo} density={density}: result differs from the "
                              f"NumPy reference on rank(s) {[r for r, o in enumerate(oks) if not o]}")
            fns[algo] = f
            checked[algo] = (len(set(digests)) == 1, stats.as_dict(), max_err)
            del out, stats, out_np

        all_times = {algo: [] for algo in args.algorithms}
        all_faults = {algo: [] for algo in args.algorithms}  # minor page faults per call
        for _ in range(args.repeats):
            for algo, f in fns.items():
                comm.Barrier()
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                jax.block_until_ready(f(v_dev, i_dev))
                all_times[algo].append(time.perf_counter() - t0)
                all_faults[algo].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)

        for algo in args.algorithms:
            identical, st, max_err = checked[algo]
            g = gather_volumes(comm, algo, all_times[algo], st, n, k, max_err=max_err,
                               faults=statistics.median(all_faults[algo]))
            if rank == 0:
                allr, per_rep, sent = g["ranks"], g["times_s"], g["bytes_sent"]
                pmin, pmax = g["predicted_bytes_min"], g["predicted_bytes_max"]
                within = [lo <= s <= hi for s, lo, hi in zip(sent, pmin, pmax)]
                rec = {
                    "P": nranks, "N": n, "k": k, "density": density, "algorithm": algo,
                    "oversubscribed": nranks > ncpu,
                    "median_s": statistics.median(per_rep),
                    "min_s": min(per_rep),
                    "times_s": per_rep,  # per repeat: max over ranks
                    "rank_median_s": [statistics.median(r["times"]) for r in allr],
                    # minor page faults per call (median over repeats), per rank: fresh
                    # buffers (XLA's N-float output, MPI's scratch) being touched
                    "minor_faults_per_call": [r["faults"] for r in allr],
                    "bytes_sent_rank0": sent[0],
                    "bytes_sent_max": max(sent),
                    **{key: g[key] for key in ("bytes_sent", "bytes_received", "messages",
                                               "predicted_bytes_min", "predicted_bytes_max",
                                               "predicted_messages")},
                    "predicted_bytes_min_rank0": pmin[0],
                    "predicted_bytes_max_rank0": pmax[0],
                    "predicted_bytes_max_over_ranks": max(pmax),
                    "predicted_bytes_min_over_ranks": max(pmin),
                    "measured_within_predicted": all(within),
                    "messages_match_predicted": g["messages"] == g["predicted_messages"],
                    "predicted_time_s_default_alpha_beta": cost_model.predict_time(
                        algo, nranks=nranks, size=n, k=k),
                    "result_nnz": st["result_nnz"],
                    "union_nnz_reference": union,
                    "switched_to_dense": st["switched_to_dense"],
                    "correct": True,
                    "max_abs_err": max(r["max_err"] for r in allr),
                    "identical_across_ranks": identical,
                    "loadavg_1min": loadavg(),
                }
                records.append(rec)
                print(f"  density={density:.1%} k={k:>7} {algo:>18}: median {rec['median_s'] * 1e3:8.2f} ms"
                      f"  (min {rec['min_s'] * 1e3:7.2f})  sent rank0 {fmt_bytes(sent[0]):>9}"
                      f" max {fmt_bytes(max(sent)):>9}  predicted rank0 "
                      f"[{fmt_bytes(pmin[0])}, {fmt_bytes(pmax[0])}]"
                      f"{'' if all(within) else '  !! outside prediction'}"
                      f"{'' if identical else '  !! ranks differ bitwise'}", flush=True)
        del fns

    if rank == 0:
        frag = {
            "P": nranks, "N": n, "oversubscribed": nranks > ncpu, "cpu_count": ncpu,
            "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
            "machine": info, "note": NOTE, "records": records,
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            # what `import jax_sparse_sync` set in the ranks (docs/performance.md)
            "host_allocator": host_allocator.default_tuning(),
        }
        write_fragment(frag, args.fragment or RESULTS / f"allreduce_shm_P{nranks}.json.tmp")
    comm.Barrier()
    return 0


# --------------------------------------------------------------------------- driver


def run_one(p: int, args) -> dict:
    # next to the output (benchmarks/results/ by default; git ignores *.tmp there)
    return launch(Path(__file__).resolve(), p, [
        "--size", args.size, "--densities", *args.densities, "--algorithms", *args.algorithms,
        *timing_args(args)], Path(args.out).parent / f"allreduce_shm_P{p}.json.tmp", args.timeout,
        mpiexec_args=args.mpiexec_args, keep=args.keep_fragments, quiet_wait=args.quiet_wait,
        quiet_busy=args.quiet_busy,
        env={**os.environ, **(TUNED_MALLOC_ENV if args.tuned_malloc else {})})


def summarize(records) -> list[dict]:
    rows = []
    dense = {(r["P"], r["density"]): r["median_s"] for r in records if r["algorithm"] == "dense"}
    dense_min = {(r["P"], r["density"]): r["min_s"] for r in records if r["algorithm"] == "dense"}
    for r in records:
        d = dense.get((r["P"], r["density"]))
        dm = dense_min.get((r["P"], r["density"]))
        rows.append({
            "P": r["P"], "density": r["density"], "k": r["k"], "algorithm": r["algorithm"],
            "median_ms": r["median_s"] * 1e3,
            "min_ms": r["min_s"] * 1e3,
            "speedup_vs_dense": d / r["median_s"] if d else None,
            "speedup_vs_dense_min": dm / r["min_s"] if dm else None,
            "bytes_sent_rank0": r["bytes_sent_rank0"],
            "bytes_sent_max": r["bytes_sent_max"],
            "predicted_rank0": [r["predicted_bytes_min_rank0"], r["predicted_bytes_max_rank0"]],
            "measured_within_predicted": r["measured_within_predicted"],
            "oversubscribed": r["oversubscribed"],
        })
    return rows


def print_table(data: dict) -> None:
    rows = summarize(data["records"])
    print()
    print(f"# {data['note']}")
    print_header(f"{'P':>2} {'dens':>5} {'algorithm':>18} | {'median ms':>9} {'vs dense':>8} | "
                 f"{'min ms':>7} {'vs dense':>8} | "
                 f"{'sent r0':>9} {'sent max':>9} | {'predicted r0 [min, max]':>24} {'ok':>3}")
    order = {a: i for i, a in enumerate(data.get("algorithms") or ALGORITHMS)}
    for r in sorted(rows, key=lambda r: (r["density"], r["P"], order.get(r["algorithm"], 99),
                                         r["algorithm"])):
        sp = f"{r['speedup_vs_dense']:.2f}x" if r["speedup_vs_dense"] else "-"
        spm = f"{r['speedup_vs_dense_min']:.2f}x" if r["speedup_vs_dense_min"] else "-"
        pr = f"[{fmt_bytes(r['predicted_rank0'][0])}, {fmt_bytes(r['predicted_rank0'][1])}]"
        print(f"{r['P']:>2}{'*' if r['oversubscribed'] else ' '}{r['density']:>5.1%} "
              f"{r['algorithm']:>18} | {r['median_ms']:>9.2f} {sp:>8} | "
              f"{r['min_ms']:>7.2f} {spm:>8} | "
              f"{fmt_bytes(r['bytes_sent_rank0']):>9} {fmt_bytes(r['bytes_sent_max']):>9} | "
              f"{pr:>24} {'yes' if r['measured_within_predicted'] else 'NO':>3}")
    print("(* = oversubscribed: more ranks than cores; 'vs dense' = dense time / this time, on "
          "medians and on the fastest repeat ('min');\n "
          "'ok' = measured bytes within cost_model.wire_volume bounds on every rank)")
    for p in sorted({r["P"] for r in rows}):
        for d in sorted({r["density"] for r in rows}):
            sp = {r["algorithm"]: (r["speedup_vs_dense"], r["speedup_vs_dense_min"]) for r in rows
                  if r["P"] == p and r["density"] == d}
            print(f"speedup over dense, P={p} density {d:.1%}: "
                  + ", ".join(f"{a} {s:.2f}x (min: {m:.2f}x)" for a, (s, m) in sp.items()
                              if a != "dense" and s))


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator

    bytes_fmt = FuncFormatter(lambda v, _: fmt_bytes(v).replace(".00", ""))
    recs = data["records"]
    densities = sorted({r["density"] for r in recs}, reverse=True)
    ps = sorted({r["P"] for r in recs})
    algos = list(dict.fromkeys(r["algorithm"] for r in recs))
    palette = ["tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"]
    color = {"dense": "tab:gray", "allgather": "tab:blue", "recursive_doubling": "tab:red"}
    marker = {"dense": "s", "allgather": "o", "recursive_doubling": "^"}
    for j, a in enumerate(x for x in algos if x not in color):
        color[a] = palette[j % len(palette)]
        marker[a] = "DvP*h"[j % 5]
    dxs = {a: 0.07 * (j - (len(algos) - 1) / 2) for j, a in enumerate(algos)}
    fig, axes = plt.subplots(2, len(densities), figsize=(6 * len(densities), 9), squeeze=False)
    for col, d in enumerate(densities):
        ax = axes[0][col]
        for a in algos:
            pts = sorted((r["P"], r["median_s"], min(r["times_s"]), max(r["times_s"]))
                         for r in recs if r["density"] == d and r["algorithm"] == a)
            if not pts:
                continue
            x = [p[0] for p in pts]
            med = [p[1] * 1e3 for p in pts]
            err = [[(p[1] - p[2]) * 1e3 for p in pts], [(p[3] - p[1]) * 1e3 for p in pts]]
            ax.errorbar(x, med, yerr=err, capsize=3, color=color[a], marker=marker[a], label=a)
        k = next(r["k"] for r in recs if r["density"] == d)
        ax.set(title=f"time per call, N={fmt_size(recs[0]['N'])}, density {d:.1%} (k={k})",
               xlabel="P (ranks)", ylabel="ms (median of max-over-ranks; bars: min..max)",
               yscale="log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        plain_ticks(ax.yaxis)
        ax.set_xticks(ps)
        ax.grid(True, which="both", alpha=0.3)
        shade_oversubscribed(ax, ps, data["machine"]["cpu_count"])
        ax.legend(fontsize=9)

        ax = axes[1][col]
        for a in algos:
            # P = 1 sends nothing: no point on a log axis.
            pts = sorted((r["P"], r["bytes_sent_max"], r["predicted_bytes_min_over_ranks"],
                          r["predicted_bytes_max_over_ranks"], r["bytes_sent_rank0"])
                         for r in recs if r["density"] == d and r["algorithm"] == a and r["P"] > 1)
            if not pts:
                continue
            x = [p[0] for p in pts]
            dx = dxs[a]
            xm = [v + dx for v in x]  # measured markers nudged apart so equal values stay visible
            ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], color=color[a], alpha=0.15)
            ax.plot(x, [p[3] for p in pts], color=color[a], ls="--", lw=1)
            ax.plot(x, [p[2] for p in pts], color=color[a], ls=":", lw=1)
            ax.plot(xm, [p[1] for p in pts], color=color[a], marker=marker[a], ls="none", ms=8,
                    mfc="none", mew=2, label=f"{a}: measured (max over ranks)")
            ax.plot(xm, [p[4] for p in pts], color=color[a], marker="x", ls="none", ms=7)
        ax.plot([], [], color="k", ls="--", lw=1, label="predicted max (band: [min, max])")
        ax.plot([], [], color="k", marker="x", ls="none", label="measured, rank 0")
        ax.set(title=f"bytes sent per rank per call, density {d:.1%}", xlabel="P (ranks)",
               ylabel="bytes (C++ stats vs cost_model.wire_volume)", yscale="log")
        ax.yaxis.set_major_formatter(bytes_fmt)
        ax.set_xticks(ps)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    info = data["machine"]
    malloc = data.get("malloc_env", "glibc default")
    malloc = (malloc if isinstance(malloc, str) else "tuned malloc (" + ", ".join(
        f"{k}={v}" for k, v in malloc.items()) + ")")
    save_figure(fig, path, "jss.sparse_allreduce, MPICH shared memory on one host "
                f"({info['cpu_count']}-core {info['cpu_model']}), jax {info['jax_version']}, "
                f"{info['date'][:10]}; {malloc}")


def sweep(args) -> int:
    def run():
        frags = [run_one(p, args) for p in args.procs]
        ok = [f for f in frags if f.get("records")]
        if not ok:
            return None
        records = [r for f in ok for r in f["records"]]
        return {
            "benchmark": "sparse_allreduce",
            "transport": "MPICH shared memory, single host",
            "note": NOTE,
            "N": parse_size(args.size),
            "densities": args.densities,
            "algorithms": args.algorithms,
            "procs": args.procs,
            "repeats": args.repeats,
            "warmup": args.warmup,
            # the library tunes glibc at import unless JSS_TUNE_HOST_ALLOCATOR=0 (its
            # settings per rank: the fragments' host_allocator, {} where it opted out)
            "malloc_env": TUNED_MALLOC_ENV if args.tuned_malloc else (
                "glibc default" if os.environ.get("JSS_TUNE_HOST_ALLOCATOR") == "0"
                else "as import jax_sparse_sync tunes it"),
            "host_allocator": ok[0].get("host_allocator"),
            "timing": "per repeat: barrier, then time one jitted call on every rank; the repeat's "
                      "time is the max over ranks; median over repeats; algorithms interleaved "
                      "within each repeat",
            "oversubscribed": {str(f["P"]): f["P"] > os.cpu_count() for f in frags},
            **sweep_fields(frags),
            "records": records,
            "summary": summarize(records),
        }
    return record_or_replot(args, run, print_table, plot)


def main(argv=None) -> int:
    p = parser(__doc__, procs=[2, 3, 4])
    p.add_argument("--size", default="4M", help="dense size N (K/M suffix); default 4M")
    p.add_argument("--densities", nargs="+", type=float, default=[0.01, 0.001])
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                   help="default: dense allgather recursive_doubling; any name "
                        "jss.sparse_allreduce accepts works (e.g. split_allgather)")
    add_timing_options(p, repeats=15, minimum=1)
    add_launch_options(p, timeout=240, keep=True)
    p.add_argument("--tuned-malloc", action="store_true",
                   help="sweep: run the ranks with " + " ".join(f"{k}={v}" for k, v in
                                                               TUNED_MALLOC_ENV.items()))
    add_quiet_options(p)
    add_record_options(p, RESULTS / "allreduce_shm.json")
    return driver_or_worker(p.parse_args(argv), sweep, worker)


if __name__ == "__main__":
    sys.exit(main())
