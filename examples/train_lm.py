"""The byte-level transformer LM of ``examples/train.py --model lm``, on the Python
standard library's sources: its data, options and optimizer (the loop is ``train.py``'s).

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
sync mode unless ``--decay-steps`` says otherwise. ``--sync-what adam_direction``
(``train.py`` describes it and the other warm-up options) puts the clipping inside the
sync's fused Adam pass (``jss.adam_direction_sync(..., max_grad_norm=1.0)``), as
``clip_by_global_norm(1)`` in front of it would clip.

``--every H`` wraps that optimizer, with no sync in it, in ``jss.diloco`` (DiLoCo's
outer step every H steps through ``--outer-sync``; ``train.py`` describes the options):
the clipping and AdamW are the inner optimizer, run on each rank's own gradients.

The log and ``--json`` carry the validation loss (``val_loss``) and the corpus.

Run it (the seeded configuration ``benchmarks/convergence.py`` uses, per mode)::

    mpiexec -n 4 python -m mpi4py examples/train_lm.py --sync dense --steps 600 \\
        --json lm_dense.json
    mpiexec -n 4 python -m mpi4py examples/train_lm.py --sync topk --density 0.001 \\
        --selection threshold_reuse --steps 600
    mpiexec -n 2 python -m mpi4py examples/train_lm.py --steps 20 --dim 64 --layers 2 \\
        --heads 2 --seq 32 --log-every 10          # a tiny smoke run
    python examples/train_lm.py --steps 20          # a world of one rank
    mpiexec -n 2 python -m mpi4py examples/train_lm.py --every 30 --outer-sync dense_bf16 \\
        --steps 600 --log-every 30                  # DiLoCo, an outer step every 30 steps
    mpiexec -n 2 python -m mpi4py examples/train_lm.py --every 30 --outer-sync chunked_topk \\
        --outer-density 0.01 --outer-bits 2 --steps 600 --log-every 30   # SparseLoCo
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import sysconfig
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (examples/models.py)
import train  # noqa: E402  (examples/train.py: the loop)


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the command line (``argv`` without the program name; None: sys.argv)."""
    p = train.base_parser(
        "Train a byte-level transformer LM on the Python standard library's sources with "
        "dense or sparse gradient sync.", steps=300, batch_size=2, batch_what="sequences",
        lr="1e-3", log_what="validation",
        seed_what="the initial parameters, the batches and the validation windows")
    for size, what in (("seq", "sequence length in bytes"), ("dim", "d_model"),
                       ("layers", "transformer blocks"), ("heads", "attention heads")):
        p.add_argument(f"--{size}", type=int, default=models.LM_CONFIG[size],
                       help=f"{what} (default {models.LM_CONFIG[size]})")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decay (0.01)")
    p.add_argument("--corpus-mb", type=float, default=12.0,
                   help="corpus size cap in MB (default 12)")
    p.add_argument("--val-every", type=int, default=20,
                   help="every N-th file is validation text (default 20)")
    p.add_argument("--val-windows", type=int, default=128,
                   help="validation windows, split over the ranks (default 128)")
    args = p.parse_args(argv)
    if args.every < 0:
        p.error("--every must be >= 0 (0: sync every step with --sync)")
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
def make_optimizer(args: argparse.Namespace, sync) -> optax.GradientTransformation:
    """``chain(sync, clip_by_global_norm(1), adamw(warm-up + cosine))``; ``--sync sharded``:
    ``sharded_sync(adamw(warm-up + cosine), max_grad_norm=1)``."""
    schedule = models.lr_schedule(args, end_value=args.lr / 10)
    if args.sync == "sharded":  # AdamW inside the sync, on each rank's region
        return models.sharded_optimizer(
            args, optax.adamw(schedule, weight_decay=args.weight_decay), max_grad_norm=1.0)
    if args.sync_what == "adam_direction":
        # the clipping inside the fused Adam pass: chain(clip_by_global_norm(1), ...)
        # bit for bit, without the clipped gradient written and read back
        return optax.chain(*models.adam_then_sync(args, sync, schedule, args.weight_decay,
                                                  max_grad_norm=1.0))
    return optax.chain(models.dense_small_leaves(args, sync), optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, weight_decay=args.weight_decay))


def setup(args: argparse.Namespace, rank: int, size: int) -> train.Task:
    """The corpus, the model and its initial parameters, the batches and the validation."""
    train_text, val_text, corpus = build_corpus(int(args.corpus_mb * 1e6), args.val_every)
    cfg = dict(models.LM_CONFIG, dim=args.dim, layers=args.layers, heads=args.heads,
               seq=args.seq)
    model = models.TransformerLM(cfg)
    params = model.init(jax.random.key(args.seed),
                        jnp.zeros((1, args.seq), jnp.int32))["params"]

    def loss_fn(p, x, y):
        return models.lm_loss(model.apply({"params": p}, x), y)

    eval_loss = jax.jit(loss_fn)
    per_rank = -(-args.val_windows // size)
    starts = val_starts(val_text, seed=args.seed, count=per_rank * size, seq=args.seq)
    val_x, val_y = windows(val_text, starts[rank * per_rank:(rank + 1) * per_rank], args.seq)

    def validate(p) -> dict[str, float]:
        total = 0.0
        for i in range(0, per_rank, 16):
            total += float(eval_loss(p, val_x[i:i + 16], val_y[i:i + 16])) * len(val_x[i:i + 16])
        return {"val_loss": train.WORLD.allreduce(total) / (per_rank * size)}

    return train.Task(
        name="train_lm", model=cfg, params=params, loss_fn=loss_fn,
        batch=lambda step: train_batch(train_text, seed=args.seed, step=step, rank=rank,
                                       batch=args.batch_size, seq=args.seq),
        evaluate=validate,
        describe=f"corpus: {corpus['train_files']} train files ({corpus['train_bytes']:,} B), "
                 f"{corpus['val_files']} validation files ({corpus['val_bytes']:,} B) of "
                 f"Python {corpus['python']}'s standard library",
        data={"corpus": corpus}, final=("val_loss",), eval_format="val {val_loss:.4f}",
        final_format="final val loss {val_loss:.4f}", widths=(9, 7))


def main(argv: list[str] | None = None) -> int:
    """Trains, logs, checks the replicas; returns the exit status."""
    return train.run(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
