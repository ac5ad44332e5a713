"""The documentation's result tables, written from their records.

Each table is a named :class:`Table`: the page it lives on, the records it reads, and a
function from those records to Markdown. On the page it lies between two markers,

    <!-- table:NAME (written by benchmarks/doc_tables.py from its records; do not edit) -->
    ...
    <!-- table:NAME:end -->

so that a number in it cannot differ from its record: ``tests/test_doc_tables.py``
renders every table and compares it with the page. After re-measuring a record:

    python -m benchmarks.doc_tables            # rewrite every table from the records
    python -m benchmarks.doc_tables --check    # exit 1 if a page differs from its records

(``python -m benchmarks.headlines --write`` runs the first too.)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Table:
    name: str
    page: str  # relative to the repository root
    records: tuple[str, ...]  # file names in benchmarks/results/
    render: Callable[[dict], str]  # {record name: its JSON} -> Markdown


def begin_marker(name: str) -> str:
    return f"<!-- table:{name} (written by benchmarks/doc_tables.py from its records; do not edit) -->"


def end_marker(name: str) -> str:
    return f"<!-- table:{name}:end -->"


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fill(text: str, width: int = 90, bullet: str = "") -> str:
    """Prose wrapped as the pages wrap it (never inside a hyphenated word, nor between a
    number and its ``%``); ``bullet`` (``"* "``, ``"- "``) makes it a list item."""
    return textwrap.fill(text.replace(" %", "\0%"), width, initial_indent=bullet,
                         subsequent_indent=" " * len(bullet),
                         break_on_hyphens=False).replace("\0", " ")


def ranks_phrase(P: int, cores: int) -> str:
    return "a core per rank" if P <= cores else f"{P} ranks on {cores} cores"


def md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# --------------------------------------------------------------------------- step time


def step_point(recs: dict, record: str, model: str, link: str, P: int, mode: str):
    """The record entry of one (model, link, P, mode) point (its median repeat), or None."""
    for r in recs[record]["records"]:
        if (r["model"], r["link"], r["P"], r["mode"]) == (model, link, P, mode):
            return r
    return None


def step_cell(r, unit: str = " ms") -> str:
    """Step in ms with, in bold, the median over repeats of measured / predicted."""
    if r is None:
        return "-"
    ms = f"{1e3 * r['step_s']:.0f}{unit}"
    if r["mode"] == "none" or r.get("measured_over_predicted_median") is None:
        return ms
    return f"{ms}, **{r['measured_over_predicted_median']:.2f}**"


#: (model, P, link, record) of each row of the step-time matrix
MATRIX_ROWS = (
    ("mlp", 4, "1000", "step_time_matrix_mlp_1000.json"),
    ("mlp", 4, "200", "step_time_matrix_mlp_200_shm.json"),
    ("mlp", 4, "shm", "step_time_matrix_mlp_200_shm.json"),
    ("mlp", 8, "1000", "step_time_matrix_p8.json"),
    ("cnn", 4, "1000", "step_time_model_p4_yield.json"),
    ("cnn", 4, "200", "step_time_matrix_cnn_lm_200_shm.json"),
    ("cnn", 4, "shm", "step_time_matrix_cnn_lm_200_shm.json"),
    ("cnn", 8, "1000", "step_time_matrix_p8.json"),
    ("transformer", 4, "1000", "step_time_model_p4_lm_yield.json"),
    ("transformer", 4, "200", "step_time_matrix_cnn_lm_200_shm.json"),
    ("transformer", 4, "shm", "step_time_matrix_cnn_lm_200_shm.json"),
    ("transformer", 8, "1000", "step_time_matrix_lm_p8.json"),
)
MATRIX_MODES = ("none", "dense", "topk_1pct_auto", "topk_0.1pct_auto", "oktopk_1pct",
                "oktopk_0.1pct", "psum")
ALGOS = ("allgather", "recursive_doubling", "split_allgather", "dsar_split_allgather")
#: (model, link, record) of each row of the forced-algorithm table
ALGO_ROWS = (
    ("mlp", "1000", "step_time_matrix_mlp_1000.json"),
    ("mlp", "200", "step_time_matrix_mlp_200_shm.json"),
    ("mlp", "shm", "step_time_matrix_mlp_200_shm.json"),
    ("cnn", "1000", "step_time_matrix_cnn_lm_algos.json"),
    ("transformer", "1000", "step_time_matrix_cnn_lm_algos.json"),
)
STEP_RECORDS = tuple(dict.fromkeys(r for *_, r in (*MATRIX_ROWS, *ALGO_ROWS)))


def link_name(link: str) -> str:
    return {"shm": "shm", "1000": "1 Gbit/s"}.get(link, f"{link} Mbit/s")


def step_matrix(recs: dict) -> str:
    rows = [[f"{model}, {P}, {link_name(link)}"]
            + [step_cell(step_point(recs, rec, model, link, P, m)) for m in MATRIX_MODES]
            for model, P, link, rec in MATRIX_ROWS]
    return md_table(["model, P, link", "none", "dense", "topk 1 %", "topk 0.1 %", "oktopk 1 %",
                     "oktopk 0.1 %", "psum"], rows)


def step_algorithms(recs: dict) -> str:
    modes = [f"topk_{d}_{a}" for d in ("1pct", "0.1pct") for a in ALGOS]
    rows = [[f"{model}, {link_name(link)}"]
            + [step_cell(step_point(recs, rec, model, link, 4, m), unit="") for m in modes]
            for model, link, rec in ALGO_ROWS]
    names = ("allgather", "rec. doubling", "split allgather", "DSAR")
    return md_table(["model, link"] + [f"{n} {d}" for d in ("1 %", "0.1 %") for n in names], rows)


def within_25pct(measured_over_predicted: float) -> bool:
    """The cost model's accuracy goal: the one rule that the tables here and the README's
    headline (``headlines.cost_model_summary``) count points by."""
    return abs(measured_over_predicted - 1) <= 0.25


def step_points(recs: dict) -> list[dict]:
    """Every (model, link, P, mode) point of the step-time records with a prediction (the
    no-sync step, which the model takes as its compute, left out), each point once."""
    seen, out = set(), []
    for name in STEP_RECORDS:
        for r in recs[name]["records"]:
            key = (r["model"], r["link"], r["P"], r["mode"])
            if r["mode"] != "none" and r.get("measured_over_predicted_median") is not None \
                    and key not in seen:
                seen.add(key)
                out.append(r)
    return out


def repeats_of(recs: dict, record: str, model: str, link: str, P: int, mode: str) -> list[dict]:
    return sorted((r for r in recs[record]["runs"]
                   if (r["model"], r["link"], r["P"], r["mode"]) == (model, link, P, mode)),
                  key=lambda r: r["repeat"])


def per_repeat(recs, record, model, link, P, over: str, mode="topk_0.1pct_auto") -> str:
    """``mode``'s step per repeat against ``over``'s (``none``: mode / none; ``dense``:
    dense / mode), paired within each repeat."""
    mine = {r["repeat"]: r["step_s"] for r in repeats_of(recs, record, model, link, P, mode)}
    base = {r["repeat"]: r["step_s"] for r in repeats_of(recs, record, model, link, P, over)}
    ratios = [mine[k] / base[k] if over == "none" else base[k] / mine[k]
              for k in sorted(mine) if k in base]
    return " / ".join(f"{x:.2f}" if over == "none" else f"{x:.1f}" for x in ratios) + "x"


def step_summary(recs: dict) -> str:
    points = step_points(recs)
    medians = [r["measured_over_predicted_median"] for r in points]
    repeats = [x for r in points for x in r.get("repeats_measured_over_predicted") or []]
    outside = sum(1 for x in repeats if not within_25pct(x))
    commits = sorted({recs[n]["machine"]["commit"][:7] for n in STEP_RECORDS
                      if recs[n]["machine"].get("commit")})
    unknown = sum(1 for n in STEP_RECORDS if not recs[n]["machine"].get("commit"))
    when = "; ".join(([f"at {', '.join(commits)}"] if commits else []) + (
        [f"{unknown} of the {len(STEP_RECORDS)} records before records named their commit"]
        if unknown else []))
    auto = sorted({r["algorithm_run"] for r in points if r["algorithm"] == "auto"})
    m1, m8 = "step_time_matrix_mlp_1000.json", "step_time_matrix_p8.json"
    m200 = "step_time_matrix_mlp_200_shm.json"
    return "\n".join([
        f"- Measured {when}. Of the {len(points)} (model, P, link, sync) "
        f"points with a prediction, the median over repeats of measured / predicted lies in "
        f"{min(medians):.2f}-{max(medians):.2f}, and {sum(map(within_25pct, medians))} "
        f"of them within 25 %; of the {len(repeats)} single repeats, {outside} are further off.",
        "- MLP, P = 4, `topk_sync(density=0.001)`, per repeat: "
        f"{per_repeat(recs, m1, 'mlp', '1000', 4, 'none')} the no-sync step and "
        f"{per_repeat(recs, m1, 'mlp', '1000', 4, 'dense')} faster than `dense_sync` at "
        f"1 Gbit/s; {per_repeat(recs, m200, 'mlp', '200', 4, 'dense')} faster than dense at "
        f"200 Mbit/s. At P = 8 (8 ranks on 2 cores): "
        f"{per_repeat(recs, m8, 'mlp', '1000', 8, 'none')} the no-sync step, "
        f"{per_repeat(recs, m8, 'mlp', '1000', 8, 'dense')} faster than dense.",
        f"- `algorithm=\"auto\"` ran {', '.join(f'`{a}`' for a in auto)} at these points; "
        f"where one run timed it beside every forced algorithm (the MLP at P = 4), its step was "
        f"{auto_against_fastest(recs)} the fastest forced algorithm's.",
    ])


def auto_against_fastest(recs: dict) -> str:
    """The range of auto's step over the fastest forced algorithm's, per (link, density)
    of the MLP records that time both."""
    ratios = []
    for model, link, rec in ALGO_ROWS:
        for d in ("1pct", "0.1pct"):
            auto = step_point(recs, rec, model, link, 4, f"topk_{d}_auto")
            forced = [step_point(recs, rec, model, link, 4, f"topk_{d}_{a}") for a in ALGOS]
            if auto is not None and all(forced):
                ratios.append(auto["step_s"] / min(r["step_s"] for r in forced))
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


# --------------------------------------------------------------------------- time to accuracy

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


# --------------------------------------------------------------------------- sharded state

SHARDED_MODES = (("replicated_adamdir", "replicated `adam_direction_sync`"),
                 ("replicated_topk_adamw", "replicated `topk_sync` + AdamW"),
                 ("sharded_topk", 'sharded, `change="topk"`'),
                 ("sharded_topk_1pct_change", 'sharded, `"topk"` at 1 % of the region'),
                 ("sharded_lazy", 'sharded, `change="lazy"`'),
                 ("sharded_dense", 'sharded, `change="dense"`'))


def kilobytes(x: float) -> str:
    return f"{x / 1e3:,.0f}" if x >= 1e6 else f"{x / 1e3:.1f}"


def sharded_state(P: int) -> Callable[[dict], str]:
    def render(recs: dict) -> str:
        data = recs[f"sharded_state_p{P}.json"]
        rows_, cores = data["rows"], data["machine"].get("cpu_count", 2)
        head = fill(f"P = {P}, {ranks_phrase(P, cores)}: "
                    f"`python benchmarks/{data['machine']['command']}` "
                    f"(`benchmarks/results/sharded_state_p{P}.{{json,png}}`, every run trained "
                    f"{trained_at(data)}):")
        base, rep = rows_["replicated_adamdir"], rows_["replicated_topk_adamw"]
        rows = []
        for mode, label in SHARDED_MODES:
            r, model = rows_[mode], rows_[mode].get("model_bytes")
            sent = f"{kilobytes(r['bytes_per_step'])} kB" + (
                f" ({kilobytes(model['typical'])})" if model else "")
            loss_a, loss_b = r["val_loss"] / base["val_loss"], r["val_loss"] / rep["val_loss"]
            ratio = r["step_s"] / base["step_s"]
            rows.append([label, f"{r['val_loss']:.4f}", "1" if r is base else f"{loss_a:.3f}",
                         "1" if r is rep else f"{loss_b:.3f}", f"{1e3 * r['step_s']:.0f} ms",
                         "1" if r is base else f"{ratio:.2f}", sent,
                         f"{r['adamw_state_bytes'] / 1e6:.2f} MB"])
        return head + "\n\n" + md_table(
            ["mode", "final val loss", "x adam_direction", "x topk + AdamW", "step",
             "x adam_direction", "bytes/step (model)", "AdamW state"], rows)
    return render


def span(values, fmt_: str = ".2f", unit: str = "") -> str:
    """``lo-hi`` of values (one value when they round alike)."""
    lo, hi = format(min(values), fmt_), format(max(values), fmt_)
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


#: the rank counts of the sharded-state records
SHARDED_PS = (2, 4)


def ceil2(x: float, digits: int = 2) -> str:
    """``x`` rounded up to ``digits`` decimals: the bound an "at most" or "within" states."""
    scale = 10 ** digits
    return f"{math.ceil(x * scale - 1e-9) / scale:.{digits}f}"


SHARDED = ("sharded_topk", "sharded_topk_1pct_change", "sharded_lazy", "sharded_dense")


def ratios(rows: dict, modes, over: str, key: str, pct_: bool = False) -> list[float]:
    """``key`` of each mode over ``over``'s, at every P (``pct_``: as % above 1)."""
    out = [r[m][key] / r[over][key] for r in rows.values() for m in modes]
    return [100 * (x - 1) for x in out] if pct_ else out


