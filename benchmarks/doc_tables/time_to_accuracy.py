"""benchmarks/time_to_accuracy.py's records: time to dense's final metric per link."""

from __future__ import annotations

from typing import Callable

from .common import Table, fmt, md_table

TTA_MODES = (("dense", "`dense_sync()`"), ("dense_bf16", "`dense_sync(wire_dtype=jnp.bfloat16)`"),
             ("topk_1pct_adamdir_mask_ramp_enc", "Adam direction 1 %, masking, ramp, encoded"))


def quartiles(r: dict) -> str:
    q = r.get("fraction_of_ideal_paired_quartiles") or [None, None]
    return f"{fmt(r.get('fraction_of_ideal_paired'), 3)} ({fmt(q[0], 3)}-{fmt(q[1], 3)})"


def tta_lm(P: int) -> Callable[[dict], str]:
    def render(recs: dict) -> str:
        rows = []
        for link, name in (("1gbit", "1 Gbit/s"), ("200mbit", "200 Mbit/s")):
            rs = {r["mode"]: r for r in recs[f"time_to_accuracy_lm_{link}_p{P}.json"]["records"]}
            for mode, label in TTA_MODES:
                r, steps = rs[mode], rs[mode]["phase_step_s"]
                step = " / ".join(f"{s:.3f}" for s in steps[:-1]) + (", " if len(steps) > 1 else "")
                bf16 = r.get("speedup_over_dense_bf16_paired")
                rows.append([name, label, step + f"{steps[-1]:.3f}", str(r["steps_to_target"]),
                             fmt(r["speedup_over_dense_paired"]), fmt(bf16) if bf16 else "-",
                             quartiles(r)])
            rows.append([name, "no sync", f"{rs['dense']['no_sync_step_s']:.3f}", "", "", "", ""])
        return md_table(["link", "mode", "step s (ramp stages 25 / 6.25 / 1.56 %, then 1 %)",
                         "steps to target", "x dense, paired", "x bf16 dense, paired",
                         "fraction of ideal, paired (quartiles)"], rows,
                        ["---", "---", "---", "---:", "---:", "---:", "---:"])
    return render


def tta_cnn(P: int) -> Callable[[dict], str]:
    def render(recs: dict) -> str:
        a = {r["mode"]: r for r in recs[f"time_to_accuracy_cnn_1gbit_p{P}.json"]["records"]}
        b = {r["mode"]: r for r in recs[f"time_to_accuracy_cnn_200mbit_p{P}.json"]["records"]}

        def speed(r):
            if r["steps_to_target"] is None:
                return "never"
            return f"{fmt(r['speedup_over_dense_paired'])}, {quartiles(r)}"
        rows = []
        for mode, label in TTA_MODES:
            x, y = a[mode], b[mode]
            smooth = "never" if x["steps_to_target_smoothed"] is None else (
                f"{x['steps_to_target_smoothed']}, {fmt(x['fraction_of_ideal_smoothed_paired'], 3)}"
                f" / {fmt(y['fraction_of_ideal_smoothed_paired'], 3)}")
            to_target = "never" if x["steps_to_target"] is None else str(x["steps_to_target"])
            rows.append([label, f"{x['final_metric']:.2f} %", to_target,
                         f"{fmt(x['step_s'], 3)} / {fmt(y['step_s'], 3)}", speed(x), speed(y),
                         smooth])
        head = (f"**P = {P}** (no-sync step {a['dense']['no_sync_step_s']:.3f} s at 1 Gbit/s, "
                f"{b['dense']['no_sync_step_s']:.3f} s at 200 Mbit/s):\n\n")
        return head + md_table(
            ["mode", "final test accuracy", "steps to dense's final", "step s, 1 Gbit/s / 200 Mbit/s",
             "1 Gbit/s: x dense, fraction of ideal (quartiles)",
             "200 Mbit/s: x dense, fraction (quartiles)",
             "from 3 evaluations: steps, fraction at 1 Gbit/s / 200 Mbit/s"], rows,
            ["---", "---:", "---:", "---", "---", "---", "---"])
    return render


# this topic's tables: name, page, records, renderer
TABLES = (
    *(Table(f"time_to_accuracy_lm_p{P}", "docs/topics/time_to_accuracy.md",
            (f"time_to_accuracy_lm_1gbit_p{P}.json", f"time_to_accuracy_lm_200mbit_p{P}.json"),
            tta_lm(P)) for P in (2, 4)),
    *(Table(f"time_to_accuracy_cnn_p{P}", "docs/topics/time_to_accuracy.md",
            (f"time_to_accuracy_cnn_1gbit_p{P}.json", f"time_to_accuracy_cnn_200mbit_p{P}.json"),
            tta_cnn(P)) for P in (4, 2)),
)
