"""ASC-WFBP's Table IV predicted by our planner and event simulator.

Shi, Chu, Li, "Exploiting simultaneous communications to accelerate data parallel
distributed deep learning" (``/work/shared/papers/asc-wfbp.md``) measured WFBP, MG-WFBP
and ASC-WFBP on 32 GPUs over 10 GbE (Table IV) and compared ASC-WFBP's speedup S with
the bound S_max (Table V). This script predicts those 12 iteration times and the four
S / S_max from the paper's own parameters, with nothing fitted: the real architectures'
gradient tensors in backward order (``asc_wfbp_models.py``); compute ``t_f + t_b = S *
T_ASC / P`` split ``1 : 2``; ready times ``t_f + t_b * FLOPs(layers done) / FLOPs(all)``;
the link ``t_AR(m) = a + b m`` (``A_S``, ``B_S_PER_BYTE``) with contention ``GAMMA``, two
operations at once, 4-byte gradients; the plans ``wfbp``, ``mg`` and ``asc`` of
``jax_sparse_sync.model.grouping``; S_max from eq. 42-43.

Diagnostics, never the prediction (``summary["hypotheses"]`` and the records' extra
fields, read by ``docs/topics/scheduling.md``): ``no_overlap_s`` (one allreduce after
the backward pass), ``single_stream_fig4b`` (:func:`single_stream_link`),
``horovod_fusion_wfbp``, ``fig4b_utilisation`` and ``wfbp_implied_tiny_a_s``
(:func:`implied`).

  python benchmarks/asc_wfbp_table4.py
writes ``benchmarks/results/asc_wfbp_table4.{json,png}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness  # noqa: E402
import asc_wfbp_models  # noqa: E402

from jax_sparse_sync.model import grouping as gp  # noqa: E402

P = 32
A_S = 1.4e-3          # startup of one allreduce (Section VI-B)
B_S_PER_BYTE = 1.7e-9  # seconds per byte of one allreduce
GAMMA = 1.5           # contention of two simultaneous allreduces
MAX_CONCURRENT = 2    # two-way simultaneous communications
LINK_BITS_PER_S = 9.43e9  # iperf3 bandwidth of eq. 43
FIT_MIN_BYTES = 8 * 1024  # the smallest message of the nccl-tests fit (Section VI-B)
HOROVOD_FUSION_BYTES = 64 * 2 ** 20  # Horovod's default fusion buffer
HOROVOD_CYCLES_S = (1e-3, 5e-3)  # Horovod's default cycle time (1 ms or 5 ms by version)
TF_SHARE = 1.0 / 3.0  # t_f / (t_f + t_b): ResNet-152's 0.091 / (0.091 + 0.182)
GRADIENT_BYTES = 4

#: Table IV (seconds) and Table V of the paper
PAPER = {
    "resnet152": {"wfbp": 0.956, "mg_wfbp": 0.710, "asc_wfbp": 0.524, "s": 16.7, "s_max": 17.5},
    "densenet201": {"wfbp": 0.778, "mg_wfbp": 0.375, "asc_wfbp": 0.314, "s": 22.3,
                    "s_max": 32.0},
    "inception_v4": {"wfbp": 0.719, "mg_wfbp": 0.510, "asc_wfbp": 0.377, "s": 16.1,
                     "s_max": 17.2},
    "bert_base": {"wfbp": 1.010, "mg_wfbp": 1.062, "asc_wfbp": 0.924, "s": 10.6, "s_max": 11.5},
}
#: our plan method for each of the paper's columns
PLANS = {"wfbp": "wfbp", "mg_wfbp": "mg", "asc_wfbp": "asc"}


def paper_link(bounded: bool = True) -> gp.Link:
    """The paper's link; ``bounded``: never faster than eq. 43's 2 m / B together."""
    return gp.Link(a=A_S, b=B_S_PER_BYTE, gamma=GAMMA, max_concurrent=MAX_CONCURRENT,
                   link_b=2 * 8 / LINK_BITS_PER_S if bounded else None)


def compute_times(model: str) -> tuple[float, float]:
    """``(t_f, t_b)`` of one GPU: ``S * T_ASC / P`` split 1 : 2."""
    total = PAPER[model]["s"] * PAPER[model]["asc_wfbp"] / P
    return TF_SHARE * total, (1.0 - TF_SHARE) * total


def layer_times(layers: asc_wfbp_models.GradientLayers, t_f: float,
                t_b: float) -> gp.LayerTimes:
    """The planner's input: the tensors ready at ``t_f + t_b * FLOPs done / FLOPs``."""
    n = len(layers.names)
    ready = [t_f + t_b * f / layers.total_flops for f in layers.ready_flops]
    return gp.LayerTimes(leaves=tuple(range(n)), ready_s=tuple(ready),
                         entries=layers.entries,
                         dense_bytes=tuple(GRADIENT_BYTES * e for e in layers.entries),
                         compute_s=t_f + t_b, names=layers.names)