def goal(targets: dict, key: str) -> str:
    """A sharded-state goal as the records' ``goals.targets`` state it: one value, or one
    per P."""
    values = {P: t[key] for P, t in targets.items()}
    if len(set(values.values())) == 1:
        return f"{next(iter(values.values())):g}"
    return " / ".join(f"{v:g}" for v in values.values()) + " at P = " + " / ".join(
        map(str, values))


def memory_bullet(rows: dict, targets: dict) -> str:
    exact = all(P * r[m]["adamw_state_bytes"] == r["replicated_topk_adamw"]["adamw_state_bytes"]
                for P, r in rows.items() for m in SHARDED)
    adamw = ", ".join(f"{ratios({P: r}, SHARDED[:1], 'replicated_topk_adamw', 'adamw_state_bytes')[0]:.3f}"
                      f" at P = {P}" for P, r in rows.items())
    state = ratios(rows, SHARDED[:1], "replicated_adamdir", "state_bytes_per_rank")
    kept = ratios(rows, SHARDED[2:], "replicated_adamdir", "state_bytes_per_rank")
    rss = lambda kind: [x["peak_rss_mb"] for r in rows.values() for m, x in r.items()  # noqa: E731
                        if m.startswith(kind)]
    return (f"**Memory**: the AdamW state per rank is 1/P of the replicated one"
            f"{', exactly' if exact else ''} ({adamw}; goal at most "
            f"{goal(targets, 'adamw_state_ratio')}). The whole "
            f"optimizer state per rank, against the replicated `adam_direction_sync`'s, is "
            f"{' and '.join(f'{s:.2f}' for s in state)} with `change=\"topk\"` (which keeps "
            f"the change's residual too), {span(kept)} with `\"lazy\"` or `\"dense\"`: the "
            "gradient residual (N floats) is each rank's own and stays. The "
            f"processes' peak resident memory ({span(rss('sharded'), '.0f')} MB sharded, "
            f"{span(rss('replicated'), '.0f')} MB replicated) is mostly JAX, XLA and the corpus "
            "at this model size, not the state.")


def bytes_bullet(rows: dict, targets: dict) -> str:
    sent = ratios(rows, SHARDED[:3], "replicated_topk_adamw", "bytes_per_step")
    off = [abs(r[m]["bytes_per_step"] / r[m]["model_bytes"]["typical"] - 1)
           for r in rows.values() for m in ("sharded_topk", "sharded_dense")]
    in_range = all(x["model_bytes"]["min"] <= x["bytes_per_step"] <= x["model_bytes"]["max"]
                   for r in rows.values() for m, x in r.items() if m in SHARDED)
    return (f"**Bytes**: at most {ceil2(max(sent))}x the replicated 1 % sync's (goal "
            f"{goal(targets, 'bytes_ratio')}x), nothing "
            "dense on the wire but with `change=\"dense\"`; "
            f"{'every count within the model' + chr(39) + 's range, ' if in_range else ''}"
            f"`\"topk\"` and `\"dense\"` within {ceil2(100 * max(off), 1)} % of its typical count "
            "(lazy below it: the ranks' selections overlap, so a region's union holds fewer "
            "than k).")


def loss_bullet(rows: dict) -> str:
    rep, base = "replicated_topk_adamw", "replicated_adamdir"
    return ("**Loss**: the sharded sync does what the replicated `topk_sync` + AdamW does. With "
            "the change sent lazily or dense it ends at "
            f"{span(ratios(rows, SHARDED[2:], rep, 'val_loss'), '.3f')}x that run's loss; the "
            "owner's top-k of the change ends "
            f"{span(ratios(rows, SHARDED[:1], rep, 'val_loss', True), '.1f', ' %')} higher (at "
            f"1 % of the region, {span(ratios(rows, SHARDED[1:2], rep, 'val_loss', True), '.1f', ' %')}"
            "). Against `adam_direction_sync` the sharded sync ends "
            f"{span(ratios(rows, SHARDED, base, 'val_loss', True), '.1f', ' %')} higher, and the "
            f"replicated `topk_sync` + AdamW {span(ratios(rows, (rep,), base, 'val_loss', True), '.1f', ' %')}"
            ": syncing each rank's Adam direction is the better algorithm at 1 %, and it needs "
            "every rank's own moments, which is the replicated state.")


def step_bullet(rows: dict, cores: dict, targets: dict) -> str:
    per_p = "; ".join(
        f"P = {P} ({ranks_phrase(P, cores[P])}): "
        f"{span(ratios({P: r}, SHARDED[:3], 'replicated_adamdir', 'step_s'))}x, `\"dense\"` "
        f"{span(ratios({P: r}, SHARDED[3:], 'replicated_adamdir', 'step_s'))}x"
        for P, r in rows.items())
    return (f"**Step** over the replicated `adam_direction_sync` step (goal "
            f"{goal(targets, 'step_ratio')}x), {per_p}.")


def sharded_state_goals(recs: dict) -> str:
    """What the sharded-state records show against the issue's goals: memory, bytes, loss
    and step, over every P measured."""
    data = [recs[f"sharded_state_p{P}.json"] for P in SHARDED_PS]
    rows = {d["P"]: d["rows"] for d in data}
    cores = {d["P"]: d["machine"].get("cpu_count", 2) for d in data}
    targets = {d["P"]: d["goals"]["targets"] for d in data}  # sharded_state.py's, per P
    bullets = (memory_bullet(rows, targets), bytes_bullet(rows, targets), loss_bullet(rows),
               step_bullet(rows, cores, targets))
    return "\n".join(fill(b, bullet="* ") for b in bullets)


# --------------------------------------------------------------------------- selection, compression

M = 1 << 20


def selection_entry(records: list[dict], method: str, n: int, density=None) -> dict | None:
    """A selection.py record's entry of ``method`` at N (and density, where given), or None:
    the one lookup that the tables here and ``headlines.kernel_times`` share."""
    for r in records:
        if r["method"] == method and r["N"] == n and (
                density is None or abs(r.get("density", float("nan")) - density) < 1e-9):
            return r
    return None


def median_ms(records: list[dict], method: str, n: int, density=None):
    r = selection_entry(records, method, n, density)
    return None if r is None else r["median_s"] * 1e3


def ms(v) -> str:
    return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.0f}")


def quiet_phrase(data: dict) -> str:
    """Where the record was measured and how busy the CPUs were just before each point."""
    rs = data["records"]
    busy = [r["cpu_busy_before"] for r in rs if r.get("cpu_busy_before") is not None]
    loads = [r["loadavg_1min_before"] for r in rs if r.get("loadavg_1min_before") is not None]
    return (f"measured {measured_at(data)} with the CPUs {100 * min(busy):.1f}-"
            f"{100 * max(busy):.1f} % busy in the second before each point (1-min load average "
            f"{min(loads):.1f}-{max(loads):.1f}, decaying from the job before)")


def selection_cpu(recs: dict) -> str:
    data = recs["selection_cpu.json"]
    rs, rows = data["records"], []
    for n, d in ((M, .01), (4 * M, .01), (16 * M, .01), (64 * M, .01), (16 * M, .001), (64 * M, .001)):
        t, th, lax, el = (median_ms(rs, m, n, d) for m in ("topk", "threshold_select", "lax.top_k",
                                                            "elementwise"))
        rows.append([f"{n // M}M", f"{d * 100:g} %", ms(t), ms(th), ms(lax), ms(el),
                     f"{lax / t:.1f}x", f"{th / el:.2f}"])
    read = [median_ms(rs, "threshold_select", n, d) / median_ms(rs, "read_pass", n, d)
            for n in (16 * M, 64 * M) for d in (.01, .001)]
    return "\n".join([
        "**Result**, CPU (`benchmarks/results/selection_cpu.json`, plot",
        f"`benchmarks/results/selection_cpu.png`; {quiet_phrase(data)}; median ms):", "",
        md_table(["N", "density", "`topk`", "`threshold_select`", "`lax.top_k`", "elementwise",
                  "`lax.top_k` / `topk`", "`threshold_select` / elementwise"], rows), "",
        "From 16M on the elementwise pass page-faults its fresh output buffer on every",
        f"call; `threshold_select` runs at {min(read):.2f}-{max(read):.2f}x the read-only pass there."])


def selection_reuse(recs: dict) -> str:
    rs, rows = recs["selection_cpu.json"]["records"], []
    for n, d in ((4 * M, .01), (16 * M, .01), (64 * M, .01), (64 * M, .001)):
        rows.append([f"{n // M}M, {d * 100:g} %"] + [f"{median_ms(rs, m, n, d):.2f}" for m in (
            "topk", "threshold_select", "reuse_within", "reuse_overflow", "reuse_beyond_list")])
    return md_table(["N, density", "`topk`", "`threshold_select`", "1.5 k pass",
                     "3 k (from the list)", "6 k (full selection)"], rows)


def compression_cpu(recs: dict) -> str:
    data = recs["compression_cpu.json"]
    rs, rows = data["records"], []
    for n in (M, 4 * M, 16 * M, 64 * M):
        cells = []
        for m in ("block_scan_sparse", "block_scan_dense", "qsgd_quantize", "qsgd_dequantize"):
            ours, xla = median_ms(rs, m, n), median_ms(rs, "xla_" + m, n)
            cells.append(f"{ours:.2f} ({xla / ours:.1f}x)")
        rows.append([f"{n // M}M", *cells, f"{median_ms(rs, 'elementwise', n):.2f}"])
    return "\n".join([
        "**Result** (`benchmarks/results/compression_cpu.json`, plot",
        f"`benchmarks/results/compression_cpu.png`; {quiet_phrase(data)}; ms, then XLA's time / ours):",
        "", md_table(["N", "block scan, sparse", "block scan, dense", "QSGD quantize",
                      "QSGD dequantize", "elementwise pass"], rows)])


# --------------------------------------------------------------------------- grouping

GROUPING_RUNS = ("mlp_topk_200mbit", "cnn_topk_200mbit", "cnn_topk_1gbit", "cnn_dense_200mbit",
                 "cnn_dense_1gbit", "lm_topk_200mbit", "lm_topk_1gbit", "lm_dense_200mbit",
                 "lm_dense_1gbit")
GROUPING_RECORDS = tuple(f"grouping_{run}_p2.json" for run in GROUPING_RUNS)


def short_commit(data: dict) -> str:
    commit = data["machine"].get("commit") or "?"
    return commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")


