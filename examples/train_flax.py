"""Data-parallel training of a small Flax CNN with dense vs. Top-k sparse sync.

The model is trained twice from the same initial parameters on scikit-learn's
8x8 digits data set (bundled with scikit-learn, no download):

  1. ``dense``:  gradients averaged with ``jss.dense_sync()`` (MPI_Allreduce);
  2. ``sparse``: gradients synchronized with ``jss.topk_sync(density=...)``
     (error-feedback Top-k and a sparse allreduce).

Both runs use the same optimizer and hyperparameters. Rank 0 prints, per epoch,
the mean training loss (averaged over ranks), the test accuracy and the bytes
this rank has sent so far, then a summary comparing the two runs: accuracy,
bytes sent, and the median wall-clock time per step (each step is blocked on,
the first step, which compiles, is left out; each rank's median over its
steps, then the median over ranks).

A rank that fails aborts the whole job (``jss.mpi.abort_on_error()``), so the
other ranks never wait for it forever.

At the end of each run the script checks that the parameters are bitwise
identical on every rank. It exits with a non-zero status if they are not, or
if the sparse run's test accuracy is more than ``--tolerance`` points below
the dense run's (``--no-check`` turns the accuracy check off).

Run it with any number of ranks, or with none:

    mpiexec -n 4 python examples/train_flax.py
    mpiexec -n 2 python examples/train_flax.py --epochs 10 --no-check --json metrics.json
    python examples/train_flax.py            # a world of one rank
    sudo -E python examples/train_flax.py --link 1000 --procs 4   # on emulated 1 Gbit/s links

Under plain ``mpiexec`` the ranks of one machine talk through shared memory, where
a 38K-parameter model has nothing to save: the measured speed-up is about 1x or
below. So with two or more ranks the summary also prints what the steps would
take on real links, **a projection of the library's cost model, not a
measurement**: ``jss.planning.cost_model.predict_step_time`` of each run at
1 and 10 Gbit/s (``LINKS_MBIT``, :data:`LINK_ALPHA_S` per message), from the
no-sync step measured here and each sync's local work calibrated here
(``jss.planning.calibrate(local=...)``, a few seconds; ``--no-projection``
skips both). ``--link MBIT`` measures instead of projecting: the script starts
``--procs`` ranks of itself on an emulated network of MBIT Mbit/s links
(``benchmarks/emulated_network.py``: network namespaces and ``tc``, so root),
and their summary sets the measured step beside its projection for that link.

Each rank trains on its own shard of the training set with a per-rank batch
of ``--batch-size`` examples, so the global batch grows with the number of
ranks. The defaults (25 epochs, SGD with momentum 0.9, learning rate 0.1
cosine-decayed to zero) let the sparse run match the dense one for 1 to 4
ranks; in much shorter runs the sparse run may not have caught up yet, so add
``--no-check`` there.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from mpi4py import MPI
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import jax_sparse_sync as jss

NUM_CLASSES = 10
MODES = ("dense", "sparse")

# Host-side bookkeeping (loss and accuracy averages, replica checks) uses
# COMM_WORLD; the library syncs gradients on its own clone of it, so the two
# kinds of traffic never interleave.
WORLD = MPI.COMM_WORLD

#: The links the summary projects the steps onto (Mbit/s): 1 and 10 Gbit Ethernet.
LINKS_MBIT = (1000.0, 10000.0)
#: Latency per message of the projection: the library's uncalibrated default
#: (``cost_model.DEFAULT_ALPHA_BETA``), about what the emulated links measure
#: (one-way 10-11 us, benchmarks/results/step_time_matrix_mlp_1000.json).
LINK_ALPHA_S = 10e-6


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the command line.

    Args:
      argv: arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
      The parsed options.
    """
    parser = argparse.ArgumentParser(
        description="Train a Flax CNN on digits with dense and Top-k sparse gradient sync.")
    parser.add_argument("--epochs", type=int, default=25, help="epochs per run (default 25)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction of gradient entries sent per step (default 0.01)")
    parser.add_argument("--lr", type=float, default=0.1,
                        help="initial learning rate, cosine-decayed to 0 (default 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="examples per rank per step (default 32)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the split, the initial parameters and the shuffling")
    parser.add_argument("--algorithm", default="auto",
                        choices=("auto", "allgather", "recursive_doubling", "dense"),
                        help="sparse allreduce algorithm of the sparse run (default auto)")
    parser.add_argument("--tolerance", type=float, default=2.0,
                        help="largest allowed accuracy gap sparse below dense, in points")
    parser.add_argument("--no-check", action="store_true",
                        help="do not fail when sparse accuracy falls short of dense")
    parser.add_argument("--json", metavar="PATH",
                        help="write the per-epoch metrics of both runs to PATH (rank 0)")
    parser.add_argument("--no-projection", action="store_true",
                        help="skip the cost model's projection onto 1 and 10 Gbit/s links "
                             "(and the few seconds of calibration it takes)")
    parser.add_argument("--link", type=float, metavar="MBIT",
                        help="run --procs ranks on an emulated network of MBIT Mbit/s links "
                             "(root; benchmarks/emulated_network.py) instead of this world")
    parser.add_argument("--procs", type=int, default=4,
                        help="ranks of the --link run (default 4)")
    parser.add_argument("--on-link", type=float, help=argparse.SUPPRESS)  # set by --link
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        parser.error("--epochs and --batch-size must be positive")
    if args.link is not None and not (args.link > 0 and args.procs >= 2):
        parser.error(f"--link needs a rate > 0 Mbit/s and --procs >= 2 (got --link "
                     f"{args.link:g} --procs {args.procs})")
    return args


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #
def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Loads digits and splits it 80/20, stratified, the same way on every rank.

    Args:
      seed: seed of the split.

    Returns:
      ``(x_train, y_train, x_test, y_test)``; images are float32 NHWC arrays
      of shape ``(n, 8, 8, 1)`` scaled to [0, 1], labels are int32.
    """
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # pixels are 0..16
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=seed)
    return x_train, y_train, x_test, y_test


def shard(x: np.ndarray, y: np.ndarray, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shard: every ``size``-th example, starting at ``rank``."""
    return x[rank::size], y[rank::size]


def steps_per_epoch(num_train: int, batch_size: int, size: int) -> int:
    """Steps per epoch, equal on all ranks (every step is a collective).

    Shards differ in length by at most one example, so every rank uses the
    smallest shard's number of full batches.
    """
    steps = (num_train // size) // batch_size
    if steps == 0:
        raise SystemExit(
            f"error: a shard of {num_train // size} examples holds no batch of {batch_size}; "
            "lower --batch-size or use fewer ranks.")
    return steps


def batches(x: np.ndarray, y: np.ndarray, *, batch_size: int, steps: int,
            seed: int, epoch: int, rank: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields ``steps`` shuffled batches of this rank's shard for one epoch.

    The shuffle depends on ``(seed, epoch, rank)``, so it is reproducible and
    the ranks see their examples in different orders.
    """
    order = np.random.default_rng([seed, epoch, rank]).permutation(len(x))
    for step in range(steps):
        idx = order[step * batch_size:(step + 1) * batch_size]
        yield x[idx], y[idx]


# --------------------------------------------------------------------------- #
# Model and steps
# --------------------------------------------------------------------------- #
class CNN(nn.Module):
    """A small CNN for 8x8 grey-scale digits: two 3x3 convolutions, two dense layers."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(16, (3, 3))(x))                           # 8x8x16
        x = nn.relu(nn.Conv(32, (3, 3))(x))                           # 8x8x32
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))                    # 4x4x32
        x = x.reshape((x.shape[0], -1))                               # 512
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(NUM_CLASSES)(x)


def make_optimizer(mode: str, args: argparse.Namespace,
                   total_steps: int) -> optax.GradientTransformation:
    """The gradient sync of ``mode`` followed by SGD with momentum.

    The learning rate decays from ``args.lr`` to zero over the run (cosine),
    so the final accuracies of the two runs are settled values rather than a
    snapshot of an oscillating one.

    The sync comes first in the chain, so ``opt_state[0]`` is its state and
    ``opt_state[0].last_stats`` holds the last step's wire statistics.
    """
    if mode == "dense":
        sync = jss.dense_sync()
    else:
        sync = jss.topk_sync(density=args.density, algorithm=args.algorithm)
    schedule = optax.cosine_decay_schedule(args.lr, decay_steps=total_steps)
    return optax.chain(sync, optax.sgd(schedule, momentum=args.momentum))


def make_loss(model: nn.Module) -> Callable:
    """The mean cross-entropy of ``model`` on a batch, as a function of its parameters."""

    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return loss_fn


def make_train_step(model: nn.Module, tx: optax.GradientTransformation) -> Callable:
    """A jitted training step: local gradient, MPI sync (inside ``tx``), update.

    The step returns this rank's loss on its batch and the number of bytes
    this rank sent to synchronize the gradient.
    """
    loss_fn = make_loss(model)

    # The optimizer state is donated: the syncs update their N-float buffers (the
    # error-feedback residual) in place; without donation XLA copies them every step.
    @functools.partial(jax.jit, donate_argnums=(1,))
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)  # MPI happens here
        params = optax.apply_updates(params, updates)
        bytes_sent = jss.SyncStats.from_vector(opt_state[0].last_stats).bytes_sent
        return params, opt_state, loss, bytes_sent

    return train_step


