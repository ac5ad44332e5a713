"""How far Ok-Topk's reused thresholds drift from the exact ones during training.

Trains the Flax CNN of ``examples/train_flax.py`` with ``optax.chain(jss.oktopk_sync(
density, tau, tau_prime, selection=POLICY), optax.sgd(cosine schedule, momentum))`` for
each local selection policy (``threshold_reuse``, ``gaussian``, ``exact``) and, for the
final accuracy, with ``jss.topk_sync`` and ``jss.dense_sync``; every run from the same
parameters on the same batches. Every step, on every rank, for the Ok-Topk runs:
``local_count / k``, ``global_count / k``, whether the step recomputed or balanced, the
local threshold used against the exact one (the k-th magnitude of the accumulator), the
count that qualified (overflow fallbacks) and the global threshold. Rank 0 prints the
summary: count/k per policy, the reused/exact threshold ratio, overflow fallbacks and
every run's final test accuracy.

    timeout 600 mpiexec -n 4 python benchmarks/oktopk_threshold_drift.py
    timeout 600 mpiexec -n 4 python benchmarks/oktopk_threshold_drift.py --no-region-band \\
        --out /tmp/before.json    # oktopk_sync(region_band=None): the paper's rule
    python benchmarks/oktopk_threshold_drift.py --plot-only    # redraw from the JSON

Writes ``benchmarks/results/oktopk_threshold_drift.{json,png}`` (results:
benchmarks/README.md, "oktopk_threshold_drift.py").
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
from _harness import (add_record_options, load_record, machine_info, parser,  # noqa: E402
                      print_header, pyplot, save_figure, write_record)
POLICIES = ("threshold_reuse", "gaussian", "exact")
BASELINES = ("topk_sync", "dense_sync")
BAND = (0.75, 1.25)
WIDE_BAND = (0.5, 2.0)


def load_example():
    """examples/train_flax.py as a module (model, data, shards, batches)."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import train_flax  # noqa: E402
    return train_flax


def compact(obj):
    """Floats rounded to 7 significant digits (float32 precision), for a smaller JSON."""
    if isinstance(obj, float):
        return float(f"{obj:.7g}")
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [compact(v) for v in obj]
    return obj


def percentiles(x, qs=(5, 50, 95)):
    import numpy as np
    x = np.asarray(x, float)
    if x.size == 0:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(np.percentile(x, q)) for q in qs}


# --------------------------------------------------------------------------- training