def grouping_goals(recs: dict) -> str:
    """Which runs meet each of the three goals, as their records' ``goals`` read."""
    goals = {run: recs[name]["goals"][0] for run, name in zip(GROUPING_RUNS, GROUPING_RECORDS)}

    def verdict(what: str, ok: Callable[[dict], bool | None]) -> str:
        judged = {run: ok(g) for run, g in goals.items() if ok(g) is not None}
        missed = [f"`{run}`" for run, met in judged.items() if not met]
        return (f"{what}: met in {len(judged) - len(missed)} of {len(judged)} runs"
                + (f" (missed: {', '.join(missed)})" if missed else ""))
    return "Goals, as each record's `goals` reads: " + "; ".join([
        verdict("every plan predicted within 20 %", lambda g: g["all_within_20pct"]),
        verdict("`auto` not slower than the best baseline beyond the noise",
                lambda g: g["auto_not_slower"]),
        verdict("1.15x over ungrouped where 1.2x is predicted", lambda g: g.get("speedup_goal")),
    ]) + "."


def grouping_p2(recs: dict) -> str:
    """Per run: measured / predicted ms of each plan, the planner's choice, the worst
    prediction error, the noise (larger half-IQR) and the speed-up over ungrouped."""
    rows = []
    for run, name in zip(GROUPING_RUNS, GROUPING_RECORDS):
        data = recs[name]
        plans = {r["plan"]: r for r in data["records"]}
        goal = data["goals"][0]

        def cell(plan, groups=True):
            r = plans[plan]
            text = f"{1e3 * r['measured_s']:.1f} / {1e3 * r['predicted_s']:.1f}"
            return text + (f" ({r['groups']})" if groups else "")
        auto = plans["auto"]
        chosen = "ungrouped" if auto["groups"] == 1 else f"{auto['groups']} groups"
        measured = goal["measured_speedup"]
        speed = f"{goal['predicted_speedup']:.2f} / " + (  # bold: the 1.15x goal applies
            f"**{measured:.2f}**" if goal.get("speedup_goal") is not None else f"{measured:.2f}")
        rows.append([f"`{run}` ({short_commit(data)})",
                     f"{1e3 * plans['no_sync']['measured_s']:.1f}", cell("ungrouped", False),
                     cell("wfbp"), cell("mg_wfbp"), cell("asc_wfbp"), chosen,
                     f"{100 * goal['max_abs_error']:.1f} %", f"{100 * goal['noise']:.1f} %", speed])
    return md_table(["run (`grouping_<run>_p2.json`, commit)", "no sync", "ungrouped",
                     "WFBP (groups)", "MG-WFBP (groups)", "ASC-WFBP (groups)", "auto",
                     "worst error", "noise", "x over ungrouped, predicted / measured"], rows,
                    ["---", "---:", "---:", "---:", "---:", "---:", "---", "---:", "---:", "---:"])


GROUPING_PLANS = (("no_sync", "no sync"), ("ungrouped", "ungrouped"), ("wfbp", "`wfbp`"),
                  ("mg_wfbp", "`mg_wfbp`"), ("bucket", "`bucket`"), ("asc_wfbp", "`asc_wfbp`"),
                  ("auto", "`auto`"))


def grouping_models(name: str) -> Callable[[dict], str]:
    """A column per model of a grouping.py record: each plan's measured ms, then the
    predicted ms and the groups in brackets; last, each model's worst prediction error and
    noise (the larger half-IQR)."""
    def render(recs: dict) -> str:
        data = recs[name]
        models = list(dict.fromkeys(r["model"] for r in data["records"]))
        plans = {(r["model"], r["plan"]): r for r in data["records"]}
        # one goals entry per run with records (grouping.py), a run per model here
        goals = dict(zip([run["model"] for run in data["runs"] if run["records"]], data["goals"]))
        rows = []
        for plan, label in GROUPING_PLANS:
            cells = []
            for model in models:
                r = plans.get((model, plan))
                cells.append("-" if r is None else f"{1e3 * r['measured_s']:.1f}" + (
                    f" ({1e3 * r['predicted_s']:.1f}; {r['groups']})"
                    if r.get("predicted_s") is not None else ""))
            if any(c != "-" for c in cells):
                rows.append([label, *cells])
        if goals:
            rows.append(["worst error, noise", *(
                f"{100 * goals[m]['max_abs_error']:.1f} %, {100 * goals[m]['noise']:.1f} %"
                for m in models)])
        return md_table(["plan", *models], rows)
    return render


# --------------------------------------------------------------------------- SparCML's Figure 3

#: (transport, record) of each row: the 100 Mbit/s row is its own P = 8 run
FIG3_ROWS = (("500Mbit", "sparcml_fig3.json"), ("200Mbit", "sparcml_fig3.json"),
             ("100Mbit", "sparcml_fig3_100mbit_p8.json"), ("shm", "sparcml_fig3.json"))
FIG3_ALGOS = ("allgather", "recursive_doubling", "split_allgather", "dsar_split_allgather")


def sparcml_fig3(recs: dict) -> str:
    """Speed-up over ``MPI_Allreduce`` at P = 8, d = 1 %, per link (achieved rate)."""
    rows = []
    for transport, name in FIG3_ROWS:
        data = recs[name]
        at = data["speedup_P_density"]["by_transport"][transport]
        link = next(t for t in data["transports"] if t["name"] == transport)
        label = ("shared memory" if transport == "shm" else
                 f"{link['rate_mbit']:.0f} Mbit/s ({link['probe']['achieved_mbit']:.0f})")
        rows.append([label, f"{at['dense_ms']:.0f} ms"]
                    + [f"{at[a]['speedup']:.1f}x" if a in at else "-" for a in FIG3_ALGOS])
    shm = recs["sparcml_fig3.json"]["speedup_P_density"]["by_transport"]["shm"]
    floor = [shm[a]["ms"] for a in FIG3_ALGOS[:3] if a in shm]
    links = [recs[name]["speedup_P_density"]["by_transport"][t] for t, name in FIG3_ROWS
             if t != "shm"]
    model = max(at[a]["model_speedup"] or 0 for at in links for a in FIG3_ALGOS if a in at)
    text = (f"The gain grows as the link slows, as in SparCML. 8 ranks on 2 cores put a floor "
            f"under every sparse call, its time on shared memory ({min(floor):.0f}-"
            f"{max(floor):.0f} ms for the three sparse algorithms), so it stays below the "
            f"model's {model:.1f}x.")
    return md_table(["link (achieved)", "dense", "allgather", "recursive doubling",
                     "split allgather", "DSAR"], rows) + "\n\n" + fill(text)


# --------------------------------------------------------------------------- the allreduce alone

def allreduce_shm(recs: dict) -> str:
    """benchmarks/allreduce.py at N = 4M: median ms of dense and the two sparse algorithms,
    and the best sparse speed-up, for each (density, P)."""
    data = recs["allreduce_shm.json"]
    by = {(r["P"], r["density"], r["algorithm"]): r["median_s"] * 1e3 for r in data["records"]}
    rows, best, worst = [], [], []
    for density in sorted(data["densities"], reverse=True):
        for P in data["procs"]:
            dense, ag, rd = (by[(P, density, a)] for a in ("dense", "allgather", "recursive_doubling"))
            best.append(dense / min(ag, rd))
            worst.append(dense / max(ag, rd))
            rows.append([str(P), pct(density), f"{dense:.2f}", f"{ag:.2f}", f"{rd:.2f}",
                         f"{best[-1]:.1f}x"])
    head = (f"**Result**, N = {data['N'] >> 20}M, measured {measured_at(data)} "
            "(`benchmarks/results/allreduce_shm.json`, plot `benchmarks/results/allreduce_shm.png`; "
            f"median ms over {data['repeats']} repeats; {oversubscribed(data)}). Each "
            f"sparse algorithm is {min(worst):.1f}-{max(best):.1f}x faster than `MPI_Allreduce` "
            "of the dense vector:")
    return fill(head, 90) + "\n\n" + md_table(["P", "density", "dense", "allgather", "recursive doubling",
                                      "best speed-up"], rows)


def oversubscribed(data: dict) -> str:
    over = [p for p, o in sorted(data["oversubscribed"].items(), key=lambda x: int(x[0])) if o]
    cores = data["machine"].get("cpu_count")
    return (f"P = {', '.join(over)} oversubscribe{'s' if len(over) == 1 else ''} the {cores} cores"
            if over else f"no P oversubscribes the {cores} cores")


def pct(density: float) -> str:
    return f"{100 * density:g} %"


def below_topka(procs: list[int], words) -> str:
    """From which P on each Ok-Topk variant sends less than TopkA at every larger P too."""
    parts = []
    for variant, label in (("oktopk", "exact"), ("oktopk_reuse", "reused")):
        below = [words(P, variant) < words(P, "topka") for P in procs]
        first = next((P for i, P in enumerate(procs) if all(below[i:])), None)
        parts.append(f"with the {label} threshold " + (f"from P = {first} on" if first else
                                                      "at no P up to the last"))
    return ", ".join(parts)


def oktopk_volume(recs: dict) -> str:
    """benchmarks/oktopk_volume.py: words sent per rank (mean / max) at P = 2, 4, 8 against
    Ok-Topk's bounds, TopkA and DSAR, and what the sweep over every P shows."""
    data, k = recs["oktopk_volume.json"], recs["oktopk_volume.json"]["k"]
    by = {(r["P"], r["variant"]): r for r in data["records"]}
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    words = lambda P, v, key="words_sent": mean(by[(P, v)][key])  # noqa: E731
    rows = []
    for P in (p for p in (2, 4, 8) if p in data["procs"]):
        b = by[(P, "oktopk")]["bounds_words"]
        rows.append([str(P), *(f"{words(P, v):,.0f} / {max(by[(P, v)]['words_sent']):,.0f}"
                               for v in ("oktopk", "oktopk_reuse")),
                     f"{b['lower_2k']:,.0f}", f"{b['upper_6k']:,.0f}",
                     f"{words(P, 'topka'):,.0f}", f"{words(P, 'dsar'):,.0f}"])
    procs = data["procs"]
    payload = [words(P, "oktopk", "payload_words_sent") / (k * (P - 1) / P) for P in procs]
    extra = [(words(P, "oktopk") - words(P, "oktopk_reuse")) / ((P - 1) / P) for P in procs]
    hist = [by[(P, "oktopk")]["control_parts_bytes"]["threshold"] / 4 / ((P - 1) / P)
            for P in procs]
    top = procs[-1]
    text = (f"The payload is {min(payload):.2f}-{max(payload):.2f} k(P-1)/P words per rank on "
            f"average (P = {procs[0]}-{top}), the middle of the band; an exact-threshold step "
            f"sends {min(extra):,.0f}-{max(extra):,.0f} (P-1)/P words more than a reused-threshold "
            f"one, {min(hist):,.0f}-{max(hist):,.0f} of them its radix-select histograms. "
            f"Ok-Topk sends less than TopkA {below_topka(procs, words)} "
            f"({words(top, 'topka') / words(top, 'oktopk_reuse'):.1f}x less at P = {top}, "
            "reused threshold).")
    return md_table(["P", "Ok-Topk, exact threshold", "Ok-Topk, reused threshold", "2k(P-1)/P",
                     "6k(P-1)/P", "TopkA", "DSAR"], rows) + "\n\n" + fill(text, 90)


# --------------------------------------------------------------------------- update profile

PIECES = (("sgd", "SGD only"), ("add", "+ accumulate"), ("select", "+ top-k"),
          ("allreduce", "+ allreduce"), ("residual", "+ residual"), ("update", "+ update"))


def size_label(n: int) -> str:
    return f"{n / M:g}M"


def update_profile_cpu(recs: dict) -> str:
    """benchmarks/update_profile.py, SGD: the cumulative pieces of a sparse update and the
    whole transforms' steps (ms), and each piece's own milliseconds at the largest N."""
    data = recs["update_profile_cpu.json"]
    rs, density = data["records"], data["records"][0]["density"]
    head = (f"**Result** (`benchmarks/results/update_profile_cpu.json`, plot "
            f"`benchmarks/results/update_profile_cpu.png`; measured "
            f"{measured_at(data)}, quiet wait {data['waited_s']:g} s; ms, "
            f"d = {pct(density)}):")
    syncs = ("topk_sync", "dense_sync", "oktopk_sync")
    rows = [[size_label(r["size"]), *(f"{r['cumulative_ms'][p]:.2f}" for p, _ in PIECES),
             *(f"{r['transform_ms'][t]:.2f}" for t in syncs)] for r in rs]
    last = rs[-1]
    pieces = ", ".join(f"{label.lstrip('+ ')} {last['piece_ms'][p]:.1f}" for p, label in PIECES[1:])
    tail = (f"Each piece's own milliseconds (its cumulative step less the one before) at "
            f"{size_label(last['size'])}: {pieces}.")
    return (fill(head, 90) + "\n\n"
            + md_table(["N", *(label for _, label in PIECES), *(f"`{t}`" for t in syncs)], rows)
            + "\n\n" + fill(tail, 90))


