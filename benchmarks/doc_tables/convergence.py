"""benchmarks/convergence.py's records: final metrics per mode, over seeds."""

from __future__ import annotations

import statistics
from typing import Callable

from .common import Table, fill, md_table, trained_at

def final(rec: dict, mode: str) -> float | None:
    """A convergence record's final metric of ``mode`` (its table: the first seed's run)."""
    row = next((r for r in rec["table"] if r["mode"] == mode), None)
    return None if row is None else row[f"final_{rec['metric']}"]


def conv_cell(rec: dict, mode: str | None, bold: bool = False) -> str:
    """``87.22 %`` (accuracy) or ``2.478 (+13.6 %)`` (loss, gap to the record's own dense)."""
    v = None if mode is None else final(rec, mode)
    if v is None:
        return ""
    if rec["lower_is_better"]:
        text = f"{v:.3f} ({100 * (v / final(rec, 'dense') - 1):+.1f} %)"
    else:
        text = f"{v:.2f} %"
    return f"**{text}**" if bold else text


def seed_gaps(rec: dict, mode: str, finals: dict | None = None) -> dict:
    """Per seed, ``mode``'s gap to dense of the same seed (points, or % of a loss), from
    ``finals`` (mode -> seed -> final; default the record's ``seed_finals``)."""
    finals = rec["seed_finals"] if finals is None else finals
    dense = finals["dense"]
    return {s: (100 * (v - dense[s]) / dense[s] if rec["lower_is_better"] else v - dense[s])
            for s, v in sorted(finals[mode].items()) if s in dense}


def gap_phrase(rec: dict, modes: tuple[str, ...]) -> str:
    unit = " %" if rec["lower_is_better"] else " pt"
    parts = []
    for m in modes:
        g = list(seed_gaps(rec, m).values())
        parts.append(f"{statistics.median(g):+.2f}{unit} [{min(g):+.2f}, {max(g):+.2f}]")
    return (f"over its {len(rec['seed_finals']['dense'])} seeds the median gaps to dense "
            f"[min, max] are {' and '.join(parts)}")


MASKED = ("topk_1pct_adamdir_mask_ramp", "topk_0.1pct_adamdir_mask_ramp")
#: (row label, chain(...) mode, adam_direction_sync mode, masked mode of the seeds record)
CONV_P4_ROWS = {
    "cnn": (("Top-k 1 %", "topk_1pct", "topk_1pct_adamdir", None),
            ("Top-k 1 %, DGC ramp", "topk_1pct_ramp", "topk_1pct_adamdir_ramp", MASKED[0]),
            ("Top-k 0.1 %", "topk_0.1pct", "topk_0.1pct_adamdir", None),
            ("Top-k 0.1 %, DGC ramp", None, "topk_0.1pct_adamdir_ramp", MASKED[1]),
            ("Ok-Topk 1 % / 0.1 %", ("oktopk_1pct", "oktopk_0.1pct"), None, None),
            ("Top-k threshold reuse 1 % / 0.1 %", ("topk_1pct_reuse", "topk_0.1pct_reuse"),
             None, None)),
    "lm": (("Top-k 1 %", "topk_1pct", "topk_1pct_adamdir", None),
           ("Top-k 1 %, DGC ramp", None, "topk_1pct_adamdir_ramp", MASKED[0]),
           ("Top-k 0.1 %", "topk_0.1pct", None, None),
           ("Top-k 0.1 %, DGC ramp", None, "topk_0.1pct_adamdir_ramp", MASKED[1])),
}


def convergence_p4(model: str) -> Callable[[dict], str]:
    """The P = 4 table: chain(sync, optimizer) and the Adam-direction sync from
    convergence_<model>.json; the masked column from seed 0 of the 3-seed record."""
    def render(recs: dict) -> str:
        rec, seeds = recs[f"convergence_{model}.json"], recs[f"convergence_{model}_seeds.json"]
        cell = lambda r, m, bold=False: " / ".join(  # noqa: E731
            conv_cell(r, x, bold) for x in m) if isinstance(m, tuple) else conv_cell(r, m, bold)
        rows = [[label, cell(rec, a), cell(rec, b), cell(seeds, c, bold=True)]
                for label, a, b, c in CONV_P4_ROWS[model]]
        dense = lambda r: conv_cell(r, "dense").split(" (")[0]  # noqa: E731
        what = ("test accuracy after" if model == "cnn" else "validation loss (nats/byte) after")
        head = (f"**{model.upper()}, P = 4**, {what} {rec['table'][0]['steps']} steps; dense "
                f"{dense(rec)} (`benchmarks/results/convergence_{model}.json`, plot "
                f"`benchmarks/results/convergence_{model}.png`); the masking column is seed 0 "
                f"of `benchmarks/results/convergence_{model}_seeds.json` (plot "
                f"`benchmarks/results/convergence_{model}_seeds.png`), whose dense ended at "
                f"{dense(seeds)}; {gap_phrase(seeds, MASKED)}:")
        optimizer = "adamw" if model == "cnn" else "clip, adamw"
        return fill(head, 90) + "\n\n" + md_table(
            ["mode", f"`chain(sync, {optimizer})`", "`adam_direction_sync(sync)`",
             "the same with momentum masking"], rows)
    return render


