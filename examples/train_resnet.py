"""Data-parallel training of a ResNet-style CNN with dense or sparse gradient sync.

The model is ``examples/models.py``'s :class:`ResNet` in the configuration
``benchmarks/step_time.py`` measures (``cnn``: stride-2 stem, 3 stages of 32, 64, 128
channels with 3 residual blocks each, conv + LayerNorm twice per block, 32x32x3
inputs, 10 classes: 1,085,706 parameters in 80 small leaves), so its per-step times
on the emulated network are those of this very model and input shape.

Data: scikit-learn's bundled 8x8 digits (1,797 images, 10 classes, installed with
scikit-learn: nothing is downloaded; the ``fetch_*`` data sets would download, so
none of them is used). It is the only labelled image set available offline here.
To give the 32x32x3 CNN its input shape, each image is upscaled 4x (bilinear) and
its grey channel repeated three times; pixels are standardized with the training
set's mean and standard deviation. Split 80/20, stratified, seeded (1,437 training
and 360 test images). Augmentation (training only): every image is shifted by a
random offset of up to ``--shift`` pixels (default 2, half an original pixel) in
each direction, padded with the background value; at 8x8 the digits fill their box,
so large shifts cut strokes off (measured, one process, batch 64, 100 steps of Adam
5e-4: shift 2 reached 97.2% test accuracy, shift 4 92.5%).

Data order: each rank trains on its own shard (every P-th training image),
reshuffled every epoch from ``(seed, epoch, rank)``; the shifts come from ``(seed,
step, rank)``. The same for every sync mode.

Optimizer: ``optax.chain(<sync>, adamw(schedule, weight_decay=1e-4))``, the schedule
a linear warm-up to ``--lr`` (5e-4) over ``--warmup-steps``, then a cosine decay to 0
at ``--steps`` (or at ``--decay-steps``, then held); the same for every mode. (SGD with momentum 0.9 at 0.01-0.05 did not
leave chance level in 60 steps with this LayerNorm ResNet; Adam at 1e-3 neither.)

``--sync-what adam_direction`` moves the sync behind a per-rank Adam
(``jss.adam_direction_sync``; without ``--mask-momentum`` it is
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

Each ``--log-every`` steps rank 0 prints the mean training loss of those steps (all
ranks), the test loss and accuracy (the whole test set, split over the ranks), the
bytes this rank sent per step and the median step time; ``--json`` gets those and
every step's train loss, bytes per rank, result nnz and time. At the end the
parameters must be bitwise identical on every rank (non-zero exit otherwise).

Run it (the seeded configuration ``benchmarks/convergence.py`` uses, per mode)::

    mpiexec -n 4 python -m mpi4py examples/train_resnet.py --sync dense --steps 400
    mpiexec -n 4 python -m mpi4py examples/train_resnet.py --sync oktopk --density 0.001
    mpiexec -n 2 python -m mpi4py examples/train_resnet.py --steps 30 --widths 8 16 \\
        --blocks 1 --log-every 10                     # a tiny smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from mpi4py import MPI
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (examples/models.py)

import jax_sparse_sync as jss  # noqa: E402

WORLD = MPI.COMM_WORLD  # host-side bookkeeping; the library syncs on its own clone


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the command line (``argv`` without the program name; None: sys.argv)."""
    p = argparse.ArgumentParser(
        description="Train a ResNet-style CNN on upscaled digits with dense or sparse "
                    "gradient sync.")
    models.add_sync_arguments(p)
    models.add_warmup_argument(p)
    models.add_schedule_argument(p)
    p.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    p.add_argument("--batch-size", type=int, default=16,
                   help="images per rank per step (default 16)")
    p.add_argument("--widths", type=int, nargs="+", default=list(models.CNN_CONFIG["widths"]),
                   help="channels per stage (default 32 64 128)")
    p.add_argument("--blocks", type=int, default=models.CNN_CONFIG["blocks"],
                   help="residual blocks per stage (default 3)")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (default 5e-4)")
    p.add_argument("--warmup-steps", type=int, default=30,
                   help="linear learning-rate warm-up (default 30)")
    p.add_argument("--shift", type=int, default=2,
                   help="largest random shift in pixels of the 32x32 image (default 2)")
    p.add_argument("--log-every", type=int, default=25,
                   help="steps between evaluations and log lines (default 25)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the split, the initial parameters, the shuffling and the "
                        "shifts (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the metrics to PATH (rank 0)")
    args = p.parse_args(argv)
    if min(args.steps, args.batch_size, args.log_every, args.blocks) < 1 or args.shift < 0:
        p.error("--steps, --batch-size, --log-every, --blocks must be positive")
    return args


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #
def load_data(seed: int, image: int = 32) -> tuple[np.ndarray, ...]:
    """Digits upscaled to ``image`` x ``image`` x 3, standardized, split 80/20.

    Returns:
      ``(x_train, y_train, x_test, y_test)``: float32 NHWC images, int32 labels.
    """
    digits = load_digits()
    small = (digits.images / 16.0).astype(np.float32)  # (n, 8, 8), pixels 0..16
    big = np.asarray(jax.image.resize(small, (len(small), image, image), "bilinear"))
    images = np.repeat(big[..., None], 3, axis=-1)
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=seed)
    mean, std = x_train.mean(), x_train.std()
    return ((x_train - mean) / std).astype(np.float32), y_train, \
        ((x_test - mean) / std).astype(np.float32), y_test


