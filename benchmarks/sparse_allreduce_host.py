"""The host path against the plain mpi4py + NumPy equivalent, with the allocator tuned, by default and opted out.

One mpiexec job per P and allocator setting (separate processes: glibc's settings are per
process): ``tuned`` (``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647
MALLOC_ARENA_MAX=1`` in the ranks' environment, from process start), ``default`` (nothing
set: what ``import jax_sparse_sync`` applies itself) and ``untuned``
(``JSS_TUNE_HOST_ALLOCATOR=0``: glibc as it is). The ranks import as a user script does
(JAX, ``mpi4py.MPI``, then ``jax_sparse_sync``). In each job every rank draws k distinct
sorted random indices of N with normal values, for each k of ``--ks``, and times in turns
``ours`` (the jitted ``jss.sparse_allreduce(v, i, size=N, algorithm="allgather")``) and
``plain`` (``comm.Allgather`` of the 8-byte (index, value) pairs, then each rank's run
added in rank order into ``np.zeros(N, float32)``); the two results are checked equal bit
for bit, and across ranks. Then ``dense_sync`` (its jitted update, donated, at
``--dense-size``) against ``comm.Allreduce(MPI.IN_PLACE, buf)`` on a NumPy buffer, the
sum checked against float64. A repeat's time is the slowest rank's, a job's the median
over repeats; the methods take turns (their order rotating) and rank 0 holds the
measurement lock (``flock``) while timing; the summary is the median over ``--rounds``
jobs of each configuration, interleaved. Minor page faults per call are recorded.

    python benchmarks/sparse_allreduce_host.py --sweep                       # P 1 2, all three
    mpiexec -n 2 python -m mpi4py benchmarks/sparse_allreduce_host.py --allocator default

writes ``benchmarks/results/sparse_allreduce_host_shm.{json,png}`` (results:
docs/performance.md); ``--plot-only`` redraws both from the JSON.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from _harness import (add_launch_options, add_quiet_options, add_record_options,  # noqa: E402
                      add_timing_options, driver_machine, driver_or_worker, grouped_bars, launch,
                      loadavg, machine_info, parse_size, parser, pyplot, record_or_replot,
                      save_figure, timing_args, write_fragment)

RESULTS = Path(__file__).resolve().parent / "results"
MEASURE_LOCK = "/tmp/jss_measure.lock"
#: The ranks' environment per allocator setting (every other MALLOC_* and the opt-out
#: variable are removed first).
ALLOCATORS = {
    "tuned": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647",
              "MALLOC_ARENA_MAX": "1"},
    "default": {},
    "untuned": {"JSS_TUNE_HOST_ALLOCATOR": "0"},
}
NOTE = ("MPICH over shared memory on one host; a repeat's time is the slowest rank's, a job's "
        "the median over repeats, the summary the median over rounds.")


# --------------------------------------------------------------------------- worker


def sparse_cases(comm, n: int, ks, seed: int):
    """Per k: (case name, {method: prepare}), ``prepare()`` returning the call to time; ours
    and plain checked equal bit for bit (and across ranks) before any timing."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss

    rank, nranks = comm.Get_rank(), comm.Get_size()
    pair = np.dtype([("i", np.int32), ("v", np.float32)])
    ours_fn = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=n, algorithm="allgather"))
    cases = []
    for k in ks:
        rng = np.random.default_rng([seed, rank, k])
        idx = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int32)
        val = rng.standard_normal(k).astype(np.float32)
        pairs = np.empty(k, pair)
        pairs["i"], pairs["v"] = idx, val
        v_dev, i_dev = jnp.asarray(val), jnp.asarray(idx)

        def plain(pairs=pairs, k=k):
            gathered = np.empty(nranks * k, pair)
            comm.Allgather([pairs.view(np.uint8), MPI.BYTE], [gathered.view(np.uint8), MPI.BYTE])
            out = np.zeros(n, np.float32)
            for r in range(nranks):  # rank order: the same sums as ours, bit for bit
                run = gathered[r * k:(r + 1) * k]
                out[run["i"]] += run["v"]
            return out

        def ours(v_dev=v_dev, i_dev=i_dev):
            return ours_fn(v_dev, i_dev)

        mine, theirs = np.asarray(jax.block_until_ready(ours())), plain()
        same = bool(np.array_equal(mine.view(np.uint32), theirs.view(np.uint32)))
        digests = comm.allgather(hashlib.sha1(mine.tobytes()).hexdigest())
        assert all(comm.allgather(same)), f"k={k}: ours differs from plain on some rank"
        assert len(set(digests)) == 1, f"k={k}: ranks differ"
        cases.append((f"sparse k={k}", {"ours": lambda f=ours: f, "plain": lambda f=plain: f}))
    return cases


