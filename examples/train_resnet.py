"""The ResNet-style CNN of ``examples/train.py --model resnet``, on upscaled digits: its
data, options and optimizer (the loop is ``train.py``'s).

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

``--sync-what adam_direction`` and the warm-up options: see ``train.py``.

The log and ``--json`` carry the test loss and accuracy (``test_loss``,
``test_accuracy``: the whole test set, split over the ranks) and the data's description.

Run it (the seeded configuration ``benchmarks/convergence.py`` uses, per mode)::

    mpiexec -n 4 python -m mpi4py examples/train_resnet.py --sync dense --steps 400
    mpiexec -n 4 python -m mpi4py examples/train_resnet.py --sync oktopk --density 0.001
    mpiexec -n 2 python -m mpi4py examples/train_resnet.py --steps 30 --widths 8 16 \\
        --blocks 1 --log-every 10                     # a tiny smoke run
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (examples/models.py)
import train  # noqa: E402  (examples/train.py: the loop)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the command line (``argv`` without the program name; None: sys.argv)."""
    p = train.base_parser(
        "Train a ResNet-style CNN on upscaled digits with dense or sparse gradient sync.",
        steps=400, batch_size=16, batch_what="images", lr="5e-4", log_what="evaluations",
        seed_what="the split, the initial parameters, the shuffling and the shifts")
    p.add_argument("--widths", type=int, nargs="+", default=list(models.CNN_CONFIG["widths"]),
                   help="channels per stage (default 32 64 128)")
    p.add_argument("--blocks", type=int, default=models.CNN_CONFIG["blocks"],
                   help="residual blocks per stage (default 3)")
    p.add_argument("--shift", type=int, default=2,
                   help="largest random shift in pixels of the 32x32 image (default 2)")
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
def make_optimizer(args: argparse.Namespace, sync) -> optax.GradientTransformation:
    """``chain(sync, adamw(warm-up + cosine, weight_decay=1e-4))``."""
    schedule = models.lr_schedule(args, end_value=0.0)
    if args.sync == "sharded":  # AdamW inside the sync, on each rank's region
        return models.sharded_optimizer(args, optax.adamw(schedule, weight_decay=1e-4))
    if args.sync_what == "adam_direction":
        return optax.chain(*models.adam_then_sync(args, sync, schedule, 1e-4))
    return optax.chain(models.dense_small_leaves(args, sync), optax.adamw(schedule, weight_decay=1e-4))


def setup(args: argparse.Namespace, rank: int, size: int) -> train.Task:
    """The data and this rank's shard, the model and its initial parameters, the
    batches and the evaluation."""
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

    def loss_fn(p, x, y):
        logits = model.apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def eval_fn(p, x, y):
        logits = model.apply({"params": p}, x)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        return losses.sum(), jnp.sum(jnp.argmax(logits, -1) == y)

    def evaluate(p) -> dict[str, float]:
        loss_sum, correct = eval_fn(p, x_eval, y_eval) if len(x_eval) else (0.0, 0)
        tot_loss, tot_correct = train.WORLD.allreduce(np.array([float(loss_sum),
                                                                float(correct)]))
        return {"test_loss": tot_loss / len(x_test),
                "test_accuracy": 100.0 * tot_correct / len(x_test)}

    return train.Task(
        name="train_resnet", model=dict(cfg, widths=list(cfg["widths"])), params=params,
        loss_fn=loss_fn,
        batch=lambda step: train_batch(x_shard, y_shard, seed=args.seed, step=step, rank=rank,
                                       batch=args.batch_size, shift=args.shift),
        evaluate=evaluate,
        describe=f"digits: {len(x_train)} train / {len(x_test)} test images, 32x32x3; "
                 f"{len(x_shard) // args.batch_size} steps per epoch of batch "
                 f"{args.batch_size} per rank",
        data={"data": {"name": "sklearn digits, 4x bilinear upscale to 32x32, grey repeated x3",
                       "train": len(x_train), "test": len(x_test), "shift": args.shift}},
        final=("test_accuracy", "test_loss"),
        eval_format="test loss {test_loss:.4f} | acc {test_accuracy:6.2f}%",
        final_format="final test accuracy {test_accuracy:.2f}%", widths=(8, 6))


def main(argv: list[str] | None = None) -> int:
    """Trains, logs, checks the replicas; returns the exit status."""
    return train.run(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