#: adam_fused.py's variants: (key, label) of the whole step and of the optimizer work alone
ADAM_FUSED_STEP = (("none+adamw", "no sync, clip + AdamW"),
                   ("topk+adamw", "`topk_sync(1%)` + clip + AdamW"),
                   ("adamdir_unfused", "`adam_direction_sync(topk_sync(1%))`, unfused"),
                   ("adamdir_fused", "`adam_direction_sync(topk_sync(1%))`, fused"))
ADAM_FUSED_PASS = (("adamw", "`optax.adamw` update + `apply_updates` (XLA's one fused pass)"),
                   ("accumulate_topk", "`accumulate_topk` (what every `topk_sync` step makes)"),
                   ("adam+accumulate_topk unfused", "Adam pass + `split_like` + `accumulate_topk`"),
                   ("adam_accumulate fused", "`adam_accumulate` with the top-k (fused)"))


def adam_fused(recs: dict) -> str:
    """benchmarks/adam_fused.py: the LM's step and the optimizer work alone, CPU and wall ms
    (medians of interleaved rounds), and what the fused pass saves."""
    data = recs["adam_fused_lm.json"]
    step, pass_ = data["step"], data["pass"]
    cpu = lambda part, k: 1e3 * part[k]["cpu_median_s"]  # noqa: E731
    wall = lambda part, k: 1e3 * part[k]["median_s"]  # noqa: E731
    base = "topk+adamw"
    head = fill(f"Measured {measured_at(data)} by `python benchmarks/{data['machine']['command']}` "
                f"(load average {data['loadavg_before']:.1f} before and "
                f"{data['loadavg_after']:.1f} after), medians of {data['args']['rounds']} "
                "interleaved rounds; CPU is the process's CPU time over all its threads, wall "
                "the wall clock, in ms:")
    steps = md_table(["LM training step", "CPU", "wall", "CPU vs `topk+adamw`",
                      "wall vs `topk+adamw`"],
                     [[label, f"{cpu(step, k):.1f}", f"{wall(step, k):.1f}",
                       f"{cpu(step, k) / cpu(step, base):.2f}x",
                       f"{wall(step, k) / wall(step, base):.2f}x"] for k, label in ADAM_FUSED_STEP])
    passes = md_table(["optimizer work alone, 10.9M entries, 102 leaves", "CPU", "wall"],
                      [[label, f"{cpu(pass_, k):.1f}", f"{wall(pass_, k):.1f}"]
                       for k, label in ADAM_FUSED_PASS])
    fused, unfused = "adam_accumulate fused", "adam+accumulate_topk unfused"
    topk_work = cpu(pass_, "adamw") + cpu(pass_, "accumulate_topk")
    bullets = [
        f"**The pass alone**: the fused pass costs {cpu(pass_, fused) / cpu(pass_, unfused):.2f}x "
        f"the unfused one in CPU time ({wall(pass_, fused) / wall(pass_, unfused):.2f}x wall), "
        f"{cpu(pass_, fused) / topk_work:.2f}x AdamW plus `accumulate_topk`, the work "
        "`topk_sync` + AdamW does.",
        f"**The whole step**: the fused step's CPU time is "
        f"{cpu(step, 'adamdir_fused') / cpu(step, base):.2f}x `topk_sync(1%)` + AdamW's, "
        f"against {cpu(step, 'adamdir_unfused') / cpu(step, base):.2f}x unfused (the issue's "
        f"goal: {ADAM_FUSED_TARGET}x); wall {wall(step, 'adamdir_fused') / wall(step, base):.2f}x and "
        f"{wall(step, 'adamdir_unfused') / wall(step, base):.2f}x."]
    return "\n\n".join([head, steps, passes, "\n".join(fill(b, bullet="- ") for b in bullets)])


#: the fused step's CPU time against ``topk_sync(1%)`` + AdamW's that its issue asked for
ADAM_FUSED_TARGET = 1.1
#: N-float streams of the fused Adam pass with float32 ages (5 read, 4 written), and how many
#: of them are the ages (read and written): docs/topics/adam_direction.md, "The ages as int16"
ADAM_PASS_STREAMS, ADAM_PASS_AGE_STREAMS = 9, 2


def numpy_name(c_type: str) -> str:
    """A C++ element type as NumPy names it (``float`` -> ``float32``, ``int16_t`` -> ``int16``)."""
    return {"float": "float32", "double": "float64"}.get(c_type, c_type.removesuffix("_t"))


def adam_pass_time(recs: dict) -> str:
    """benchmarks/adam_pass_time.py: the fused pass with int16 ages against the float32-age
    kernel of an older revision, paired round by round."""
    data = recs["adam_pass_time.json"]
    base, this = data["records"]
    q = statistics.quantiles(data["paired_ratios"], n=4)
    resolved = not q[0] <= 1.0 <= q[2]
    size = lambda c_type: np.dtype(numpy_name(c_type)).itemsize  # noqa: E731
    less = ADAM_PASS_AGE_STREAMS * (1 - size(this["age_type"]) / size(base["age_type"])) \
        / ADAM_PASS_STREAMS
    return fill(
        f"**Measured** {measured_at(data)}, the fused pass with the top-k at 1 % on the LM's N, "
        f"one pinned core, this tree's kernel ({numpy_name(this['age_type'])} ages) against "
        f"the {numpy_name(base['age_type'])}-age kernel of {data['base']} built from the same source file, "
        f"{len(data['paired_ratios'])} rounds taking turns (ABBA): per-round medians "
        f"{base['median_ms']:.1f} ms against {this['median_ms']:.1f} ms, minima "
        f"{base['min_ms']:.1f} against {this['min_ms']:.1f} ms; the paired ratio's median "
        f"**{data['paired_ratio_median']:.2f}** (quartiles {q[0]:.2f}-{q[2]:.2f}): "
        + ("resolved on this machine." if resolved else "the quartiles hold 1, so this shared "
           f"2-core VM does not resolve the {100 * less:.0f} % of the streams less per round.")
        + f" Command: `python benchmarks/{data['machine']['command']}`; record "
        "`benchmarks/results/adam_pass_time.{json,png}`.", bullet="- ")


#: calibration_stability.py's fits: (key, row label)
CALIBRATION_FITS = (("old", "old (relative least squares, 8 B - 2 MiB)"),
                    ("new_2mib", "new fit, 8 B - 2 MiB only"),
                    ("new", "new fit, sweep to 8 MiB (`calibrate` now)"))


def calibration_stability(recs: dict) -> str:
    """benchmarks/calibration_stability.py: beta of each calibration, fitted three ways on the
    same medians, its spread and its worst error against the link's nominal rate."""
    data = recs["calibration_stability_200mbit_p2.json"]
    nominal = data["link_beta_s_per_byte"] * 1e9
    rows = []
    for key, label in CALIBRATION_FITS:
        betas = data["summary"][key]["beta_ns_per_byte"]
        sign = 1 if max(betas, key=lambda b: abs(b - nominal)) >= nominal else -1
        error = sign * data["summary"][key]["max_abs_error_vs_link"]  # from the unrounded fit
        bold = (lambda s: f"**{s}**") if key == "new" else (lambda s: s)
        rows.append([label, ", ".join(f"{b:.1f}" for b in betas),
                     bold(f"{100 * data['summary'][key]['spread']:.1f} %"),
                     bold(f"{100 * error:+.1f} %")])
    head = (f"`benchmarks/results/calibration_stability_200mbit_p2.{{json,png}}` (measured "
            f"{measured_at(data)}: {len(data['calibrations'])} calibrations in one job at "
            f"P = {data['P']}, each fitted three ways on the same medians):")
    return fill(head) + "\n\n" + md_table(
        ["fit", f"beta over {len(data['calibrations'])} calibrations (ns/B)",
         "spread (max - min) / mean", f"worst vs {nominal:g} ns/B"], rows,
        ["---", "---", "---:", "---:"])


def host_allocator_rows(data: dict) -> tuple[list, dict]:
    """Per (P, case) our call's summary entries by allocator, in the record's order."""
    cells: dict = {}
    for s in data["summary"]:
        if s["method"] == "ours":
            cells.setdefault((s["P"], s["case"]), {})[s["allocator"]] = s
    return sorted(cells, key=lambda pc: (pc[0], pc[1] == "dense_sync", pc[1])), cells


def plain_ms(data: dict, P: int, case: str) -> float:
    """The plain mpi4py + NumPy code's median ms beside the default allocator's run."""
    return next(s["median_ms"] for s in data["summary"] if s["P"] == P and s["case"] == case
                and s["method"] == "plain" and s["allocator"] == "default")


def sparse_allreduce_host(recs: dict) -> str:
    """benchmarks/sparse_allreduce_host.py --sweep: our host calls against the plain mpi4py +
    NumPy code, with the allocator tuned at launch, by default, and opted out."""
    data = recs["sparse_allreduce_host_shm.json"]
    order, cells = host_allocator_rows(data)
    rows, defaults, untuned_sparse = [], [], []
    for P, case in order:
        c = cells[(P, case)]
        if P == 1 and case == "dense_sync":
            continue  # a copy against a no-op Allreduce: the sentence below
        faults = c["untuned"]["minor_faults_per_call"][0]
        label = ("`dense_sync`" if case == "dense_sync"
                 else f"sparse, k = {int(case.split('=')[1]) // 1000}K")
        rows.append([str(P), label, f"{c['tuned']['vs_plain']:.2f}x",
                     f"**{c['default']['vs_plain']:.2f}x**",
                     f"{c['untuned']['vs_plain']:.1f}x" + (f" ({faults:,.0f} page faults a call)"
                                                           if faults else "")])
        defaults.append(c["default"])
        if case != "dense_sync":
            untuned_sparse.append(c["untuned"]["vs_plain"])
    one = cells[(1, "dense_sync")]
    head = fill(f"`python benchmarks/{data['machine']['command']}` (record "
                f"`benchmarks/results/sparse_allreduce_host_shm.{{json,png}}`, measured "
                f"{measured_at(data)}, shared memory, this 2-core VM; medians over "
                f"{data['rounds']} interleaved rounds of {data['repeats']} timed calls; x plain: "
                "our call's time over the plain mpi4py + NumPy equivalent's, in the same job):")
    below = max(d["vs_plain"] for d in defaults) <= 1.0
    tail = fill(
        "What a user gets without doing anything (the default column) is within "
        f"{ceil2(max(d['vs_tuned'] for d in defaults))}x of the launch variables' time in every "
        f"row (paired, within a round: {ceil2(max(d['vs_tuned_paired'] for d in defaults))}x at "
        f"most) and {'at or below' if below else 'not always below'} the plain mpi4py + NumPy "
        f"code; opting out costs {span(untuned_sparse, '.1f')}x on the sparse call, the page "
        "faults of its N-float output every call. (At P = 1 `dense_sync` is a copy against a "
        f"no-op Allreduce: {one['default']['median_ms']:.1f} against "
        f"{plain_ms(data, 1, 'dense_sync'):.2f} ms.)")
    return head + "\n\n" + md_table(
        ["P", "case", "tuned by launch variables", "**default** (nothing set)",
         "opted out (`JSS_TUNE_HOST_ALLOCATOR=0`)"], rows) + "\n\n" + tail


#: dense_allreduce.py's methods in the page's order, with their labels
DENSE_METHODS = (
    ("mpi4py_inplace", "mpi4py `Allreduce(IN_PLACE, buf)`, host array"),
    ("mpi4py_inplace_fresh", "the same, a fresh copy of the array each call"),
    ("mpi4py", "mpi4py `Allreduce(x, y)`, host arrays"),
    ("dense_sync", "`jss.dense_sync()` update, jitted, donated"),
    ("dense_allreduce", "`jss.dense_allreduce`, jitted, donated"),
    ("mpi4jax", "`mpi4jax.allreduce` in `jit`, donated"),
    ("sparse_path", "before: `sparse_allreduce(arange(N), algorithm='dense')` + mean"),
    ("dense_sync_bf16", "`jss.dense_sync(wire_dtype=jnp.bfloat16)` update, donated"),
    ("dense_sync_not_donated", "`jss.dense_sync()` update, plain `jit`"),
    ("topk_sync", "`jss.topk_sync(density=0.001)` update, donated"),
    ("topk_sync_not_donated", "`jss.topk_sync(density=0.001)` update, plain `jit`"))


