"""step_time.py's report: each record's breakdown (compute, local, wire) and the cost
model's prediction, the median of the repeats, the table and the figure."""

from __future__ import annotations

import statistics
from pathlib import Path

from _harness import fmt_bytes, machine_line, pyplot, save_figure

from .modes import (LOCAL_KIND, NO_SYNC, PLOT_ORDER, PSUM_MODES, parse_mode, run_algorithm,
                    wire_dtype_index)
from .models import MODELS


def predict_sync_time(mode: str, nranks: int, size: int, k: int | None, link,
                      local_seconds: float | None = None, volume: str = "typical") -> float:
    """Predicted seconds the gradient sync adds to a step: ``cost_model.sync_wire_time`` of
    the algorithm the mode runs (``auto`` resolved as the library does) on ``link`` (an
    ``AlphaBeta``) with ``volume``'s bytes (``"typical"`` or ``"max"``; Ok-Topk's from
    ``cost_model.oktopk_sync_volume``), plus ``local_seconds``; ``none`` predicts 0.
    ``size``: N; ``k``: entries kept per rank (ignored by the dense modes)."""
    from jax_sparse_sync.planning import cost_model

    mode_kind = parse_mode(mode)["kind"]
    if mode_kind in NO_SYNC:
        t = 0.0
    else:  # psum has no transform of its own: its bytes are the dense allreduce's
        t = cost_model.sync_wire_time(LOCAL_KIND.get(mode_kind, "dense_sync"), nranks=nranks,
                                      size=size, k=k or size,
                                      algorithm=run_algorithm(mode, nranks, size) or "auto",
                                      params=link, volume=volume,
                                      wire_dtype=wire_dtype_index(mode))
    return t + (local_seconds or 0.0)


def predicted_volume(mode: str, nranks: int, size: int, k: int | None):
    """``cost_model`` WireVolume (rank 0) of a mode's sync; None for the no-sync modes."""
    from jax_sparse_sync.planning import cost_model

    kind = parse_mode(mode)["kind"]
    if kind in NO_SYNC:
        return None
    if kind == "oktopk":
        return cost_model.oktopk_sync_volume(nranks=nranks, k=k)
    return cost_model.wire_volume(run_algorithm(mode, nranks, size), nranks=nranks, size=size,
                                  k=k or 0, wire_dtype=wire_dtype_index(mode))


def link_alpha_beta(link: dict):
    """alpha/beta of a link record: measured latency and the configured rate (emulated);
    the library's current parameters (shm)."""
    from jax_sparse_sync.planning import cost_model

    if link["rate_mbit"] is None:
        return cost_model.current_alpha_beta()
    return cost_model.AlphaBeta(alpha=link["alpha_s"], beta=8.0 / (link["rate_mbit"] * 1e6))


