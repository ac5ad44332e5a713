"""Data-parallel training of a byte-level transformer LM with dense or sparse gradient sync.

The model is ``examples/models.py``'s :class:`TransformerLM` in the configuration
``benchmarks/step_time.py`` measures (``transformer``: vocabulary 256, d_model 384, 6
pre-LayerNorm blocks of 6 heads, MLP ratio 4, sequence 128: 10,893,568 parameters in
102 leaves), trained on real text that ships with every Python: the CPython standard
library's own ``.py`` sources.

Corpus (deterministic, no download). Every ``.py`` file under
``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and ``__pycache__`` left out),
sorted by relative path, taken in that order until ``--corpus-mb`` MB (default 12; the
file that would pass the cap and all after it are left out). Every ``--val-every``-th
file of that list (index 0, 20, 40, ...) is held out for validation, the rest is
training text; the files of each split are concatenated. The split is by file, so no
validation byte was seen in training. The corpus depends on the Python version (the
sizes and SHA-256 of both splits are logged and written to ``--json``).

Data order. At step s, rank r trains on ``--batch-size`` windows of ``seq + 1`` bytes
starting at offsets drawn from ``numpy.random.default_rng([seed, s, r])``: the same
batches for every sync mode (and a different set per rank). Validation loss is the
mean next-byte cross entropy (nats per byte) over ``--val-windows`` fixed windows of
the validation text (drawn once from the seed), split over the ranks.

Optimizer: ``optax.chain(<sync>, clip_by_global_norm(1), adamw(schedule))``, the
schedule a linear warm-up to ``--lr`` over ``--warmup-steps`` then a cosine decay to
``--lr`` / 10 at ``--steps`` (or at ``--decay-steps``, then held); the same for every
sync mode unless ``--decay-steps`` says otherwise. The sync comes first, so
``opt_state[0]`` is its state (``last_stats``: the step's wire statistics).

``--sync-what adam_direction`` moves the sync behind a per-rank Adam, after the
clipping (``jss.adam_direction_sync(..., max_grad_norm=1.0)``: the clipping inside its
fused pass, as ``clip_by_global_norm(1)`` in front of it would clip; without ``--mask-momentum`` it is
``optax.scale_by_adam()``): each rank keeps Adam moments of its own gradient and the sync averages the ranks' Adam
directions (sparsely, with error feedback), then weight decay and the schedule apply.
With the default (``gradient``) Adam sees the synced sparse sum, whose rarely sent
coordinates arrive as spikes of many steps' gradient that Adam's second moment
shrinks: measured here (P = 4), the sparse runs then learn far slower than dense; see
``benchmarks/convergence.py``. ``--dense-warmup W`` syncs densely for the first W
steps and ``--density-ramp S`` runs DGC's ramp (1/4, 1/16, ... of the entries, S
steps each) before ``--density``: the sync's own ``warmup=`` phases.
``--mask-momentum restart`` (with ``adam_direction``) adds DGC's momentum factor masking:
``jss.adam_direction_sync(sync, momentum_masking="restart")`` zeroes Adam's first
moment (and restarts its bias correction) where a rank sends what it had held back.
``--lr-before-sync`` (with ``adam_direction``) scales each direction by the schedule
before the sync (``jss.adam_direction_sync(sync, learning_rate=schedule)``), so the
residual holds learning-rate-scaled steps, as error-feedback SGD does.

Each ``--log-every`` steps rank 0 prints the mean training loss of those steps (all
ranks), the validation loss, the bytes this rank sent per step and the median step
time; ``--json`` gets every interval and every step (train loss averaged over ranks,
bytes sent by each rank, the allreduce's result nnz: for ``oktopk`` the global count,
which ideally stays near k, and the step's wall time). At the end the script checks
that the parameters are bitwise identical on every rank and exits non-zero if not.

Run it (the seeded configuration ``benchmarks/convergence.py`` uses, per mode)::

    mpiexec -n 4 python -m mpi4py examples/train_lm.py --sync dense --steps 600 \\
        --json lm_dense.json
    mpiexec -n 4 python -m mpi4py examples/train_lm.py --sync topk --density 0.001 \\
        --selection threshold_reuse --steps 600
    mpiexec -n 2 python -m mpi4py examples/train_lm.py --steps 20 --dim 64 --layers 2 \\
        --heads 2 --seq 32 --log-every 10          # a tiny smoke run
    python examples/train_lm.py --steps 20          # a world of one rank
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import sysconfig
import time
from typing import Any

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


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the command line (``argv`` without the program name; None: sys.argv)."""
    p = argparse.ArgumentParser(
        description="Train a byte-level transformer LM on the Python standard library's "
                    "sources with dense or sparse gradient sync.")
    models.add_sync_arguments(p)
    models.add_warmup_argument(p)
    models.add_schedule_argument(p)
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--batch-size", type=int, default=2,
                   help="sequences per rank per step (default 2)")
    p.add_argument("--seq", type=int, default=models.LM_CONFIG["seq"],
                   help="sequence length in bytes (default 128)")
    p.add_argument("--dim", type=int, default=models.LM_CONFIG["dim"], help="d_model (384)")
    p.add_argument("--layers", type=int, default=models.LM_CONFIG["layers"],
                   help="transformer blocks (6)")
    p.add_argument("--heads", type=int, default=models.LM_CONFIG["heads"],
                   help="attention heads (6)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup-steps", type=int, default=30,
                   help="linear learning-rate warm-up (default 30)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decay (0.01)")
    p.add_argument("--corpus-mb", type=float, default=12.0,
                   help="corpus size cap in MB (default 12)")
    p.add_argument("--val-every", type=int, default=20,
                   help="every N-th file is validation text (default 20)")
    p.add_argument("--val-windows", type=int, default=128,
                   help="validation windows, split over the ranks (default 128)")
    p.add_argument("--log-every", type=int, default=25,
                   help="steps between validation and log lines (default 25)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial parameters, the batches and the validation "
                        "windows (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the metrics to PATH (rank 0)")
    args = p.parse_args(argv)
    if min(args.steps, args.batch_size, args.seq, args.log_every, args.val_windows) < 1:
        p.error("--steps, --batch-size, --seq, --log-every, --val-windows must be positive")
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    return args


