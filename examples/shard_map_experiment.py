"""Data-parallel Flax training with shard_map over a device mesh: dense psum vs TopkA vs Ok-Topk.

The same small CNN on scikit-learn's 8x8 digits as ``train_flax.py``, but the
engine is JAX itself: the train step is ``jax.shard_map``-ped over a 1-D
mesh axis ``"data"`` and the gradients are synchronized with JAX collectives
through ``comm=jss.axis("data")`` (no MPI in the loop). Runs, all from the
same initial parameters and with the same data order:

  dense       ``jss.dense_sync(comm=axis)``: ``psum`` of the gradient
  topk        ``jss.topk_sync(density, algorithm=..., comm=axis)``: error-feedback
              Top-k with TopkA (``all_gather``) by default
  oktopk      ``jss.oktopk_sync(density, comm=axis)``: Ok-Topk SGD (split-and-reduce
              with ``all_to_all`` over balanced regions, global top-k by threshold,
              ``all_gather``); thresholds reused for ``--tau`` steps, regions for
              ``--tau-prime``
  topk-pmap   the same Top-k step written with ``jax.pmap`` instead of shard_map;
              it must end bitwise equal to ``topk``
  block       (not run by default) ``jss.block_sync(comm=axis)``: the lossless
              block-sparse allreduce, a baseline that trains like ``dense``; on this
              CNN's dense gradients nearly every block is nonzero, so whole ranges
              travel and the bytes are about dense's

Each device trains on its own shard of the training set (every P-th example),
``--batch-size`` examples per device and step. The parameters are replicated
(``out_specs=P()``); the optimizer state, residuals included, is per device
(a leading axis of size P sharded over ``"data"``). After every epoch the
script checks that every device's copy of the parameters is bitwise
identical (across processes too), and prints the mean training loss, the test
accuracy and the bytes one device sent per step, as counted by the
transport's statistics. ``--json`` / ``--plot`` save the curves.

Devices: by default 8 host CPU devices (``--devices``; XLA_FLAGS is set before
JAX starts), or the GPUs where present. Across processes, with
``jax.distributed`` (coordinator on 127.0.0.1 only)::

    python examples/shard_map_experiment.py                       # 8 CPU devices
    python examples/shard_map_experiment.py --spawn 2 --devices 4   # 2 processes x 4
    # or start the processes yourself:
    python examples/shard_map_experiment.py --num-processes 2 --process-id 0 --devices 4 \\
        --coordinator 127.0.0.1:12355 &
    python examples/shard_map_experiment.py --num-processes 2 --process-id 1 --devices 4 \\
        --coordinator 127.0.0.1:12355

Exit status: non-zero if the replicas ever differ, if the pmap run differs
from the shard_map run, or if Top-k's or Ok-Topk's final accuracy is more than
``--tolerance`` points below dense (``--no-check`` turns that last check off).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

MODES = ("dense", "topk", "oktopk", "topk-pmap", "block")
DEFAULT_MODES = ("dense", "topk", "oktopk", "topk-pmap")
SPARSE_MODES = ("topk", "oktopk")  # lossy: checked against dense's accuracy


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=30, help="epochs per run (default 30)")
    p.add_argument("--batch-size", type=int, default=16, help="examples per device and step")
    p.add_argument("--density", type=float, default=0.01, help="Top-k density (default 0.01)")
    p.add_argument("--algorithm", default="allgather",
                   choices=("allgather", "recursive_doubling", "split_allgather",
                            "dsar_split_allgather", "auto"),
                   help="sparse allreduce of the topk runs (default allgather = TopkA)")
    p.add_argument("--lr", type=float, default=0.1, help="initial learning rate (cosine decay)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tau", type=int, default=32,
                   help="Ok-Topk: steps between exact thresholds (default 32)")
    p.add_argument("--tau-prime", type=int, default=64,
                   help="Ok-Topk: steps between region repartitions (default 64)")
    p.add_argument("--block-size", type=int, default=256, help="block mode: entries per block")
    p.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES), choices=MODES)
    p.add_argument("--devices", type=int, default=8,
                   help="host CPU devices per process (XLA_FLAGS; ignored by GPUs), default 8")
    p.add_argument("--num-processes", type=int, default=1, help="jax.distributed processes")
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--coordinator", default=None, help="host:port of process 0 (127.0.0.1 only)")
    p.add_argument("--spawn", type=int, default=0, metavar="N",
                   help="start N processes of this script on 127.0.0.1 and wait for them")
    p.add_argument("--tolerance", type=float, default=2.0,
                   help="largest allowed accuracy gap topk/oktopk below dense, in points")
    p.add_argument("--no-check", action="store_true", help="do not fail on the accuracy gap")
    p.add_argument("--json", metavar="PATH", help="write the curves and summary (process 0)")
    p.add_argument("--plot", metavar="PATH", help="plot loss, accuracy and bytes (process 0)")
    args = p.parse_args(argv)
    if args.coordinator and not args.coordinator.startswith("127.0.0.1:"):
        p.error("--coordinator must be 127.0.0.1:PORT (this example stays on this machine)")
    return args


def spawn(args: argparse.Namespace, argv: list[str]) -> int:
    """Runs ``args.spawn`` copies of this script as one jax.distributed job."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rest, skip = [], False
    for a in argv:  # drop --spawn N
        if skip:
            skip = False
            continue
        if a == "--spawn":
            skip = True
            continue
        if not a.startswith("--spawn="):
            rest.append(a)
    procs = []
    for i in range(args.spawn):
        cmd = [sys.executable, os.path.abspath(__file__), *rest, "--num-processes",
               str(args.spawn), "--process-id", str(i), "--coordinator", f"127.0.0.1:{port}"]
        procs.append(subprocess.Popen(cmd, stdout=None if i == 0 else subprocess.DEVNULL,
                                      stderr=None if i == 0 else subprocess.PIPE, text=True))
    codes = [p.wait(timeout=3600) for p in procs]
    for i, (p, c) in enumerate(zip(procs, codes)):
        if c and i:
            print(f"process {i} exited with {c}:\n{p.stderr.read()[-3000:]}", file=sys.stderr)
    return max(codes, key=abs)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.spawn:
        return spawn(args, argv)
    # The host device count is fixed when JAX starts: set it before importing JAX.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    import jax
    if args.num_processes > 1:
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes, process_id=args.process_id,
                                   initialization_timeout=300)
    return run(args)


