"""The fused Adam-direction pass: the LM's training step and the pass alone, fused vs unfused.

``jss.adam_direction_sync`` in front of ``jss.topk_sync`` runs one kernel
(``jss_adam_accumulate``) for the Adam pass and the accumulator; a sync without the flat
entry point (``update_from``) gets the direction as a tree (the unfused path). Both are
measured in one process, interleaved. Part 1, ``step``: one jitted, donated step of
``step_time.py``'s transformer LM on ``MPI.COMM_SELF`` (local work, no wire) for
``none+adamw``, ``topk+adamw``, ``adamdir_unfused`` and ``adamdir_fused``: ``--rounds``
rounds of ``--steps`` steps per mode, the median over rounds of each round's median in
wall time (``median_s``) and process CPU time (``cpu_median_s``). Part 2, ``pass``: the
optimizer work alone at the LM's leaf shapes (:func:`pass_runners`): ``adamw``,
``accumulate_topk``, the unfused and the fused Adam + accumulate + top-k.

    python benchmarks/adam_fused.py --rounds 7 --tag lm

Output: ``results/adam_fused_<tag>.{json,png}`` (results: docs/topics/adam_direction.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from mpi4py import MPI

import jax_sparse_sync as jss
from jax_sparse_sync.transforms import adam_accumulate, adam_pass, flat
from _harness import loadavg, machine_info, pyplot, save_figure, write_record

HERE = Path(__file__).parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
import step_time  # noqa: E402  (the LM and its config, shared with the step-time benchmark)

LR = 1e-3
WEIGHT_DECAY = step_time.WEIGHT_DECAY
DENSITY = 0.01
STEP_MODES = ("none+adamw", "topk+adamw", "adamdir_unfused", "adamdir_fused")
PASS_MODES = ("adamw", "accumulate_topk", "adam+accumulate_topk unfused",
              "adam_accumulate fused")


def hide_flat_entry(sync):
    """The sync without ``update_from``: adam_direction_sync hands it the direction's leaves."""
    return optax.GradientTransformation(sync.init, sync.update)


def step_tx(mode: str, comm):
    topk = jss.topk_sync(density=DENSITY, algorithm="allgather", comm=comm)
    if mode == "none+adamw":
        return optax.chain(optax.clip_by_global_norm(1.0),
                           optax.adamw(LR, weight_decay=WEIGHT_DECAY))
    if mode == "topk+adamw":
        return optax.chain(topk, optax.clip_by_global_norm(1.0),
                           optax.adamw(LR, weight_decay=WEIGHT_DECAY))
    sync = hide_flat_entry(topk) if mode == "adamdir_unfused" else topk
    return optax.chain(optax.clip_by_global_norm(1.0),
                       jss.adam_direction_sync(sync, momentum_masking="restart"),
                       optax.add_decayed_weights(WEIGHT_DECAY), optax.scale_by_learning_rate(LR))


class Runner:
    """A donated state and a step over it; ``run(n)`` times n steps, one each: the wall
    time and the CPU time of the whole process (all its threads: XLA's and the
    kernels'), which the other jobs on a shared machine disturb less."""

    def __init__(self, step, state, inputs):
        self.step, self.state, self.inputs, self.i = step, state, inputs, 0

    def once(self) -> tuple[float, float]:
        x = self.inputs[self.i % len(self.inputs)]
        self.i += 1
        c0, t0 = time.process_time(), time.perf_counter()
        self.state = jax.block_until_ready(self.step(*self.state, x))
        return time.perf_counter() - t0, time.process_time() - c0

    def run(self, n: int) -> tuple[list[float], list[float]]:
        wall, cpu = zip(*(self.once() for _ in range(n)))
        return list(wall), list(cpu)