#: shared-support mode -> the ``topk_sync`` mode with the same recipe (convergence_cnn.json)
SHARED_SUPPORT_ROWS = {"shared_support_1pct": "topk_1pct",
                       "shared_support_1pct_adamdir": "topk_1pct_adamdir"}


def shared_support_cnn(recs: dict) -> str:
    """The CNN's final test accuracy with the index-free shared-support sync, against its
    record's own dense and ``topk_sync`` with the same recipe (convergence_cnn.json)."""
    rec, topk = recs["convergence_cnn_shared_support.json"], recs["convergence_cnn.json"]
    row = {r["mode"]: r for r in rec["table"]}
    dense = final(rec, "dense")
    rows = [["dense", f"{dense:.2f} %", "", "",
             f"{row['dense']['bytes_sent_per_step'] / 1e3:.1f}"]]
    behind = []
    for mode, same in SHARED_SUPPORT_ROWS.items():
        v, w = final(rec, mode), final(topk, same)
        behind.append(v - w)
        rows.append([f"`{mode}`", f"{v:.2f} %", f"{v - dense:+.2f} pt",
                     f"{v - w:+.2f} pt (`{same}`: {w:.2f} %)",
                     f"{row[mode]['bytes_sent_per_step'] / 1e3:.1f}"])
    head = fill(f"Final test accuracy (`benchmarks/results/convergence_cnn_shared_support."
                f"{{json,png}}`, its runs trained {trained_at(rec)}; the `topk_sync` rows from "
                f"`benchmarks/results/convergence_cnn.json`, trained {trained_at(topk)}, "
                f"whose dense ended at {final(topk, 'dense'):.2f} %):")
    met = max(final(rec, m) for m in SHARED_SUPPORT_ROWS) >= dense - 1.0
    tail = fill(f"The CNN goal (within 1 point of dense at 1 %) is "
                f"{'met' if met else '**not met**'}; against `topk_sync` with the same recipe "
                f"{min(behind):+.2f} to {max(behind):+.2f} points.")
    return head + "\n\n" + md_table(
        ["mode", "test accuracy", "vs dense", "vs `topk_sync` (same recipe)", "kB sent / step"],
        rows, ["---", "---:", "---:", "---:", "---:"]) + "\n\n" + tail


#: (row label, record, mode(s), bold); every row with the Adam-direction sync
CONV_P8_ROWS = (
    ("dense sync of each rank's Adam direction (`dense_adamdir`)", "variants", "dense_adamdir", False),
    ("Top-k 1 %", "variants", "topk_1pct_adamdir_mask_ramp", False),
    ("... learning rate before the sync (`_lrin`)", "variants", "topk_1pct_adamdir_mask_ramp_lrin", False),
    ("... ramp 40 steps a stage", "variants", "topk_1pct_adamdir_mask_ramp40", False),
    ("... leaves under 10,000 entries synced densely", "variants",
     "topk_1pct_adamdir_mask_ramp_densesmall", False),
    ("... mean second moment ramped in (`_meanvwarm`)", "lrin_meanvwarm",
     "topk_1pct_adamdir_mask_ramp_meanvwarm", False),
    ("... `_meanvwarm` and union selection", "union", "topk_1pct_adamdir_mask_ramp_union_meanvwarm", False),
    ("... `_meanvwarm` and leak 0.99 / 0.95", "leak", ("topk_1pct_adamdir_mask_ramp_meanvwarm_decay99",
                                                      "topk_1pct_adamdir_mask_ramp_meanvwarm_decay95"), False),
    ("... `_meanvwarm` and leak 0.95 fading to none over the run", "leak",
     "topk_1pct_adamdir_mask_ramp_meanvwarm_decayfade95", False),
    ("... `_lrin` and `_meanvwarm`", "lrin_meanvwarm", "topk_1pct_adamdir_mask_ramp_lrin_meanvwarm", True),
    ("Top-k 0.1 %", "variants", "topk_0.1pct_adamdir_mask_ramp", False),
    ("Top-k 0.1 %, `_meanvwarm`", "lrin_meanvwarm", "topk_0.1pct_adamdir_mask_ramp_meanvwarm", False),
    ("Top-k 0.1 %, mean second moment from the start (`_meanv`)", "leak",
     "topk_0.1pct_adamdir_mask_ramp_meanv", False),
    ("Top-k 0.1 %, `_meanvwarm` and leak 0.99 / 0.999", "leak",
     ("topk_0.1pct_adamdir_mask_ramp_meanvwarm_decay99",
      "topk_0.1pct_adamdir_mask_ramp_meanvwarm_decay999"), False),
    ("Top-k 0.1 %, `_lrin` and `_meanvwarm`", "lrin_meanvwarm",
     "topk_0.1pct_adamdir_mask_ramp_lrin_meanvwarm", True),
)
CONV_P8_RECORDS = tuple(dict.fromkeys(f"convergence_lm_{r}_P8.json" for _, r, _, _ in CONV_P8_ROWS))