#: issue 32's target for the dense sync: at most this many times mpi4py's in-place Allreduce
DENSE_SYNC_TARGET = 1.2


def dense_allreduce_shm(recs: dict) -> str:
    """benchmarks/dense_allreduce.py --sweep: every method's median ms per P, over mpi4py's
    in-place Allreduce and its fresh-buffer twin, then the dense sync against the targets."""
    data = recs["dense_allreduce_shm.json"]
    by = {(s["P"], s["method"]): s for s in data["summary"]}
    ps = sorted({s["P"] for s in data["summary"]})
    rows = [[label, *(x for P in ps for x in (
        (f"{by[(P, m)]['median_ms']:.1f}", f"{by[(P, m)]['vs_mpi4py_inplace']:.2f}",
         f"{by[(P, m)]['vs_mpi4py_inplace_fresh']:.2f}") if (P, m) in by else ("", "", "")))]
            for m, label in DENSE_METHODS if any((P, m) in by for P in ps)]
    loads = [r["loadavg_1min"] for r in data["records"] if r.get("loadavg_1min") is not None]
    head = fill(f"Measured {measured_at(data)} by `python benchmarks/{data['machine']['command']}`"
                f" ({data['N'] / 1e6:g}M float32 entries; load average {span(loads, '.1f')}):")
    header = ["method", *(h for P in ps for h in (f"P = {P}: ms", "x mpi4py", "x fresh"))]
    ratio = lambda m, over: " / ".join(  # noqa: E731
        f"{by[(P, m)]['median_ms'] / by[(P, over)]['median_ms']:.2f}x" for P in ps)
    met = [P for P in ps if by[(P, "dense_sync")]["vs_mpi4py_inplace"] <= DENSE_SYNC_TARGET]
    tail = fill(
        f"Against the targets of issue 32 (P = {' / '.join(map(str, ps))}): the dense sync is "
        f"{ratio('dense_sync', 'mpi4py_inplace')} mpi4py's in-place `Allreduce` "
        f"(`dense_allreduce` alone {ratio('dense_allreduce', 'mpi4py_inplace')}); the "
        f"{DENSE_SYNC_TARGET}x "
        f"target is met at {', '.join(f'P = {P}' for P in met) or 'no P'} in this run. "
        + (f"It takes {ratio('dense_sync', 'mpi4jax')} the time of `mpi4jax.allreduce` "
           "(target: no slower)." if all((P, "mpi4jax") in by for P in ps)
           else "mpi4jax was not installed: its comparison is missing."))
    return head + "\n\n" + md_table(header, rows, ["---", *["---:"] * (len(header) - 1)]) \
        + "\n\n" + tail


def fuzz_runs(recs: dict) -> str:
    """scripts/fuzz.sh measure: each target's executions, coverage and findings."""
    data = recs["fuzz_runs.json"]
    runs = data["runs"]
    names = " / ".join(f"`{r['target']}`" for r in runs)
    sanitizers = sorted({s for r in runs for s in r["sanitizers"]})
    findings = sum(r["findings"] for r in runs)
    k = lambda n: f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"  # noqa: E731
    coverage = [f"{r['coverage']:,}" for r in runs]
    return fill(
        f"Long runs, `benchmarks/results/fuzz_runs.json` (`{data['machine']['command']}` "
        f"{measured_at(data)}: {runs[0]['jobs']} processes a target for about "
        f"{statistics.median(r['seconds'] for r in runs):.0f} s on the 2-core machine): "
        f"{' / '.join(k(r['executions']) for r in runs)} executions of {names}, coverage "
        f"{' / '.join(coverage)} "
        f"edges, sanitizers {', '.join(sanitizers[:-1])} and {sanitizers[-1]} read from each "
        f"binary, {'no findings' if not findings else f'{findings} findings'}.")


def update_profile_adam(recs: dict) -> str:
    """benchmarks/update_profile.py --adam: ``topk_sync`` with SGD, with clip + AdamW, and
    the Adam-direction sync (ms per step)."""
    data = recs["update_profile_adam.json"]
    rs = data["records"]
    head = (f"With Adam (`benchmarks/results/update_profile_adam.json`, plot "
            f"`benchmarks/results/update_profile_adam.png`; measured "
            f"{measured_at(data)}; ms per step, d = {pct(rs[0]['density'])}):")
    rows = [[size_label(r["size"]), *(f"{r['transform_ms'][t]:.1f}" for t in (
        "topk_sync", "topk_sync+adamw", "adam_direction_sync"))] for r in rs]
    return fill(head, 90) + "\n\n" + md_table(
        ["N", "`topk_sync` + SGD", "`topk_sync` + clip + AdamW", "`adam_direction_sync(topk_sync)`"],
        rows)


# --------------------------------------------------------------------------- convergence

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
    ("... `_lrin` and `_meanvwarm`", "lrin_meanvwarm", "topk_1pct_adamdir_mask_ramp_lrin_meanvwarm", True),
    ("Top-k 0.1 %", "variants", "topk_0.1pct_adamdir_mask_ramp", False),
    ("Top-k 0.1 %, `_meanvwarm`", "lrin_meanvwarm", "topk_0.1pct_adamdir_mask_ramp_meanvwarm", False),
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


# --------------------------------------------------------------------------- outer step

#: outer_step.py's records: the timed runs at H = 10 and 30, at H = 5, the outer-optimizer sweep
OUTER_LINKS = (("100mbit", "100 Mbit/s"), ("1gbit", "1 Gbit/s"))
OUTER_MAIN = tuple(f"outer_step_lm_{link}_p2.json" for link, _ in OUTER_LINKS)
OUTER_H5 = tuple(f"outer_step_lm_{link}_p2_h5.json" for link, _ in OUTER_LINKS)
OUTER_SWEEP = "outer_step_sweep_lm_p2.json"
#: issue 56's goals for the sparse outer step: bytes fewer than DDP dense and than dense
#: DiLoCo at the same H, the final loss within this fraction of DDP dense's, and on the
#: slower link this speed-up over DDP dense at this fraction of the free-sync ideal
OUTER_GOALS = {"bytes_vs_ddp": 100, "bytes_vs_diloco": 10, "loss_gap": 0.01, "speedup": 5,
               "fraction_of_ideal": 0.9}
TO_FINAL, TO_WITHIN = "", "_within_1pct"  # the record keys' suffixes of the two targets