def run(name: str, args, ex, model, init_params, data, k: int) -> dict:
    """One training run; per-step records for the Ok-Topk policies."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.flatten_util import ravel_pytree
    from jax.scipy.special import ndtri

    import jax_sparse_sync as jss

    rank, size = jss.comm_rank(), jss.comm_size()
    x_train, y_train, x_test, y_test = data
    x_shard, y_shard = ex.shard(x_train, y_train, rank, size)
    steps = ex.steps_per_epoch(len(x_train), args.batch_size, size)
    total = args.epochs * steps
    if name == "dense_sync":
        sync = jss.dense_sync()
    elif name == "topk_sync":
        sync = jss.topk_sync(density=args.density)
    else:
        sync = jss.oktopk_sync(density=args.density, tau=args.tau, tau_prime=args.tau_prime,
                               selection=name, region_band=args.region_band)
    tx = optax.chain(sync, optax.sgd(optax.cosine_decay_schedule(args.lr, decay_steps=total),
                                     momentum=args.momentum))
    oktopk = name in POLICIES

    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        acc = gauss = None
        if oktopk:  # the accumulator the selection sees: residual + grad, before the update
            acc = ravel_pytree(opt_state[0].residual)[0] + ravel_pytree(grads)[0]
            # Gaussiank's threshold, as jax_sparse_sync.transforms.selection_policy computes it
            z = ndtri(1.0 - k / (2.0 * acc.shape[0]))
            gauss = jnp.abs(jnp.mean(acc)) + jnp.std(acc) * z
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc, gauss

    count_correct = ex.make_count_correct(model)
    params, opt_state = init_params, tx.init(init_params)
    n = int(ravel_pytree(init_params)[0].size)
    capacity = min(n, max(k, int(2.0 * k))) if name != "exact" else k
    steps_rec = []
    history = []
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        losses = []
        for x, y in ex.batches(x_shard, y_shard, batch_size=args.batch_size, steps=steps,
                               seed=args.seed, epoch=epoch, rank=rank):
            pre = opt_state[0]
            if oktopk:
                count = int(pre.count)
                pre_local, pre_global = float(pre.local_threshold), float(pre.global_threshold)
            params, opt_state, loss, acc, gauss = train_step(params, opt_state, x, y)
            losses.append(loss)
            if not oktopk:
                continue
            post = opt_state[0]
            st = np.asarray(post.last_stats)
            mag = np.abs(np.asarray(acc, np.float32))
            exact_kth = float(np.partition(mag, n - k)[n - k])
            local_exact_step = name == "threshold_reuse" and (count % args.tau == 0 or pre_local <= 0)
            global_exact_step = count % args.tau == 0 or pre_global <= 0
            post_local = float(post.local_threshold)
            selected = int(post.last_local_count)
            if name == "threshold_reuse" and not local_exact_step:
                used = pre_local
            elif name == "gaussian":
                used = float(gauss)
            else:  # exact (or a threshold_reuse recompute step): the k-th magnitude
                used = post_local
            qualified = int(np.count_nonzero((mag >= np.float32(used)) & (mag != 0)))
            overflow = name != "exact" and not local_exact_step and qualified > capacity
            steps_rec.append({
                "step": count, "epoch": epoch,
                "local_exact_step": bool(local_exact_step or name == "exact"),
                "global_exact_step": bool(global_exact_step),
                "local_count": selected, "qualified": qualified, "overflow_fallback": overflow,
                "local_threshold_next": post_local,
                "global_count": int(st[3]), "balancing_ran": bool(st[4]), "bytes_sent": int(st[0]),
                "local_threshold_used": used, "local_threshold_exact": exact_kth,
                "global_threshold_used": (float(post.global_threshold) if global_exact_step
                                          else pre_global),
                "global_threshold_next": float(post.global_threshold),
            })
        mean_loss = ex.WORLD.allreduce(float(np.mean(np.asarray(jnp.stack(losses))))) / size
        accuracy = ex.test_accuracy(count_correct, params, x_test, y_test, rank, size)
        history.append({"epoch": epoch, "steps": epoch * steps, "train_loss": mean_loss,
                        "test_accuracy": accuracy})
        if rank == 0 and (epoch % 5 == 0 or epoch == args.epochs):
            print(f"  {name:>15} | epoch {epoch:3d} | loss {mean_loss:.4f} | test acc "
                  f"{accuracy:6.2f}% | {time.perf_counter() - t0:6.1f} s", flush=True)
    identical = ex.replicas_identical(params)
    return {"name": name, "steps_per_epoch": steps, "total_steps": total, "capacity": capacity,
            "history": history, "final_test_accuracy": history[-1]["test_accuracy"],
            "replicas_identical": identical, "seconds": time.perf_counter() - t0,
            "per_rank_steps": ex.WORLD.gather(steps_rec, root=0)}


# --------------------------------------------------------------------------- summary


def summarize(data: dict) -> dict:
    import numpy as np

    k, p, tau = data["k"], data["ranks"], data["config"]["tau"]
    bound6 = 6 * k * (p - 1) / p if p > 1 else None  # words: Ok-Topk's upper bound
    out = {}
    for name, r in data["runs"].items():
        s = {"final_test_accuracy": r["final_test_accuracy"],
             "replicas_identical": r["replicas_identical"]}
        ranks = r.get("per_rank_steps")
        if ranks and ranks[0]:
            allsteps = [st for rk in ranks for st in rk]
            reuse = [st for st in allsteps if not st["local_exact_step"]]
            selected = [st["local_count"] / k for st in allsteps]
            qualified = [st["qualified"] / k for st in reuse]
            glob = [st["global_count"] / k for st in ranks[0]]  # equal on all ranks
            glob_reuse = [st["global_count"] / k for st in ranks[0] if not st["global_exact_step"]]
            ratio = [st["local_threshold_used"] / st["local_threshold_exact"] for st in reuse
                     if st["local_threshold_exact"] > 0]
            s.update({
                "steps": len(ranks[0]), "ranks": len(ranks),
                "threshold_steps": len(reuse) // max(1, len(ranks)),
                # what the step sent: after an overflow fallback this is k
                "local_selected_over_k": percentiles(selected),
                # what the (reused / Gaussian) threshold picked, before any fallback
                "local_qualified_over_k": percentiles(qualified),
                "local_fraction_in_band": (float(np.mean([(BAND[0] <= v <= BAND[1])
                                                          for v in qualified]))
                                           if qualified else None),
                "global_count_over_k": percentiles(glob),
                "global_count_over_k_reuse_steps": percentiles(glob_reuse),
                "global_fraction_in_band": (float(np.mean([(BAND[0] <= v <= BAND[1])
                                                           for v in glob_reuse]))
                                            if glob_reuse else None),
                # issue 15's goal: the global count within [0.5 k, 2 k], every step
                "global_fraction_in_wide_band": float(np.mean([(WIDE_BAND[0] <= v <= WIDE_BAND[1])
                                                               for v in glob])),
                "threshold_ratio_used_over_exact": percentiles(ratio),
                "overflow_fallbacks": int(sum(st["overflow_fallback"] for st in allsteps)),
                "qualified_matches_selected": int(sum(
                    st["qualified"] == st["local_count"] for st in allsteps
                    if not st["overflow_fallback"] and not st["local_exact_step"])),
                "reuse_steps_checked": int(sum(not st["overflow_fallback"]
                                               and not st["local_exact_step"] for st in allsteps)),
                "balancing_ran_steps": int(sum(st["balancing_ran"] for st in ranks[0])),
                "mean_bytes_sent_per_step": float(np.mean([st["bytes_sent"] for st in allsteps])),
            })
            if bound6:
                # words sent per rank and step over 6k(P-1)/P; control traffic included
                w_reuse = [st["bytes_sent"] / 4 / bound6 for st in allsteps if st["step"] % tau]
                w_exact = [st["bytes_sent"] / 4 / bound6 for st in allsteps
                           if st["step"] % tau == 0]
                s.update({
                    "words_sent_over_6k_bound_reused_threshold_steps": percentiles(w_reuse),
                    "fraction_reused_threshold_steps_above_6k_bound": (
                        float(np.mean([w > 1 for w in w_reuse])) if w_reuse else None),
                    "max_words_sent_over_6k_bound_reused_threshold_steps": (
                        float(max(w_reuse)) if w_reuse else None),
                    "words_sent_over_6k_bound_exact_threshold_steps": percentiles(w_exact),
                })
        out[name] = s
    return out


def fmt_range(p: dict) -> str:
    if p.get("p50") is None:
        return "-"
    return f"{p['p50']:.3f} [{p['p5']:.3f}, {p['p95']:.3f}]"


def print_summary(data: dict) -> None:
    s = data["summary"]
    print(f"\n# {data['ranks']} ranks, {data['num_params']} parameters, k = {data['k']} "
          f"(density {data['config']['density']}), tau = {data['config']['tau']}, "
          f"tau' = {data['config']['tau_prime']}, {data['config']['epochs']} epochs, "
          f"region_band = {data['config'].get('region_band', 'None (before the option)')}")
    print("# count/k: median [5%, 95%] over steps (local: over steps and ranks). 'selected' = "
          "entries the local selection sent (k after an overflow fallback); 'qualified' = "
          "entries at or above the threshold the step used, on the steps that select by "
          "threshold (threshold_reuse: all but every tau-th; gaussian: all)")
    print_header(f"{'run':>15} | {'local selected/k (all)':>24} {'qualified/k (thr steps)':>24} "
                 f"{'in band':>7} | {'global count/k (all)':>24} {'in band':>7} | "
                 f"{'thr used/exact (reuse)':>24} | {'ovfl':>4} | {'test acc':>8}")
    for name, r in s.items():
        if "steps" not in r:
            print(f"{name:>15} | {'':>24} {'':>24} {'':>7} | {'':>24} {'':>7} | {'':>24} | "
                  f"{'':>4} | {r['final_test_accuracy']:7.2f}%")
            continue
        band = r["local_fraction_in_band"]
        gband = r["global_fraction_in_band"]
        print(f"{name:>15} | {fmt_range(r['local_selected_over_k']):>24} "
              f"{fmt_range(r['local_qualified_over_k']):>24} "
              f"{'-' if band is None else f'{band:.0%}':>7} | "
              f"{fmt_range(r['global_count_over_k']):>24} "
              f"{'-' if gband is None else f'{gband:.0%}':>7} | "
              f"{fmt_range(r['threshold_ratio_used_over_exact']):>24} | "
              f"{r['overflow_fallbacks']:>4} | {r['final_test_accuracy']:7.2f}%")
    for name, r in s.items():
        if r.get("global_fraction_in_wide_band") is not None:
            print(f"{name:>15}: global count in [{WIDE_BAND[0]}k, {WIDE_BAND[1]}k] on "
                  f"{r['global_fraction_in_wide_band']:.0%} of the steps")
    for name, r in s.items():
        if r.get("words_sent_over_6k_bound_reused_threshold_steps"):
            w = r["words_sent_over_6k_bound_reused_threshold_steps"]
            print(f"{name:>15}: words sent per rank and step / 6k(P-1)/P: reused-threshold steps "
                  f"{fmt_range(w)}, {r['fraction_reused_threshold_steps_above_6k_bound']:.0%} above "
                  f"1 (max {r['max_words_sent_over_6k_bound_reused_threshold_steps']:.2f}); "
                  f"exact-threshold steps (every tau) "
                  f"{r['words_sent_over_6k_bound_exact_threshold_steps']['p50']:.2f}")
    print("(in band: fraction of threshold steps with count/k in [0.75, 1.25] (local: qualified; "
          "global: steps with a reused global threshold); thr used/exact: local threshold the "
          "step used over the exact k-th |residual + grad|; ovfl: threshold steps x ranks where "
          "more than capacity = 2k entries qualified and the step fell back to the exact top-k)")


# --------------------------------------------------------------------------- plot


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    import numpy as np

    k, tau = data["k"], data["config"]["tau"]
    runs = data["runs"]
    fig, axes = plt.subplots(3, 2, figsize=(15, 13))
    rank_colors = plt.cm.tab10(np.arange(10))

    def steps_of(name):
        return runs[name]["per_rank_steps"] if name in runs else None

    def decorate(ax, title, ylabel, band=True):
        if band:
            ax.axhspan(*BAND, color="tab:green", alpha=0.12, label="[0.75, 1.25] band")
            ax.axhline(1.0, color="k", lw=0.6)
        total = max(st["step"] for st in steps_of(next(n for n in POLICIES if n in runs))[0]) + 1
        for t in range(0, total, tau):
            ax.axvline(t, color="tab:gray", ls=":", lw=0.8)
        ax.plot([], [], color="tab:gray", ls=":", lw=0.8, label=f"exact recompute (every tau={tau})")
        ax.set_title(title, fontsize=10)
        ax.set(xlabel="step", ylabel=ylabel)
        ax.grid(True, alpha=0.25)

    # (a) threshold_reuse: local count / k per rank
    ax = axes[0][0]
    if "threshold_reuse" in runs:
        for r, rk in enumerate(steps_of("threshold_reuse")):
            x = [st["step"] for st in rk]
            ax.plot(x, [(st["local_count"] if st["local_exact_step"] else st["qualified"]) / k
                        for st in rk], color=rank_colors[r % 10], lw=0.9, alpha=0.85,
                    label=f"rank {r}")
            ov = [st for st in rk if st["overflow_fallback"]]
            if ov:
                ax.plot([st["step"] for st in ov], [st["qualified"] / k for st in ov], "x",
                        color=rank_colors[r % 10], ms=6)
        ax.plot([], [], "kx", label="overflow (> 2k): step redone with exact top-k")
        decorate(ax, "threshold_reuse (Ok-Topk): local count / k (entries >= the reused "
                     "threshold)", "local count / k")
        ax.legend(fontsize=7, ncol=2, loc="upper right")

    # (b) global count / k, every policy (equal on all ranks: rank 0)
    ax = axes[0][1]
    style = {"threshold_reuse": ("tab:red", "-"), "gaussian": ("tab:blue", "-"),
             "exact": ("k", "--")}
    for name in POLICIES:
        if name in runs:
            rk = steps_of(name)[0]
            ax.plot([st["step"] for st in rk], [st["global_count"] / k for st in rk],
                    color=style[name][0], ls=style[name][1], lw=0.9,
                    label=f"selection={name}")
            # recomputes off the tau grid: the stored global threshold was 0 (fewer than k
            # entries in the sum at the last recompute), which forces another one
            forced = [st for st in rk if st["global_exact_step"] and st["step"] % tau]
            if forced:
                ax.plot([st["step"] for st in forced], [st["global_count"] / k for st in forced],
                        "o", mfc="none", color=style[name][0], ms=6,
                        label=f"{name}: forced recompute (stored threshold 0), {len(forced)} steps")
    for y in WIDE_BAND:
        ax.axhline(y, color="tab:orange", ls="--", lw=0.8)
    band = data["config"].get("region_band")
    ax.plot([], [], color="tab:orange", ls="--", lw=0.8,
            label=f"[{WIDE_BAND[0]:g}, {WIDE_BAND[1]:g}] (region_band = "
                  f"{tuple(band) if band else None})")
    decorate(ax, "global count / k (global threshold reused between recomputes)",
             "global count / k")
    ax.legend(fontsize=7.5, loc="upper right")

    # (c) local threshold used / exact, reuse steps
    ax = axes[1][0]
    if "threshold_reuse" in runs:
        for r, rk in enumerate(steps_of("threshold_reuse")):
            pts = [(st["step"], st["local_threshold_used"] / st["local_threshold_exact"])
                   for st in rk if st["local_threshold_exact"] > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=rank_colors[r % 10], lw=0.9,
                    alpha=0.85, label=f"rank {r}")
    if "gaussian" in runs:
        rk = steps_of("gaussian")[0]
        ax.plot([st["step"] for st in rk],
                [st["local_threshold_used"] / st["local_threshold_exact"] for st in rk],
                color="tab:blue", lw=0.8, ls="--", alpha=0.7, label="gaussian, rank 0")
    decorate(ax, "local threshold used / exact k-th |residual + grad|", "ratio", band=False)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.legend(fontsize=7, ncol=2, loc="upper right")

    # (d) gaussian: local count / k per rank
    ax = axes[1][1]
    if "gaussian" in runs:
        for r, rk in enumerate(steps_of("gaussian")):
            ax.plot([st["step"] for st in rk], [st["qualified"] / k for st in rk],
                    color=rank_colors[r % 10], lw=0.9, alpha=0.85, label=f"rank {r}")
        ax.axhline(2.0, color="tab:red", ls="--", lw=0.8,
                   label="capacity 2k: above it the step falls back to exact top-k")
        decorate(ax, "gaussian (Gaussiank): local count / k, threshold |mean| + std * "
                     "ppf(1 - d/2)", "local count / k")
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v in (0.5, 2, 3, 5) else ""))
        ax.legend(fontsize=7, ncol=2, loc="upper right")

    # (e) distributions of local count / k
    ax = axes[2][0]
    top = 6.0
    bins = np.linspace(0, top, 121)
    for name, col in (("threshold_reuse", "tab:red"), ("gaussian", "tab:blue")):
        if name in runs:
            vals = [st["qualified"] / k for rk in steps_of(name) for st in rk
                    if not st["local_exact_step"]]
            ax.hist(np.clip(vals, 0, top), bins=bins, color=col, alpha=0.5,
                    label=f"{name} (threshold steps; clipped at {top:g})")
    ax.axvspan(*BAND, color="tab:green", alpha=0.12, label="[0.75, 1.25]")
    ax.axvline(2.0, color="tab:red", ls="--", lw=0.8, label="capacity 2k")
    ax.set(xlabel="local count / k", ylabel="steps x ranks")
    ax.set_title("distribution of the local count / k on threshold steps", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.25)

    # (f) test accuracy per epoch, every run
    ax = axes[2][1]
    colors = {"threshold_reuse": "tab:red", "gaussian": "tab:blue", "exact": "k",
              "topk_sync": "tab:purple", "dense_sync": "tab:gray"}
    for name, r in runs.items():
        h = r["history"]
        ax.plot([e["steps"] for e in h], [e["test_accuracy"] for e in h],
                color=colors.get(name, None), marker=".",
                label=f"{name}: {r['final_test_accuracy']:.2f}%")
    ax.set(xlabel="step", ylabel="test accuracy (%)")
    late = [e["test_accuracy"] for r in runs.values() for e in r["history"][len(r["history"]) // 4:]]
    ax.set_ylim(max(0, min(late) - 3), 100.5)
    ax.set_title("test accuracy (oktopk_sync policies; topk_sync and dense_sync baselines)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, alpha=0.25)

    c = data["config"]
    save_figure(fig, path, "jss.oktopk_sync on the Flax digits CNN of examples/train_flax.py: "
                f"{data['ranks']} ranks, {data['num_params']} parameters, k={k} (density "
                f"{c['density']}), tau={c['tau']}, tau'={c['tau_prime']}, {c['epochs']} epochs, "
                f"lr {c['lr']}, batch {c['batch_size']}/rank; {data['date'][:10]}", dpi=100)


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--epochs", type=int, default=30, help="epochs per run (default 30)")
    for flag, default in (("--density", 0.01), ("--tau", 32), ("--tau-prime", 64), ("--lr", 0.1),
                          ("--momentum", 0.9), ("--batch-size", 32)):  # the sync's and SGD's
        ap.add_argument(flag, type=type(default), default=default)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--region-band", type=float, nargs=2, default=(0.5, 2.0),
                    metavar=("LO", "HI"),
                    help="oktopk_sync(region_band=(LO, HI)) (default 0.5 2)")
    ap.add_argument("--no-region-band", dest="region_band", action="store_const", const=None,
                    help="oktopk_sync(region_band=None): the threshold alone (the paper's rule)")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--baselines", nargs="*", default=list(BASELINES), choices=BASELINES,
                    help="runs for the accuracy comparison only (default topk_sync dense_sync)")
    add_record_options(ap, RESULTS / "oktopk_threshold_drift.json")
    args = ap.parse_args(argv)
    data = load_record(args.out) if args.plot_only else train(args)
    if data is None:  # a rank other than 0
        return 0
    data["summary"] = summarize(data)  # (with --plot-only recomputed from the per-step records)
    write_record(compact(data), args.out, indent=None, separators=(",", ":"))
    print_summary(data)
    png = Path(args.png) if args.png else Path(args.out).with_suffix(".png")
    plot(data, png)
    print(f"wrote {png}  (wall {data['wall_s']} s)")
    ok = args.plot_only or all(r["replicas_identical"] for r in data["runs"].values())
    if not ok:
        print("FAIL: parameters differ across ranks in some run")
    return 0 if ok else 1


def train(args) -> dict | None:
    """Every run, trained; rank 0 returns the record (without its summary), the others None."""
    import jax
    from jax.flatten_util import ravel_pytree

    import jax_sparse_sync as jss

    ex = load_example()
    rank = jss.comm_rank()
    wall = time.perf_counter()
    data_ = ex.load_data(args.seed)
    model = ex.CNN()
    init_params = model.init(jax.random.key(args.seed), data_[0][:1])["params"]
    n = int(ravel_pytree(init_params)[0].size)
    k = jss.planning.resolve_k(size=n, density=args.density, k=None)
    if rank == 0:
        print(f"# {jss.comm_size()} ranks, {n} parameters, k = {k}; runs: "
              f"{args.policies + args.baselines}", flush=True)
    runs = {}
    for name in list(args.policies) + list(args.baselines):
        runs[name] = run(name, args, ex, model, init_params, data_, k)
    if rank != 0:
        return None
    return {
        "benchmark": "oktopk_threshold_drift",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "ranks": jss.comm_size(), "cpu_count": os.cpu_count(), "num_params": n, "k": k,
        "config": {kk: v for kk, v in vars(args).items() if kk not in ("out", "png", "plot_only")},
        "jax_version": jax.__version__,
        "machine": machine_info(),
        "wall_s": round(time.perf_counter() - wall, 1),
        "runs": runs,
    }


if __name__ == "__main__":
    sys.exit(main())
