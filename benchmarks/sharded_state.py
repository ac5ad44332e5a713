"""Sparse sync with sharded optimizer state on the examples' LM: ``jss.sharded_sync`` at 1 %
(AdamW on each rank's region, its three ways of sending the change) against the replicated
``adam_direction_sync(topk_sync(1 %))`` and ``topk_sync(1 %)`` + AdamW, at the same steps.

Each mode of :data:`MODES` trains ``examples/train_lm.py`` (a smaller configuration than its
default: ``--dim --layers --heads --seq`` below) from the same parameters on the same
batches for ``--steps`` steps on P ranks (one ``mpiexec`` job a run, ``--repeats`` runs a
mode, the modes taking turns so that the machine's load hits them alike). Per mode: the
final validation loss (every repeat must end bitwise the same: ``params_sha256``), the
median step time (the median over the repeats of each run's median step), the bytes a
rank sends per step, the optimizer state per rank (its ``jax.Array`` leaves; the inner
AdamW moments apart) and the ranks' peak resident memory (``ru_maxrss``); the byte count
predicted by ``jax_sparse_sync.model.sharded`` beside the measured one. The example clips
the synced gradient by its global norm (1) in the sharded runs
(``sharded_sync(max_grad_norm=1)``) and in ``replicated_topk_adamw``, each rank's own in
``replicated_adamdir`` (inside its Adam pass). The goals (issue 58):
the sharded 1 % within 1 % of the replicated ``adam_direction_sync`` run's final loss, its
step at most 1.1x that run's, its bytes at most 2x, its AdamW state per rank at most
1/P + 1 % of the replicated one's. Writes ``benchmarks/results/sharded_state_p<P>.{json,png}``
(results: docs/topics/sharded_state.md).

    python benchmarks/sharded_state.py --procs 2 4 --quiet-wait 600     # the records
    python benchmarks/sharded_state.py --procs 4 --plot-only
    python benchmarks/sharded_state.py --procs 2 --steps 4 --dim 32 --layers 1 --heads 2 \\
        --seq 16 --modes replicated_adamdir sharded_topk --repeats 1 --out-dir /tmp/s   # smoke
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (add_launch_options, add_quiet_options, bind_args, find_mpiexec,  # noqa: E402
                      git_commit, load_record, machine_info, machine_line, parser, pyplot,
                      quiet_before, run_fragment, save_figure, write_record)

ROOT = HERE.parent
RESULTS = HERE / "results"
TOPK = ["--sync", "topk", "--density", "0.01", "--selection", "exact"]
SHARDED = ["--sync", "sharded", "--density", "0.01"]
#: mode -> the example's arguments
MODES = {
    # the replicated baseline of the goals: each rank's Adam direction synced at 1 %
    "replicated_adamdir": TOPK + ["--sync-what", "adam_direction", "--mask-momentum", "restart"],
    # the sharded sync's own semantics (AdamW on the synced sparse gradient), replicated
    "replicated_topk_adamw": TOPK,
    "sharded_topk": SHARDED + ["--change", "topk"],
    # the change's budget at the gradient's own fraction (k / P an owner) instead of k
    "sharded_topk_1pct_change": SHARDED + ["--change", "topk", "--change-density", "0.01"],
    "sharded_lazy": SHARDED + ["--change", "lazy"],
    "sharded_dense": SHARDED + ["--change", "dense"],
}
BASELINE, HEADLINE = "replicated_adamdir", "sharded_topk"


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--procs", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each mode (default 2)")
    for name, default in (("dim", 256), ("layers", 4), ("heads", 4), ("seq", 64),
                          ("batch-size", 4)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out-dir", default=str(RESULTS), help="where sharded_state_p<P> go")
    ap.add_argument("--work-dir", default=None, help="the runs' JSON (default: a temp dir)")
    ap.add_argument("--plot-only", action="store_true", help="redraw tables and PNGs")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the finished runs found in --work-dir (same arguments)")
    add_quiet_options(ap)
    add_launch_options(ap, timeout=7200, keep=False)
    ap.add_argument("--bind-to", default=None, help="MPICH -bind-to for the jobs")
    return ap


def example_args(args, mode: str, path: Path) -> list[str]:
    return [*MODES[mode], "--steps", args.steps, "--log-every", max(1, args.steps // 10),
            "--dim", args.dim, "--layers", args.layers, "--heads", args.heads,
            "--seq", args.seq, "--batch-size", args.batch_size, "--lr", args.lr,
            "--seed", 0, "--json", path]


def run_mode(args, p: int, mode: str, repeat: int, work: Path) -> dict:
    """One training run: the example's ``final`` metrics and its validation curve."""
    path = work / f"{mode}_p{p}_r{repeat}.json"
    cmd = [find_mpiexec(), *bind_args(args), "-n", p, sys.executable, "-m", "mpi4py",
           ROOT / "examples" / "train_lm.py", *example_args(args, mode, path)]
    reused = load_run(path) if args.resume else None
    if reused is not None:
        print(f"reused {path} (--resume): {reused.get('cpu_busy_before')}", flush=True)
        return reused
    path.unlink(missing_ok=True)
    busy, waited = quiet_before(args.quiet_wait, args.quiet_busy)
    print(f"$ {' '.join(map(str, cmd))}   [cpu busy before: {busy}, waited {waited}s]",
          flush=True)
    data = run_fragment(cmd, path, args.timeout, keep=True)
    if "error" in data:
        return {"error": data["error"], "cpu_busy_before": busy}
    run = run_summary(data, busy, git_commit())
    path.with_suffix(".run.json").write_text(json.dumps(run))  # what --resume reuses
    return run


