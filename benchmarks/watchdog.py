"""The watchdog for stuck collectives: its cost per collective and how fast it ends a stuck job.

Two measurements, one JSON record (benchmarks/results/watchdog_cpu.json):

* cost: under ``mpiexec -n P``, the watchdog's own enter/exit pair per collective,
  timed in C++ off and on, and a small, latency-bound jitted ``sparse_allreduce`` timed
  with the watchdog off and on in alternating blocks (median of the blocks; the load
  average recorded);
* detection: jobs where the last rank stops before a collective the others enter:
  seconds from the moment it stopped until ``mpiexec`` returned (MPI_Abort), per run.

    python benchmarks/watchdog.py                 # P = 2 and 3, 3 detection runs each
    python benchmarks/watchdog.py --ranks 2 --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _harness import (loadavg, machine_info, pyplot, run_fragment, save_figure,  # noqa: E402
                      time_per_call, write_fragment, write_record)

RESULT = HERE / "results" / "watchdog_cpu.json"
FIGURE = RESULT.with_suffix(".png")
TIMEOUT_S = 2.0


def worker(fragment: str, pairs: int, calls: int, blocks: int) -> None:
    """Runs under mpiexec: the cost measurements; rank 0 writes the fragment."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from jax_sparse_sync import _ext

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    own = world.Dup()  # the pair timing advances its communicator's numbers: not the library's
    pair = {}
    for label, timeout in (("off", None), ("on", 600.0)):
        jss.mpi.set_timeout(timeout)
        samples = [_ext.cpu_module.watchdog_pair_cost_ns(own.py2f(), pairs) for _ in range(5)]
        pair[label] = float(np.median(samples))
    jss.mpi.set_timeout(None)

    rng = np.random.default_rng(rank)
    n, k = 4096, 64
    values = jnp.asarray(rng.standard_normal(k), jnp.float32)
    indices = jnp.asarray(rng.choice(n, k, replace=False).astype(np.int32))
    fn = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=n, algorithm="allgather"))
    jax.block_until_ready(fn(values, indices))
    per_call = {"off": [], "on": []}
    for b in range(2 * blocks):
        label = "off" if b % 2 == 0 else "on"
        jss.mpi.set_timeout(600.0 if label == "on" else None)
        world.Barrier()
        per_call[label].append(time_per_call(lambda: fn(values, indices), calls) * 1e6)
    jss.mpi.set_timeout(None)
    pair_all = world.gather(pair, root=0)
    calls_all = world.gather(per_call, root=0)
    if rank == 0:
        med = {lab: float(np.median([np.median(c[lab]) for c in calls_all])) for lab in ("off", "on")}
        write_fragment({
            "ranks": size,
            "pair_cost_ns": {lab: float(np.median([p[lab] for p in pair_all])) for lab in ("off", "on")},
            "pair_cost_ns_per_rank": pair_all,
            "sparse_allreduce_us": med,
            "sparse_allreduce_us_blocks_rank0": calls_all[0],
            "sparse_allreduce_overhead_us": med["on"] - med["off"],
            "calls_per_block": calls, "blocks_each": blocks, "pairs_per_sample": pairs,
            "loadavg_after": loadavg(),
        }, fragment)


STUCK = r'''
import os, sys, time
from mpi4py import MPI
rank, nranks = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
import jax, jax.numpy as jnp
import jax_sparse_sync as jss
v = jnp.ones(4, jnp.float32); i = jnp.arange(4, dtype=jnp.int32)
for _ in range(2):
    jax.block_until_ready(jss.sparse_allreduce(v, i, size=64))
MPI.COMM_WORLD.Barrier()
jss.mpi.set_timeout(float(sys.argv[2]))
if rank == nranks - 1:
    open(sys.argv[1], "w").write(f"{time.time():.4f}")
    time.sleep(120)
jax.block_until_ready(jss.sparse_allreduce(v, i, size=64))
'''