def make_count_correct(model: nn.Module) -> Callable:
    """A jitted function counting correct predictions on a batch."""

    @jax.jit
    def count_correct(params, x, y):
        logits = model.apply({"params": params}, x)
        return jnp.sum(jnp.argmax(logits, axis=-1) == y)

    return count_correct


def test_accuracy(count_correct: Callable, params: Any, x_test: np.ndarray,
                  y_test: np.ndarray, rank: int, size: int) -> float:
    """Test accuracy in percent; each rank scores its own shard of the test set."""
    x, y = shard(x_test, y_test, rank, size)
    correct = int(count_correct(params, x, y)) if len(x) else 0
    return 100.0 * WORLD.allreduce(correct) / len(x_test)


# --------------------------------------------------------------------------- #
# Replica check
# --------------------------------------------------------------------------- #
def params_digest(params: Any) -> str:
    """SHA-256 of all parameter bytes, leaves in ``jax.tree_util`` order."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def replicas_identical(params: Any) -> bool:
    """True on every rank if all ranks hold bitwise identical parameters."""
    return len(set(WORLD.allgather(params_digest(params)))) == 1


def describe_sparse_sync(args: argparse.Namespace, num_params: int) -> str:
    """Entries kept per step and the algorithm the sparse run uses ("auto" resolved)."""
    k = jss.planning.resolve_k(size=num_params, density=args.density, k=None)
    algorithm = args.algorithm
    if algorithm == "auto":  # the same cost-model choice topk_sync makes
        choice = jss.planning.resolve_algorithm("auto", nranks=jss.comm_size(), size=num_params, k=k)
        algorithm = f"auto -> {choice}"
    return f"k = {k} of {num_params} entries per step, algorithm {algorithm}"


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
def log(*args: Any) -> None:
    """Prints on rank 0 only, flushed at once (output of several ranks interleaves)."""
    if WORLD.Get_rank() == 0:
        print(*args, flush=True)


def train(mode: str, init_params: Any, model: nn.Module, data: tuple,
          args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """Trains ``model`` from ``init_params`` with the gradient sync of ``mode``.

    Args:
      mode: ``"dense"`` or ``"sparse"``.
      init_params: initial parameters, the same on every rank.
      model: the Flax module.
      data: ``(x_train, y_train, x_test, y_test)``, the same on every rank.
      args: command-line options.

    Returns:
      The final parameters, one dict of metrics per epoch, and the step times
      (see :func:`step_timing`).
    """
    rank, size = jss.comm_rank(), jss.comm_size()
    x_train, y_train, x_test, y_test = data
    x_shard, y_shard = shard(x_train, y_train, rank, size)
    steps = steps_per_epoch(len(x_train), args.batch_size, size)

    tx = make_optimizer(mode, args, total_steps=args.epochs * steps)
    train_step = make_train_step(model, tx)
    count_correct = make_count_correct(model)
    params, opt_state = init_params, tx.init(init_params)

    history: list[dict[str, Any]] = []
    total_bytes = 0
    step_seconds: list[float] = []  # every step of the run, wall clock, the first compiles
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        losses, sent = [], []
        for x, y in batches(x_shard, y_shard, batch_size=args.batch_size, steps=steps,
                            seed=args.seed, epoch=epoch, rank=rank):
            t0 = time.perf_counter()
            params, opt_state, loss, bytes_sent = jax.block_until_ready(
                train_step(params, opt_state, x, y))
            step_seconds.append(time.perf_counter() - t0)
            losses.append(loss)
            sent.append(bytes_sent)
        # One device-to-host transfer per epoch; sum in Python ints (no overflow).
        total_bytes += int(np.sum(np.asarray(jnp.stack(sent)), dtype=np.int64))
        mean_loss = WORLD.allreduce(float(np.mean(np.asarray(jnp.stack(losses))))) / size
        accuracy = test_accuracy(count_correct, params, x_test, y_test, rank, size)
        history.append({"epoch": epoch, "train_loss": mean_loss, "test_accuracy": accuracy,
                        "cumulative_bytes_sent": total_bytes, "steps": epoch * steps,
                        "seconds": time.perf_counter() - start})
        log(f"{mode:>6} | epoch {epoch:3d} | loss {mean_loss:.4f} | "
            f"test acc {accuracy:6.2f}% | sent {total_bytes / 1e6:9.3f} MB")
    return params, history, step_timing(step_seconds)


def step_timing(step_seconds: list[float]) -> dict[str, Any]:
    """Median time per step over ranks (collective: every rank calls it).

    Each rank's median over its steps, the first one (compilation) left out,
    then the median of those over the ranks. Also gathers every rank's step
    times; ``per_step_ms`` is the median over ranks of each step (the first
    one included, with its compilation).

    Args:
      step_seconds: this rank's wall-clock time of every step, in order.

    Returns:
      ``{"median_ms", "rank_medians_ms", "per_step_ms", "first_step_ms"}``,
      the same on every rank.
    """
    mine = np.asarray(step_seconds, dtype=np.float64) * 1e3
    timed = mine[1:] if len(mine) > 1 else mine  # one step only: it has to count
    rank_medians = WORLD.allgather(float(np.median(timed)))
    per_step = np.median(np.stack(WORLD.allgather(mine)), axis=0)
    return {"median_ms": float(np.median(rank_medians)),
            "rank_medians_ms": rank_medians,
            "per_step_ms": [round(float(t), 4) for t in per_step],
            "first_step_ms": float(per_step[0])}


# --------------------------------------------------------------------------- #
# What the times mean on real links
# --------------------------------------------------------------------------- #
def time_compute_step(model: nn.Module, init_params: Any, data: tuple,
                      args: argparse.Namespace, steps: int = 20) -> float:
    """Seconds of the training step without any sync: the projection's compute term.

    The runs' model, batch size and optimizer, the gradient applied as it is
    (nothing on the wire, no sync work); one batch ``steps`` times after a
    compiling call, each rank's median, then the median over ranks.
    """
    loss_fn = make_loss(model)
    tx = optax.sgd(args.lr, momentum=args.momentum)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    x, y = shard(data[0], data[1], jss.comm_rank(), jss.comm_size())
    x, y = x[:args.batch_size], y[:args.batch_size]
    params, opt_state = jax.block_until_ready(step(init_params, tx.init(init_params), x, y))
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt_state = jax.block_until_ready(step(params, opt_state, x, y))
        seconds.append(time.perf_counter() - t0)
    return float(np.median(WORLD.allgather(float(np.median(seconds)))))


def project_links(args: argparse.Namespace, num_params: int, compute_s: float) -> dict:
    """Both runs' steps on :data:`LINKS_MBIT` (and a ``--link`` run's own), by the cost model.

    ``cost_model.predict_step_time``: ``compute_s`` + each sync's local work,
    calibrated here on this machine (``jss.planning.calibrate(local=...)``, on
    every rank: collective) + its wire time, :data:`LINK_ALPHA_S` per message
    and 8 / rate per byte for the bytes the cost model counts. The sparse run's
    algorithm is the one it ran with (``auto`` resolved as ``topk_sync`` does).
    """
    cm = jss.planning.cost_model
    nranks = jss.comm_size()
    k = jss.planning.resolve_k(size=num_params, density=args.density, k=None)
    algorithm = jss.planning.resolve_algorithm(args.algorithm, nranks=nranks, size=num_params,
                                               k=k)
    calibrated = jss.planning.calibrate(sizes=(8, 4096), bandwidth_seconds=0, repeats=3,
                                        local=("dense_sync", "topk_sync"),
                                        local_sizes=(num_params // 4, num_params),
                                        density=args.density, install=False)
    rows = []
    for mbit in sorted(set(LINKS_MBIT) | ({args.on_link} if args.on_link else set())):
        link = cm.AlphaBeta(alpha=LINK_ALPHA_S, beta=8.0 / (mbit * 1e6), local=calibrated.local)
        dense = dict(kind="dense_sync", nranks=nranks, size=num_params, k=num_params, params=link)
        sparse = dict(kind="topk_sync", nranks=nranks, size=num_params, k=k,
                      algorithm=algorithm, params=link)
        row = {"link_mbit": mbit,
               "dense_ms": 1e3 * cm.predict_step_time(compute_s=compute_s, **dense),
               "sparse_ms": 1e3 * cm.predict_step_time(compute_s=compute_s, **sparse),
               "dense_wire_ms": 1e3 * cm.sync_wire_time(**dense),
               "sparse_wire_ms": 1e3 * cm.sync_wire_time(**sparse)}
        row["speedup"] = row["dense_ms"] / row["sparse_ms"]
        rows.append(row)
    local = {kind: 1e3 * cm.local_work_time(kind, size=num_params, k=k, params=calibrated)
             for kind in ("dense_sync", "topk_sync")}
    return {"what": "projection by jss.planning.cost_model.predict_step_time, not a measurement",
            "compute_ms": 1e3 * compute_s, "dense_local_ms": local["dense_sync"],
            "sparse_local_ms": local["topk_sync"], "alpha_s": LINK_ALPHA_S, "k": k,
            "algorithm": algorithm, "local_work_calibrated": [list(t) for t in calibrated.local],
            "links": rows}


def print_projection(projection: dict, summary: dict, on_link: float | None) -> None:
    """Prints the projection on rank 0, labelled as one (and a --link run's measured row)."""
    p = projection
    log("\nProjection onto real links: the cost model's prediction, NOT a measurement\n"
        f"  (jss.planning.cost_model.predict_step_time: the no-sync step measured here, "
        f"{p['compute_ms']:.2f} ms,\n"
        f"   + each sync's local work calibrated here, dense {p['dense_local_ms']:.2f} ms, "
        f"sparse {p['sparse_local_ms']:.2f} ms,\n"
        f"   + the wire: {1e6 * p['alpha_s']:g} us a message and the link's rate; "
        f"{jss.comm_size()} ranks, k = {p['k']}, {p['algorithm']})")
    log(f"{'link':>14}{'dense ms/step':>15}{'sparse ms/step':>16}{'speed-up':>10}"
        f"{'wire dense / sparse ms':>26}")
    for r in p["links"]:
        log(f"{r['link_mbit'] / 1e3:>7g} Gbit/s{r['dense_ms']:15.2f}{r['sparse_ms']:16.2f}"
            f"{r['speedup']:9.2f}x{r['dense_wire_ms']:15.3f} / {r['sparse_wire_ms']:.3f}")
    if on_link:
        log(f"measured on the emulated {on_link:g} Mbit/s links: dense "
            f"{summary['dense_ms_per_step']:.2f} ms/step, sparse "
            f"{summary['sparse_ms_per_step']:.2f} ms/step (speed-up "
            f"{summary['speedup']:.2f}x); the projection above for that link beside it")


def drop_options(argv: list[str], names: set[str]) -> list[str]:
    """``argv`` without the options ``names`` and their values (``--x V`` or ``--x=V``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif a.split("=", 1)[0] not in names:
            out.append(a)
    return out


def run_on_emulated_link(args: argparse.Namespace, argv: list[str]) -> int:
    """``--link``: ``--procs`` ranks of this script on emulated links of ``--link`` Mbit/s.

    The network is ``benchmarks/emulated_network.py``'s (one namespace per rank,
    ``tc tbf`` on both ends of each veth, MPICH over TCP); the ranks get this
    command line without ``--link`` and ``--procs``. Returns their exit status.
    """
    if WORLD.Get_size() > 1:
        log("error: --link starts its own --procs ranks on the emulated network: run it "
            "as one process, e.g. sudo -E .venv/bin/python examples/train_flax.py --link "
            f"{args.link:g} --procs {WORLD.Get_size()} (without mpiexec)")
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    from emulated_network import EmulatedNetwork, usable

    ok, why = usable()
    if not ok:
        print(f"error: --link {args.link:g}: no emulated network on this machine: {why}. "
              "Without --link the job runs on this machine's MPI transport.", file=sys.stderr)
        return 2
    child = drop_options(argv, {"--link", "--procs"}) + ["--on-link", f"{args.link:g}"]
    print(f"# {args.procs} ranks on emulated {args.link:g} Mbit/s links "
          "(benchmarks/emulated_network.py)", flush=True)
    with EmulatedNetwork(args.procs, args.link) as net:
        proc = net.launch([os.path.abspath(__file__), *child], timeout=3600, stream=True,
                          cwd=root)
    return proc.returncode


# --------------------------------------------------------------------------- #
# Reporting
# --------------------------------------------------------------------------- #
def summarize(histories: dict[str, list[dict[str, Any]]],
              timings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Final accuracies, bytes and step times of both runs, and how they compare.

    ``bytes_ratio`` is ``None`` when the sparse run sent nothing (one rank);
    ``speedup`` is the dense run's median time per step over the sparse run's.
    """
    dense, sparse = histories["dense"][-1], histories["sparse"][-1]
    dense_ms, sparse_ms = timings["dense"]["median_ms"], timings["sparse"]["median_ms"]
    return {
        "dense_accuracy": dense["test_accuracy"],
        "sparse_accuracy": sparse["test_accuracy"],
        "accuracy_gap_points": sparse["test_accuracy"] - dense["test_accuracy"],
        "dense_bytes_sent": dense["cumulative_bytes_sent"],
        "sparse_bytes_sent": sparse["cumulative_bytes_sent"],
        "bytes_ratio": (dense["cumulative_bytes_sent"] / sparse["cumulative_bytes_sent"]
                        if sparse["cumulative_bytes_sent"] else None),
        "dense_bytes_per_step": dense["cumulative_bytes_sent"] / dense["steps"],
        "sparse_bytes_per_step": sparse["cumulative_bytes_sent"] / sparse["steps"],
        "dense_ms_per_step": dense_ms,
        "sparse_ms_per_step": sparse_ms,
        "speedup": dense_ms / sparse_ms if sparse_ms > 0 else None,
    }


