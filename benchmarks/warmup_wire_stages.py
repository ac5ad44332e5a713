"""The density ramp's stages on a 16-bit wire (``topk_sync(warmup_wire_dtype=)``), side by side.

Collects what ``benchmarks/time_to_accuracy.py`` measured in one ``--work-dir`` (its
``--timing-only`` jobs, one per link, and its training runs) into one record: per link,
each mode's step time per ramp stage, the step with no sync and the dense steps, all
from the same timing job; per training run, the validation loss at each evaluation,
the bytes sent per step and the step that first reaches dense's final loss. Nothing is
measured here.

Commands (from the repository root; root for the emulated links)::

    M="dense topk_1pct_adamdir_mask_ramp topk_1pct_adamdir_mask_ramp_enc \\
       topk_1pct_adamdir_mask_ramp_warmbf16 topk_1pct_adamdir_mask_ramp_warmbf16_enc"
    python benchmarks/time_to_accuracy.py --model lm --link 1000 --procs 2 --train-only \\
        --modes dense topk_1pct_adamdir_mask_ramp_warmbf16_enc --work-dir RUNS
    for L in 1000 200; do python benchmarks/time_to_accuracy.py --model lm --link $L \\
        --procs 2 --timing-only --modes $M --work-dir RUNS --compile-nice 0 \\
        --timing-repeats 5; done
    for L in 1000 200; do python benchmarks/time_to_accuracy.py --model lm --link $L \\
        --procs 2 --resume --modes dense topk_1pct_adamdir_mask_ramp \\
        topk_1pct_adamdir_mask_ramp_enc topk_1pct_adamdir_mask_ramp_warmbf16_enc \\
        --work-dir RUNS --out-dir RUNS/out; done   # the join, from the saved timing
    python benchmarks/warmup_wire_stages.py --work-dir RUNS

Writes ``benchmarks/results/warmup_wire_stages_lm_p2.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import machine_info, pyplot, save_figure, write_record  # noqa: E402

RESULTS = HERE / "results"
LINKS = {"1gbit": 1000.0, "200mbit": 200.0}


def stage_table(timing: dict) -> dict:
    """``{mode: [{"density", "step_s", "repeats_step_s"}, ...]}`` of one timing job."""
    return {mode: [{"density": ph["density"], "step_s": ph["step_s"],
                    "repeats_step_s": ph.get("repeats_step_s")} for ph in rec["phases"]]
            for mode, rec in timing.items()}


def run_summary(path: Path, target: float | None) -> dict:
    """A training run's evaluations, bytes per step and first step at ``target``."""
    run = json.loads(path.read_text())
    history = [{"step": h["step"], "val_loss": h.get("val_loss"),
                "bytes_sent_per_step": h.get("bytes_sent_per_step")} for h in run["history"]]
    reached = None
    if target is not None:
        reached = next((h["step"] for h in history
                        if h["val_loss"] is not None and h["step"] > 0
                        and h["val_loss"] <= target), None)
    return {"final_val_loss": run["final"]["val_loss"],
            "replicas_identical": run["final"].get("replicas_identical"),
            "params_sha256": run["final"].get("params_sha256"),
            "warmup_phases": run.get("warmup_phases"), "command": run.get("command"),
            "history": history, "steps_to_dense_final": reached}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, required=True,
                    help="time_to_accuracy.py's --work-dir (timing_lm_<link>_p2.json, runs)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "warmup_wire_stages_lm_p2.json")
    ap.add_argument("--note", default="", help="the conditions of the timing (e.g. the load)")
    args = ap.parse_args(argv)
    links = {}
    for name, mbit in LINKS.items():
        path = args.work_dir / f"timing_lm_{name}_p{args.procs}.json"
        if not path.exists():
            continue
        saved = json.loads(path.read_text())
        links[name] = {"link_mbit": mbit, "stages": stage_table(saved["timing"]),
                       "achieved_mbit": saved["link"].get("achieved_mbit"),
                       "timing_machine": saved["machine"]}
        # the join of the same timing with the runs (time_to_accuracy.py --resume
        # --out-dir RUNS/out), where it was made: time to dense's final per mode
        joined = args.work_dir / "out" / f"time_to_accuracy_lm_{name}_p{args.procs}.json"
        if joined.exists():
            keys = ("steps_to_target", "time_to_target_s", "dense_time_s", "ideal_time_s",
                    "fraction_of_ideal", "speedup_over_dense", "final_metric", "phase_step_s",
                    "no_sync_step_s", "run_source")
            links[name]["time_to_accuracy"] = {
                r["mode"]: {k: r.get(k) for k in keys}
                for r in json.loads(joined.read_text())["records"]}
    dense = args.work_dir / f"lm_P{args.procs}_dense.json"
    target = json.loads(dense.read_text())["final"]["val_loss"] if dense.exists() else None
    runs = {p.stem.split(f"lm_P{args.procs}_", 1)[1]: run_summary(p, target)
            for p in sorted(args.work_dir.glob(f"lm_P{args.procs}_*.json"))}
    record = {"benchmark": "warmup_wire_stages", "model": "lm", "P": args.procs,
              "dense_final_val_loss": target, "note": args.note, "links": links, "runs": runs,
              "machine": machine_info()}
    write_record(record, args.out)
    plot(record, args.out.with_suffix(".png"))
    return 0


def plot(record: dict, path: Path) -> None:
    plt = pyplot()

    links = record["links"]
    fig, axes = plt.subplots(1, max(1, len(links)), figsize=(6 * max(1, len(links)), 4.2),
                             squeeze=False)
    for ax, (name, link) in zip(axes[0], links.items()):
        modes = [m for m, st in link["stages"].items() if len(st) > 1]
        densities = sorted({ph["density"] for m in modes for ph in link["stages"][m]},
                           reverse=True)
        width = 0.8 / max(1, len(modes))
        for i, mode in enumerate(modes):
            by = {ph["density"]: ph["step_s"] for ph in link["stages"][mode]}
            xs = [j + i * width for j in range(len(densities))]
            ax.bar(xs, [by.get(d, 0.0) for d in densities], width,
                   label=mode.replace("topk_1pct_adamdir_mask_", ""))
        for ref in ("none", "dense", "dense_bf16"):
            if ref in link["stages"]:
                ax.axhline(link["stages"][ref][0]["step_s"], ls=":", lw=1, color="k")
                ax.text(len(densities) - 0.5, link["stages"][ref][0]["step_s"], ref,
                        fontsize=7, va="bottom", ha="right")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(densities))])
        ax.set_xticklabels([f"{100 * d:g} %" for d in densities])
        ax.set(ylabel="step time (s), median of repeats",
               title=f"LM, P = {record['P']}, {link['link_mbit']:g} Mbit/s: ramp stages")
        ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