def shift_images(x: np.ndarray, rng: np.random.Generator, shift: int) -> np.ndarray:
    """Each image moved by its own random offset in [-shift, shift]^2, zero padded."""
    if shift == 0:
        return x
    n, h, w, _ = x.shape
    padded = np.pad(x, ((0, 0), (shift, shift), (shift, shift), (0, 0)),
                    constant_values=float(x.min()))
    dy, dx = rng.integers(0, 2 * shift + 1, (2, n))
    return np.stack([padded[i, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def train_batch(x: np.ndarray, y: np.ndarray, *, seed: int, step: int, rank: int,
                batch: int, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s batch (1-based) from this rank's shard ``(x, y)``, shifted."""
    per_epoch = len(x) // batch
    epoch, i = divmod(step - 1, per_epoch)
    order = np.random.default_rng([seed, epoch, rank]).permutation(len(x))
    idx = order[i * batch:(i + 1) * batch]
    return shift_images(x[idx], np.random.default_rng([seed, step, rank, 1]), shift), y[idx]


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
def log(*a: Any) -> None:
    """Prints on rank 0 only, flushed."""
    if WORLD.Get_rank() == 0:
        print(*a, flush=True)


def make_optimizer(args: argparse.Namespace, sync) -> optax.GradientTransformation:
    """``chain(sync, adamw(warm-up + cosine, weight_decay=1e-4))``."""
    schedule = models.lr_schedule(args, end_value=0.0)
    if args.sync_what == "adam_direction":
        return optax.chain(*models.adam_then_sync(args, sync, schedule, 1e-4))
    return optax.chain(models.dense_small_leaves(args, sync), optax.adamw(schedule, weight_decay=1e-4))


def main(argv: list[str] | None = None) -> int:
    """Trains, logs, checks the replicas; returns the exit status."""
    jss.mpi.abort_on_error()
    jss.mpi.tune_host_allocator()
    args = parse_args(argv)
    rank, size = jss.comm_rank(), jss.comm_size()
    wall_start = time.perf_counter()

    x_train, y_train, x_test, y_test = load_data(args.seed)
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    if len(x_train) // size < args.batch_size:
        raise SystemExit("error: a rank's shard holds no full batch; lower --batch-size")
    # every rank steps through the smallest shard's length, so epochs stay aligned
    shard_len = (len(x_train) // size // args.batch_size) * args.batch_size
    x_shard, y_shard = x_shard[:shard_len], y_shard[:shard_len]
    x_eval, y_eval = x_test[rank::size], y_test[rank::size]

    cfg = dict(models.CNN_CONFIG, widths=tuple(args.widths), blocks=args.blocks)
    model = models.ResNet(cfg)
    params = model.init(jax.random.key(args.seed), x_train[:1])["params"]
    num_params = int(ravel_pytree(params)[0].size)
    leaves = len(jax.tree_util.tree_leaves(params))
    k = None if args.sync == "dense" else jss.planning.resolve_k(size=num_params, density=args.density,
                                                         k=None)
    log(f"{size} rank(s); {models.sync_label(args)}; {num_params:,} parameters in "
        f"{leaves} leaves; k = {k}")
    log(f"digits: {len(x_train)} train / {len(x_test)} test images, 32x32x3; "
        f"{len(x_shard) // args.batch_size} steps per epoch of batch {args.batch_size} per rank")

    def loss_fn(p, x, y):
        logits = model.apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    tx = make_optimizer(args, models.make_sync(args))  # any warm-up runs inside the sync
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(p, s, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)  # the gradient sync happens here
        return optax.apply_updates(p, updates), s, loss, models.sync_stats(s)

    @jax.jit
    def eval_fn(p, x, y):
        logits = model.apply({"params": p}, x)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        return losses.sum(), jnp.sum(jnp.argmax(logits, -1) == y)


    def evaluate(p) -> tuple[float, float]:
        loss_sum, correct = eval_fn(p, x_eval, y_eval) if len(x_eval) else (0.0, 0)
        tot_loss, tot_correct = WORLD.allreduce(np.array([float(loss_sum), float(correct)]))
        return tot_loss / len(x_test), 100.0 * tot_correct / len(x_test)

    history: list[dict[str, Any]] = []
    per_step = {"train_loss": [], "bytes_sent": [], "result_nnz": [], "seconds": []}
    pending_loss, pending_stats, pending_time = [], [], []
    test_loss, acc = evaluate(params)
    history.append({"step": 0, "train_loss": None, "test_loss": test_loss,
                    "test_accuracy": acc, "seconds": 0.0})
    log(f"step {0:5d} | test loss {test_loss:.4f} | acc {acc:6.2f}%")
    train_seconds = 0.0
    for step in range(1, args.steps + 1):
        x, y = train_batch(x_shard, y_shard, seed=args.seed, step=step, rank=rank,
                           batch=args.batch_size, shift=args.shift)
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
            stats = np.asarray(jnp.stack(pending_stats))
            sent = np.stack(WORLD.allgather(stats[:, 0].astype(np.int64)), axis=1)
            times = np.median(np.stack(WORLD.allgather(np.asarray(pending_time))), axis=0)
            per_step["train_loss"] += [float(v) for v in losses]
            per_step["bytes_sent"] += sent.tolist()
            per_step["result_nnz"] += [int(v) for v in stats[:, 3]]
            per_step["seconds"] += [round(float(t), 5) for t in times]
            test_loss, acc = evaluate(params)
            entry = {"step": step, "train_loss": float(losses.mean()), "test_loss": test_loss,
                     "test_accuracy": acc, "bytes_sent_per_step": float(sent.mean()),
                     "median_step_s": float(np.median(times)), "seconds": train_seconds}
            history.append(entry)
            log(f"step {step:5d} | train {entry['train_loss']:.4f} | test loss "
                f"{test_loss:.4f} | acc {acc:6.2f}% | sent "
                f"{entry['bytes_sent_per_step'] / 1e3:8.1f} kB/step | "
                f"{1e3 * entry['median_step_s']:6.1f} ms/step")
            pending_loss, pending_stats, pending_time = [], [], []

    digest = models.params_digest(params)
    identical = len(set(WORLD.allgather(digest))) == 1
    log(f"parameters bitwise identical on all ranks: {'yes' if identical else 'NO'}")
    timed = per_step["seconds"][1:] or per_step["seconds"]
    result = {
        "example": "train_resnet", "ranks": size, "config": vars(args),
        "warmup_phases": [list(ph) for ph in models.warmup_phases(args)],
        "model": dict(cfg, widths=list(cfg["widths"])), "num_params": num_params,
        "leaves": leaves, "k": k, "sync": models.sync_label(args),
        "data": {"name": "sklearn digits, 4x bilinear upscale to 32x32, grey repeated x3",
                 "train": len(x_train), "test": len(x_test), "shift": args.shift},
        "history": history, "per_step": per_step,
        "final": {"test_accuracy": history[-1]["test_accuracy"],
                  "test_loss": history[-1]["test_loss"],
                  "train_loss": history[-1]["train_loss"],
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
    log(f"final test accuracy {result['final']['test_accuracy']:.2f}%; median step "
        f"{1e3 * result['final']['median_step_s']:.1f} ms; wall "
        f"{result['final']['wall_s']:.1f} s; {'OK' if identical else 'FAILED'}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