# --------------------------------------------------------------------------- #
# Corpus
# --------------------------------------------------------------------------- #
def stdlib_sources(root: str | None = None) -> list[str]:
    """Sorted relative paths of the ``.py`` files of the standard library.

    Args:
      root: the library directory; None: ``sysconfig.get_paths()["stdlib"]``.
        ``site-packages``, ``dist-packages`` and ``__pycache__`` are skipped.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d not in ("site-packages", "dist-packages", "__pycache__")]
        found += [os.path.relpath(os.path.join(dirpath, f), root)
                  for f in filenames if f.endswith(".py")]
    return sorted(found)


def split_files(files: list[str], sizes: list[int], *, max_bytes: int,
                val_every: int) -> tuple[list[str], list[str]]:
    """The capped, split file lists: ``(train_files, val_files)``.

    Files are taken in the given order while the running total stays within
    ``max_bytes``; the i-th file taken is validation text when ``i % val_every == 0``.
    Deterministic, and every file lands in at most one split.
    """
    if val_every < 2:
        raise ValueError("val_every must be at least 2")
    train, val, total = [], [], 0
    for i, (name, size) in enumerate(zip(files, sizes)):
        if total + size > max_bytes:
            break
        total += size
        (val if i % val_every == 0 else train).append(name)
    return train, val


def build_corpus(max_bytes: int, val_every: int, root: str | None = None
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The training and validation text as uint8 arrays, and a description.

    Returns:
      ``(train, val, info)``; ``info`` has the root, file counts, byte counts and the
      SHA-256 of both splits.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    files = stdlib_sources(root)
    sizes = [os.path.getsize(os.path.join(root, f)) for f in files]
    train_files, val_files = split_files(files, sizes, max_bytes=max_bytes,
                                         val_every=val_every)

    def read(names):
        data = b"".join(open(os.path.join(root, n), "rb").read() for n in names)
        return np.frombuffer(data, dtype=np.uint8)

    train, val = read(train_files), read(val_files)
    info = {"root": root, "python": sys.version.split()[0], "max_bytes": max_bytes,
            "val_every": val_every, "train_files": len(train_files),
            "val_files": len(val_files), "train_bytes": int(train.size),
            "val_bytes": int(val.size),
            "train_sha256": hashlib.sha256(train.tobytes()).hexdigest(),
            "val_sha256": hashlib.sha256(val.tobytes()).hexdigest()}
    return train, val, info


def windows(text: np.ndarray, starts: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-byte targets (int32 ``(len(starts), seq)``) at ``starts``."""
    idx = starts[:, None] + np.arange(seq + 1)[None, :]
    tok = text[idx].astype(np.int32)
    return tok[:, :-1], tok[:, 1:]


