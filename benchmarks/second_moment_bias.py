"""How well one rank estimates the mean gradient's second moment, on the LM.

``jss.adam_direction_sync(second_moment="mean")`` estimates the second moment of the
mean of the P ranks' gradients from one rank's own: ``nu_hat - (1 - 1/P) sigma_hat^2``.
This script measures that estimate's error during training for the noise estimators
``none`` (``second_moment="rank"``), ``diff1`` (from consecutive gradients), ``diff2``
(second differences, the library's), ``split`` (the two halves of the rank's
batch) and ``oracle`` (the ranks' actual variance). One process simulates P ranks of
``examples/train_lm.py``'s configuration (per-rank gradients clipped to norm 1, Adam on
their mean, ``b2 = 0.999``); every ``--every`` steps it records, for rank 0 and each
estimator, the quantiles over all coordinates of ``sqrt(v_true / v_est)`` (1: exact).

    python benchmarks/second_moment_bias.py --steps 300 \\
        --out benchmarks/results/second_moment_bias_P8.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import _harness  # noqa: E402
import models  # noqa: E402
import train_lm  # noqa: E402

ESTIMATORS = ("none", "diff1", "diff2", "split", "oracle")
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=8, help="simulated ranks P (default 8)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=2, help="windows per rank (even)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--every", type=int, default=10, help="record every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus-mb", type=float, default=12.0)
    p.add_argument("--lm", nargs="*", default=[], metavar="KEY=INT",
                   help="override examples/models.py's LM_CONFIG, e.g. dim=32 layers=1 heads=2 "
                        "seq=16 (a tiny model for a smoke run)")
    p.add_argument("--out", default=os.path.join(HERE, "results",
                                                 "second_moment_bias_P8.json"))
    args = p.parse_args(argv)
    if args.batch_size % 2:
        p.error(f"--batch-size must be even (two halves per rank), got {args.batch_size}")
    overrides = {}
    for item in args.lm:
        key, _, value = item.partition("=")
        if key not in models.LM_CONFIG or not value.isdigit():
            p.error(f"--lm takes KEY=INT with KEY one of {sorted(models.LM_CONFIG)}, got {item!r}")
        overrides[key] = int(value)
    args.lm = overrides
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    P, B, b2 = args.procs, args.batch_size, 0.999
    train_text, _, corpus = train_lm.build_corpus(int(args.corpus_mb * 1e6), 20)
    cfg = dict(models.LM_CONFIG, **args.lm)
    model = models.TransformerLM(cfg)
    params = model.init(jax.random.key(args.seed), jnp.zeros((1, cfg["seq"]), jnp.int32))["params"]
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    n = flat.size
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.lr, warmup_steps=min(args.warmup_steps, args.steps),
        decay_steps=max(args.steps, args.warmup_steps + 1),
        end_value=args.lr / 10)
    tx = optax.adamw(schedule, weight_decay=0.01)

    def half_grad(p, x, y):  # the gradient of half a rank's batch, flat
        g = jax.grad(lambda q: models.lm_loss(model.apply({"params": q}, x), y))(p)
        return jax.flatten_util.ravel_pytree(g)[0]

    def clip(g):
        return g * jnp.minimum(1.0, 1.0 / jnp.maximum(jnp.linalg.norm(g), 1e-30))

    def ema(old, new):
        return b2 * old + (1.0 - b2) * new

    @jax.jit
    def step(p, opt, mom, t, x, y):
        half = (P * 2, B // 2, x.shape[-1])
        gw = jax.vmap(half_grad, in_axes=(None, 0, 0))(p, x.reshape(half), y.reshape(half))
        gw = gw.reshape(P, 2, n)
        raw = gw.mean(axis=1)
        clipped = jax.vmap(clip)(raw)  # the clipped rank gradients (P, n)
        factor = jnp.minimum(1.0, 1.0 / jnp.maximum(jnp.linalg.norm(raw[0]), 1e-30))
        g0 = clipped[0]
        mean = clipped.mean(axis=0)
        half_a, half_b = gw[0, 0] * factor, gw[0, 1] * factor
        first = t > 1.0
        second = t > 2.0
        d1 = g0 - mom["last1"]
        d2 = g0 - 2.0 * mom["last1"] + mom["last2"]
        new = {
            "true": ema(mom["true"], mean * mean),
            "nu": ema(mom["nu"], g0 * g0),
            "m": 0.9 * mom["m"] + 0.1 * g0,
            "diff1": jnp.where(first, ema(mom["diff1"], 0.5 * d1 * d1), mom["diff1"]),
            "diff2": jnp.where(second, ema(mom["diff2"], d2 * d2 / 6.0), mom["diff2"]),
            # per-window variance / B: E[(mean_a - mean_b)^2] = 4 sigma_rank^2 for halves
            "split": ema(mom["split"], (half_a - half_b) ** 2 / 4.0),
            "oracle": ema(mom["oracle"], clipped.var(axis=0, ddof=1)),
            "last1": g0, "last2": mom["last1"],
        }
        updates, opt = tx.update(unravel(mean), opt, p)
        return optax.apply_updates(p, updates), opt, new

    @jax.jit
    def ratios_of(new, t):
        corr = lambda s: jnp.maximum(1.0 - b2 ** s, 1e-30)  # noqa: E731
        true_hat = new["true"] / corr(t)
        nu_hat = new["nu"] / corr(t)
        sig = {"none": jnp.zeros_like(nu_hat), "diff1": new["diff1"] / corr(t - 1.0),
               "diff2": new["diff2"] / corr(t - 2.0), "split": new["split"] / corr(t),
               "oracle": new["oracle"] / corr(t)}
        ratios = {}
        # the coordinates that move parameters: weight by |m| / sqrt(v_true)
        w = jnp.abs(new["m"]) / jnp.sqrt(jnp.maximum(true_hat, 1e-30))
        for name in ESTIMATORS:
            v = jnp.maximum(nu_hat - (1.0 - 1.0 / P) * sig[name], nu_hat / P)
            r = jnp.sqrt(true_hat / jnp.maximum(v, 1e-30))
            ratios[name] = (jnp.quantile(r, jnp.asarray(QUANTILES)),
                            jnp.sum(w * r) / jnp.maximum(jnp.sum(w), 1e-30))
        return ratios

    opt = tx.init(params)
    zeros = jnp.zeros(n, jnp.float32)
    mom = {key: zeros for key in ("true", "nu", "m", "diff1", "diff2", "split", "oracle",
                                  "last1", "last2")}
    records = []
    t0 = time.perf_counter()
    for s in range(1, args.steps + 1):
        xs, ys = zip(*(train_lm.train_batch(train_text, seed=args.seed, step=s, rank=r,
                                            batch=B, seq=cfg["seq"]) for r in range(P)))
        x = jnp.asarray(np.concatenate(xs))
        y = jnp.asarray(np.concatenate(ys))
        params, opt, mom = step(params, opt, mom, jnp.float32(s), x, y)
        if s % args.every == 0 or s == args.steps:
            ratios = ratios_of(mom, jnp.float32(s))
            rec = {"step": s}
            for name, (q, wmean) in ratios.items():
                rec[name] = {"quantiles": [round(float(v), 4) for v in np.asarray(q)],
                             "weighted_mean": round(float(wmean), 4)}
            records.append(rec)
            print(f"step {s:4d} ({time.perf_counter() - t0:6.0f} s) | " + " | ".join(
                f"{k} {rec[k]['quantiles'][2]:.3f}/{rec[k]['weighted_mean']:.3f}"
                for k in ESTIMATORS), flush=True)
    out = {"benchmark": "second_moment_bias", "procs": P, "batch_size": B, "b2": b2,
           "steps": args.steps, "lm_config": cfg, "quantiles": list(QUANTILES), "num_params": int(n),
           "corpus": corpus, "machine": _harness.machine_info(mpi=False),
           "command": "python benchmarks/second_moment_bias.py " + " ".join(
               sys.argv[1:] if argv is None else argv),
           "records": records}
    _harness.write_record(out, args.out)
    plot(out, args.out.replace(".json", ".png"))


def plot(out: dict, path: str) -> None:
    """Median (band: 25-75 %) of sqrt(v_true / v_est) against step, per estimator."""
    plt = _harness.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    steps = [r["step"] for r in out["records"]]
    for name in ESTIMATORS:
        q = np.array([r[name]["quantiles"] for r in out["records"]])
        line, = ax.plot(steps, q[:, 2], label=name)
        ax.fill_between(steps, q[:, 1], q[:, 3], color=line.get_color(), alpha=0.15)
        ax2.plot(steps, [r[name]["weighted_mean"] for r in out["records"]], label=name)
    for a, title in ((ax, "median over coordinates (band 25-75 %)"),
                     (ax2, "mean weighted by |m| / sqrt(v_true)")):
        a.axhline(1.0, color="k", lw=0.8)
        a.set(xlabel="step", ylabel="sqrt(v_true / v_est): step too large by")
        a.set_title(title, fontsize=10)
        a.legend(fontsize=8)
    fig.suptitle(f"LM, P = {out['procs']} simulated ranks, batch {out['batch_size']} per rank: "
                 "one rank's estimate of the mean gradient's second moment", fontsize=10)
    _harness.save_figure(fig, path)


if __name__ == "__main__":
    main()
