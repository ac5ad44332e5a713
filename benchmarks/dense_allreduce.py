"""The dense allreduce against MPI's own: ``jss.dense_sync()`` beside mpi4py and mpi4jax.

Every rank holds the same-size float32 vector (random normal, seeded by rank) and sums
it over the ranks, the methods timed in turn within every repeat: ``mpi4py_inplace``
(``comm.Allreduce(MPI.IN_PLACE, buf)``: MPI's own cost), ``mpi4py_inplace_fresh`` (a new
copy each call, as XLA's buffers are), ``mpi4py`` (separate buffers); ``dense_sync`` and
``dense_sync_not_donated``, ``dense_allreduce``, ``sparse_path``
(``jss.sparse_allreduce(..., algorithm="dense")`` on ``arange(N)``), ``dense_sync_bf16``,
``mpi4jax`` (when importable), and ``topk_sync`` / ``topk_sync_not_donated`` at density
0.001. Every result is checked against the float64 sum and across ranks (bitwise); a
repeat's time is the slowest rank's, a method's the median over repeats. Oversubscribed
jobs run with MPICH's heavy yield (``--heavy-yield auto``), every method with the glibc
allocator keeping freed memory (as ``jss.mpi.tune_host_allocator``).

    mpiexec -n 2 python -m mpi4py benchmarks/dense_allreduce.py --size 7500000   # one P
    python benchmarks/dense_allreduce.py --sweep --procs 2 4     # one mpiexec job per P

writes ``benchmarks/results/dense_allreduce_shm.{json,png}`` (results:
docs/topics/dense_sync.md); ``--plot-only`` redraws both from the JSON.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

from _harness import (add_launch_options, add_quiet_options, add_record_options,  # noqa: E402
                      add_timing_options, driver_or_worker, launch, loadavg, machine_info,
                      parse_size, parser, pyplot, record_or_replot, save_figure, timing_args,
                      write_fragment)

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("mpi4py_inplace", "mpi4py_inplace_fresh", "mpi4py", "dense_sync", "dense_sync_not_donated",
           "dense_allreduce", "sparse_path", "mpi4jax", "dense_sync_bf16", "topk_sync",
           "topk_sync_not_donated")
LABELS = {
    "mpi4py_inplace": "mpi4py Allreduce(IN_PLACE)",
    "mpi4py_inplace_fresh": "mpi4py Allreduce(IN_PLACE), fresh buffer",
    "mpi4py": "mpi4py Allreduce(x, y)",
    "dense_sync": "jss.dense_sync() update, donated",
    "dense_sync_not_donated": "jss.dense_sync() update, plain jit",
    "dense_allreduce": "jss.dense_allreduce, donated",
    "sparse_path": "before: sparse_allreduce(arange(N), 'dense')",
    "mpi4jax": "mpi4jax.allreduce in jit, donated",
    "dense_sync_bf16": "jss.dense_sync(wire_dtype=bf16) update, donated",
    "topk_sync": "jss.topk_sync(0.1%) update, donated",
    "topk_sync_not_donated": "jss.topk_sync(0.1%) update, plain jit",
}
HEAVY_YIELD_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
NOTE = ("MPICH over shared memory on one host; P > cpu_count ranks are oversubscribed (heavy "
        "yield then). A repeat's time is the slowest rank's; medians over repeats.")


# --------------------------------------------------------------------------- worker


def _mpi4jax():
    try:
        import mpi4jax
    except Exception as e:  # noqa: BLE001 - any import failure means: not available
        return None, f"mpi4jax not importable ({type(e).__name__}: {e})"
    return mpi4jax, getattr(mpi4jax, "__version__", "?")


def worker(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from jax_sparse_sync.transforms.flat import split_like

    world = MPI.COMM_WORLD
    comm = jss.mpi.default_comm()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    n = parse_size(args.size)
    info = machine_info() if rank == 0 else None
    x = np.random.default_rng([args.seed, rank]).standard_normal(n).astype(np.float32)
    ref = np.zeros(n, np.float64)
    world.Allreduce(x.astype(np.float64), ref)
    tol = 1e-5 * float(np.abs(ref).max()) + 1e-5
    abs_sum = np.zeros(n, np.float64)
    world.Allreduce(np.abs(x).astype(np.float64), abs_sum)
    # the bfloat16 wire: the inputs and the sum rounded to bfloat16, 2**-8 relative each
    bf16_tol = 2.0 ** -8 * (abs_sum + np.abs(ref)) / nranks + 1e-30

    mpi4jax, mpi4jax_note = _mpi4jax()
    methods = [m for m in args.methods if m != "mpi4jax" or mpi4jax is not None]

    tx = jss.dense_sync()
    state0 = tx.init({"w": jnp.zeros(n)})
    donated_step = jax.jit(tx.update, donate_argnums=(0, 1))
    plain_step = jax.jit(tx.update)
    summed = jax.jit(jss.dense_allreduce, donate_argnums=0)
    bf16_tx = jss.dense_sync(wire_dtype=jnp.bfloat16)
    bf16_step = jax.jit(bf16_tx.update, donate_argnums=(0, 1))
    topk = jss.topk_sync(density=0.001)
    topk_state0 = topk.init({"w": jnp.zeros(n)})
    topk_donated = jax.jit(topk.update, donate_argnums=(0, 1))
    topk_plain = jax.jit(topk.update)

    @jax.jit
    def sparse_path(v):  # dense_sync's update before jss.dense_allreduce existed
        total = jss.sparse_allreduce(v, jnp.arange(n, dtype=jnp.int32), size=n,
                                     algorithm="dense", nan_policy="propagate")
        return split_like(total, {"w": v}, scale=nranks)

    if mpi4jax is not None:
        def _mpi4jax_sum(v):
            out = mpi4jax.allreduce(v, op=MPI.SUM, comm=comm)
            return out[0] if isinstance(out, tuple) else out  # mpi4jax < 0.8 returned a token
        mpi4jax_sum = jax.jit(_mpi4jax_sum, donate_argnums=0)

    host_buf, host_out = np.empty_like(x), np.empty_like(x)

    def prepare(method):
        """The call's fresh inputs (untimed) and the call itself."""
        if method == "mpi4py_inplace":
            np.copyto(host_buf, x)
            return lambda: (comm.Allreduce(MPI.IN_PLACE, host_buf), host_buf)[1]
        if method == "mpi4py_inplace_fresh":
            fresh = x.copy()
            return lambda: (comm.Allreduce(MPI.IN_PLACE, fresh), fresh)[1]
        if method == "mpi4py":
            return lambda: (comm.Allreduce(x, host_out), host_out)[1]
        g = jax.block_until_ready(jnp.array(x))  # a fresh buffer: donation consumes it
        steps = {"dense_sync": (donated_step, state0, True),
                 "dense_sync_bf16": (bf16_step, state0, True),
                 "dense_sync_not_donated": (plain_step, state0, False),
                 "topk_sync": (topk_donated, topk_state0, True),
                 "topk_sync_not_donated": (topk_plain, topk_state0, False)}
        if method in steps:
            step, st, donated = steps[method]
            st = jax.tree_util.tree_map(jnp.copy, st) if donated else st
            return lambda: step({"w": g}, st)[0]["w"]
        return {"dense_allreduce": lambda: summed(g), "sparse_path": lambda: sparse_path(g)["w"],
                "mpi4jax": lambda: mpi4jax_sum(g)}[method]

    mean_methods = {"dense_sync", "dense_sync_not_donated", "sparse_path", "dense_sync_bf16"}
    checks = {}
    for method in methods:  # compile, warm up, check
        for _ in range(args.warmup):
            call = prepare(method)
            comm.Barrier()
            out = np.asarray(jax.block_until_ready(call()))
        digests = comm.allgather(hashlib.sha1(out.tobytes()).hexdigest())
        checks[method] = {"identical_across_ranks": len(set(digests)) == 1}
        if not method.startswith("topk_sync"):  # a sum or a mean of every entry
            expect = ref / nranks if method in mean_methods else ref
            diff = np.abs(out.astype(np.float64) - expect)
            err = float(np.max(diff))
            ok = comm.allgather(bool((diff <= bf16_tol).all()) if method == "dense_sync_bf16"
                                else err <= tol)
            assert all(ok), f"P={nranks} {method}: result off the reference on some rank ({err})"
            checks[method]["max_abs_err"] = err
        del out

    times = {m: [] for m in methods}
    for _ in range(args.repeats):
        for method in methods:
            call = prepare(method)
            comm.Barrier()
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            times[method].append(time.perf_counter() - t0)

    everyone = comm.gather(times, root=0)
    if rank == 0:
        records = []
        for method in methods:
            per_rep = [max(t[method][j] for t in everyone) for j in range(args.repeats)]
            records.append({
                "P": nranks, "N": n, "method": method, "label": LABELS[method],
                "median_s": statistics.median(per_rep), "min_s": min(per_rep),
                "times_s": per_rep, **checks[method], "loadavg_1min": loadavg(),
            })
            print(f"  P={nranks} {LABELS[method]:>46}: median {records[-1]['median_s'] * 1e3:8.2f}"
                  f" ms (min {records[-1]['min_s'] * 1e3:7.2f})"
                  f"{'' if checks[method]['identical_across_ranks'] else '  (ranks differ)'}",
                  flush=True)
        frag = {"P": nranks, "N": n, "cpu_count": os.cpu_count(),
                "oversubscribed": nranks > (os.cpu_count() or 1), "repeats": args.repeats,
                "warmup": args.warmup, "seed": args.seed, "mpi4jax": mpi4jax_note,
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(("MALLOC_", "MPIR_CVAR"))},
                "machine": info, "records": records}
        write_fragment(frag, args.fragment or RESULTS / f"dense_allreduce_shm_P{nranks}.json.tmp")
    comm.Barrier()
    return 0