def train_batch(text: np.ndarray, *, seed: int, step: int, rank: int, batch: int,
                seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s batch of step ``step`` (the same for every sync mode)."""
    starts = np.random.default_rng([seed, step, rank]).integers(0, text.size - seq - 1, batch)
    return windows(text, starts, seq)


def val_starts(text: np.ndarray, *, seed: int, count: int, seq: int) -> np.ndarray:
    """The fixed validation window offsets."""
    return np.random.default_rng([seed, 2**31 - 1]).integers(0, text.size - seq - 1, count)


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
def log(*a: Any) -> None:
    """Prints on rank 0 only, flushed."""
    if WORLD.Get_rank() == 0:
        print(*a, flush=True)


def make_optimizer(args: argparse.Namespace, sync) -> optax.GradientTransformation:
    """``chain(sync, clip_by_global_norm(1), adamw(warm-up + cosine))``."""
    schedule = models.lr_schedule(args, end_value=args.lr / 10)
    if args.sync_what == "adam_direction":
        # the clipping inside the fused Adam pass: chain(clip_by_global_norm(1), ...)
        # bit for bit, without the clipped gradient written and read back
        return optax.chain(*models.adam_then_sync(args, sync, schedule, args.weight_decay,
                                                  max_grad_norm=1.0))
    return optax.chain(models.dense_small_leaves(args, sync), optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, weight_decay=args.weight_decay))


def main(argv: list[str] | None = None) -> int:
    """Trains, logs, checks the replicas; returns the exit status."""
    jss.mpi.abort_on_error()
    jss.mpi.tune_host_allocator()
    args = parse_args(argv)
    rank, size = jss.comm_rank(), jss.comm_size()
    wall_start = time.perf_counter()

    train_text, val_text, corpus = build_corpus(int(args.corpus_mb * 1e6), args.val_every)
    cfg = dict(models.LM_CONFIG, dim=args.dim, layers=args.layers, heads=args.heads,
               seq=args.seq)
    model = models.TransformerLM(cfg)
    params = model.init(jax.random.key(args.seed),
                        jnp.zeros((1, args.seq), jnp.int32))["params"]
    num_params = int(ravel_pytree(params)[0].size)
    k = None if args.sync == "dense" else jss.planning.resolve_k(size=num_params, density=args.density,
                                                         k=None)
    log(f"{size} rank(s); {models.sync_label(args)}; {num_params:,} parameters in "
        f"{len(jax.tree_util.tree_leaves(params))} leaves; k = {k}")
    log(f"corpus: {corpus['train_files']} train files ({corpus['train_bytes']:,} B), "
        f"{corpus['val_files']} validation files ({corpus['val_bytes']:,} B) of Python "
        f"{corpus['python']}'s standard library")

    def loss_fn(p, x, y):
        return models.lm_loss(model.apply({"params": p}, x), y)

    tx = make_optimizer(args, models.make_sync(args))  # any warm-up runs inside the sync
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(p, s, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)  # the gradient sync happens here
        return optax.apply_updates(p, updates), s, loss, models.sync_stats(s)

    eval_loss = jax.jit(loss_fn)

    per_rank = -(-args.val_windows // size)
    starts = val_starts(val_text, seed=args.seed, count=per_rank * size, seq=args.seq)
    val_x, val_y = windows(val_text, starts[rank * per_rank:(rank + 1) * per_rank], args.seq)

    def validate(p) -> float:
        total = 0.0
        for i in range(0, per_rank, 16):
            total += float(eval_loss(p, val_x[i:i + 16], val_y[i:i + 16])) * len(val_x[i:i + 16])
        return WORLD.allreduce(total) / (per_rank * size)

    history: list[dict[str, Any]] = []
    per_step = {"train_loss": [], "bytes_sent": [], "result_nnz": [], "seconds": []}
    pending_loss, pending_stats, pending_time = [], [], []
    val0 = validate(params)
    history.append({"step": 0, "train_loss": None, "val_loss": val0, "seconds": 0.0})
    log(f"step {0:5d} | val {val0:.4f}")
    train_seconds = 0.0
    for step in range(1, args.steps + 1):
        x, y = train_batch(train_text, seed=args.seed, step=step, rank=rank,
                           batch=args.batch_size, seq=args.seq)
        t0 = time.perf_counter()
        params, opt_state, loss, stats = jax.block_until_ready(
            train_step(params, opt_state, x, y))
        dt = time.perf_counter() - t0
        train_seconds += dt
        pending_loss.append(loss)
        pending_stats.append(stats)
        pending_time.append(dt)
        if step % args.log_every == 0 or step == args.steps:
            losses = np.mean(np.stack(WORLD.allgather(np.asarray(jnp.stack(pending_loss)))),
                             axis=0)
            stats = np.asarray(jnp.stack(pending_stats))  # (steps, fields) of this rank
            sent = np.stack(WORLD.allgather(stats[:, 0].astype(np.int64)), axis=1)
            times = np.median(np.stack(WORLD.allgather(np.asarray(pending_time))), axis=0)
            per_step["train_loss"] += [float(v) for v in losses]
            per_step["bytes_sent"] += sent.tolist()
            per_step["result_nnz"] += [int(v) for v in stats[:, 3]]
            per_step["seconds"] += [round(float(t), 5) for t in times]
            val = validate(params)
            entry = {"step": step, "train_loss": float(losses.mean()), "val_loss": val,
                     "bytes_sent_per_step": float(sent.mean()),
                     "median_step_s": float(np.median(times)),
                     "seconds": train_seconds}
            history.append(entry)
            log(f"step {step:5d} | train {entry['train_loss']:.4f} | val {val:.4f} | "
                f"sent {entry['bytes_sent_per_step'] / 1e3:9.1f} kB/step | "
                f"{1e3 * entry['median_step_s']:7.1f} ms/step")
            pending_loss, pending_stats, pending_time = [], [], []

    digest = models.params_digest(params)
    identical = len(set(WORLD.allgather(digest))) == 1
    log(f"parameters bitwise identical on all ranks: {'yes' if identical else 'NO'}")
    timed = per_step["seconds"][1:] or per_step["seconds"]
    result = {
        "example": "train_lm", "ranks": size, "config": vars(args),
        "warmup_phases": [list(ph) for ph in models.warmup_phases(args)], "model": cfg,
        "num_params": num_params, "leaves": len(jax.tree_util.tree_leaves(params)), "k": k,
        "sync": models.sync_label(args), "corpus": corpus,
        "history": history, "per_step": per_step,
        "final": {"val_loss": history[-1]["val_loss"], "train_loss": history[-1]["train_loss"],
                  "median_step_s": float(np.median(timed)),
                  "bytes_sent_per_step": float(np.mean(per_step["bytes_sent"])),
                  "replicas_identical": identical,
                  # two runs that should be the same training bit for bit (e.g. another
                  # index encoding) compare this
                  "params_sha256": digest,
                  "wall_s": time.perf_counter() - wall_start},
    }
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    log(f"final val loss {result['final']['val_loss']:.4f}; median step "
        f"{1e3 * result['final']['median_step_s']:.1f} ms; wall "
        f"{result['final']['wall_s']:.1f} s; {'OK' if identical else 'FAILED'}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
