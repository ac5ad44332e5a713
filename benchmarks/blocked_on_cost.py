"""What recording "blocked on" costs: the watchdog's report of the peer each rank waits for.

Every blocking MPI call of the collectives records, for its duration, what the calling
thread waits for (ffi/runtime/blocked_on.h: relaxed atomic stores into a slot the thread
owns), watchdog or not. Two measurements, one JSON record
(benchmarks/results/blocked_on_cost_cpu.json):

* pair: one record + clear (a ``BlockedOn`` built and destroyed, no MPI call), timed in
  C++ over many iterations, median of samples;
* end to end: a small, latency-bound jitted ``sparse_allreduce`` per algorithm, with the
  extension built from this tree and with one built from the commit before the
  recording (``--baseline-module``), in alternating jobs, median of the jobs' medians
  (the load average recorded).

    # the baseline module: the commit before, built with CMake into its own directory
    git archive <commit> | tar -x -C /tmp/base && cmake -S /tmp/base -B /tmp/base/build \\
        -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$PWD/.venv/bin/python && \\
        cmake --build /tmp/base/build --target _jss_cpu
    flock /tmp/jss_measure.lock python benchmarks/blocked_on_cost.py \\
        --baseline-module /tmp/base/build/_jss_cpu.cpython-311-x86_64-linux-gnu.so
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (find_mpiexec, loadavg, machine_info, pyplot, run_fragment,  # noqa: E402
                      save_figure, time_per_call, write_fragment, write_record)

RESULT = HERE / "results" / "blocked_on_cost_cpu.json"
ALGORITHMS = ("recursive_doubling", "split_allgather", "allgather")


def load_module(path: str) -> None:
    """Makes ``jax_sparse_sync._jss_cpu`` the extension at `path` (before the package
    imports it), so that one installed tree can time another build of the module."""
    spec = importlib.util.spec_from_file_location("jax_sparse_sync._jss_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["jax_sparse_sync._jss_cpu"] = module


def worker(fragment: str, module: str | None, calls: int, blocks: int, pairs: int) -> None:
    """Runs under mpiexec: per algorithm, the median us per call; rank 0 writes it."""
    if module:
        load_module(module)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from jax_sparse_sync import _ext

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    rng = np.random.default_rng(rank)
    n, k = 4096, 64
    values = jnp.asarray(rng.standard_normal(k), jnp.float32)
    indices = jnp.asarray(rng.choice(n, k, replace=False).astype(np.int32))
    per_call = {}
    for algorithm in ALGORITHMS:
        fn = jax.jit(lambda v, i, a=algorithm: jss.sparse_allreduce(v, i, size=n, algorithm=a))
        jax.block_until_ready(fn(values, indices))
        samples = []
        for _ in range(blocks):
            world.Barrier()
            samples.append(time_per_call(lambda: fn(values, indices), calls) * 1e6)
        per_call[algorithm] = float(np.median(samples))
    pair = None
    if hasattr(_ext.cpu_module, "blocked_on_pair_cost_ns"):
        pair = float(np.median([_ext.cpu_module.blocked_on_pair_cost_ns(pairs) for _ in range(7)]))
    gathered = world.gather(per_call, root=0)
    if rank == 0:
        write_fragment({"us_per_call": {a: float(np.median([g[a] for g in gathered]))
                                        for a in ALGORITHMS},
                        "pair_cost_ns": pair, "loadavg_after": loadavg()}, fragment)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-module", required=False,
                        help="a _jss_cpu .so built from the commit before (omit: this build only)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=5, help="jobs per build, alternating")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--worker", metavar="FRAGMENT")
    parser.add_argument("--module")
    parser.add_argument("--out", type=Path, default=RESULT, help=f"JSON path (default {RESULT})")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.module, args.calls, args.blocks, args.pairs)
        return

    import numpy as np

    mpiexec = find_mpiexec()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    builds = {"with": None}
    if args.baseline_module:
        builds["without"] = args.baseline_module
    jobs = {b: [] for b in builds}
    with tempfile.TemporaryDirectory() as tmp:
        for j in range(args.jobs):
            for build, module in builds.items():
                frag = Path(tmp) / f"{build}_{j}.json"
                data = run_fragment([mpiexec, "-n", args.ranks, sys.executable, __file__,
                                     "--worker", frag, "--calls", args.calls, "--blocks",
                                     args.blocks, "--pairs", args.pairs,
                                     *(["--module", module] if module else [])], frag, 600, env)
                jobs[build].append(data)
                print(build, json.dumps(data), flush=True)
    summary = {b: {a: float(np.median([d["us_per_call"][a] for d in jobs[b]])) for a in ALGORITHMS}
               for b in builds}
    record = {"benchmark": "blocked_on_cost", "machine": machine_info(),
              "config": {"ranks": args.ranks, "size": 4096, "entries_per_rank": 64,
                         "calls_per_block": args.calls, "blocks_per_job": args.blocks,
                         "jobs_per_build": args.jobs, "baseline_module": args.baseline_module},
              "pair_cost_ns": float(np.median([d["pair_cost_ns"] for d in jobs["with"]])),
              "us_per_call_median": summary, "jobs": jobs}
    if "without" in summary:
        record["overhead_us"] = {a: summary["with"][a] - summary["without"][a] for a in ALGORITHMS}
        record["overhead_relative"] = {a: record["overhead_us"][a] / summary["without"][a]
                                       for a in ALGORITHMS}
    write_record(record, args.out)
    print(json.dumps({k: record[k] for k in record if k not in ("jobs", "machine")}, indent=1))
    plot(record, args.out.with_suffix(".png"))


def plot(record: dict, figure: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 3.8))
    builds = list(record["us_per_call_median"])
    x = range(len(ALGORITHMS))
    width = 0.8 / len(builds)
    for j, build in enumerate(builds):
        med = record["us_per_call_median"][build]
        ax.bar([i + (j - (len(builds) - 1) / 2) * width for i in x], [med[a] for a in ALGORITHMS],
               width, label=f"{build} the blocked-on record")
        for jobrec in record["jobs"][build]:  # each job's median, as dots
            ax.scatter([i + (j - (len(builds) - 1) / 2) * width for i in x],
                       [jobrec["us_per_call"][a] for a in ALGORITHMS], s=8, color="k", zorder=3)
    ax.set_xticks(list(x), ALGORITHMS)
    ax.set_ylabel("us per sparse_allreduce (median)")
    cfg = record["config"]
    ax.set_title(f"P = {cfg['ranks']}, N = {cfg['size']}, {cfg['entries_per_rank']} entries/rank; "
                 f"one record + clear: {record['pair_cost_ns']:.1f} ns", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, figure)
    print(f"wrote {figure}")


if __name__ == "__main__":
    main()