def run_summary(data: dict, busy, commit) -> dict:
    """What the summary reads of one run of the example (its JSON ``data``)."""
    return {"final": data["final"], "num_params": data["num_params"], "k": data["k"],
            "curve": [[h["step"], h["val_loss"]] for h in data["history"]],
            "cpu_busy_before": busy, "trained_at_commit": commit}


def load_run(path: Path) -> dict | None:
    """A finished run of an earlier invocation (``--resume``): its summary beside the
    example's JSON, or the example's JSON itself (the load before it then unknown)."""
    for candidate in (path.with_suffix(".run.json"), path):
        try:
            data = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if "history" in data and "final" in data:
            return run_summary(data, None, None)  # the example's own JSON: not stamped
        if "final" in data:
            return data
    return None


def summarize(runs: list[dict], p: int, n: int, k: int, mode: str) -> dict:
    """A mode's runs as one row: the first run's metrics, the step time's median over runs."""
    from jax_sparse_sync.model import sharded as model

    ok = [r for r in runs if "final" in r]
    first = ok[0]["final"]
    row = {"val_loss": first["val_loss"], "train_loss": first["train_loss"],
           "step_s": statistics.median(r["final"]["median_step_s"] for r in ok),
           "step_s_runs": [r["final"]["median_step_s"] for r in ok],
           "bytes_per_step": first["bytes_sent_per_step"],
           "state_bytes_per_rank": first["state_bytes_per_rank"],
           "state_bytes_by_part": first["state_bytes_by_part"],
           "adamw_state_bytes": first["state_bytes_by_part"]["moments"],
           "peak_rss_mb": max(r["final"]["peak_rss_mb"] for r in ok),
           "same_params_every_run": len({r["final"]["params_sha256"] for r in ok}) == 1,
           "replicas_identical": all(r["final"]["replicas_identical"] for r in ok),
           "curve": ok[0]["curve"], "runs": len(ok)}
    if mode.startswith("sharded_"):
        change, change_k = change_of(mode, n, k, p)
        # the example clips the synced gradient in every sharded run: the norm's gather too
        v = model.sharded_sync_volume(nranks=p, size=n, k=k, change=change, change_k=change_k,
                                      max_grad_norm=True)
        row["model_bytes"] = {"min": v.bytes_min, "typical": v.bytes_typical, "max": v.bytes_max}
    return row


def change_of(mode: str, n: int, k: int, p: int) -> tuple[str, int]:
    """A sharded mode's ``change`` and the entries an owner sends with ``"topk"``, read
    from its example arguments, counted as the library counts them."""
    from jax_sparse_sync.model.sharded import change_entries

    argv = MODES[mode]
    change = argv[argv.index("--change") + 1]
    density = (float(argv[argv.index("--change-density") + 1])
               if "--change-density" in argv else None)
    return change, change_entries(size=n, nranks=p, k=k, change_density=density)


def goals(rows: dict, p: int) -> dict:
    """The issue's ratios, sharded 1 % (topk) against the replicated baseline."""
    if BASELINE not in rows or HEADLINE not in rows:
        return {}
    base, ours = rows[BASELINE], rows[HEADLINE]
    replicated_adamw = rows.get("replicated_topk_adamw", base)["adamw_state_bytes"]
    return {
        "loss_ratio": ours["val_loss"] / base["val_loss"],
        "step_ratio": ours["step_s"] / base["step_s"],
        "bytes_ratio": ours["bytes_per_step"] / base["bytes_per_step"],
        "adamw_state_ratio": ours["adamw_state_bytes"] / replicated_adamw,
        "state_ratio": ours["state_bytes_per_rank"] / base["state_bytes_per_rank"],
        "targets": {"loss_ratio": 1.01, "step_ratio": 1.1, "bytes_ratio": 2.0,
                    "adamw_state_ratio": 1 / p + 0.01},
    }