def step_runners(comm, cfg) -> dict:
    module, loss_fn, make_batch = step_time.build_model("transformer", cfg)
    rng = np.random.default_rng(1)
    batches = [tuple(jnp.asarray(a) for a in make_batch(rng, cfg["batch"])) for _ in range(4)]
    runners = {}
    for mode in STEP_MODES:
        tx = step_tx(mode, comm)
        params = step_time.init_params(module, make_batch, seed=0)

        def step(params, opt_state, batch, tx=tx):
            grads = jax.grad(loss_fn)(params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state
        runners[mode] = Runner(jax.jit(step, donate_argnums=(0, 1)), (params, tx.init(params)),
                               batches)
    return runners


ADAM_KW = dict(b1=0.9, b2=0.999, eps=1e-8, masking="restart")


def gradient_pool(params) -> list:
    """4 random gradient trees of ``params``' shapes: each step takes the next."""
    return [jax.tree_util.tree_map(
        lambda x, s=s: jnp.asarray(np.random.default_rng(s + x.size).standard_normal(x.shape),
                                   jnp.float32), params) for s in range(4)]


def fused_runner(params, k: int, pool, max_norm: float | None = None) -> "Runner":
    """The fused Adam + accumulate + top-k call (``max_norm``: the clipping folded in), its
    state donated."""
    n = flat.flat_size(params)

    def step(mu, nu, age, residual, last, count, g):
        count = count + 1
        c = None if max_norm is None else (adam_pass.global_norm(g), max_norm)
        mu, nu, age, _, acc, values, indices, _ = adam_accumulate.adam_accumulate(
            g, mu, nu, age, residual, count, k=k, last_kth=last, clip=c, **ADAM_KW)
        return (mu, nu, age, jss.residual_update(acc, indices), jnp.min(jnp.abs(values)),
                count)
    return Runner(jax.jit(step, donate_argnums=tuple(range(6))),
                  (*(jnp.zeros((n,), jnp.float32) for _ in range(4)), jnp.float32(0),
                   jnp.int32(0)), pool)


def pass_runners(params) -> dict:
    n = flat.flat_size(params)
    k = max(1, round(DENSITY * n))
    pool = gradient_pool(params)
    zeros = lambda: jnp.zeros((n,), jnp.float32)  # noqa: E731  (separate buffers, donated)

    adamw = optax.adamw(LR, weight_decay=WEIGHT_DECAY)

    def adamw_step(p, s, g):
        u, s = adamw.update(g, s, p)
        return optax.apply_updates(p, u), s

    def acc_topk_step(residual, last, count, g):
        acc, values, indices, _ = flat.accumulate_topk(residual, g, k, last_kth=last)
        return jss.residual_update(acc, indices), jnp.min(jnp.abs(values)), count + 1

    def unfused_step(mu, nu, age, residual, last, count, g):
        count = count + 1
        mu, nu, age, d = adam_pass.adam_direction_pass(g, mu, nu, age, residual, count,
                                                       **ADAM_KW)
        acc, values, indices, _ = flat.accumulate_topk(residual, flat.split_like(d, g), k,
                                                       last_kth=last)
        return (mu, nu, age, jss.residual_update(acc, indices), jnp.min(jnp.abs(values)),
                count)

    def jit(fn, nstate):
        return jax.jit(fn, donate_argnums=tuple(range(nstate)))
    p0 = jax.tree_util.tree_map(jnp.array, params)
    return {
        "adamw": Runner(jit(adamw_step, 2), (p0, adamw.init(p0)), pool),
        "accumulate_topk": Runner(jit(acc_topk_step, 3),
                                  (zeros(), jnp.float32(0), jnp.int32(0)), pool),
        "adam+accumulate_topk unfused": Runner(
            jit(unfused_step, 6), (zeros(), zeros(), zeros(), zeros(), jnp.float32(0),
                                   jnp.int32(0)), pool),
        "adam_accumulate fused": fused_runner(params, k, pool),
    }


def interleave(runners: dict, rounds: int, steps: int, warmup: int, label: str) -> dict:
    for name, r in runners.items():  # compile, first touch, the hint's first steps
        r.run(1 + warmup)
    wall = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    for i in range(rounds):
        for name, r in runners.items():
            w, c = r.run(steps)
            wall[name].append(statistics.median(w))
            cpu[name].append(statistics.median(c))
        print(f"# {label} round {i + 1}/{rounds} (wall / cpu): " + ", ".join(
            f"{name} {1e3 * wall[name][-1]:.1f} / {1e3 * cpu[name][-1]:.1f}"
            for name in runners) + " ms", flush=True)
    return {name: {"median_s": statistics.median(wall[name]), "rounds_s": wall[name],
                   "cpu_median_s": statistics.median(cpu[name]), "cpu_rounds_s": cpu[name]}
            for name in runners}


def plot(data: dict, path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, part, title in ((axes[0], "step", "LM training step (one process)"),
                            (axes[1], "pass", "optimizer work alone, LM size")):
        recs = data[part]
        names = list(recs)
        x = np.arange(len(names))
        for off, key, label, color in ((-0.2, "median_s", "wall", "tab:blue"),
                                       (0.2, "cpu_median_s", "CPU (process)", "tab:orange")):
            med = [1e3 * recs[m][key] for m in names]
            ax.bar(x + off, med, 0.38, color=color, alpha=0.6, label=label)
            rounds = key.replace("median_s", "rounds_s")
            for j, m in enumerate(names):
                ax.scatter([j + off] * len(recs[m][rounds]), [1e3 * v for v in recs[m][rounds]],
                           color="k", s=6, zorder=3)
                ax.text(j + off, med[j], f"{med[j]:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [m.replace(" ", "\n") for m in names], fontsize=7)
        ax.set_ylabel("ms (median of round medians; dots: rounds)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    info = data["machine"]
    save_figure(fig, path, f"fused Adam-direction pass, N = {data['size']:,}, topk 1 %: "
                f"{info['cpu_count']} CPUs (shared, loaded), {info['date'][:10]}", fontsize=9)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per mode and round")
    ap.add_argument("--pass-steps", type=int, default=15,
                    help="timed calls per pass variant and round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--parts", nargs="+", default=["step", "pass"], choices=["step", "pass"])
    ap.add_argument("--tag", default="lm")
    args = ap.parse_args(argv)
    jss.mpi.tune_host_allocator()
    cfg = {"vocab": 256, "dim": 384, "heads": 6, "layers": 6, "mlp_ratio": 4, "seq": 128,
           "batch": 2}
    module, _, make_batch = step_time.build_model("transformer", cfg)
    params = step_time.init_params(module, make_batch, seed=0)
    n = flat.flat_size(params)
    data = {"machine": machine_info(), "config": cfg, "size": n,
            "leaves": len(jax.tree_util.tree_leaves(params)), "density": DENSITY,
            "args": vars(args), "loadavg_before": loadavg()}
    print(f"# LM: {n:,} parameters in {data['leaves']} leaves", flush=True)
    if "pass" in args.parts:
        data["pass"] = interleave(pass_runners(params), args.rounds, args.pass_steps,
                                  args.warmup, "pass")
    if "step" in args.parts:
        data["step"] = interleave(step_runners(MPI.COMM_SELF, cfg), args.rounds, args.steps,
                                  args.warmup, "step")
    data["loadavg_after"] = loadavg()
    ratios = {}
    for clock, key in (("wall", "median_s"), ("cpu", "cpu_median_s")):
        if "step" in data:
            s = {m: r[key] for m, r in data["step"].items()}
            ratios[f"step_fused_over_topk_adamw_{clock}"] = s["adamdir_fused"] / s["topk+adamw"]
            ratios[f"step_unfused_over_topk_adamw_{clock}"] = (s["adamdir_unfused"]
                                                               / s["topk+adamw"])
            ratios[f"step_fused_over_unfused_{clock}"] = s["adamdir_fused"] / s["adamdir_unfused"]
        if "pass" in data:
            p = {m: r[key] for m, r in data["pass"].items()}
            ratios[f"pass_fused_over_unfused_{clock}"] = (p["adam_accumulate fused"]
                                                          / p["adam+accumulate_topk unfused"])
            ratios[f"pass_fused_over_adamw_plus_accumulate_topk_{clock}"] = (
                p["adam_accumulate fused"] / (p["adamw"] + p["accumulate_topk"]))
    data["ratios"] = ratios
    print(json.dumps(ratios, indent=1))
    out = write_record(data, RESULTS / f"adam_fused_{args.tag}.json")
    if "step" in data and "pass" in data:
        plot(data, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
