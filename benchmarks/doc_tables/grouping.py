"""benchmarks/grouping.py and calibration_stability.py: layer grouping, its traces, the calibration."""

from __future__ import annotations

from typing import Callable

from .common import Table, fill, md_table, measured_at, short_commit

GROUPING_RUNS = ("mlp_topk_200mbit", "cnn_topk_200mbit", "cnn_topk_1gbit", "cnn_dense_200mbit",
                 "cnn_dense_1gbit", "lm_topk_200mbit", "lm_topk_1gbit", "lm_dense_200mbit",
                 "lm_dense_1gbit")
GROUPING_RECORDS = tuple(f"grouping_{run}_p2.json" for run in GROUPING_RUNS)


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


TIMELINES = ("grouping_timeline_1gbit_p4.json", "grouping_timeline_mg_1gbit_p4.json")


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


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("grouping_timelines", "benchmarks/README.md", TIMELINES, grouping_timelines),
    Table("calibration_stability", "docs/topics/scheduling.md",
          ("calibration_stability_200mbit_p2.json",), calibration_stability),
    Table("grouping_1gbit_p4", "benchmarks/README.md", ("grouping_1gbit_p4.json",),
          grouping_models("grouping_1gbit_p4.json")),
    Table("grouping_p2", "docs/topics/scheduling.md", GROUPING_RECORDS, grouping_p2),
    Table("grouping_p2_goals", "docs/topics/scheduling.md", GROUPING_RECORDS, grouping_goals),
)