def print_summary(summary: dict[str, Any], num_params: int, on_link: float | None) -> None:
    """Prints the comparison table on rank 0, saying where the times were measured."""
    where = (f"the emulated {on_link:g} Mbit/s links" if on_link else
             "this job's MPI transport (shared memory between the ranks of one host: "
             "no link to save on)")
    log(f"Summary ({jss.comm_size()} rank(s), {num_params} parameters, bytes are per rank)")
    log(f"{'':24}{'dense':>14}{'sparse':>14}")
    log(f"{'final test accuracy (%)':24}{summary['dense_accuracy']:14.2f}"
        f"{summary['sparse_accuracy']:14.2f}")
    log(f"{'bytes sent (MB)':24}{summary['dense_bytes_sent'] / 1e6:14.3f}"
        f"{summary['sparse_bytes_sent'] / 1e6:14.3f}")
    log(f"{'time per step (ms)':24}{summary['dense_ms_per_step']:14.2f}"
        f"{summary['sparse_ms_per_step']:14.2f}")
    log(f"accuracy sparse - dense: {summary['accuracy_gap_points']:+.2f} points")
    ratio = summary["bytes_ratio"]
    log(f"bytes dense / sparse:    "
        f"{'n/a (one rank sends nothing)' if ratio is None else f'{ratio:.1f}x'}")
    speedup = summary["speedup"]
    log(f"dense: {summary['dense_ms_per_step']:.2f} ms/step, "
        f"{summary['dense_bytes_per_step'] / 1e6:.4f} MB/step; "
        f"sparse: {summary['sparse_ms_per_step']:.2f} ms/step, "
        f"{summary['sparse_bytes_per_step'] / 1e6:.4f} MB/step; "
        f"speed-up {'n/a' if speedup is None else f'{speedup:.2f}x'} "
        f"(median wall clock per step, first step excluded, median over ranks), measured "
        f"on {where}")