def median_records(runs: list[dict]) -> list[dict]:
    """One record per (model, link, P, mode): the repeat whose step time is the (upper)
    median of the R, whole (one job's breakdown and prediction), with every repeat's
    ``repeats_step_s`` and ``repeats_measured_over_predicted`` and the median of the
    latter, ``measured_over_predicted_median``."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["link"], r["P"], r["mode"]), []).append(r)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r["step_s"])
        rec = dict(ordered[len(ordered) // 2])
        rec["repeats_step_s"] = [r["step_s"] for r in group]
        ratios = [r.get("measured_over_predicted") for r in group]
        rec["repeats_measured_over_predicted"] = ratios
        known = [x for x in ratios if x is not None]
        rec["measured_over_predicted_median"] = statistics.median(known) if known else None
        out.append(rec)
    return out


def finish(data: dict) -> None:
    """Adds the breakdown and the predictions to every run, each against its own job's
    compute step (the same repeat's), then picks the median records (idempotent)."""
    runs = data.get("runs") or data["records"]
    by_repeat: dict[int, list[dict]] = {}
    for r in runs:
        by_repeat.setdefault(r.get("repeat", 0), []).append(r)
    links = {lk["name"]: lk for lk in data["links"]}
    for group in by_repeat.values():
        _predict(group, links)
    if data.get("runs"):
        data["records"] = median_records(data["runs"])


def _predict(recs: list[dict], links: dict) -> None:
    """The breakdown and the predictions of the records of one repeat."""
    from jax_sparse_sync.planning import cost_model

    compute = {(r["model"], r["link"], r["P"], r["mode"]): r["step_s"] for r in recs
               if r["mode"] in NO_SYNC}
    # the MPI job's local-work calibration, for the psum job's records of the same repeat
    calibration = {(r["model"], r["link"], r["P"]): r["local_work_calibrated"] for r in recs
                   if r.get("local_work_calibrated")}
    for r in recs:
        base = "psum_none" if r["kind"] in PSUM_MODES else "none"
        c = compute.get((r["model"], r["link"], r["P"], base))
        r["compute_s"] = c
        r["compute_from"] = base if c is not None else None
        if c is None:
            r["local_raw_s"] = r["local_s"] = r["wire_s"] = None
        elif r["kind"] in NO_SYNC:
            r["local_raw_s"], r["local_s"], r["wire_s"] = 0.0, 0.0, 0.0
        else:
            lr = r["local_step_s"] - c if r["local_step_s"] is not None else None
            r["local_raw_s"] = lr
            r["local_s"] = max(0.0, lr) if lr is not None else None
            r["wire_s"] = max(0.0, r["step_s"] - c - (r["local_s"] or 0.0))
        ab = link_alpha_beta(links[r["link"]])
        r["alpha_s"], r["beta_s_per_byte"] = ab.alpha, ab.beta
        sync = predict_sync_time(r["mode"], r["P"], r["N"], r["k"], ab)
        vol = predicted_volume(r["mode"], r["P"], r["N"], r["k"])
        r["predicted_algorithm"] = (None if vol is None
                                    else run_algorithm(r["mode"], r["P"], r["N"]))
        r["predicted_bytes_max"] = vol.bytes_max if vol else 0
        r["predicted_bytes_typical"] = vol.bytes_typical if vol else 0
        r["predicted_sync_s"] = sync
        r["predicted_sync_measured_bytes_s"] = (
            vol.messages * ab.alpha + max(r["bytes_sent"]) * ab.beta
            if vol and r["bytes_sent"] else sync)
        # the cost model's local-work term, calibrated in the same job (jss.planning.calibrate)
        local = (r.get("local_work_calibrated")
                 or calibration.get((r["model"], r["link"], r["P"])) or ())
        calibrated = cost_model.AlphaBeta(alpha=ab.alpha, beta=ab.beta,
                                          local=tuple(tuple(t) for t in local))
        kind = LOCAL_KIND.get(r["kind"])
        r["predicted_local_s"] = (cost_model.local_work_time(kind, size=r["N"], k=r["k"] or 0,
                                                             params=calibrated)
                                  if kind else 0.0)
        r["predicted_wire_only_s"] = c + sync if c is not None else None
        r["predicted_s"] = c + r["predicted_local_s"] + sync if c is not None else None
        r["predicted_worst_case_s"] = (
            c + r["predicted_local_s"] + predict_sync_time(r["mode"], r["P"], r["N"], r["k"],
                                                           ab, volume="max")
            if c is not None else None)
        r["predicted_with_local_s"] = (
            c + predict_sync_time(r["mode"], r["P"], r["N"], r["k"], ab,
                                  local_seconds=r["local_s"])
            if c is not None else None)
        r["measured_over_predicted"] = r["step_s"] / r["predicted_s"] if c else None


def print_table(data: dict) -> None:
    """The records as a table (milliseconds; bytes are the max over ranks)."""
    hdr = (f"{'model':>11} {'link':>8} {'P':>2} {'mode':>26} | {'step':>8} {'compute':>8} "
           f"{'local':>8} {'wire':>8} | {'sent':>9} {'k':>8} | {'pred':>8} {'no-local':>8} "
           f"{'meas/pred':>9} {'median':>6}")
    print("\n" + hdr + "\n" + "-" * len(hdr))

    def ms(v):
        return f"{v * 1e3:8.1f}" if v is not None else f"{'-':>8}"
    for r in data["records"]:
        ratio = r.get("measured_over_predicted")
        med = r.get("measured_over_predicted_median")
        print(f"{r['model']:>11} {r['link']:>8} {r['P']:>2} {r['mode']:>26} | {ms(r['step_s'])} "
              f"{ms(r.get('compute_s'))} {ms(r.get('local_s'))} {ms(r.get('wire_s'))} | "
              f"{fmt_bytes(max(r['bytes_sent']) if r['bytes_sent'] else None):>9} "
              f"{r['k'] if r['k'] is not None else '-':>8} | {ms(r.get('predicted_s'))} "
              f"{ms(r.get('predicted_wire_only_s'))} "
              f"{f'{ratio:.2f}' if ratio else '-':>9} "
              f"{f'{med:.2f}' if med else '-':>6}")
    for f in data["failures"]:
        print(f"!! {f['model']} {f['link']} P={f['P']} {f['kind']}: {f['error']}")


def plot(data: dict, path: Path) -> None:
    """Per model (rows) and P (columns): bars per mode, one per link, stacked
    compute / local / wire, the prediction as a marker."""
    plt = pyplot()
    from matplotlib.patches import Patch

    recs = [r for r in data["records"] if r["mode"] != "psum_none"]
    if not recs:
        return
    models = [m for m in MODELS if any(r["model"] == m for r in recs)]
    procs = sorted({r["P"] for r in recs})
    links = [lk["name"] for lk in data["links"]]
    hatches = dict(zip(links, ("", "//", "xx", "..", "\\\\")))
    colors = {"compute": "#9e9e9e", "local": "#f28e2b", "wire": "#4e79a7",
              "unattributed": "#c7c7c7"}
    height = 4.6 * len(models) + 0.8  # for the title and the legend
    fig, axes = plt.subplots(len(models), len(procs), squeeze=False,
                             figsize=(max(8, 0.3 * len(PLOT_ORDER) * len(links)) * len(procs),
                                      height))
    width = 0.8 / len(links)
    for i, model in enumerate(models):
        for j, p in enumerate(procs):
            ax = axes[i][j]
            here = [r for r in recs if r["model"] == model and r["P"] == p]
            modes = [m for m in PLOT_ORDER if any(r["mode"] == m for r in here)]
            for x, mode in enumerate(modes):
                for li, link in enumerate(links):
                    r = next((r for r in here if r["mode"] == mode and r["link"] == link), None)
                    if r is None:
                        continue
                    xb = x - 0.4 + width * (li + 0.5)
                    if r.get("compute_s") is None:
                        parts = [("unattributed", r["step_s"])]
                    else:
                        # the stack adds up to the step: a local measured above
                        # step - compute (noise) is drawn up to the step only
                        comp = min(r["compute_s"], r["step_s"])
                        loc = min(r["local_s"] or 0.0, r["step_s"] - comp)
                        parts = [("compute", comp), ("local", loc), ("wire", r["wire_s"] or 0.0)]
                    bottom = 0.0
                    for name, v in parts:
                        ax.bar(xb, v, width, bottom=bottom, color=colors[name],
                               hatch=hatches[link], edgecolor="k", linewidth=0.4)
                        bottom += v
                    if r.get("predicted_s") is not None:
                        ax.plot(xb, r["predicted_s"], marker="_", color="k", ms=9, mew=2)
                        ax.plot(xb, r["predicted_with_local_s"], marker="o", mfc="none",
                                color="k", ms=4, mew=0.8)
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels(modes, rotation=60, ha="right", fontsize=7)
            n = here[0]["N"] if here else 0
            ax.set_title(f"{model}: N = {n:,} parameters, P = {p}"
                         + (" (oversubscribed: P > cores)" if p > data["machine"]["cpu_count"]
                            else ""), fontsize=9)
            ax.set_ylabel("step time (s), median over ranks")
            ax.grid(True, axis="y", alpha=0.3)
    handles = [Patch(facecolor=colors[c], edgecolor="k", label=c)
               for c in ("compute", "local", "wire")]
    handles += [Patch(facecolor="white", edgecolor="k", hatch=hatches[lk],
                      label=f"link {lk}" + (" Mbit/s" if lk != "shm" else " (shared memory)"))
                for lk in links]
    handles += [plt.Line2D([], [], color="k", marker="_", ls="", ms=9, mew=2,
                           label="predicted: compute + cost-model local + wire"),
                plt.Line2D([], [], color="k", marker="o", mfc="none", ls="", ms=4,
                           label="compute + measured local + model wire")]
    info = data["machine"]
    fig.suptitle(f"Training-step time by gradient sync: {machine_line(info)}",
                 fontsize=10, y=1 - 0.1 / height)
    fig.legend(handles=handles, loc="upper center", ncol=(len(handles) + 1) // 2, fontsize=8,
               bbox_to_anchor=(0.5, 1 - 0.3 / height))
    save_figure(fig, path, dpi=90, rect=(0, 0, 1, 1 - 0.8 / height))