def s_max(t_f: float, t_b: float, parameters: int) -> float:
    """Eq. 42 with eq. 43's t_c^min = 2 m / B."""
    tc_min = 2 * GRADIENT_BYTES * 8 * parameters / LINK_BITS_PER_S
    return P * (t_f + t_b) / (t_f + t_b + tc_min - min(t_b, tc_min))


def predict(model: str, layers: asc_wfbp_models.GradientLayers | None = None) -> dict:
    """The three plans' predictions, S and S_max of one model."""
    layers = layers or asc_wfbp_models.gradient_layers(model)
    t_f, t_b = compute_times(model)
    lt = layer_times(layers, t_f, t_b)
    link = paper_link()
    plans = {}
    for col, method in PLANS.items():
        t0 = time.perf_counter()
        p = gp.plan(method, lt, link, message_bytes=lambda n: float(GRADIENT_BYTES * n))
        plans[col] = (p, time.perf_counter() - t0)
    t_asc = plans["asc_wfbp"][0].predicted_s
    unbounded = gp.plan("asc", lt, paper_link(bounded=False),
                        message_bytes=lambda n: float(GRADIENT_BYTES * n)).predicted_s
    no_overlap = gp.plan("none", lt, link,
                         message_bytes=lambda n: float(GRADIENT_BYTES * n)).predicted_s
    single = single_stream_link()
    single_stream = {col: gp.plan(method, lt, single,
                                  message_bytes=lambda n: float(GRADIENT_BYTES * n)).predicted_s
                     for col, method in PLANS.items()}
    fusion = {f"{1e3 * c:g}ms": horovod_fusion_wfbp(lt, link, c) for c in HOROVOD_CYCLES_S}
    return {"layers": layers, "t_f": t_f, "t_b": t_b, "plans": plans,
            "asc_unbounded_s": unbounded, "no_overlap_s": no_overlap,
            "single_stream_s": single_stream, "horovod_fusion_wfbp": fusion,
            "s": P * (t_f + t_b) / t_asc, "s_max": s_max(t_f, t_b, layers.parameters)}


def single_stream_link() -> gp.Link:
    """Diagnostic link: one allreduce alone at ``2 link_b / gamma`` per byte (two
    together fill the link, each at gamma times one's time), the paper's a,
    gamma and the link bound."""
    link = paper_link()
    return gp.Link(a=A_S, b=2 * link.link_b / GAMMA, gamma=GAMMA,
                   max_concurrent=MAX_CONCURRENT, link_b=link.link_b)