# --------------------------------------------------------------------------- #
def run(args: argparse.Namespace) -> int:
    import hashlib
    import json
    from functools import partial

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import multihost_utils
    from jax.flatten_util import ravel_pytree
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax_sparse_sync as jss
    from train_flax import CNN, load_data

    main_process = jax.process_index() == 0

    def log(*a):
        if main_process:
            print(*a, flush=True)

    devices = jax.devices()
    n_dev = len(devices)
    mesh = jax.make_mesh((n_dev,), ("data",))
    axis = jss.axis("data")
    replicated, per_device = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    # The mesh's device order decides which device gets which shard.
    mine = [r for r, d in enumerate(mesh.devices.flat) if d.process_index == jax.process_index()]

    x_train, y_train, x_test, y_test = load_data(args.seed)
    steps = (len(x_train) // n_dev) // args.batch_size
    if steps == 0:
        raise SystemExit("a device's shard holds no batch: lower --batch-size")
    model = CNN()
    init_params = model.init(jax.random.key(args.seed), x_train[:1])["params"]
    num_params = ravel_pytree(init_params)[0].size
    k = jss.planning.resolve_k(size=num_params, density=args.density, k=None)
    log(f"{n_dev} devices ({devices[0].platform}) in {jax.process_count()} process(es), "
        f"{num_params} parameters, Top-k keeps k = {k} per device and step "
        f"({args.algorithm}), batch {args.batch_size} per device, {steps} steps per epoch")

    def make_tx(mode):
        if mode == "dense":
            sync = jss.dense_sync(comm=axis)
        elif mode == "oktopk":
            sync = jss.oktopk_sync(density=args.density, tau=args.tau, tau_prime=args.tau_prime,
                                   comm=axis)
        elif mode == "block":
            sync = jss.block_sync(block_size=args.block_size, comm=axis)
        else:
            sync = jss.topk_sync(density=args.density, algorithm=args.algorithm, comm=axis)
        schedule = optax.cosine_decay_schedule(args.lr, decay_steps=args.epochs * steps)
        return optax.chain(sync, optax.sgd(schedule, momentum=args.momentum))

    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def local_step(tx, params, state, x, y):
        """One device's step: its gradient, the sync (collectives inside tx), the update."""
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        sent = jss.SyncStats.from_vector(state[0].last_stats).bytes_sent
        return (optax.apply_updates(params, updates), state,
                jax.lax.pmean(loss, "data"), jax.lax.pmean(sent.astype(jnp.float32), "data"))

    def with_device_axis(tree):  # per-device state travels with a leading axis of size 1
        return jax.tree_util.tree_map(lambda a: a[None], tree)

    def without_device_axis(tree):
        return jax.tree_util.tree_map(lambda a: a[0], tree)

    def shard_map_fns(tx):
        init = jax.jit(jax.shard_map(lambda p: with_device_axis(tx.init(p)), mesh=mesh,
                                     in_specs=P(), out_specs=P("data"), check_vma=False))

        # the optimizer state is donated: the syncs update their buffers in place
        @partial(jax.jit, donate_argnums=(1,))
        @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data"), P("data")),
                 out_specs=(P(), P("data"), P(), P()), check_vma=False)
        def step(params, state, x, y):
            params, state, loss, sent = local_step(tx, params, without_device_axis(state), x, y)
            return params, with_device_axis(state), loss, sent

        def put_params(p):  # replicated: every device holds its own copy
            return jax.tree_util.tree_map(
                lambda a: jax.make_array_from_callback(a.shape, replicated,
                                                       lambda i, a=a: np.asarray(a)[i]), p)

        def put_batch(xs):  # xs: one batch per device, for every device of the mesh
            xs = np.stack([xs[r] for r in mine])
            return jax.make_array_from_process_local_data(
                per_device, xs.reshape((-1,) + xs.shape[2:]),
                (n_dev * xs.shape[1],) + xs.shape[2:])

        def copies(params):  # every local device's copy of the parameters
            leaves = jax.tree_util.tree_leaves(params)
            return [[np.asarray(leaf.addressable_shards[j].data) for leaf in leaves]
                    for j in range(len(leaves[0].addressable_shards))]

        return init, step, put_params, put_batch, copies

    def pmap_fns(tx):
        init = jax.pmap(tx.init, axis_name="data")
        step = jax.pmap(partial(local_step, tx), axis_name="data", donate_argnums=(1,))
        local_n = jax.local_device_count()

        def put_params(p):
            return jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (local_n,) + a.shape), p)

        def put_batch(xs):
            return np.stack([xs[r] for r in mine])

        def copies(params):
            leaves = jax.tree_util.tree_leaves(params)
            return [[np.asarray(leaf.addressable_shards[j].data).reshape(leaf.shape[1:])
                     for leaf in leaves] for j in range(local_n)]

        return init, step, put_params, put_batch, copies

    def digest(arrays):
        h = hashlib.sha256()
        for a in arrays:
            h.update(np.ascontiguousarray(a).tobytes())
        return np.frombuffer(h.digest(), np.uint8)

    def replicas_identical(copies):
        local = {digest(c).tobytes() for c in copies}
        everywhere = multihost_utils.process_allgather(digest(copies[0]))
        return len(local) == 1 and len({d.tobytes() for d in np.atleast_2d(everywhere)}) == 1

    def first_local(a):  # replicated (shard_map) or per device (pmap): this process's first
        return np.asarray(a.addressable_shards[0].data).reshape(-1)[0]

    @jax.jit
    def count_correct(params, x, y):
        return jnp.sum(jnp.argmax(model.apply({"params": params}, x), -1) == y)

    shards = [(x_train[r::n_dev], y_train[r::n_dev]) for r in range(n_dev)]
    ok, histories, finals = True, {}, {}
    for mode in args.modes:
        tx = make_tx(mode)
        init, step, put_params, put_batch, copies = (pmap_fns if mode == "topk-pmap"
                                                     else shard_map_fns)(tx)
        params = put_params(init_params)
        state = init(params)
        history, start = [], time.perf_counter()
        for epoch in range(1, args.epochs + 1):
            orders = [np.random.default_rng([args.seed, epoch, r]).permutation(len(shards[r][0]))
                      for r in range(n_dev)]
            losses, sent = [], []
            for s in range(steps):
                idx = [o[s * args.batch_size:(s + 1) * args.batch_size] for o in orders]
                x = put_batch([shards[r][0][idx[r]] for r in range(n_dev)])
                y = put_batch([shards[r][1][idx[r]] for r in range(n_dev)])
                params, state, loss, b = step(params, state, x, y)
                losses.append(loss)
                sent.append(b)
            loss = float(np.mean([first_local(a) for a in losses]))
            bytes_per_step = float(np.mean([first_local(a) for a in sent]))
            local_copies = copies(params)
            identical = replicas_identical(local_copies)
            ok &= identical
            host_params = jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(init_params), local_copies[0])
            acc = 100.0 * int(count_correct(host_params, x_test, y_test)) / len(x_test)
            history.append(dict(epoch=epoch, train_loss=loss, test_accuracy=acc,
                                bytes_per_step=bytes_per_step, replicas_identical=identical,
                                seconds=time.perf_counter() - start))
            log(f"{mode:>9} | epoch {epoch:3d} | loss {loss:.4f} | test acc {acc:6.2f}% | "
                f"{bytes_per_step / 1e3:8.1f} kB sent per device and step | replicas "
                f"{'identical' if identical else 'DIFFER'}")
        histories[mode] = history
        finals[mode] = digest(local_copies[0])
        log(f"{mode}: {time.perf_counter() - start:.1f} s, "
            f"{1e3 * (time.perf_counter() - start) / (args.epochs * steps):.1f} ms per step\n")

    if "topk" in finals and "topk-pmap" in finals:
        same = finals["topk"].tobytes() == finals["topk-pmap"].tobytes()
        ok &= same
        log(f"pmap step == shard_map step (final parameters bitwise): {'yes' if same else 'NO'}")
    summary = {m: {"final_test_accuracy": h[-1]["test_accuracy"],
                   "final_train_loss": h[-1]["train_loss"],
                   "bytes_per_step_per_device": h[-1]["bytes_per_step"]}
               for m, h in histories.items()}
    log(f"\nSummary: {n_dev} devices, {jax.process_count()} process(es), {num_params} parameters")
    log(f"{'':10}{'test acc %':>12}{'train loss':>12}{'kB/step/device':>16}")
    for m, s in summary.items():
        log(f"{m:10}{s['final_test_accuracy']:12.2f}{s['final_train_loss']:12.4f}"
            f"{s['bytes_per_step_per_device'] / 1e3:16.1f}")
    for m in SPARSE_MODES:
        if "dense" not in summary or m not in summary:
            continue
        ratio = summary["dense"]["bytes_per_step_per_device"] / max(
            1.0, summary[m]["bytes_per_step_per_device"])
        gap = summary[m]["final_test_accuracy"] - summary["dense"]["final_test_accuracy"]
        log(f"bytes dense / {m}: {ratio:.1f}x; accuracy {m} - dense: {gap:+.2f} points")
        if gap < -args.tolerance:
            log(f"{'warning' if args.no_check else 'FAIL'}: {m} is more than {args.tolerance} "
                "points below dense")
            ok &= args.no_check
    if main_process and args.json:
        with open(args.json, "w") as f:
            json.dump({"devices": n_dev, "processes": jax.process_count(),
                       "platform": devices[0].platform, "parameters": int(num_params), "k": k,
                       "config": {a: v for a, v in vars(args).items()},
                       "history": histories, "summary": summary}, f, indent=2)
    if main_process and args.plot:
        plot(histories, args.plot, f"{n_dev} {devices[0].platform} devices, "
             f"{jax.process_count()} process(es), k = {k} of {num_params} ({args.algorithm})")
    log(f"{'OK' if ok else 'FAILED'}")
    if jax.process_count() > 1:
        jax.distributed.shutdown()
    return 0 if ok else 1


def plot(histories, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for mode, h in histories.items():
        e = [r["epoch"] for r in h]
        style = dict(ls="--") if mode == "topk-pmap" else {}
        axes[0].plot(e, [r["train_loss"] for r in h], label=mode, **style)
        axes[1].plot(e, [r["test_accuracy"] for r in h], label=mode, **style)
        axes[2].plot(e, [r["bytes_per_step"] / 1e3 for r in h], label=mode, **style)
    axes[0].set(xlabel="epoch", ylabel="train loss", yscale="log")
    axes[1].set(xlabel="epoch", ylabel="test accuracy (%)")
    axes[2].set(xlabel="epoch", ylabel="kB sent per device and step", yscale="log")
    for a in axes:
        a.legend()
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