def convergence_lm_p8(recs: dict) -> str:
    """The P = 8 LM variants: final validation loss and gap to dense, each row from its record."""
    rows = []
    for label, short, modes, bold in CONV_P8_ROWS:
        rec = recs[f"convergence_lm_{short}_P8.json"]
        modes = modes if isinstance(modes, tuple) else (modes,)
        b = (lambda t: f"**{t}**") if bold else (lambda t: t)
        vals = [final(rec, m) for m in modes]
        gaps = [100 * (v / final(rec, "dense") - 1) for v in vals]
        rows.append([label, b(" / ".join(f"{v:.4f}" for v in vals)),
                     b(" / ".join(f"{g:+.2f} %" for g in gaps)), f"`{short}`"])
    dense = {final(recs[n], "dense") for n in CONV_P8_RECORDS}
    files = ", ".join(f"`benchmarks/results/{n}`" for n in CONV_P8_RECORDS)
    plots = ", ".join(f"`benchmarks/results/{n.removesuffix('.json')}.png`" for n in CONV_P8_RECORDS)
    head = (f"**LM, P = 8**, {recs[CONV_P8_RECORDS[0]]['table'][0]['steps']} steps, dense "
            f"{' / '.join(f'{v:.4f}' for v in sorted(dense))} (the records {files}, named "
            f"in the last column; plots {plots}; all with the Adam-direction sync, momentum "
            "masking and the ramp unless said):")
    return fill(head, 90) + "\n\n" + md_table(["mode", "final", "gap", "record"], rows)


#: how the 600-step sentences name a mode
MODE_WORDS = {
    "dense_adamdir": "the dense sync of per-rank Adam directions",
    "dense_adamdir_meanv": "the same with the mean second moment (`second_moment=\"mean\"`)",
    "topk_1pct_adamdir_ramp": "Top-k 1 % with the ramp but no momentum masking",
    "topk_1pct_adamdir_mask_ramp": "Top-k 1 % (ramp, masking)",
    "topk_1pct_adamdir_mask_ramp_meanv": "Top-k 1 % (ramp, masking) with the mean second moment",
}


def convergence_600(name: str) -> Callable[[dict], str]:
    """One sentence: every mode of a 600-step LM record, its final loss and gap to dense."""
    def render(recs: dict) -> str:
        rec = recs[name]
        dense = final(rec, "dense")
        parts = [f"{MODE_WORDS[r['mode']]} {r['final_val_loss']:.4f} "
                 f"({100 * (r['final_val_loss'] / dense - 1):+.2f} %)"
                 for r in rec["table"] if r["mode"] != "dense"]
        stem = name.removesuffix(".json")
        return fill(f"With {rec['table'][0]['steps']} steps at P = {rec['procs']} "
                    f"(`benchmarks/results/{name}`, plot `benchmarks/results/{stem}.png`): dense "
                    f"{dense:.4f}; " + "; ".join(parts) + ".")
    return render


# this topic's tables: name, page, records, renderer
TABLES = (
    *(Table(f"convergence_{m}_p4", "benchmarks/README.md",
            (f"convergence_{m}.json", f"convergence_{m}_seeds.json"), convergence_p4(m))
      for m in ("cnn", "lm")),
    Table("convergence_lm_p8", "benchmarks/README.md", CONV_P8_RECORDS, convergence_lm_p8),
    Table("shared_support_cnn", "docs/topics/shared_support.md",
          ("convergence_cnn_shared_support.json", "convergence_cnn.json"), shared_support_cnn),
    *(Table(f"convergence_lm_600_p{P}", "benchmarks/README.md", (n,), convergence_600(n))
      for P, n in ((4, "convergence_lm_steps600.json"), (8, "convergence_lm_steps600_meanv_P8.json"))),
)
