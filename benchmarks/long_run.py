"""A long run: 2,000 steps of a small MLP with ``topk_sync`` at P = 4, watching for leaks.

Every rank trains the same MLP on its own synthetic data (``topk_sync``, 1 %, exact
selection, ``optax.sgd`` with momentum; the state donated) and records its resident
memory (``/proc/self/statm``) every ``--every`` steps; the bytes it sent and received,
from each step's ``last_stats`` (an int32 counter per step), summed in Python ints; and
every ``--check-every`` steps whether every rank's parameters are bitwise equal (a
mismatch ends the run with an error). The goal: after the first ``--warmup`` steps,
resident memory flat within 1 % (``growth_after_warmup_pct``, per rank). Times are for
orientation only.

    python benchmarks/long_run.py                         # P = 4, 2,000 steps
    python benchmarks/long_run.py --procs 2 --steps 200 --out /tmp/x.json   # a smoke run

Rank 0 writes ``benchmarks/results/long_run_p4.{json,png}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (find_mpiexec, machine_info, pyplot, run_fragment, save_figure,  # noqa: E402
                      write_fragment, write_record)

RESULT = HERE / "results" / "long_run_p4.json"  # --steps 8000: long_run_p4_steps8000.json
INPUT, HIDDEN, CLASSES, SAMPLES, BATCH = 64, 256, 10, 2048, 64


def resident_bytes() -> int:
    """This process's resident set size, from /proc/self/statm (pages * page size)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(args) -> None:
    """Runs under mpiexec: trains and traces; rank 0 writes the fragment."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from mpi4py import MPI

    import jax_sparse_sync as jss

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    rng = np.random.default_rng(rank)  # each rank its own data
    teacher = np.random.default_rng(1234).standard_normal((INPUT, CLASSES)).astype(np.float32)
    x_all = rng.standard_normal((SAMPLES, INPUT)).astype(np.float32)
    y_all = np.argmax(x_all @ teacher, axis=1).astype(np.int32)
    x_all, y_all = jnp.asarray(x_all), jnp.asarray(y_all)

    init_rng = np.random.default_rng(0)  # the same start on every rank

    def dense(n_in, n_out):
        return {"w": jnp.asarray(init_rng.standard_normal((n_in, n_out)).astype(np.float32)
                                 / np.sqrt(n_in)),
                "b": jnp.zeros((n_out,), jnp.float32)}
    params = {"l1": dense(INPUT, HIDDEN), "l2": dense(HIDDEN, HIDDEN),
              "l3": dense(HIDDEN, CLASSES)}
    n_params = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params))

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["l1"]["w"] + p["l1"]["b"])
        h = jax.nn.relu(h @ p["l2"]["w"] + p["l2"]["b"])
        logits = h @ p["l3"]["w"] + p["l3"]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    tx = optax.chain(jss.topk_sync(density=args.density), optax.sgd(0.05, momentum=0.9))
    state = tx.init(params)

    def step(p, s, i):
        start = (i * BATCH) % SAMPLES
        x = jax.lax.dynamic_slice_in_dim(x_all, start, BATCH)
        y = jax.lax.dynamic_slice_in_dim(y_all, start, BATCH)
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss
    step = jax.jit(step, donate_argnums=(0, 1))

    trace_steps, rss, losses = [], [], []
    sent = received = 0
    checks = mismatches = 0
    stats_dtype = str(state[0].last_stats.dtype)
    saturated_steps = 0
    limit = np.iinfo(state[0].last_stats.dtype).max
    t0 = time.monotonic()
    for i in range(args.steps):
        params, state, loss = step(params, state, jnp.int32(i))
        stats = np.asarray(state[0].last_stats)  # waits for the step
        sent += int(stats[0])
        received += int(stats[1])
        saturated_steps += int(stats[0] == limit or stats[1] == limit)
        if (i + 1) % args.every == 0 or i == 0:
            trace_steps.append(i + 1)
            rss.append(resident_bytes())
            losses.append(float(loss))
        if (i + 1) % args.check_every == 0 or i + 1 == args.steps:
            flat = np.concatenate([np.asarray(x).ravel()
                                   for x in jax.tree_util.tree_leaves(params)])
            everyone = world.allgather(flat.tobytes())
            checks += 1
            if any(b != everyone[0] for b in everyone):
                mismatches += 1
                raise SystemExit(f"rank {rank}: replicas differ after step {i + 1}")
    elapsed = time.monotonic() - t0
    per_rank = world.gather({"rank": rank, "rss_bytes": rss, "bytes_sent": sent,
                             "bytes_received": received, "saturated_steps": saturated_steps},
                            root=0)
    if rank != 0:
        return
    warm_index = max(i for i, s in enumerate(trace_steps) if s <= args.warmup)
    half_index = max(i for i, s in enumerate(trace_steps) if s <= args.steps // 2)
    ranks = []
    for r in per_rank:
        after = r["rss_bytes"][warm_index:]
        base, mid = after[0], r["rss_bytes"][half_index]
        ranks.append({**r,
                      "rss_at_warmup_end": base,
                      "rss_last": after[-1],
                      "growth_after_warmup_pct": round(100.0 * (max(after) - base) / base, 3),
                      "last_minus_warmup_pct": round(100.0 * (after[-1] - base) / base, 3),
                      # a leak keeps growing; an allocator settling does not
                      "growth_second_half_pct": round(
                          100.0 * (max(r["rss_bytes"][half_index:]) - mid) / mid, 3)})
    record = {
        "benchmark": "long_run",
        "config": {"procs": size, "steps": args.steps, "density": args.density,
                   "params": n_params, "batch_per_rank": BATCH, "warmup_steps": args.warmup,
                   "rss_every": args.every, "check_every": args.check_every,
                   "sync": "topk_sync(density, selection='exact') + sgd(0.05, momentum=0.9)"},
        "steps_per_s": round(args.steps / elapsed, 1),
        "wall_s": round(elapsed, 1),
        "trace_steps": trace_steps,
        "loss_rank0": losses,
        "last_stats_dtype": stats_dtype,
        "replica_checks": checks,
        "replica_mismatches": mismatches,
        "ranks": ranks,
        "max_growth_after_warmup_pct": max(r["growth_after_warmup_pct"] for r in ranks),
        "max_growth_second_half_pct": max(r["growth_second_half_pct"] for r in ranks),
        "machine": machine_info(),
    }
    write_fragment(record, args.fragment)


def plot(record: dict, path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 4))
    steps = record["trace_steps"]
    for r in record["ranks"]:
        ax.plot(steps, [b / 2**20 for b in r["rss_bytes"]], label=f"rank {r['rank']}")
    ax.axvline(record["config"]["warmup_steps"], color="grey", ls=":", label="end of warm-up")
    cfg = record["config"]
    ax.set(xlabel="step", ylabel="resident memory (MiB)")
    ax.set_title(f"{cfg['steps']} steps, P = {cfg['procs']}, topk_sync {cfg['density']:.0%}, "
                 f"{cfg['params']} parameters: growth after warm-up at most "
                 f"{record['max_growth_after_warmup_pct']:.2f} %", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--every", type=int, default=50, help="steps between RSS samples")
    ap.add_argument("--check-every", type=int, default=100,
                    help="steps between replica checks")
    ap.add_argument("--warmup", type=int, default=200, help="steps excluded from the growth")
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fragment", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        fragment = Path(tmp) / "long_run.json"
        record = run_fragment([find_mpiexec(), "-n", args.procs, sys.executable, __file__,
                               "--worker", "--fragment", fragment, "--steps", args.steps,
                               "--density", args.density, "--every", args.every, "--check-every",
                               args.check_every, "--warmup", args.warmup], fragment,
                              args.timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if "error" in record:
        raise SystemExit(f"long_run: {record['error']}")
    # the driver's command line is what reproduces it
    record["machine"]["command"] = " ".join(["long_run.py"] + sys.argv[1:])
    write_record(record, args.out)
    plot(record, args.out.with_suffix(".png"))
    print(f"{record['steps_per_s']} steps/s, "
          f"replica checks {record['replica_checks']} (mismatches "
          f"{record['replica_mismatches']}), RSS growth after warm-up at most "
          f"{record['max_growth_after_warmup_pct']} %", flush=True)
    for r in record["ranks"]:
        print(f"  rank {r['rank']}: {r['rss_at_warmup_end'] / 2**20:.1f} MiB at warm-up end, "
              f"{r['rss_last'] / 2**20:.1f} MiB last, growth {r['growth_after_warmup_pct']} % "
              f"(second half {r['growth_second_half_pct']} %), "
              f"sent {r['bytes_sent']} B", flush=True)


if __name__ == "__main__":
    main()