def detection_run(mpiexec: str, nranks: int, tmp: Path) -> dict:
    script, stamp = tmp / "stuck.py", tmp / f"stopped_{nranks}"
    script.write_text(STUCK)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
               JSS_WATCHDOG_DIR=str(tmp / f"records_{nranks}_{time.time_ns()}"))
    proc = subprocess.run([mpiexec, "-n", str(nranks), sys.executable, str(script), str(stamp),
                           str(TIMEOUT_S)], env=env, capture_output=True, text=True, timeout=120)
    ended = time.time()
    out = proc.stdout + proc.stderr
    m = re.search(r"has not completed ([\d.]+) s after", out)
    missing = re.search(r"ranks that have not entered #(\d+): ([\d, ]+) ", out)
    return {
        "ranks": nranks,
        "exit_code": proc.returncode,
        "seconds_from_stop_to_job_end": round(ended - float(stamp.read_text()), 3),
        "reported_wait_s": float(m.group(1)) if m else None,
        "reported_op_number": int(missing.group(1)) if missing else None,
        "reported_missing_ranks": missing.group(2) if missing else None,
        "expected_missing_rank": nranks - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--runs", type=int, default=3, help="detection runs per rank count")
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--worker", metavar="FRAGMENT")
    parser.add_argument("--out", type=Path, default=RESULT, help=f"JSON path (default {RESULT})")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.pairs, args.calls, args.blocks)
        return

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")  # the mpich wheel's
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    record = {"benchmark": "watchdog", "machine": machine_info(), "timeout_s": TIMEOUT_S,
              "cost": [], "detection": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for p in args.ranks:
            frag = tmp / f"cost_{p}.json"
            data = run_fragment([mpiexec, "-n", p, sys.executable, __file__, "--worker", frag,
                                 "--pairs", args.pairs, "--calls", args.calls, "--blocks",
                                 args.blocks], frag, 600, env)
            record["cost"].append(data)
            print(json.dumps({k: v for k, v in data.items() if "per_rank" not in k
                              and "blocks_rank0" not in k}), flush=True)
            for _ in range(args.runs):
                run = detection_run(mpiexec, p, tmp)
                record["detection"].append(run)
                print(json.dumps(run), flush=True)
    write_record(record, args.out)
    plot(record, args.out.with_suffix(".png"))


def plot(record: dict, figure: Path = FIGURE) -> None:
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    cost = [c for c in record["cost"] if "ranks" in c]
    labels = [f"P={c['ranks']}" for c in cost]
    x = range(len(cost))
    a.bar([i - 0.2 for i in x], [c["pair_cost_ns"]["off"] / 1e3 for c in cost], 0.4, label="off")
    a.bar([i + 0.2 for i in x], [c["pair_cost_ns"]["on"] / 1e3 for c in cost], 0.4, label="on")
    for i, c in zip(x, cost):
        a.annotate(f"call: {c['sparse_allreduce_us']['off']:.0f} us off, "
                   f"{c['sparse_allreduce_us']['on']:.0f} us on", (i, 0), ha="center",
                   va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points", rotation=90)
    a.set_xticks(list(x), labels)
    a.set(ylabel="us per collective (enter + exit)", title="watchdog bookkeeping per collective")
    a.legend()
    runs = record["detection"]
    b.scatter([r["ranks"] for r in runs], [r["seconds_from_stop_to_job_end"] for r in runs])
    b.axhline(record["timeout_s"], ls="--", c="gray", label="timeout")
    b.axhline(record["timeout_s"] + 5, ls=":", c="red", label="timeout + 5 s")
    b.set(xlabel="ranks", ylabel="s from the rank's stop to the job's end",
          title="a rank stops calling: time to MPI_Abort")
    b.legend()
    m = record["machine"]
    save_figure(fig, figure, f"benchmarks/watchdog.py at {m.get('commit')}, {m.get('cpu_count')} "
                "CPUs (shared)", fontsize=8)
    print(f"wrote {figure}")


if __name__ == "__main__":
    main()