def dense_case(comm, n: int, seed: int):
    """("dense_sync", {method: prepare}): ``prepare()`` makes the call's fresh inputs (untimed)
    and returns the call; dense_sync's mean checked against float64."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss

    rank, nranks = comm.Get_rank(), comm.Get_size()
    x = np.random.default_rng([seed, rank]).standard_normal(n).astype(np.float32)
    ref = np.zeros(n, np.float64)
    comm.Allreduce(x.astype(np.float64), ref)
    tx = jss.dense_sync()
    state0 = tx.init({"w": jnp.zeros(n)})
    step = jax.jit(tx.update, donate_argnums=(0, 1))
    buf = np.empty_like(x)

    def ours():  # a fresh gradient and state each call: donation consumes them
        g = jax.block_until_ready(jnp.array(x))
        st = jax.block_until_ready(jax.tree_util.tree_map(jnp.copy, state0))
        return lambda: step({"w": g}, st)[0]["w"]

    def plain():
        np.copyto(buf, x)
        return lambda: (comm.Allreduce(MPI.IN_PLACE, buf), buf)[1]

    out = np.asarray(jax.block_until_ready(ours()()), np.float64)
    err = float(np.max(np.abs(out - ref / nranks)))
    assert all(comm.allgather(err <= 1e-5 * float(np.abs(ref).max()) + 1e-5)), err
    return "dense_sync", {"ours": ours, "plain": plain}


def time_cases(comm, cases, repeats: int, warmup: int) -> dict:
    """{case: {method: (times_s, faults)}}: this rank's seconds and minor page faults per
    call, the methods taking turns within each repeat (their order rotating)."""
    import jax

    out = {}
    for case, methods in cases:
        names = list(methods)
        times = {m: [] for m in names}
        faults = {m: [] for m in names}
        for rep in range(warmup + repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for m in order:
                call = methods[m]()
                comm.Barrier()
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                jax.block_until_ready(call())
                dt = time.perf_counter() - t0
                if rep >= warmup:
                    times[m].append(dt)
                    faults[m].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        out[case] = {m: (times[m], faults[m]) for m in names}
    return out


def worker(args) -> int:
    import jax  # noqa: F401 - imported as a user script does: JAX, MPI, then the library
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from jax_sparse_sync.host_allocator import default_tuning, malloc_arena_count

    comm = jss.mpi.default_comm()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    n, nd = parse_size(args.size), parse_size(args.dense_size)
    info = machine_info() if rank == 0 else None
    cases = sparse_cases(comm, n, args.ks, args.seed)
    if nd > 0:
        cases.append(dense_case(comm, nd, args.seed))
    lock = open(args.lock, "a") if args.lock and rank == 0 else None
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # no other measurement runs beside this one
    comm.Barrier()
    mine = time_cases(comm, cases, args.repeats, args.warmup)
    comm.Barrier()
    if lock:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    everyone = comm.gather(mine, root=0)
    arenas = comm.gather(malloc_arena_count(), root=0)
    if rank == 0:
        records = []
        for case in mine:
            for m in mine[case]:
                per_rep = [max(r[case][m][0][j] for r in everyone) for j in range(args.repeats)]
                records.append({
                    "P": nranks, "allocator": args.allocator, "case": case, "method": m,
                    "N": nd if case == "dense_sync" else n, "median_s": statistics.median(per_rep),
                    "min_s": min(per_rep), "times_s": per_rep,
                    "minor_faults_per_call": [statistics.median(r[case][m][1]) for r in everyone],
                    "loadavg_1min": loadavg()})
                print(f"  P={nranks} {args.allocator:>8} {case:>16} {m:>5}: median "
                      f"{records[-1]['median_s'] * 1e3:8.2f} ms  faults/call "
                      f"{records[-1]['minor_faults_per_call']}", flush=True)
        env = {k: v for k, v in os.environ.items()
               if k.startswith(("MALLOC_", "JSS_TUNE", "MPIR_CVAR"))}
        frag = {"P": nranks, "allocator": args.allocator, "env": env,
                       "default_tuning": default_tuning(), "malloc_arenas": arenas,
                       "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
                       "machine": info, "records": records}
        write_fragment(frag, args.fragment or RESULTS / f"sparse_allreduce_host_P{nranks}"
                       f"_{args.allocator}.json.tmp")
    comm.Barrier()
    return 0


# --------------------------------------------------------------------------- driver


def job_env(allocator: str) -> dict:
    """The ranks' environment for one allocator setting: this one's variables only."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "JSS_TUNE_HOST_ALLOCATOR"}
    return {**env, **ALLOCATORS[allocator], "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def sweep(args) -> dict:
    """``--rounds`` rounds of one job per (P, allocator), interleaved; the merged record."""
    records, runs = [], []
    for rnd in range(args.rounds):
        for p in args.procs:
            for allocator in args.allocators:
                data = launch(Path(__file__).resolve(), p,
                              ["--allocator", allocator, "--size", args.size, "--ks", *args.ks,
                               "--dense-size", args.dense_size, "--lock", args.lock,
                               *timing_args(args)],
                              Path(args.out).parent / f"sparse_allreduce_host_P{p}_{allocator}"
                                                      f".json.tmp",
                              args.timeout, env=job_env(allocator), quiet_wait=args.quiet_wait,
                              mpi4py=True)
                runs.append({k: v for k, v in data.items() if k not in ("records", "machine")})
                if "error" in data:
                    print(f"!! P={p} {allocator}: {data['error']}", flush=True)
                    continue
                machine = data["machine"]
                records += [dict(r, round=rnd) for r in data["records"]]
    ok = [r for r in runs if "error" not in r]
    return {"benchmark": "sparse_allreduce_host", "N": parse_size(args.size),
            "dense_N": parse_size(args.dense_size), "ks": args.ks, "note": NOTE,
            "rounds": args.rounds, "repeats": args.repeats, "allocators": ALLOCATORS,
            "machine": driver_machine(machine) if ok else machine_info(),
            "failures": [{"P": r["P"], "error": r["error"]} for r in runs if "error" in r],
            "runs": runs, "records": records, "summary": summarize(records)}


def summarize(records) -> list[dict]:
    """Per (P, allocator, case, method): the median over rounds of the jobs' medians, its
    ratio to plain's (same P, allocator and case) and to the tuned job's (same method), and
    the paired ratios: the median over rounds of the ratio within a round (``vs_plain_paired``:
    within one job; ``vs_tuned_paired``: this job against the tuned job of the same round,
    which ran just before it)."""
    def key_of(r):
        return r["P"], r["allocator"], r["case"], r["method"]

    by_key = {}
    for r in records:
        by_key.setdefault(key_of(r), {})[r.get("round", 0)] = r
    keys = sorted(by_key, key=lambda k: (k[0], k[2], list(ALLOCATORS).index(k[1]), k[3]))
    med = {key: statistics.median(r["median_s"] for r in by_key[key].values()) for key in keys}

    def paired(key, other):
        mine, theirs = by_key[key], by_key.get(other, {})
        ratios = [mine[i]["median_s"] / theirs[i]["median_s"] for i in mine if i in theirs]
        return statistics.median(ratios) if ratios else None

    rows = []
    for key in keys:
        p, allocator, case, method = key
        plain, tuned = (p, allocator, case, "plain"), (p, "tuned", case, method)
        rows.append({"P": p, "allocator": allocator, "case": case, "method": method,
                     "median_ms": med[key] * 1e3, "rounds": len(by_key[key]),
                     "minor_faults_per_call": list(by_key[key].values())[-1][
                         "minor_faults_per_call"],
                     "vs_plain": med[key] / med[plain] if plain in med else None,
                     "vs_tuned": med[key] / med[tuned] if tuned in med else None,
                     "vs_plain_paired": paired(key, plain), "vs_tuned_paired": paired(key, tuned)})
    return rows


def print_table(data: dict) -> None:
    print(f"\n# N = {data['N']:,} (sparse), {data['dense_N']:,} (dense_sync); {data['note']}")
    print("x plain / x tuned: ratio of the medians (paired: median of the ratios per round)")
    print(f"{'P':>2} {'case':>16} {'allocator':>9} {'method':>6} | {'median ms':>9} | "
          f"{'x plain':>14} | {'x tuned':>14} | faults/call (per rank)")

    def two(r, what):
        a, b = r[what], r[what + "_paired"]
        return f"{a:.2f} ({b:.2f})" if a and b else "-"

    for r in data["summary"]:
        print(f"{r['P']:>2} {r['case']:>16} {r['allocator']:>9} {r['method']:>6} | "
              f"{r['median_ms']:>9.2f} | {two(r, 'vs_plain'):>14} | {two(r, 'vs_tuned'):>14} | "
              f"{r['minor_faults_per_call']}")


def plot(data: dict, path: Path) -> None:
    """Left: ms per call of ours and plain per allocator setting and case. Right: the ratios
    that the goals are stated in (paired medians): ours / plain per setting, and ours by
    default / ours tuned."""
    plt = pyplot()
    rows = data["summary"]
    groups = sorted({(r["P"], r["case"]) for r in rows},
                    key=lambda g: (g[0], g[1] == "dense_sync", g[1]))
    def label(g):
        k = g[1].removeprefix("sparse k=")
        return f"P = {g[0]}\n" + (g[1] if k == g[1] else f"k = {int(k):,}")


    def value(g, allocator, method, what):
        r = next((r for r in rows if (r["P"], r["case"]) == g and r["allocator"] == allocator
                  and r["method"] == method), None)
        return (r[what] or 0.0) if r else 0.0

    times = {f"{m}, {a}": [value(g, a, m, "median_ms") for g in groups]
             for a in ALLOCATORS for m in ("ours", "plain")}
    # dense_sync at P = 1 is left out of the ratios: there plain's Allreduce is a no-op
    paired = [g for g in groups if g != (1, "dense_sync")]
    ratios = {f"ours / plain, {a}": [value(g, a, "ours", "vs_plain_paired") for g in paired]
              for a in ALLOCATORS}
    ratios["ours: default / tuned"] = [value(g, "default", "ours", "vs_tuned_paired")
                                       for g in paired]
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 5.5))
    grouped_bars(left, [label(g) for g in groups], {k: v for k, v in times.items() if any(v)})
    left.set(ylabel="ms per call (median over rounds of the median over repeats)",
             title="time per call")
    grouped_bars(right, [label(g) for g in paired], {k: v for k, v in ratios.items() if any(v)})
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set(ylabel="ratio (median over rounds of the ratio within the round)",
              title="ratios (dense_sync at P = 1 left out: plain's Allreduce is a no-op there)")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"sparse_allreduce(algorithm='allgather') of k entries into "
                 f"{data['N']:,} and dense_sync of {data['dense_N']:,} against mpi4py + NumPy, "
                 f"allocator tuned / by default / opted out (commit "
                 f"{data['machine'].get('commit')})")
    save_figure(fig, path)


