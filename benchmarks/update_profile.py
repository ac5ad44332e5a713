"""Where the milliseconds of a sparse update go: its pieces, cumulatively, in one jitted step.

One process, one rank (``MPI.COMM_SELF``: only the local work around the allreduce),
``jss.planning.calibrate``'s synthetic 16-leaf tree of N entries, the step
``params <- params - lr * update`` with the update made by (each adding to the
previous) ``sgd``, ``add`` (the accumulator), ``select`` (``jss.topk``), ``allreduce``,
``residual`` and ``update`` (the whole update), beside the library's ``topk_sync``,
``dense_sync`` and ``oktopk_sync`` (``--adam``: also with AdamW and
``adam_direction_sync``). The hand-written variants use the transforms' own passes
(``transforms/flat.py``) and donate every input; the gradients come from the
calibration's pool; times are medians of ``--repeats`` steps after
``local_work.WARMUP_STEPS`` warm-up steps.

    python benchmarks/update_profile.py                    # N = 1M 4M 16M 64M, density 0.1%, 1%
    python benchmarks/update_profile.py --sizes 4M 11M --densities 0.01 --adam --tag adam

Writes ``results/update_profile_<tag>.{json,png}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from mpi4py import MPI

import jax_sparse_sync as jss
from jax_sparse_sync.planning.local_work import (  # the calibration's tree and gradient draws
    GRADIENT_POOL, WARMUP_STEPS, gradient_draws, synthetic_tree as make_tree)
from jax_sparse_sync.transforms.flat import accumulate, split_like  # the transforms' own passes
from _harness import (fmt_size, machine_info, median_time, parse_size, pyplot, save_figure,
                      wait_for_quiet, write_record)

RESULTS = Path(__file__).parent / "results"
PIECES = ("sgd", "add", "select", "allreduce", "residual", "update")
TRANSFORMS = ("topk_sync", "dense_sync", "oktopk_sync")
#: with --adam: the LM example's two Adam steps (clip, weight decay 1e-4): AdamW after
#: topk_sync, and adam_direction_sync(topk_sync) (momentum masking "restart") in front
#: of the weight decay and learning rate.
ADAM_TRANSFORMS = ("topk_sync+adamw", "adam_direction_sync")
LR = 0.01


def piece_step(last: str, k: int, comm):
    """The hand-written step up to piece ``last`` (see the module table)."""
    upto = PIECES.index(last)

    def step(params, residual, grads):
        if upto == 0:
            return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), residual
        acc = accumulate(residual, grads, jnp.float32)
        out, alive = acc, 0.0
        if upto >= 2:
            values, indices = jss.topk(acc, k)
            alive = values.sum()  # keeps the selection alive without another N buffer
        if upto >= 3:
            summed = jss.sparse_allreduce(values, indices, size=acc.shape[0],
                                          algorithm="allgather", comm=comm)
            out = summed
        if upto >= 4:
            residual = jss.residual_update(acc, indices)
        else:
            residual = out
        if upto >= 5:
            new = split_like(summed, grads, scale=comm.Get_size())
            params = jax.tree_util.tree_map(lambda p, u: p - LR * u, params, new)
        else:
            # the update's bytes are still read once, so the later pieces add only themselves
            params = jax.tree_util.tree_map(lambda p: p + (out[0] + alive), params)
        return params, residual

    return jax.jit(step, donate_argnums=(0, 1))


def transform_step(name: str, density: float, comm):
    def topk():
        return jss.topk_sync(density=density, algorithm="allgather", comm=comm)

    if name == "topk_sync+adamw":
        tx = optax.chain(topk(), optax.clip_by_global_norm(1.0),
                         optax.adamw(LR, weight_decay=1e-4))
    elif name == "adam_direction_sync":
        tx = optax.chain(optax.clip_by_global_norm(1.0),
                         jss.adam_direction_sync(topk(), momentum_masking="restart"),
                         optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(LR))
    else:
        sync = {"topk_sync": topk, "dense_sync": lambda: jss.dense_sync(comm=comm),
                "oktopk_sync": lambda: jss.oktopk_sync(density=density, comm=comm)}[name]()
        tx = optax.chain(sync, optax.sgd(LR))

    def step(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return tx, jax.jit(step, donate_argnums=(0, 1))


def _timed(fn, state: tuple, pool, repeats: int, label: str, n: int, density: float) -> float:
    """Median ms of ``state = fn(*state, grads)`` (inputs donated), printed; each step's
    gradient drawn from ``pool`` (the same draws for every variant)."""
    box = {"s": state}
    draws = gradient_draws(pool, repeats)

    def run():
        box["s"] = fn(*box["s"], next(draws))
        jax.block_until_ready(box["s"])

    ms = round(1e3 * median_time(run, repeats, WARMUP_STEPS), 3)  # past the first steps' transient
    print(f"  N={fmt_size(n):>4} d={density:g} {label:>10}: {ms:8.2f} ms", flush=True)
    return ms


def profile(n: int, density: float, repeats: int, comm, transforms=TRANSFORMS) -> dict:
    k = max(1, round(density * n))
    grads = [make_tree(n, 10 + i) for i in range(GRADIENT_POOL)]
    rec = {"size": n, "density": density, "k": k, "cumulative_ms": {}, "transform_ms": {}}
    for last in PIECES:
        rec["cumulative_ms"][last] = _timed(
            piece_step(last, k, comm), (make_tree(n, 2), jnp.zeros((n,), jnp.float32)), grads,
            repeats, last, n, density)
    for name in transforms:
        params = make_tree(n, 2)
        tx, fn = transform_step(name, density, comm)
        rec["transform_ms"][name] = _timed(fn, (params, tx.init(params)), grads, repeats, name,
                                           n, density)
    cum = [rec["cumulative_ms"][p] for p in PIECES]
    rec["piece_ms"] = {p: round(c - (cum[i - 1] if i else 0.0), 3)
                       for i, (p, c) in enumerate(zip(PIECES, cum))}
    return rec


def plot(data: dict, path: Path) -> None:
    plt = pyplot()

    recs = data["records"]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(recs), 4.2))
    x = np.arange(len(recs))
    bottom = np.zeros(len(recs))
    colors = plt.cm.tab10(np.arange(len(PIECES)))
    for p, c in zip(PIECES, colors):
        h = np.array([max(0.0, r["piece_ms"][p]) for r in recs])
        ax.bar(x - 0.2, h, 0.35, bottom=bottom, color=c, label=p)
        bottom += h
    names = list(recs[0]["transform_ms"])
    for j, (name, mk) in enumerate(zip(names, "o^sDv")):
        ax.scatter(x + 0.2, [r["transform_ms"][name] for r in recs], marker=mk, color="k",
                   label=name, zorder=3, s=20 + 10 * j)
    ax.set_xticks(x, [f"{fmt_size(r['size'])}\n{100 * r['density']:g}%" for r in recs])
    ax.set(yscale="log", ylabel="step time (ms, one rank)")
    ax.legend(fontsize=7, ncol=2)
    info = data["machine"]
    ax.set_title(f"sparse update pieces, cumulative (bars) vs transforms: {info['cpu_count']} "
                 f"CPUs, jax {info['jax_version']}, {info['date'][:10]}", fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1M", "4M", "16M", "64M"])
    ap.add_argument("--densities", nargs="+", type=float, default=[0.001, 0.01])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quiet-wait", type=float, default=0.0)
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--out", default=None,
                    help="JSON path (default benchmarks/results/update_profile_<tag>.json; "
                         "the plot goes next to it)")
    ap.add_argument("--adam", action="store_true",
                    help=f"also time the Adam steps {ADAM_TRANSFORMS}")
    ap.add_argument("--default-allocator", action="store_true",
                    help="leave glibc's malloc as it is (by default jss.mpi.tune_host_allocator(): "
                         "no per-step page faults of the N-float buffers)")
    args = ap.parse_args(argv)
    if not args.default_allocator:
        jss.mpi.tune_host_allocator()
    comm = MPI.COMM_SELF
    info = machine_info()
    busy, waited = wait_for_quiet(args.quiet_wait) if args.quiet_wait else (None, 0.0)
    records = []
    for n in map(parse_size, args.sizes):
        for d in args.densities:
            records.append(profile(n, d, args.repeats, comm,
                                   TRANSFORMS + (ADAM_TRANSFORMS if args.adam else ())))
    data = {"machine": info, "busy_before": busy, "waited_s": waited, "args": vars(args),
            "records": records}
    out = write_record(data, args.out or RESULTS / f"update_profile_{args.tag}.json")
    plot(data, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