def argv_value(argv: list[str], flag: str) -> str | None:
    """The value after ``flag`` in a recorded command line (None: not given)."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def outer_sync_label(outer_sync: str, argv: list[str]) -> str:
    return {"dense": "dense float32", "dense_bf16": "dense bfloat16"}.get(outer_sync) or (
        f"chunked Top-k {pct(float(argv_value(argv, '--outer-density')))}, "
        f"{argv_value(argv, '--outer-bits')} bits")


#: outer_step.py's per-step (DDP) modes as the page names them
OUTER_DDP_WORDS = {"dense": "DDP dense",
                   "topk_1pct_adamdir_mask_ramp": "DDP `topk_sync` 1 % (Adam direction, ramp, masking)"}


def outer_label(r: dict, commands: dict) -> str:
    """A mode of an outer_step record as the page names it."""
    if r["every"] == 0:
        return OUTER_DDP_WORDS[r["mode"]]
    return f"DiLoCo H = {r['every']}, {outer_sync_label(r['outer_sync'], commands[r['mode']])}"


def loss_gap(final_: float, target: float) -> str:
    return f"{100 * (final_ / target - 1):+.2f} %"


def outer_by_link(recs: dict, names: tuple[str, ...]) -> list[dict]:
    """Per link (OUTER_LINKS' order), the records' modes by name."""
    return [{r["mode"]: r for r in recs[n]["records"]} for n in names]


def mean_step(r: dict) -> float:
    return r.get("mean_step_s", r["step_s"])


def no_sync_step(data: dict) -> float:
    return data["timing"]["none"]["phases"][-1]["step_s"]


def outer_intro(recs: dict) -> str:
    """What the H = 10 and 30 records ran: command, commits, repeats, the link's round trip."""
    data = [recs[n] for n in OUTER_MAIN]
    first = data[0]
    rtt = [(label, d["rtt_modeled_ms"]) for (_, label), d in zip(OUTER_LINKS, data)
           if d["rtt_modeled_ms"]]
    rtt_text = "".join(f" The {label} link's {ms:g} ms round trip is added by the join (the "
                       "kernel has no netem qdisc, `--rtt-ms 0`): one round trip to every step "
                       "that synchronizes (`--model-rtt-ms`; the measured step is kept as "
                       "`measured_step_s`)." for label, ms in rtt)
    records = " and ".join(f"`benchmarks/results/{n.removesuffix('.json')}.{{json,png}}`"
                           for n in OUTER_MAIN)
    steps = " and ".join(f"{no_sync_step(d):.3f} s in the {label} job"
                         for (_, label), d in zip(OUTER_LINKS, data))
    return fill(
        f"`python benchmarks/{first['machine']['command']}` (records {records}, measured "
        f"{measured_at(first)}, the runs trained {trained_at(first)}): the LM "
        f"at P = {first['P']}, a core per rank, {first['steps']} steps from the same start on "
        "the same batches, each mode trained once (the outer optimizers of the sweep above: "
        f"dense `optax.sgd({first['dense_outer']['lr']:g})`, sparse "
        f"`optax.sgd({first['sparse_outer']['lr']:g})`) and timed on each link (medians of "
        f"{first['link_probe']['repeats']} interleaved timing repeats; an outer-step mode's "
        "time is its H - 1 no-sync steps and one outer step, as the benchmark's docstring "
        f"says).{rtt_text} The no-sync step was {steps}; each link's ratios use its own job's "
        "times.")


def megabytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e8 else f"{n / 1e6:,.0f} MB"


def outer_modes(recs: dict) -> str:
    """The H = 10 and 30 runs: final loss, bytes, and the mean step on each link."""
    by = outer_by_link(recs, OUTER_MAIN)
    first = recs[OUTER_MAIN[0]]
    target = by[0]["dense"]["final_metric"]
    rows = [[outer_label(r, first["commands"]) + (f" (target {target:.4f})" if r["mode"] == "dense"
                                                 else ""),
             f"{r['final_metric']:.4f} ({loss_gap(r['final_metric'], target)})",
             megabytes(r["bytes_per_rank"]),
             *(f"{mean_step(b[r['mode']]):.3f} s" for b in by)] for r in first["records"]]
    return md_table(["mode", "final val loss (vs DDP dense)", "bytes per rank",
                     *(f"mean step, {label}" for _, label in OUTER_LINKS)], rows,
                    ["---", "---", "---:", "---:", "---:"])


def reach_cell(r: dict, suffix: str, gap_to: float | None) -> str:
    """``fraction of the ideal, speed-up`` to a target, or "not reached" (``gap_to``: with
    the final loss's gap to it)."""
    frac = r.get(f"fraction_of_ideal{suffix}")
    if frac is None:
        return "not reached" + (f" ({loss_gap(r['final_metric'], gap_to)})" if gap_to else "")
    speedup = r.get(f"speedup_over_dense{suffix}")
    return f"{frac:.2f}" if r["mode"] == "dense" else f"{frac:.2f}, {speedup:.1f}x"


def outer_times(recs: dict) -> str:
    """Time to DDP dense's final loss and to within 1 % of it, per link, of every mode that
    reaches either on some link: a fraction of the ideal and a speed-up over DDP dense."""
    by = outer_by_link(recs, OUTER_MAIN)
    first = recs[OUTER_MAIN[0]]
    dense = by[0]["dense"]
    reached = [r for r in first["records"] if any(
        b[r["mode"]].get(f"fraction_of_ideal{s}") is not None for b in by for s in (TO_FINAL, TO_WITHIN))]
    rows = [[outer_label(r, first["commands"]),
             *(reach_cell(b[r["mode"]], s, dense["final_metric"] if (i, s) == (0, TO_FINAL) else None)
               for i, b in enumerate(by) for s in (TO_FINAL, TO_WITHIN))] for r in reached]
    head = fill(
        f"Time to DDP dense's final loss, and to within 1 % of it ({dense['target_within_1pct']:.4f}), "
        "as a fraction of the free-sync ideal (the no-sync step x DDP dense's steps to that "
        "loss) and as a speed-up over DDP dense on the same link (the modes that reach neither "
        "on either link left out):")
    return head + "\n\n" + md_table(
        ["mode", *(f"{label}: to {dense['final_metric']:.4f}" if s == TO_FINAL else "to within 1 %"
                   for _, label in OUTER_LINKS for s in (TO_FINAL, TO_WITHIN))], rows)


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def outer_bytes_bullet(by: dict, every: list[int]) -> str:
    lo, hi = min(every), max(every)
    sparse = lambda H: by[f"diloco_h{H}_chunked_topk"]  # noqa: E731
    over = lambda mode, H: by[mode]["bytes_per_rank"] / sparse(H)["bytes_per_rank"]  # noqa: E731
    g = OUTER_GOALS
    return (f"**Bytes**: the sparse outer step sends {over('dense', lo):,.0f}x fewer bytes per "
            f"rank than DDP dense at H = {lo} ({over('dense', hi):,.0f}x at H = {hi}; goal "
            f"{g['bytes_vs_ddp']}x: {met(over('dense', lo) >= g['bytes_vs_ddp'])}) and "
            f"{over(f'diloco_h{lo}_dense', lo):.0f}x fewer than dense float32 DiLoCo at the same "
            f"H ({over(f'diloco_h{lo}_dense_bf16', lo):.0f}x fewer than bfloat16; goal "
            f"{g['bytes_vs_diloco']}x: {met(over(f'diloco_h{lo}_dense_bf16', lo) >= g['bytes_vs_diloco'])}).")


def outer_loss_bullet(by: dict, every: list[int], steps: int) -> str:
    lo, hi = min(every), max(every)
    target = by["dense"]["final_metric"]
    gap = lambda mode: by[mode]["final_metric"] / target - 1  # noqa: E731
    sparse = gap(f"diloco_h{lo}_chunked_topk")
    at_hi = [100 * gap(m) for m in by if m.startswith(f"diloco_h{hi}_")]
    return (f"**Loss at equal steps and tokens**: at H = {lo} the sparse outer step ends "
            f"{loss_gap(1 + sparse, 1)} against DDP dense (goal: within "
            f"{100 * OUTER_GOALS['loss_gap']:g} %: {met(abs(sparse) <= OUTER_GOALS['loss_gap'])}), "
            f"dense DiLoCo {loss_gap(1 + gap(f'diloco_h{lo}_dense'), 1)}. At H = {hi} "
            f"({steps // hi} outer steps) the variants end {min(at_hi):+.1f} % to {max(at_hi):+.1f} %.")


STEPS_TO = {TO_FINAL: "steps_to_target", TO_WITHIN: "steps_to_within_1pct"}
TARGET_WORDS = {TO_FINAL: "DDP dense's final loss", TO_WITHIN: "within 1 % of DDP dense's loss"}


def reach_phrase(r: dict, dense: dict, suffix: str) -> str:
    """How ``r`` gets to a target: speed-up, fraction of the ideal, step (DDP dense's step)."""
    return (f"{r[f'speedup_over_dense{suffix}']:.1f}x faster than DDP dense at "
            f"{r[f'fraction_of_ideal{suffix}']:.2f} of the ideal (step {r[STEPS_TO[suffix]]}; "
            f"DDP dense: {dense[STEPS_TO[suffix]]})")


def sparse_time_bullet(by: dict, label: str, H: int, steps: int) -> str:
    """The slower link: the sparse outer step against the speed-up and ideal goals."""
    r, dense = by[f"diloco_h{H}_chunked_topk"], by["dense"]
    suffix = TO_FINAL if r["fraction_of_ideal"] is not None else TO_WITHIN
    g = OUTER_GOALS
    return (f"**Time, {label}**: to {TARGET_WORDS[suffix]} the sparse outer step at H = {H} is "
            f"{reach_phrase(r, dense, suffix)}: goal {g['speedup']}x "
            f"{met(r[f'speedup_over_dense{suffix}'] >= g['speedup'])}, goal "
            f"{g['fraction_of_ideal']} of the ideal "
            f"{met(r[f'fraction_of_ideal{suffix}'] >= g['fraction_of_ideal'])}. It steps at "
            f"{mean_step(r) / r['no_sync_step_s']:.2f}x the no-sync step"
            + ("." if suffix == TO_FINAL else
               f"; it does not reach DDP dense's final loss itself in {steps} steps."))


def within_phrase(r: dict) -> str:
    frac = r["fraction_of_ideal_within_1pct"]
    if frac is None:
        return "does not get within 1 % of DDP dense's loss"
    return (f"within 1 % of DDP dense's loss at {frac:.2f} of the ideal "
            f"({r['speedup_over_dense_within_1pct']:.1f}x faster than DDP dense)")


def goals_met(r: dict, dense: dict, suffix: str) -> str:
    """Which of OUTER_GOALS a sparse outer step's run misses on the slower link (its DiLoCo
    bytes goal needs a dense DiLoCo run at its H, so it is not checked here)."""
    g = OUTER_GOALS
    missed = [name for name, ok in (
        (f"{g['bytes_vs_ddp']}x fewer bytes than DDP dense",
         dense["bytes_per_rank"] / r["bytes_per_rank"] >= g["bytes_vs_ddp"]),
        (f"a loss within {100 * g['loss_gap']:g} %",
         abs(r["final_metric"] / dense["final_metric"] - 1) <= g["loss_gap"]),
        (f"{g['speedup']}x faster", r[f"speedup_over_dense{suffix}"] >= g["speedup"]),
        (f"{g['fraction_of_ideal']} of the ideal",
         r[f"fraction_of_ideal{suffix}"] >= g["fraction_of_ideal"])) if not ok]
    return ("every goal of issue 56 on the slower link" if not missed else
            "missed on the slower link: " + ", ".join(missed))


def fastest_phrase(by: dict, commands: dict) -> str:
    """The mode that reaches DDP dense's final loss at the largest fraction of the ideal."""
    best = max((r for r in by.values() if r["mode"] != "dense" and r["fraction_of_ideal"]),
               key=lambda r: r["fraction_of_ideal"], default=None)
    if best is None:
        return "no mode reaches DDP dense's final loss"
    return f"the fastest to DDP dense's final loss is {outer_label(best, commands)}, " + \
        reach_phrase(best, by["dense"], TO_FINAL)


def outer_goals(recs: dict) -> str:
    """The H = 10 and 30 records against issue 56's goals."""
    by = outer_by_link(recs, OUTER_MAIN)
    first = recs[OUTER_MAIN[0]]
    lo = min(first["every"])
    bullets = [outer_bytes_bullet(by[0], first["every"]),
               outer_loss_bullet(by[0], first["every"], first["steps"]),
               sparse_time_bullet(by[0], OUTER_LINKS[0][1], lo, first["steps"]),
               f"**Time, {OUTER_LINKS[1][1]}**: {fastest_phrase(by[1], first['commands'])}; the "
               f"sparse outer step at H = {lo}: {within_phrase(by[1][f'diloco_h{lo}_chunked_topk'])}."]
    return "Against the goals:\n\n" + "\n".join(fill(b, bullet="- ") for b in bullets)


def outer_h5(recs: dict) -> str:
    """The sparse outer step at the smallest H, trained apart (``--tag h5``)."""
    data = [recs[n] for n in OUTER_H5]
    by, main = outer_by_link(recs, OUTER_H5), outer_by_link(recs, OUTER_MAIN)[0]
    first, H = data[0], min(data[0]["every"])
    r, dense = by[0][f"diloco_h{H}_chunked_topk"], by[0]["dense"]
    suffix = TO_FINAL if r["fraction_of_ideal"] is not None else TO_WITHIN
    lo = min(recs[OUTER_MAIN[0]]["every"])
    same = first["trained_at"]["dense"] == recs[OUTER_MAIN[0]]["trained_at"]["dense"]
    shared = ("; the DDP runs and their timings are the records above's, `--resume` in the "
              "same work dir") if same else "; its DDP runs trained apart from the records above's"
    vs_diloco = main[f"diloco_h{lo}_dense"]["bytes_per_rank"] / \
        main[f"diloco_h{lo}_chunked_topk"]["bytes_per_rank"]
    records = " and ".join(f"`benchmarks/results/{n.removesuffix('.json')}.{{json,png}}`"
                           for n in OUTER_H5)
    links = [f"{b[r['mode']][f'speedup_over_dense{suffix}']:.1f}x faster than DDP dense at "
             f"{label} at **{b[r['mode']][f'fraction_of_ideal{suffix}']:.2f} of the ideal** "
             f"(mean step {mean_step(b[r['mode']]):.3f} s, no-sync step "
             f"{b[r['mode']]['no_sync_step_s']:.3f} s)" for b, (_, label) in zip(by, OUTER_LINKS)]
    reach = (f"reaches DDP dense's final loss at step {r['steps_to_target']}"
             if suffix == TO_FINAL else "does not reach DDP dense's final loss")
    return fill(
        f"**H = {H}.** `python benchmarks/{first['machine']['command']}` (records {records}, "
        f"measured {measured_at(first)}, the runs trained {trained_at(first)}{shared}) trained "
        f"the sparse outer step at H = {H}. It ends at {r['final_metric']:.4f}, "
        f"{loss_gap(r['final_metric'], dense['final_metric'])} against DDP dense, and {reach}, "
        f"sending {megabytes(r['bytes_per_rank'])} a rank "
        f"({dense['bytes_per_rank'] / r['bytes_per_rank']:,.0f}x fewer bytes than DDP dense; an "
        f"outer step sends the same bytes at any H, so against dense DiLoCo at H = {H} it is "
        f"the {vs_diloco:.0f}x "
        f"of H = {lo}). To {TARGET_WORDS[suffix]} it is " + ", and ".join(links) + ": "
        + goals_met(r, dense, suffix) + (" (the round trip modeled)." if first["rtt_modeled_ms"]
                                         else "."))


def outer_fastest(recs: dict) -> str:
    """Per link, the mode of every outer_step record that reaches DDP dense's final loss
    at the largest fraction of the ideal, and the lowest final loss."""
    modes = [{**main, **h5} for main, h5 in zip(outer_by_link(recs, OUTER_MAIN),
                                                 outer_by_link(recs, OUTER_H5))]
    commands = {**recs[OUTER_MAIN[0]]["commands"], **recs[OUTER_H5[0]]["commands"]}
    lowest = min(modes[0].values(), key=lambda r: r["final_metric"])
    return fill("So on this model, over the records above: at " + "; at ".join(
        f"{label} {fastest_phrase(by, commands)}" for by, (_, label) in zip(modes, OUTER_LINKS))
        + f". The lowest final loss is {outer_label(lowest, commands)}'s "
        f"({lowest['final_metric']:.4f}).")


def sweep_optimizer(r: dict) -> str:
    lr, momentum = r["outer_lr"], r["outer_momentum"]
    if momentum:
        return f"Nesterov, lr {lr:g}, momentum {momentum:g}" + (
            " (the paper's)" if (lr, momentum) == (0.7, 0.9) else "")
    as_is = lr == 1 and r["outer_sync"] != "chunked_topk"
    return f"`optax.sgd({lr:g})`" + (" (the average as it is)" if as_is else "")


def outer_sweep(recs: dict) -> str:
    """outer_step.py --sweep: each outer optimizer's final loss at H = 10, the best of each
    outer sync in bold."""
    data = recs[OUTER_SWEEP]
    rows = sorted(data["records"], key=lambda r: (r["outer_sync"] != "dense", r["ef_decay"] or 0,
                                                  r["outer_momentum"], r["outer_lr"]))
    best = {s: min((r for r in rows if r["outer_sync"] == s), key=lambda r: r["final_metric"])
            for s in {r["outer_sync"] for r in rows}}
    every = {r["every"] for r in rows}.pop()

    def row(r):
        b = "**" if best[r["outer_sync"]] is r else ""
        ef = r["ef_decay"]
        sync = outer_sync_label(r["outer_sync"], data["commands"][r["mode"]]) + (
            "" if ef is None else ", plain error feedback" if ef == 1 else f", residual decay {ef:g}")
        return [sync, sweep_optimizer(r), f"{b}{r['final_metric']:.4f}{b}",
                f"{b}{100 * r['gap_to_dense']:.2f} %{b}"]
    head = fill(
        f"`python benchmarks/{data['machine']['command']}` (record "
        f"`benchmarks/results/{OUTER_SWEEP.removesuffix('.json')}.{{json,png}}`, measured "
        f"{measured_at(data)}, the runs trained {trained_at(data)}; each run's command and "
        f"commit are in the record) trained the LM at P = {data['P']}, H = {every}, for "
        f"{data['steps']} steps with each outer optimizer from the same start on the same "
        f"batches, beside DDP dense ({data['target']:.4f}); one seed each:")
    return head + "\n\n" + md_table([f"outer step at H = {every}", "outer optimizer",
                                     "final val loss", "above DDP dense"],
                                    [row(r) for r in rows], ["---", "---", "---:", "---:"])


# --------------------------------------------------------------------------- GPU campaign

#: the device whose campaign records docs/topics/gpu_campaign.md shows (file names' suffix)
GPU = "h200"
GPU_SELECTION = f"selection_gpu_{GPU}.json"
GPU_STEP_LM = f"gpu_step_lm_{GPU}.json"
#: the MLP's step records: P = 1 and 2, and P = 1 jobs run apart (their rows fill the gaps)
GPU_STEP_MLP = (f"gpu_step_{GPU}_p1.json", f"gpu_step_{GPU}_p2.json",
                f"gpu_step_{GPU}_p1_oktopk64.json")
#: the sparse LM step's goal against its baseline's (issue 55): at most this ratio
GPU_STEP_GOAL = 1.15
HOST_CAMPAIGN = tuple(f"step_time_campaign_{dev}_p{P}.json" for dev in ("h100", "h200")
                      for P in (4, 8))


def record_ref(name: str, data: dict) -> str:
    return f"`benchmarks/results/{name.removesuffix('.json')}.{{json,png}}`, {short_commit(data)}"


def selection_gpu(recs: dict) -> str:
    """selection.py on the GPU: ``jss.topk`` against ``jax.lax.top_k(|x|)``, paired by round."""
    data = recs[GPU_SELECTION]
    rs = data["records"]
    sizes = sorted({r["N"] for r in rs})
    rounds = set()

    def cell(n, d):
        ours, lax = selection_entry(rs, "topk", n, d), selection_entry(rs, "lax.top_k", n, d)
        pairs = [a / b for a, b in zip(lax["times_s"], ours["times_s"])]
        rounds.add(len(pairs))
        return (f"{statistics.median(pairs):.1f}x ({1e3 * ours['median_s']:.2f} vs "
                f"{1e3 * lax['median_s']:.2f} ms)")
    rows = [[size_label(n), *(cell(n, d) for d in (0.001, 0.01))] for n in sizes]
    equal = all(c["topk_equals_lax_top_k"] for c in data["correctness"])
    head = fill(
        f"`benchmarks/selection.py` through JAX ({data['calls_per_sample']} queued calls per "
        f"sample, paired medians over {'/'.join(map(str, sorted(rounds)))} interleaved rounds), "
        f"`jss.topk` against `jax.lax.top_k(|x|)`, on the {data['machine']['device']} "
        f"({record_ref(GPU_SELECTION, data)}; "
        + ("every size's top-k equal to `lax.top_k`'s" if equal else
           "**a size's top-k differs from `lax.top_k`'s**") + "):")
    return head + "\n\n" + md_table(["N", "0.1 %", "1 %"], rows)


def gpu_step_cells(r: dict, over: str) -> list[str]:
    """step ms, its ratio, and the sync's parts (ms) of one gpu_step.py row."""
    part = lambda key: f"{1e3 * r[key]:.2f}" if r.get(key) is not None else ""  # noqa: E731
    ratio = "" if r["mode"] == "none" else (
        f"{r['ratio_to_baseline']:.2f}" + (f" ({r['baseline']})" if over == "baseline" else ""))
    return [part("step_s"), ratio, part("topk_s"), part("allreduce_s"), part("update_s")]


def gpu_step_lm(recs: dict) -> str:
    """gpu_step.py --models lm: the LM's step with each sync against its baseline's."""
    data = recs[GPU_STEP_LM]
    rs, lm = data["records"], data["lm"]
    by = {(r["mode"], r["transport"]): r for r in rs}
    goals = [(mode, what, by[(mode, "mpi")]["ratio_to_baseline"]) for mode, what in (
        ("topk_1pct", "`topk_sync` 1 % at most {g}x SGD's step"),
        ("adam_topk_1pct", "`adam_direction_sync(topk_sync(1 %))` at most {g}x AdamW's"))]
    head = fill(
        f"**The examples' LM** (`examples/models.py`, {rs[0]['N'] / 1e6:.1f}M parameters: "
        f"d_model {lm['dim']}, {lm['layers']} blocks, sequence {lm['seq']}, {lm['batch']} "
        f"sequences; P = {rs[0]['P']}; {record_ref(GPU_STEP_LM, data)}). Goals: " + ", ".join(
            f"{what.format(g=GPU_STEP_GOAL)} (**{ratio:.2f}x**: {met(ratio <= GPU_STEP_GOAL)})"
            for _, what, ratio in goals) + ":")
    rows = [[r["mode"], r["transport"] if r["k"] else "", *gpu_step_cells(r, "baseline")]
            for r in rs]
    return head + "\n\n" + md_table(["mode", "transport", "step ms", "x its baseline",
                                     "select ms", "allreduce ms", "update ms"], rows)


def gpu_step_mlp(recs: dict) -> str:
    """gpu_step.py on the MLP at P = 1 and 2: each sync's step against the no-sync step."""
    main, extra = GPU_STEP_MLP[:2], GPU_STEP_MLP[2]
    key = lambda r: (r["P"], r["N"], r["mode"], r["transport"])  # noqa: E731
    rows = {key(r): r for n in main for r in recs[n]["records"]}
    filled = [r for r in recs[extra]["records"] if key(r) not in rows and r["mode"] != "none"]
    rows.update({key(r): r for r in filled})
    order = sorted(rows.values(), key=lambda r: (r["P"], r["N"], r["mode"] != "none"))
    first = recs[main[0]]
    refs = " and ".join(record_ref(n, recs[n]) for n in main)
    head = (f"**An MLP of {first['layers']} square layers**, batch {first['batch']} per rank "
            f"({refs}")
    if filled:
        none = next(r for r in recs[extra]["records"] if r["mode"] == "none")
        what = ", ".join(sorted({f"{r['mode']} at {r['N'] / 1e6:.1f}M and P = {r['P']}"
                                 for r in filled}))
        head += (f"; {what} from {record_ref(extra, recs[extra])}, against its own job's "
                 f"no-sync step of {1e3 * none['step_s']:.2f} ms")
    head += "). At P = 2 both ranks share the one GPU:"
    table = md_table(["N", "P", "mode", "transport", "step ms", "x no sync", "select ms",
                      "allreduce ms", "update ms"],
                     [[f"{r['N'] / 1e6:.1f}M", str(r["P"]), r["mode"],
                       r["transport"] if r["k"] else "", *gpu_step_cells(r, "none")]
                      for r in order])
    return fill(head) + "\n\n" + table


#: step_time.py's campaign modes as the page names them
HOST_MODES = {"none": "no sync", "dense": "dense", "topk_1pct_auto": "`topk_sync` 1 %",
              "topk_0.1pct_auto": "`topk_sync` 0.1 %", "oktopk_1pct": "`oktopk_sync` 1 %"}


def host_campaign(recs: dict) -> str:
    """step_time.py on the GPU hosts, a set of cores per rank: measured / predicted ms."""
    cols = [(name.split("_")[3].upper(), recs[name]["procs"][0], recs[name]) for name in HOST_CAMPAIGN]
    by = [{r["mode"]: r for r in data["records"]} for _, _, data in cols]
    cell = lambda r: "" if r is None else f"{1e3 * r['step_s']:.1f}" + (  # noqa: E731
        "" if r["mode"] == "none" else f" / {1e3 * r['predicted_s']:.1f}")
    rows = [[label, *(cell(b.get(mode)) for b in by)] for mode, label in HOST_MODES.items()]
    refs = "; ".join(f"{dev} P = {P}: {record_ref(n, data)}"
                     for (dev, P, data), n in zip(cols, HOST_CAMPAIGN))
    first = cols[0][2]
    head = fill(f"JAX on the CPU, MPICH shared memory, the {by[0]['none']['N'] / 1e6:.1f}M MLP, "
                f"`benchmarks/step_time.py` with `--bind-to core:16/P`, medians of "
                f"{first['steps']} steps, one job each; measured / predicted ms ({refs}):")
    spans = "; ".join(f"{HOST_MODES[mode]} {span([b[mode]['measured_over_predicted'] for b in by])}"
                      for mode in HOST_MODES if mode != "none")
    ahead = " and ".join(f"{b['dense']['step_s'] / b['topk_1pct_auto']['step_s']:.2f}x (P = {P})"
                         for (dev, P, _), b in zip(cols, by) if dev == GPU.upper())
    return "\n\n".join([head, md_table(["mode", *(f"{dev} P = {P}" for dev, P, _ in cols)], rows),
                        fill(f"Measured over predicted, over the four: {spans}. On the "
                             f"{GPU.upper()}'s cores `topk_sync` 1 % steps {ahead} faster "
                             "than dense.")])


# --------------------------------------------------------------------------- reliability

def fault_label(name: str, f: dict, watchdog_s: float) -> str:
    """A fault kind as the reliability page names it, from its record entry."""
    kind, secs, fault = f["kind"], f["duration_s"], f["fault"]
    dur = f", {secs:g} s" if secs else ""
    own = f" ({f['watchdog_timeout_s']:g} s watchdog)" if (
        f["watchdog_timeout_s"] != watchdog_s or kind == "link_dead") else ""
    if kind in ("loss", "duplication", "reordering"):
        return f"{100 * fault['probability']:g} % {kind}{dur}"
    if kind == "link_flap":
        return f"link down {secs:g} s{own}"
    if kind == "bandwidth_collapse":
        return f"bandwidth to {fault['rate_mbit']:g} Mbit/s{dur}{own}"
    if kind == "pause":
        return f"rank stopped (SIGSTOP) {secs:g} s{own}"
    words = {"link_dead": "link dead", "jitter": f"jitter{dur}",
             "straggler": f"straggler, 10x compute{dur}"}
    return words.get(kind, name) + own


def fault_injected(f: dict) -> str:
    fault, counts = f["fault"], f["fault"].get("counts") or {}
    return {"link_flap": "1 outage", "link_dead": "1 outage",
            "jitter": f"{fault.get('rate_changes')} rate changes",
            "loss": f"{counts.get('dropped')} packets dropped",
            "duplication": f"{counts.get('duplicated')} copies",
            "reordering": f"{counts.get('delayed')} packets delayed",
            "straggler": f"{sum((f.get('straggling_steps') or {}).values())} slow steps",
            }.get(f["kind"], "1")


def reliability(recs: dict) -> str:
    """benchmarks/faults.py: every collective under each fault, checked bitwise; the step
    time in the fault's window against the fault-free one; the dead link's watchdog."""
    data = recs["reliability.json"]
    faults, summ, watchdog_s = data["faults"], data["summary"], data["config"]["watchdog_timeout_s"]
    rows = []
    for name, f in faults.items():
        dead = f["kind"] == "link_dead"
        hang = "yes" if f["hang"] else ("no: the watchdog ended it" if dead else "no")
        rows.append([fault_label(name, f, watchdog_s), fault_injected(f),
                     f"{f['compared']}" + (" (before it)" if dead else ""), str(f["wrong"]), hang,
                     "-" if f["step_slowdown"] is None else f"{f['step_slowdown']:.1f}x",
                     "-" if f["longest_step_in_window_s"] is None
                     else f"{f['longest_step_in_window_s']:.1f} s"])
    loads = [x for f in faults.values() for x in f["loadavg_1min"]]
    ref = data["reference"]
    head = (f"`benchmarks/results/reliability.{{json,png}}`, measured "
            f"{measured_at(data)} by `{data['machine']['command']}` (P = "
            f"{data['config']['procs']} on the {data['machine'].get('cpu_count', 2)}-core machine, "
            f"load average {min(loads):.1f}-{max(loads):.1f}, recorded per job; the fault-free "
            f"step {ref['median_step_s']:.2f} s, the median over {ref['fault_free_steps_pooled']} "
            f"fault-free rank-steps; {data['wall_s'] / 60:.0f} minutes in all):")
    w = faults["link_dead"]["watchdog"] if "link_dead" in faults else None
    tail = (f"**{summ['digests_compared']:,} digests compared, {summ['wrong_results']} wrong, "
            f"{summ['replicas_differ']} replicas that differ, {summ['hangs']} hangs.**")
    if w:
        tail += (f" The dead link: the job ended {w['job_ended_s_after_link_down']:.1f} s after "
                 f"the link went down, `MPI_Abort` from the watchdog; rank {w['reporting_rank']}'s "
                 f"report named `{w['operation']}` #{w['sequence']} and where it waited ("
                 + "; ".join(x.split(" waits in ")[-1].split(" with ranks")[0]
                             for x in w["where_it_waits"]) + ").")
    return fill(head) + "\n\n" + md_table(
        ["fault (on rank 1)", "injected", "digests compared", "wrong", "hang",
         "step time in the window / fault-free", "longest step"], rows) + "\n\n" + fill(tail)


def watchdog_cost(recs: dict) -> str:
    """benchmarks/watchdog.py: an enter + exit pair and a small sparse_allreduce with the
    watchdog off and on, per P; how soon a stuck job ended."""
    data = recs["watchdog_cpu.json"]
    rows = [[str(c["ranks"]), f"{c['pair_cost_ns']['off']:.0f} ns", f"{c['pair_cost_ns']['on']:.0f} ns",
             f"{c['sparse_allreduce_us']['off']:.0f} / {c['sparse_allreduce_us']['on']:.0f} us"]
            for c in data["cost"]]
    det = data["detection"]
    ended = [r["seconds_from_stop_to_job_end"] for r in det]
    named = sum(r["reported_missing_ranks"] == str(r["expected_missing_rank"]) for r in det)
    head = (f"`benchmarks/watchdog.py` (`benchmarks/results/watchdog_cpu.{{json,png}}`, measured "
            f"{measured_at(data)} on {data['machine'].get('cpu_count', 2)} shared cores; "
            "medians):")
    tail = (f"Detection: with a {data['timeout_s']:g} s timeout, a job whose last rank stopped "
            f"calling ended {min(ended):.2f}-{max(ended):.2f} s after it stopped ({len(det)} runs, "
            f"P = {', '.join(str(p) for p in sorted({r['ranks'] for r in det}))}); the report named "
            f"the stopped rank in {named} of them.")
    return fill(head) + "\n\n" + md_table(
        ["P", "enter + exit, off", "enter + exit, on",
         "`sparse_allreduce` (N = 4096, 64 per rank), off / on"], rows) + "\n\n" + fill(tail)


TIMELINES = ("grouping_timeline_1gbit_p4.json", "grouping_timeline_mg_1gbit_p4.json")


def trained_at(data: dict) -> str:
    """``at <commits>`` of the runs a training record joins (``trained_at``: run -> commit)."""
    commits = sorted({c[:7] for c in (data.get("trained_at") or {}).values() if c})
    return f"at {', '.join(commits)}" if commits else "at commits not recorded"


def measured_at(data: dict) -> str:
    commit = (data.get("machine") or {}).get("commit")
    return f"at {commit[:7]}" if commit else "before records named their commit"


def grouping_timelines(recs: dict) -> str:
    """What the traced steps show: per plan, how many groups started, and began and ended on
    the wire, before each rank's backward pass ended."""
    parts = []
    for name in TIMELINES:
        data = recs[name]
        st = data["runs"][0]["step_timeline"]
        sm = [r["summary"] for r in st["ranks"]]
        span = lambda key: (f"{min(x[key] for x in sm)}" if len({x[key] for x in sm}) == 1  # noqa: E731
                            else f"{min(x[key] for x in sm)}-{max(x[key] for x in sm)}")
        stem = name.removesuffix(".json")
        parts.append(f"the `{st['plan']}` plan (`benchmarks/results/{name}`, plot "
                     f"`benchmarks/results/{stem}.png`, measured "
                     f"{measured_at(data)}): of its {st['groups']} groups, "
                     f"{span('started_before')} started before the backward pass ended, "
                     f"{span('wire_began_before')} began on the wire and "
                     f"{span('wire_ended_before')} left it by then")
    return fill("The traced steps, on every rank of P = 4: " + "; ".join(parts) + ".")


# --------------------------------------------------------------------------- registry

TABLES: tuple[Table, ...] = (
    Table("selection_cpu", "benchmarks/README.md", ("selection_cpu.json",), selection_cpu),
    Table("selection_cpu_reuse", "benchmarks/README.md", ("selection_cpu.json",), selection_reuse),
    Table("compression_cpu", "benchmarks/README.md", ("compression_cpu.json",), compression_cpu),
    Table("allreduce_shm", "benchmarks/README.md", ("allreduce_shm.json",), allreduce_shm),
    Table("oktopk_volume", "benchmarks/README.md", ("oktopk_volume.json",), oktopk_volume),
    *(Table(f"convergence_{m}_p4", "benchmarks/README.md",
            (f"convergence_{m}.json", f"convergence_{m}_seeds.json"), convergence_p4(m))
      for m in ("cnn", "lm")),
    Table("convergence_lm_p8", "benchmarks/README.md", CONV_P8_RECORDS, convergence_lm_p8),
    Table("shared_support_cnn", "docs/topics/shared_support.md",
          ("convergence_cnn_shared_support.json", "convergence_cnn.json"), shared_support_cnn),
    *(Table(f"convergence_lm_600_p{P}", "benchmarks/README.md", (n,), convergence_600(n))
      for P, n in ((4, "convergence_lm_steps600.json"), (8, "convergence_lm_steps600_meanv_P8.json"))),
    Table("grouping_timelines", "benchmarks/README.md", TIMELINES, grouping_timelines),
    Table("selection_gpu", "docs/topics/gpu_campaign.md", (GPU_SELECTION,), selection_gpu),
    Table("gpu_step_lm", "docs/topics/gpu_campaign.md", (GPU_STEP_LM,), gpu_step_lm),
    Table("gpu_step_mlp", "docs/topics/gpu_campaign.md", GPU_STEP_MLP, gpu_step_mlp),
    Table("host_campaign", "docs/topics/gpu_campaign.md", HOST_CAMPAIGN, host_campaign),
    Table("outer_step_sweep", "docs/topics/slow_links.md", (OUTER_SWEEP,), outer_sweep),
    Table("outer_step_intro", "docs/topics/slow_links.md", OUTER_MAIN, outer_intro),
    Table("outer_step_modes", "docs/topics/slow_links.md", OUTER_MAIN, outer_modes),
    Table("outer_step_times", "docs/topics/slow_links.md", OUTER_MAIN, outer_times),
    Table("outer_step_goals", "docs/topics/slow_links.md", OUTER_MAIN, outer_goals),
    Table("outer_step_h5", "docs/topics/slow_links.md", OUTER_MAIN + OUTER_H5, outer_h5),
    Table("outer_step_fastest", "docs/topics/slow_links.md", OUTER_MAIN + OUTER_H5, outer_fastest),
    Table("reliability", "docs/topics/reliability.md", ("reliability.json",), reliability),
    Table("watchdog_cost", "docs/topics/reliability.md", ("watchdog_cpu.json",), watchdog_cost),
    Table("update_profile_cpu", "benchmarks/README.md", ("update_profile_cpu.json",),
          update_profile_cpu),
    Table("adam_fused_lm", "docs/topics/adam_direction.md", ("adam_fused_lm.json",), adam_fused),
    Table("fuzz_runs", "docs/topics/test_suite.md", ("fuzz_runs.json",), fuzz_runs),
    Table("dense_allreduce_shm", "docs/topics/dense_sync.md", ("dense_allreduce_shm.json",),
          dense_allreduce_shm),
    Table("sparse_allreduce_host", "docs/performance.md", ("sparse_allreduce_host_shm.json",),
          sparse_allreduce_host),
    Table("calibration_stability", "docs/topics/scheduling.md",
          ("calibration_stability_200mbit_p2.json",), calibration_stability),
    Table("adam_pass_time", "docs/topics/adam_direction.md", ("adam_pass_time.json",),
          adam_pass_time),
    Table("update_profile_adam", "benchmarks/README.md", ("update_profile_adam.json",),
          update_profile_adam),
    Table("sparcml_fig3", "benchmarks/README.md",
          tuple(dict.fromkeys(r for _, r in FIG3_ROWS)), sparcml_fig3),
    Table("step_time_matrix", "benchmarks/README.md", STEP_RECORDS, step_matrix),
    Table("step_time_algorithms", "benchmarks/README.md", STEP_RECORDS, step_algorithms),
    Table("step_time_summary", "benchmarks/README.md", STEP_RECORDS, step_summary),
    *(Table(f"time_to_accuracy_lm_p{P}", "docs/topics/time_to_accuracy.md",
            (f"time_to_accuracy_lm_1gbit_p{P}.json", f"time_to_accuracy_lm_200mbit_p{P}.json"),
            tta_lm(P)) for P in (2, 4)),
    *(Table(f"time_to_accuracy_cnn_p{P}", "docs/topics/time_to_accuracy.md",
            (f"time_to_accuracy_cnn_1gbit_p{P}.json", f"time_to_accuracy_cnn_200mbit_p{P}.json"),
            tta_cnn(P)) for P in (4, 2)),
    Table("grouping_1gbit_p4", "benchmarks/README.md", ("grouping_1gbit_p4.json",),
          grouping_models("grouping_1gbit_p4.json")),
    Table("grouping_p2", "docs/topics/scheduling.md", GROUPING_RECORDS, grouping_p2),
    Table("grouping_p2_goals", "docs/topics/scheduling.md", GROUPING_RECORDS, grouping_goals),
    Table("sharded_state_goals", "docs/topics/sharded_state.md",
          tuple(f"sharded_state_p{P}.json" for P in SHARDED_PS), sharded_state_goals),
    *(Table(f"sharded_state_p{P}", "docs/topics/sharded_state.md", (f"sharded_state_p{P}.json",),
            sharded_state(P)) for P in SHARDED_PS),
)


def render(table: Table, results: Path = RESULTS, loaded: dict | None = None) -> str:
    """``table`` rendered from its records; ``loaded`` keeps the records read so far, so
    that tables sharing a record (the step-time ones, selection_cpu) read it once."""
    loaded = {} if loaded is None else loaded
    for n in table.records:
        if n not in loaded:
            loaded[n] = json.loads((results / n).read_text())
    return table.render({n: loaded[n] for n in table.records})


def block_of(text: str, name: str) -> str | None:
    """What lies between ``name``'s markers in ``text`` (None: no markers)."""
    begin, end = begin_marker(name), end_marker(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace(text: str, name: str, block: str) -> str:
    begin, end = begin_marker(name), end_marker(name)
    if block_of(text, name) is None:
        raise SystemExit(f"table {name}: its markers must appear once each: {begin} ... {end}")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}"


def write_all(root: Path = ROOT, results: Path = RESULTS, check: bool = False) -> list[str]:
    """Rewrite (or with ``check``, only compare) every table; the names that differed."""
    differ, pages, loaded = [], {}, {}
    for table in TABLES:
        path = root / table.page
        text = pages.setdefault(path, path.read_text())
        block = render(table, results, loaded)
        if block_of(text, table.name) != block:
            differ.append(table.name)
            pages[path] = replace(text, table.name, block)
    if not check:
        for path, text in pages.items():
            path.write_text(text)
    return differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs")
    args = ap.parse_args(argv)
    differ = write_all(check=args.check)
    verb = "differ from their records" if args.check else "rewritten"
    print(f"{len(differ)} of {len(TABLES)} tables {verb}: {', '.join(differ) or '-'}")
    return 1 if args.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