def horovod_fusion_wfbp(lt: gp.LayerTimes, link: gp.Link, cycle_s: float) -> dict:
    """Diagnostic: WFBP as Horovod's tensor fusion runs it (the paper's code turns it off,
    ``HOROVOD_FUSION_THRESHOLD=0``): the tensors ready within one cycle of ``cycle_s``
    seconds in one fused allreduce of at most :data:`HOROVOD_FUSION_BYTES`, sent when
    its last tensor is ready (a lower bound), one at a time."""
    groups, cur, window, size = [], [], None, 0
    for leaf, ready, entries in zip(lt.leaves, lt.ready_s, lt.entries):
        w = int(ready // cycle_s)
        nbytes = GRADIENT_BYTES * entries
        if cur and (w != window or size + nbytes > HOROVOD_FUSION_BYTES):
            groups.append((tuple(cur), "normal"))
            cur, size = [], 0
        cur.append(leaf)
        window, size = w, size + nbytes
    if cur:
        groups.append((tuple(cur), "normal"))
    p = gp.simulate(lt, groups, link, message_bytes=lambda n: float(GRADIENT_BYTES * n))
    return {"predicted_s": p.predicted_s, "groups": len(groups)}


def fig4b_utilisation(sizes=(FIT_MIN_BYTES, 2 ** 19, 2 ** 21, 2 ** 22, 64 * 2 ** 20)) -> list[dict]:
    """What the paper's a, b, gamma say about its Fig. 4(b): the bytes per second of one
    allreduce of ``m`` bytes (``m / (a + b m)``) and of two at once (``2 m / (a + gamma b
    m)``, and with the link bound), as shares of the ring's link rate (``LINK_BITS_PER_S``)."""
    link = paper_link()
    ring_rate = LINK_BITS_PER_S / (8 * 2 * (P - 1) / P)
    return [{"message_bytes": m,
             "one": m / (A_S + B_S_PER_BYTE * m) / ring_rate,
             "two_gamma": 2 * m / (A_S + GAMMA * B_S_PER_BYTE * m) / ring_rate,
             "two_bounded": 2 * m / (A_S + link.slowdown(2) * B_S_PER_BYTE * m) / ring_rate}
            for m in sizes]


def implied(model: str, pred: dict) -> dict:
    """What the paper's measured WFBP and MG-WFBP times imply in the a + b m model:
    WFBP's startup per tensor if every byte ran at b (``(T - t_f - b sum m) / L``),
    and MG-WFBP's seconds per byte if each of its groups paid a
    (``(T - t_f - groups a) / sum m``): both one-at-a-time schedules, so the
    iteration is at least t_f + their wire time."""
    layers, paper = pred["layers"], PAPER[model]
    total_bytes = GRADIENT_BYTES * layers.parameters
    groups = len(pred["plans"]["mg_wfbp"][0].groups)
    tiny = sum(GRADIENT_BYTES * e < FIT_MIN_BYTES for e in layers.entries)
    wfbp_startups = paper["wfbp"] - pred["t_f"] - B_S_PER_BYTE * total_bytes
    return {"wfbp_implied_a_s": wfbp_startups / len(layers.names),
            "tiny_tensors": tiny,
            "wfbp_implied_tiny_a_s": (wfbp_startups - (len(layers.names) - tiny) * A_S) / tiny,
            "mg_implied_b_s_per_byte": (paper["mg_wfbp"] - pred["t_f"] - groups * A_S)
            / total_bytes}


def implied_cross_check(recs: list[dict], layers_by_model: dict) -> dict:
    """A diagnostic: do the ASC-WFBP cells follow from the other two columns, with one
    startup and one per-byte time for all four models (the means of :func:`implied`)?
    Adds ``implied_predicted_s`` to every record."""
    a = sum(r["wfbp_implied_a_s"] for r in recs) / len(recs)
    b = sum(r["mg_implied_b_s_per_byte"] for r in recs) / len(recs)
    link = gp.Link(a=a, b=b, gamma=GAMMA, max_concurrent=MAX_CONCURRENT,
                   link_b=2 * 8 / LINK_BITS_PER_S)
    for model, layers in layers_by_model.items():
        lt = layer_times(layers, *compute_times(model))
        for col, method in PLANS.items():
            p = gp.plan(method, lt, link, message_bytes=lambda n: float(GRADIENT_BYTES * n))
            r = next(r for r in recs if r["model"] == model and r["plan"] == col)
            r.update({"implied_a_s": a, "implied_b_s_per_byte": b,
                      "implied_predicted_s": p.predicted_s,
                      "implied_error": p.predicted_s / r["paper_s"] - 1.0})
            print(f"# implied a = {1e3 * a:.2f} ms, b = {1e9 * b:.2f} ns/B: {model:<13} "
                  f"{col:<9} {p.predicted_s:.3f} s ({100 * r['implied_error']:+.1f}%)")
    return {"a_s": a, "b_s_per_byte": b}


def hypotheses(recs: list[dict]) -> dict:
    """Cells within 15 % / 25 % under each reading (diagnostics, see the module
    docstring): ``paper_model`` is the prediction itself."""
    readings = {
        "paper_model": lambda r: r["predicted_s"],
        "single_stream_fig4b": lambda r: r["single_stream_fig4b_s"],
        "mg_wfbp_as_no_overlap": lambda r: r["no_overlap_s"] if r["plan"] == "mg_wfbp"
        else r["predicted_s"],
    }
    out = {}
    for name, value in readings.items():
        errs = [abs(value(r) / r["paper_s"] - 1.0) for r in recs]
        out[name] = {"cells": len(errs), "within_15pct": sum(e <= 0.15 for e in errs),
                     "within_25pct": sum(e <= 0.25 for e in errs), "max_abs_error": max(errs)}
    return out


def records(model: str, pred: dict) -> list[dict]:
    out = []
    paper = PAPER[model]
    layers = pred["layers"]
    for col, (plan, seconds) in pred["plans"].items():
        kinds = [g.kind for g in plan.groups]
        out.append({
            "model": model, "plan": col, "method": PLANS[col], "P": P,
            "paper_s": paper[col], "predicted_s": plan.predicted_s,
            "error": plan.predicted_s / paper[col] - 1.0,
            "groups": len(plan.groups), "simultaneous_groups": kinds.count("simultaneous"),
            "tensors": len(layers.names), "parameters": layers.parameters,
            "t_f_s": pred["t_f"], "t_b_s": pred["t_b"], "planning_s": seconds,
            "s": pred["s"], "s_max": pred["s_max"], "s_over_s_max": pred["s"] / pred["s_max"],
            "paper_s_speedup": paper["s"], "paper_s_max": paper["s_max"],
            "paper_s_over_s_max": paper["s"] / paper["s_max"],
            "asc_unbounded_link_s": pred["asc_unbounded_s"], **implied(model, pred),
            "exposed_comm_paper_s": paper[col] - pred["t_f"] - pred["t_b"],
            "no_overlap_s": pred["no_overlap_s"],
            "no_overlap_error": pred["no_overlap_s"] / paper[col] - 1.0,
            "single_stream_fig4b_s": pred["single_stream_s"][col],
            "single_stream_fig4b_error": pred["single_stream_s"][col] / paper[col] - 1.0,
            **({"horovod_fusion_wfbp": pred["horovod_fusion_wfbp"]} if col == "wfbp" else {}),
        })
    return out


def plot(recs: list[dict], path: Path) -> None:
    plt = _harness.pyplot()
    import numpy as np

    models = list(PAPER)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 1.3]})
    width = 0.13
    colors = {"wfbp": "tab:red", "mg_wfbp": "tab:orange", "asc_wfbp": "tab:green"}
    x = np.arange(len(models))
    for j, col in enumerate(PLANS):
        paper = [next(r for r in recs if r["model"] == m and r["plan"] == col)["paper_s"]
                 for m in models]
        pred = [next(r for r in recs if r["model"] == m and r["plan"] == col)["predicted_s"]
                for m in models]
        off = (j - 1) * 2.2 * width
        ax.bar(x + off - width / 2, paper, width, color=colors[col], alpha=0.45,
               label=f"{col} paper")
        ax.bar(x + off + width / 2, pred, width, color=colors[col], label=f"{col} predicted")
        for xi, p, q in zip(x + off, paper, pred):
            ax.text(xi + width / 2, q, f"{100 * (q / p - 1):+.0f}%", ha="center",
                    va="bottom", fontsize=7)
        if col == "mg_wfbp":  # the diagnostic: no overlap at all (plan "none")
            flat = [next(r for r in recs if r["model"] == m and r["plan"] == col)["no_overlap_s"]
                    for m in models]
            ax.scatter(x + off - width / 2, flat, marker="_", s=250, color="black", zorder=3,
                       label="no overlap (t_f + t_b + a + b m)")
    ax.set_xticks(x, [asc_wfbp_models.MODELS[m][3] for m in models])
    ax.set(ylabel="iteration time (s)",
           title="ASC-WFBP Table IV: paper (light) vs our simulator (dark), P = 32, 10 GbE")
    ax.legend(fontsize=7, ncol=3)
    ours = [next(r for r in recs if r["model"] == m)["s_over_s_max"] * 100 for m in models]
    theirs = [next(r for r in recs if r["model"] == m)["paper_s_over_s_max"] * 100
              for m in models]
    ax2.bar(x - 0.2, theirs, 0.4, color="gray", alpha=0.5, label="paper (Table V)")
    ax2.bar(x + 0.2, ours, 0.4, color="tab:green", label="predicted")
    ax2.set_xticks(x, [asc_wfbp_models.MODELS[m][3] for m in models], rotation=20, fontsize=8)
    ax2.set_ylabel("S / S_max (%)")
    ax2.set_ylim(0, 110)
    ax2.legend(fontsize=7)
    ax2.set_title("ASC-WFBP S / S_max")
    _harness.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(PAPER), choices=list(PAPER))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"
                                         / "asc_wfbp_table4.json"))
    ap.add_argument("--show-plan", action="store_true", help="print each ASC plan's groups")
    args = ap.parse_args(argv)
    recs = []
    print(f"{'model':<13} {'plan':<9} {'paper s':>8} {'ours s':>8} {'error':>7} {'groups':>6} "
          f"{'simult':>6}")
    layers_by_model = {}
    for model in args.models:
        pred = predict(model)
        layers_by_model[model] = pred["layers"]
        for r in records(model, pred):
            recs.append(r)
            print(f"{model:<13} {r['plan']:<9} {r['paper_s']:8.3f} {r['predicted_s']:8.3f} "
                  f"{100 * r['error']:+6.1f}% {r['groups']:6d} {r['simultaneous_groups']:6d}")
        r = recs[-1]
        print(f"{'':13} S / S_max: ours {r['s']:.1f} / {r['s_max']:.1f} = "
              f"{100 * r['s_over_s_max']:.1f}%, paper {r['paper_s_speedup']} / "
              f"{r['paper_s_max']} = {100 * r['paper_s_over_s_max']:.1f}%  "
              f"({r['tensors']} tensors, {r['parameters'] / 1e6:.1f}M parameters)")
        print(f"{'':13} ASC without the link bound {r['asc_unbounded_link_s']:.3f} s; the paper's "
              f"WFBP implies a = {1e3 * r['wfbp_implied_a_s']:.2f} ms per tensor, its MG-WFBP "
              f"b = {1e9 * r['mg_implied_b_s_per_byte']:.2f} ns/B")
        fusion = ", ".join(f"{k} cycle {v['predicted_s']:.3f} s ({v['groups']} groups)"
                           for k, v in pred["horovod_fusion_wfbp"].items())
        print(f"{'':13} no overlap (one allreduce after the backward) {r['no_overlap_s']:.3f} s; "
              f"the WFBP cell implies {1e3 * r['wfbp_implied_tiny_a_s']:.2f} ms per tensor under "
              f"8 KiB ({r['tiny_tensors']}); WFBP with Horovod fusion: {fusion}")
        if args.show_plan:
            print(pred["plans"]["asc_wfbp"][0].table())
    if set(args.models) == set(PAPER):
        implied_cross_check(recs, layers_by_model)
    errs = [abs(r["error"]) for r in recs]
    summary = {"cells": len(recs), "within_15pct": sum(e <= 0.15 for e in errs),
               "within_25pct": sum(e <= 0.25 for e in errs), "max_abs_error": max(errs),
               "s_over_s_max_points_off": {
                   r["model"]: 100 * (r["s_over_s_max"] - r["paper_s_over_s_max"])
                   for r in recs if r["plan"] == "asc_wfbp"}}
    if "implied_error" in recs[0]:
        ierrs = [abs(r["implied_error"]) for r in recs]
        summary["implied_cross_check"] = {
            "within_15pct": sum(e <= 0.15 for e in ierrs),
            "within_25pct": sum(e <= 0.25 for e in ierrs), "max_abs_error": max(ierrs)}
    summary["hypotheses"] = hypotheses(recs)
    summary["fig4b_utilisation"] = fig4b_utilisation()
    for name, h in summary["hypotheses"].items():
        print(f"# diagnostic {name}: {h['within_15pct']}/{h['cells']} within 15 %, "
              f"{h['within_25pct']} within 25 %, worst {100 * h['max_abs_error']:.1f}%")
    for u in summary["fig4b_utilisation"]:
        print(f"# Fig. 4(b) in the paper's model, {u['message_bytes'] / 2 ** 20:8.3f} MiB: one "
              f"allreduce {100 * u['one']:.0f}% of the link, two at once "
              f"{100 * u['two_gamma']:.0f}% (gamma alone), {100 * u['two_bounded']:.0f}% "
              f"(link-bounded)")
    print(f"# {summary['within_15pct']}/{len(recs)} cells within 15 %, "
          f"{summary['within_25pct']}/{len(recs)} within 25 %, worst {100 * max(errs):.1f}%")
    out = Path(args.out)
    if set(args.models) == set(PAPER):
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {"benchmark": "asc_wfbp_table4", "machine": _harness.machine_info(mpi=False),
                "parameters": {"P": P, "a_s": A_S, "b_s_per_byte": B_S_PER_BYTE,
                               "gamma": GAMMA, "max_concurrent": MAX_CONCURRENT,
                               "link_bits_per_s": LINK_BITS_PER_S, "tf_share": TF_SHARE,
                               "norm_flops_per_element": asc_wfbp_models.NORM_FLOPS_PER_ELEMENT},
                "summary": summary, "records": recs}
        _harness.write_record(data, out)
        plot(recs, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
