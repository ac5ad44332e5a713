"""Data-parallel training with dense or sparse gradient sync: the loop of every model.

``--model lm`` trains ``examples/train_lm.py``'s byte-level transformer LM on the Python
standard library's sources, ``--model resnet`` ``examples/train_resnet.py``'s
ResNet-style CNN on upscaled digits; each of those holds its model's data, options and
optimizer (and runs as a script of its own: ``train_lm.py ...`` is ``train.py --model
lm ...``), this module what they share: the common options, the jitted step, the loop,
the logs, the ``--json`` metrics and the replica check.

The sync and its warm-up are options (``examples/models.py``'s ``add_sync_arguments``
and ``add_warmup_argument``; ``--help`` says each). ``--sync-what adam_direction`` syncs
each rank's own Adam direction (``jss.adam_direction_sync``) instead of the gradient:
with the gradient, Adam sees the synced sparse sum, whose rarely sent coordinates arrive
as spikes of many steps' gradient that its second moment shrinks, and the sparse runs
learn far slower than dense (measured, P = 4: ``benchmarks/convergence.py``).

Each ``--log-every`` steps rank 0 prints the mean training loss of those steps (all
ranks), the model's evaluation (split over the ranks), the bytes this rank sent per step
and the median step time; ``--json`` gets every interval and every step (train loss
averaged over ranks, bytes sent by each rank, the allreduce's result nnz: for
``oktopk`` the global count, which ideally stays near k, and the step's wall time). At
the end the parameters must be bitwise identical on every rank (non-zero exit
otherwise). The sync comes first in the optimizer's ``optax.chain``, so
``opt_state[0]`` is its state (``last_stats``: the step's wire statistics).

``--every H`` trains with DiLoCo's outer step instead (``examples/models.py``'s
``add_outer_step_arguments``): the model's optimizer runs on each rank with no sync,
and every H steps ``jss.diloco`` averages the parameters' change since the last outer
step with ``--outer-sync`` (``dense``, ``dense_bf16``, ``topk``, ``chunked_topk``) and
applies it with the outer optimizer (``--outer-lr``, ``--outer-momentum``); the updates
are applied with ``jss.diloco_apply_updates``, so after an outer step every rank holds
the shared parameters bit for bit. The steps with no outer step run a program of their
own, without the outer step's conditional (``tx.inner_update``, where
``tx.inner_only(count)``): the inner optimizer's step as it runs alone. ``--fragments
F`` (Streaming DiLoCo) syncs 1/F of the model every H/F steps; ``--delay`` and ``--mix``
merge each fragment later. The evaluations, the replica check and ``params_sha256`` are
then of the shared parameters (the model of the last outer step: log every multiple of
H to see the current one); the bytes of a step are zero between outer steps, and
``final.bytes_per_rank`` is what a rank sent in the whole run.

Run it::

    mpiexec -n 4 python -m mpi4py examples/train.py --model lm --sync topk --density 0.01
    mpiexec -n 2 python -m mpi4py examples/train.py --model resnet --steps 30 \\
        --widths 8 16 --blocks 1 --log-every 10          # a tiny smoke run
    mpiexec -n 2 python -m mpi4py examples/train.py --model lm --every 30 \\
        --outer-sync topk --outer-density 0.01 --log-every 30   # DiLoCo, sparse outer step
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import resource
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (examples/models.py)

import jax_sparse_sync as jss  # noqa: E402

WORLD = MPI.COMM_WORLD  # host-side bookkeeping; the library syncs on its own clone
#: ``--model`` -> the example module that holds the model's data, options and optimizer
MODELS = {"lm": "train_lm", "resnet": "train_resnet"}


def base_parser(description: str, *, steps: int, batch_size: int, batch_what: str, lr: str,
                log_what: str, seed_what: str) -> argparse.ArgumentParser:
    """The options every model takes (the sync's, the schedule's, the loop's); the
    model adds its own."""
    p = argparse.ArgumentParser(description=description)
    models.add_sync_arguments(p)
    models.add_warmup_argument(p)
    models.add_schedule_argument(p)
    models.add_outer_step_arguments(p)
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument("--batch-size", type=int, default=batch_size,
                   help=f"{batch_what} per rank per step (default {batch_size})")
    p.add_argument("--lr", type=float, default=float(lr), help=f"peak learning rate (default {lr})")
    p.add_argument("--warmup-steps", type=int, default=30,
                   help="linear learning-rate warm-up (default 30)")
    p.add_argument("--log-every", type=int, default=25,
                   help=f"steps between {log_what} and log lines (default 25)")
    p.add_argument("--seed", type=int, default=0, help=f"seed of {seed_what} (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the metrics to PATH (rank 0)")
    return p


def log(*a: Any) -> None:
    """Prints on rank 0 only, flushed."""
    if WORLD.Get_rank() == 0:
        print(*a, flush=True)


@dataclasses.dataclass
class Task:
    """What the loop needs of one model, built by the example's ``setup(args, rank, size)``."""

    name: str                       # the metrics' "example"
    model: dict                     # the model's configuration, as the metrics record it
    params: Any                     # the initial parameters (the same on every rank)
    loss_fn: Callable               # (params, x, y) -> mean loss
    batch: Callable                 # step (1-based) -> this rank's (x, y)
    evaluate: Callable              # params -> {metric: value} over all ranks
    describe: str                   # the log line of the data
    data: dict                      # the metrics' description of the data
    final: tuple                    # the metrics "final" reports before train_loss
    eval_format: str                # a log line's evaluation, formatted with the metrics
    final_format: str               # the last log line's head, formatted with "final"
    widths: tuple = (9, 7)          # a log line's widths of kB/step and ms/step


def log_interval(task: Task, params, step: int, pending: tuple, per_step: dict,
                 train_seconds: float) -> dict[str, Any]:
    """The steps since the last log line: every rank's losses, bytes and times added to
    ``per_step``, the evaluation, a log line; returns the history entry."""
    pending_loss, pending_stats, pending_time = pending
    losses = np.mean(np.stack(WORLD.allgather(np.asarray(jnp.stack(pending_loss)))), axis=0)
    stats = np.asarray(jnp.stack(pending_stats))  # (steps, fields) of this rank
    sent = np.stack(WORLD.allgather(stats[:, 0].astype(np.int64)), axis=1)
    times = np.median(np.stack(WORLD.allgather(np.asarray(pending_time))), axis=0)
    per_step["train_loss"] += [float(v) for v in losses]
    per_step["bytes_sent"] += sent.tolist()
    per_step["result_nnz"] += [int(v) for v in stats[:, 3]]
    per_step["seconds"] += [round(float(t), 5) for t in times]
    metrics = task.evaluate(params)
    entry = {"step": step, "train_loss": float(losses.mean()), **metrics,
             "bytes_sent_per_step": float(sent.mean()),
             "median_step_s": float(np.median(times)), "seconds": train_seconds}
    kb, ms = task.widths
    log(f"step {step:5d} | train {entry['train_loss']:.4f} | "
        f"{task.eval_format.format(**metrics)} | "
        f"sent {entry['bytes_sent_per_step'] / 1e3:{kb}.1f} kB/step | "
        f"{1e3 * entry['median_step_s']:{ms}.1f} ms/step")
    return entry


def state_memory(opt_state) -> dict[str, Any]:
    """The optimizer state's bytes on each rank (its ``jax.Array`` leaves, the mean over
    the ranks: in all, and by part: Adam's ``moments`` (``mu``, ``nu``), the syncs'
    ``residuals``, the ``other`` leaves) and the ranks' largest peak resident memory
    (``ru_maxrss``: the whole process, model, data and JAX included)."""
    parts = {"moments": 0, "residuals": 0, "other": 0}
    for path, x in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        if hasattr(x, "nbytes"):
            name = jax.tree_util.keystr(path)
            part = ("moments" if ".mu" in name or ".nu" in name
                    else "residuals" if "residual" in name else "other")
            parts[part] += int(x.nbytes)
    mean = {part: float(np.mean(WORLD.allgather(b))) for part, b in parts.items()}
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    return {"state_bytes_per_rank": sum(mean.values()), "state_bytes_by_part": mean,
            "peak_rss_mb": max(WORLD.allgather(peak_kb)) / 1024}


def run(example, argv: list[str] | None = None) -> int:
    """Trains ``example``'s model (its ``parse_args``, ``setup``, ``make_optimizer``),
    logs, checks the replicas; returns the exit status."""
    jss.mpi.abort_on_error()  # (glibc's allocator: tuned by `import jax_sparse_sync` itself)
    args = example.parse_args(argv)
    rank, size = jss.comm_rank(), jss.comm_size()
    wall_start = time.perf_counter()
    task = example.setup(args, rank, size)
    params = task.params
    num_params = int(ravel_pytree(params)[0].size)
    leaves = len(jax.tree_util.tree_leaves(params))
    label = models.outer_sync_label(args) if args.every else models.sync_label(args)
    k = None if args.sync == "dense" or args.every else jss.planning.resolve_k(
        size=num_params, density=args.density, k=None)
    log(f"{size} rank(s); {label}; {num_params:,} parameters in {leaves} leaves; k = {k}")
    log(task.describe)

    if args.every:  # DiLoCo: the model's optimizer runs locally, the outer step syncs
        tx = models.make_diloco(args, example.make_optimizer(args, optax.identity()))
        apply = jss.diloco_apply_updates  # merged leaves set to the shared ones, exactly
    else:
        tx = example.make_optimizer(args, models.make_sync(args))  # any warm-up in the sync
        apply = lambda p, updates, s: optax.apply_updates(p, updates)  # noqa: E731
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(p, s, x, y):
        loss, grads = jax.value_and_grad(task.loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)  # the gradient (or outer step's) sync is here
        return apply(p, updates, s), s, loss, models.sync_stats(s)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def inner_step(p, s, x, y):  # --every: a step with no outer step, compiled without it
        loss, grads = jax.value_and_grad(task.loss_fn)(p, x, y)
        updates, s = tx.inner_update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss, models.sync_stats(s)

    history: list[dict[str, Any]] = []
    per_step = {"train_loss": [], "bytes_sent": [], "result_nnz": [], "seconds": []}
    pending = ([], [], [])  # this rank's losses, statistics and times since the last log
    metrics = task.evaluate(params)
    history.append({"step": 0, "train_loss": None, **metrics, "seconds": 0.0})
    log(f"step {0:5d} | " + task.eval_format.format(**metrics))
    train_seconds = 0.0
    for step in range(1, args.steps + 1):
        x, y = task.batch(step)
        run_step = inner_step if args.every and tx.inner_only(step - 1) else train_step
        t0 = time.perf_counter()
        params, opt_state, loss, stats = jax.block_until_ready(
            run_step(params, opt_state, x, y))
        dt = time.perf_counter() - t0
        train_seconds += dt
        for seen, value in zip(pending, (loss, stats, dt)):
            seen.append(value)
        if step % args.log_every == 0 or step == args.steps:
            history.append(log_interval(task, models.shared_params(params, opt_state), step,
                                        pending, per_step, train_seconds))
            pending = ([], [], [])

    memory = state_memory(opt_state)
    digest = models.params_digest(models.shared_params(params, opt_state))
    identical = len(set(WORLD.allgather(digest))) == 1
    log(f"parameters bitwise identical on all ranks: {'yes' if identical else 'NO'}")
    timed = per_step["seconds"][1:] or per_step["seconds"]
    result = {
        "example": task.name, "ranks": size, "config": vars(args),
        "warmup_phases": [] if args.every else [list(ph) for ph in models.warmup_phases(args)],
        "model": task.model,
        "num_params": num_params, "leaves": leaves, "k": k, "sync": label,
        "every": args.every, "fragments": args.fragments,
        **task.data, "history": history, "per_step": per_step,
        "final": {**{m: history[-1][m] for m in task.final},
                  "train_loss": history[-1]["train_loss"],
                  "median_step_s": float(np.median(timed)),
                  "bytes_sent_per_step": float(np.mean(per_step["bytes_sent"])),
                  # what a rank sent in the whole run (mean over the ranks)
                  "bytes_per_rank": float(np.sum(per_step["bytes_sent"], axis=0).mean()),
                  "replicas_identical": identical,
                  **memory,
                  # two runs that should be the same training bit for bit (e.g. another
                  # index encoding) compare this
                  "params_sha256": digest,
                  "wall_s": time.perf_counter() - wall_start},
    }
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    final = result["final"]
    log(f"{task.final_format.format(**final)}; median step "
        f"{1e3 * final['median_step_s']:.1f} ms; wall "
        f"{final['wall_s']:.1f} s; {'OK' if identical else 'FAILED'}")
    return 0 if identical else 1


def main(argv: list[str] | None = None) -> int:
    """``--model lm|resnet``, then that example's own options."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model", choices=tuple(MODELS), required=True,
                   help="lm: examples/train_lm.py's transformer; resnet: train_resnet.py's CNN")
    known, rest = p.parse_known_args(argv)
    return importlib.import_module(MODELS[known.model]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