def write_json(path: str, args: argparse.Namespace, histories: dict, summary: dict,
               timings: dict) -> None:
    """Writes the configuration, per-epoch metrics, step times and summary to ``path`` (rank 0)."""
    if WORLD.Get_rank() != 0:
        return
    report = {"ranks": jss.comm_size(), "config": vars(args), "history": histories,
              "step_times": timings, "summary": summary}
    with open(path, "w") as f:
        json.dump(report, f, indent=2)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def main(argv: list[str] | None = None) -> int:
    """Runs both trainings, checks replicas and accuracy; returns the exit status."""
    # An uncaught exception on one rank aborts the job instead of leaving the
    # other ranks waiting in a collective forever.
    jss.mpi.abort_on_error()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.link is not None:
        return run_on_emulated_link(args, argv)
    wall_start = time.perf_counter()
    data = load_data(args.seed)
    model = CNN()
    # The same key on every rank gives every rank the same initial parameters.
    init_params = model.init(jax.random.key(args.seed), data[0][:1])["params"]
    num_params = ravel_pytree(init_params)[0].size
    log(f"{jss.comm_size()} rank(s), {len(data[0])} train / {len(data[2])} test examples, "
        f"lr {args.lr}, batch {args.batch_size} per rank")
    log(f"sparse sync: {describe_sparse_sync(args, num_params)}\n")

    ok = True
    histories, timings = {}, {}
    for mode in MODES:
        params, histories[mode], timings[mode] = train(mode, init_params, model, data, args)
        identical = replicas_identical(params)
        ok &= identical
        log(f"{mode}: parameters bitwise identical on all ranks: {'yes' if identical else 'NO'}\n")

    summary = summarize(histories, timings)
    print_summary(summary, num_params, args.on_link)
    if jss.comm_size() > 1 and not args.no_projection:
        compute_s = time_compute_step(model, init_params, data, args)
        summary["projection"] = project_links(args, num_params, compute_s)
        print_projection(summary["projection"], summary, args.on_link)
    if args.json:
        write_json(args.json, args, histories, summary, timings)

    # Accuracies are reduced over all ranks, so every rank takes the same decision.
    if summary["accuracy_gap_points"] < -args.tolerance:
        log(f"{'warning' if args.no_check else 'FAIL'}: sparse accuracy is more than "
            f"{args.tolerance} points below dense.")
        ok &= args.no_check
    log(f"wall time {time.perf_counter() - wall_start:.1f} s; {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