def measure(args, p: int, work: Path) -> dict:
    runs = {mode: [] for mode in args.modes}
    for repeat in range(args.repeats):  # the modes take turns, rotated each round
        order = args.modes[repeat % len(args.modes):] + args.modes[:repeat % len(args.modes)]
        for mode in order:
            runs[mode].append(run_mode(args, p, mode, repeat, work))
    failures = {m: [r["error"] for r in rs if "error" in r] for m, rs in runs.items()}
    done = {m: rs for m, rs in runs.items() if any("final" in r for r in rs)}
    if not done:
        return None
    any_run = next(r for rs in done.values() for r in rs if "final" in r)
    n, k = any_run["num_params"], any_run["k"]
    rows = {m: summarize(rs, p, n, k, m) for m, rs in done.items()}
    return {"machine": machine_info(), "P": p, "steps": args.steps, "repeats": args.repeats,
            "model": {"dim": args.dim, "layers": args.layers, "heads": args.heads,
                      "seq": args.seq, "batch_size": args.batch_size, "lr": args.lr,
                      "num_params": n, "k": k},
            "example_args": {m: list(map(str, MODES[m])) for m in args.modes},
            # the commit each run trained at (None: reused from an earlier invocation that
            # did not stamp its runs)
            "trained_at": {f"{m}_r{i}": r.get("trained_at_commit")
                           for m, rs in runs.items() for i, r in enumerate(rs)},
            "rows": rows, "goals": goals(rows, p),
            "failures": {m: e for m, e in failures.items() if e}}


def show(data: dict) -> None:
    print(f"\nP = {data['P']}, {data['model']['num_params']:,} parameters, "
          f"{data['steps']} steps, k = {data['model']['k']}")
    print(f"{'mode':24} {'val loss':>9} {'step ms':>8} {'kB/step':>8} {'state MB':>9} "
          f"{'AdamW MB':>9} {'RSS MB':>7}")
    for mode, r in data["rows"].items():
        print(f"{mode:24} {r['val_loss']:9.4f} {1e3 * r['step_s']:8.1f} "
              f"{r['bytes_per_step'] / 1e3:8.1f} {r['state_bytes_per_rank'] / 1e6:9.2f} "
              f"{r['adamw_state_bytes'] / 1e6:9.2f} {r['peak_rss_mb']:7.0f}")
    for name, value in data["goals"].items():
        if name != "targets":
            print(f"  {name}: {value:.3f} (goal {data['goals']['targets'].get(name, '-')})")


def plot(data: dict, png: Path) -> None:
    plt = pyplot()
    rows = data["rows"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    for mode, r in rows.items():
        steps, losses = zip(*r["curve"])
        axes[0].plot(steps, losses, label=mode, lw=1.2)
    axes[0].set(xlabel="step", ylabel="validation loss (nats/byte)", title="loss")
    axes[0].legend(fontsize=7)
    names = list(rows)
    x = range(len(names))
    axes[1].bar(x, [1e3 * rows[m]["step_s"] for m in names], color="tab:blue")
    axes[1].set(ylabel="median step (ms)", title="step time")
    axes[2].bar(x, [rows[m]["bytes_per_step"] / 1e3 for m in names], color="tab:green")
    axes[2].set(ylabel="kB sent per rank per step", title="bytes")
    adamw = [rows[m]["adamw_state_bytes"] / 1e6 for m in names]
    rest = [(rows[m]["state_bytes_per_rank"] - rows[m]["adamw_state_bytes"]) / 1e6
            for m in names]
    axes[3].bar(x, adamw, label="AdamW moments", color="tab:orange")
    axes[3].bar(x, rest, bottom=adamw, label="residuals, ages, counts", color="tab:gray")
    axes[3].set(ylabel="MB per rank", title="optimizer state per rank")
    axes[3].legend(fontsize=7)
    for ax in axes[1:]:
        ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    m = data["model"]
    save_figure(fig, png, f"sharded_sync vs replicated, P = {data['P']}, "
                f"{m['num_params']:,}-parameter LM, {data['steps']} steps: "
                f"{machine_line(data['machine'])}", fontsize=9)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out_dir)
    status = 0
    for p in args.procs:
        out = out_dir / f"sharded_state_p{p}.json"
        if args.plot_only:
            data = load_record(out)
        else:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="sharded_state") as tmp:
                work = Path(args.work_dir or tmp)
                work.mkdir(parents=True, exist_ok=True)
                data = measure(args, p, work)
            if data is None:
                print(f"P = {p}: nothing succeeded", file=sys.stderr)
                status = 1
                continue
            write_record(data, out)
        show(data)
        plot(data, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.png')}", flush=True)
        status = max(status, 2 if data.get("failures") else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