# --------------------------------------------------------------------------- driver


def run_one(p: int, args) -> dict:
    env = dict(os.environ, **ALLOCATOR_ENV)
    heavy = args.heavy_yield == "on" or (args.heavy_yield == "auto" and p > (os.cpu_count() or 1))
    if heavy:
        env.update(HEAVY_YIELD_ENV)
    print(f"# heavy yield {'on' if heavy else 'off'}", flush=True)
    data = launch(Path(__file__).resolve(), p,
                  ["--size", args.size, "--methods", *args.methods, *timing_args(args)],
                  Path(args.out).parent / f"dense_allreduce_shm_P{p}_round.json.tmp",
                  args.timeout, env=env, quiet_wait=args.quiet_wait, mpi4py=True)
    data["heavy_yield"] = heavy
    return data


def summarize(records) -> list[dict]:
    """Per P and method: the median over the rounds' medians, and its ratio to mpi4py's."""
    rows = []
    for p in sorted({r["P"] for r in records}):
        mine = [r for r in records if r["P"] == p]
        med = {m: statistics.median(r["median_s"] for r in mine if r["method"] == m)
               for m in dict.fromkeys(r["method"] for r in mine)}
        base = med.get("mpi4py_inplace")
        for m, t in med.items():
            rows.append({"P": p, "method": m, "label": LABELS[m], "median_ms": t * 1e3,
                         "rounds": sum(r["method"] == m for r in mine),
                         "vs_mpi4py_inplace": t / base if base else None,
                         "vs_mpi4py_inplace_fresh": (t / med["mpi4py_inplace_fresh"]
                                                     if "mpi4py_inplace_fresh" in med else None),
                         "vs_mpi4jax": t / med["mpi4jax"] if "mpi4jax" in med else None})
    return rows


