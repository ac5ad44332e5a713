"""benchmarks/step_time.py's records: the step-time matrix, the algorithms, the cost model's fit."""

from __future__ import annotations

from .common import Table, md_table

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


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("step_time_matrix", "benchmarks/README.md", STEP_RECORDS, step_matrix),
    Table("step_time_algorithms", "benchmarks/README.md", STEP_RECORDS, step_algorithms),
    Table("step_time_summary", "benchmarks/README.md", STEP_RECORDS, step_summary),
)