def driver(args) -> int:
    return record_or_replot(args, lambda: sweep(args), print_table, plot)


def main(argv=None) -> int:
    p = parser(__doc__.split("\n")[0], procs=[1, 2])
    p.add_argument("--allocator", choices=list(ALLOCATORS), default="default",
                   help="(worker) the setting its environment was launched with, recorded")
    p.add_argument("--allocators", nargs="+", choices=list(ALLOCATORS), default=list(ALLOCATORS),
                   help="(sweep) the settings to run, one job each")
    p.add_argument("--size", default="10000000", help="the sparse vectors' dimension N")
    p.add_argument("--ks", nargs="+", type=int, default=[10_000, 100_000],
                   help="entries per rank")
    p.add_argument("--dense-size", default="7500000",
                   help="dense_sync's vector (float32 entries); 0 leaves the dense case out")
    p.add_argument("--lock", default=MEASURE_LOCK,
                   help="the measurement lock rank 0 holds while timing ('' for none)")
    add_timing_options(p, repeats=30, warmup=3)
    p.add_argument("--rounds", type=int, default=3,
                   help="(sweep) jobs per configuration, interleaved; the summary is their median")
    add_quiet_options(p, busy=False)
    add_launch_options(p, timeout=900.0, mpiexec_args=False)
    add_record_options(p, RESULTS / "sparse_allreduce_host_shm.json")
    return driver_or_worker(p.parse_args(argv), driver, worker)


if __name__ == "__main__":
    sys.exit(main())