def print_table(data: dict) -> None:
    print(f"\n# N = {data['N']:,} float32; {data['note']}")
    print(f"{'P':>2} {'method':>46} | {'median ms':>9} | {'x mpi4py':>8} | {'x mpi4jax':>9}")
    for r in data["summary"]:
        vs = f"{r['vs_mpi4py_inplace']:.2f}" if r["vs_mpi4py_inplace"] else "-"
        vj = f"{r['vs_mpi4jax']:.2f}" if r["vs_mpi4jax"] else "-"
        print(f"{r['P']:>2} {r['label']:>46} | {r['median_ms']:>9.2f} | {vs:>8} | {vj:>9}")
    if data.get("mpi4jax_note"):
        print(f"mpi4jax: {data['mpi4jax_note']}")


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    rows = data["summary"]
    ps = sorted({r["P"] for r in rows})
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    colors = {"mpi4py_inplace": "tab:gray", "mpi4py_inplace_fresh": "dimgray", "mpi4py": "silver", "dense_sync": "tab:green",
              "dense_sync_not_donated": "yellowgreen", "dense_allreduce": "tab:blue",
              "sparse_path": "tab:red", "mpi4jax": "tab:purple", "topk_sync": "tab:orange",
              "dense_sync_bf16": "tab:cyan",
              "topk_sync_not_donated": "navajowhite"}
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        xs, ys = [], []
        for i, p in enumerate(ps):
            r = next((r for r in rows if r["P"] == p and r["method"] == m), None)
            if r:
                xs.append(i + (j - (len(methods) - 1) / 2) * width)
                ys.append(r["median_ms"])
        bars = ax.bar(xs, ys, width, color=colors[m], label=LABELS[m])
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y, f"{y:.0f}", ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(range(len(ps)), [f"P = {p}" for p in ps])
    ax.set(ylabel="ms per call (median over rounds of the median over repeats)",
           title=f"Dense allreduce of {data['N']:,} float32 on shared memory "
                 f"({data['machine'].get('cpu_count')} cores; commit {data['machine'].get('commit')})")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def sweep(args) -> dict:
    records, runs = [], []
    for _ in range(args.rounds):
        for p in args.procs:
            data = run_one(p, args)
            runs.append({k: v for k, v in data.items() if k not in ("records", "machine")})
            if "error" in data:
                print(f"!! P={p}: {data['error']}", flush=True)
                continue
            for r in data["records"]:
                r["heavy_yield"] = data["heavy_yield"]
            records += data["records"]
    note = next((r.get("mpi4jax") for r in runs if r.get("mpi4jax")), None)
    return {"benchmark": "dense_allreduce", "N": parse_size(args.size), "note": NOTE,
            "rounds": args.rounds, "repeats": args.repeats, "mpi4jax_note": note,
            "allocator_env": ALLOCATOR_ENV, "machine": machine_info(), "runs": runs,
            "records": records, "summary": summarize(records)}


def driver(args) -> int:
    return record_or_replot(args, lambda: sweep(args), print_table, plot)


def main(argv=None) -> int:
    p = parser(__doc__.split("\n")[0], procs=[2, 4])
    p.add_argument("--size", default="7500000", help="entries (float32), e.g. 7500000 or 8M")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    add_timing_options(p, repeats=7)
    p.add_argument("--rounds", type=int, default=2,
                   help="(sweep) jobs per P, interleaved over P; the summary is their median")
    p.add_argument("--heavy-yield", choices=("auto", "on", "off"), default="auto",
                   help="(sweep) MPICH's heavy yield: auto = where P exceeds the cores")
    add_quiet_options(p, busy=False)
    add_launch_options(p, timeout=600.0, mpiexec_args=False)
    add_record_options(p, RESULTS / "dense_allreduce_shm.json", png=False)
    return driver_or_worker(p.parse_args(argv), driver, worker)


if __name__ == "__main__":
    sys.exit(main())
