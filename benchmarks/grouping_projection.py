"""When does layer grouping pay for a sparse sync? Projections at 32 and 256 workers.

The planner and event simulator of ``jax_sparse_sync.model.grouping`` (as checked by
``asc_wfbp_table4.py``) on the four Table IV models and our transformer LM
(``LM_BATCH``), for the ``SYNCS`` (``dense``: Rabenseifner's volume; ``topk`` at 1 % and
0.1 %: the algorithm ``cost_model.choose_algorithm`` picks, a group of n entries keeping
``k n / N``), each ungrouped (``none``), ``wfbp``, ``mg`` and ``asc``, on the
``NETWORKS`` (P = 32 on 10 GbE, P = 256 on 25 GbE; alpha ``ALPHA_S``). Compute: the
paper's ``t_f, t_b``, the LM's from its FLOPs at ResNet-152's rate; ready times by
FLOPs; a sparse group's local work ``GPU_TOPK_FIXED_S + GPU_TOPK_PER_ENTRY_S * n``.
S = P (t_f + t_b) / T and S_max from eq. 42 with the ungrouped sync's volume.

  python benchmarks/grouping_projection.py
writes ``benchmarks/results/grouping_projection.{json,png}`` (docs/topics/scheduling.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness  # noqa: E402
import asc_wfbp_models  # noqa: E402
import asc_wfbp_table4 as t4  # noqa: E402

from jax_sparse_sync.planning import cost_model as cm  # noqa: E402
from jax_sparse_sync.model import grouping as gp  # noqa: E402

ALPHA_S = t4.A_S / (2 * (t4.P - 1))
NETWORKS = {"10gbe_p32": (32, 8 / 9.43e9), "25gbe_p256": (256, 8 / (0.943 * 25e9))}
SYNCS = {"dense": None, "topk_1%": 0.01, "topk_0.1%": 0.001}
PLANS = ("none", "wfbp", "mg", "asc")
MODELS = list(t4.PAPER) + ["transformer_lm"]
#: topk on the H100 (selection_gpu_h100.json): fixed, per entry (1 %, 64M -> 256M)
GPU_TOPK_FIXED_S = 0.11e-3
GPU_TOPK_PER_ENTRY_S = 3.7e-12 * 3350 / 616
LM_BATCH = 32


def compute_times(model: str, layers) -> tuple[float, float]:
    if model in t4.PAPER:
        return t4.compute_times(model)
    resnet = asc_wfbp_models.gradient_layers("resnet152")
    rate = 3 * resnet.total_flops * 32 / (0.091 + 0.182)
    total = 3 * layers.total_flops * LM_BATCH / rate
    return t4.TF_SHARE * total, (1 - t4.TF_SHARE) * total


def sync_model(sync: str, nranks: int, beta: float, size: int):
    """``(algorithm, Link, message_bytes, local_s, whole-gradient bytes)``."""
    density = SYNCS[sync]
    params = cm.AlphaBeta(alpha=ALPHA_S, beta=beta, gamma=1.5)
    if density is None:
        alg, k = "dense", size
    else:
        k = max(1, round(density * size))
        alg = cm.choose_algorithm(nranks=nranks, size=size, k=k, params=params)

    def k_of(n: int) -> int:
        return n if density is None else min(n, max(1, round(k * n / size)))

    def message_bytes(n: int) -> float:
        return float(cm.wire_volume(alg, nranks=nranks, size=n, k=k_of(n)).bytes_max)

    def local_s(n: int) -> float:
        return 0.0 if density is None else GPU_TOPK_FIXED_S + GPU_TOPK_PER_ENTRY_S * n

    messages = cm.wire_volume(alg, nranks=nranks, size=size, k=k).messages
    link = gp.Link(a=messages * ALPHA_S, b=beta, gamma=1.5, max_concurrent=2, link_b=beta)
    return alg, link, message_bytes, local_s, message_bytes(size)


def project(models=MODELS, networks=NETWORKS, syncs=SYNCS) -> list[dict]:
    recs = []
    for model in models:
        layers = asc_wfbp_models.gradient_layers(model)
        t_f, t_b = compute_times(model, layers)
        lt = t4.layer_times(layers, t_f, t_b)
        for net in networks:
            nranks, beta = NETWORKS[net]
            for sync in syncs:
                alg, link, mbytes, local_s, total_bytes = sync_model(sync, nranks, beta,
                                                                     layers.parameters)
                t_c = beta * total_bytes
                s_max = nranks * (t_f + t_b) / (t_f + t_b + t_c - min(t_b, t_c))
                base = None
                for method in PLANS:
                    t0 = time.perf_counter()
                    p = gp.plan(method, lt, link, mbytes, local_s)
                    base = base or p.predicted_s
                    s = nranks * (t_f + t_b) / p.predicted_s
                    recs.append({
                        "model": model, "network": net, "P": nranks, "sync": sync,
                        "algorithm": alg, "plan": method, "predicted_s": p.predicted_s,
                        "speedup_over_ungrouped": base / p.predicted_s,
                        "groups": len(p.groups),
                        "simultaneous_groups": sum(g.kind == "simultaneous" for g in p.groups),
                        "s": s, "s_max": s_max, "s_over_s_max": s / s_max,
                        "t_f_s": t_f, "t_b_s": t_b, "wire_bytes_ungrouped": total_bytes,
                        "group_startup_s": link.a, "planning_s": time.perf_counter() - t0})
                    r = recs[-1]
                    print(f"{model:<14} {net:<10} {sync:<9} {alg:<20} {method:<4} "
                          f"{1e3 * r['predicted_s']:9.1f} ms  x{r['speedup_over_ungrouped']:5.2f}"
                          f"  S/Smax {100 * r['s_over_s_max']:5.1f}%  groups {r['groups']}",
                          flush=True)
    return recs


def plot(recs: list[dict], path: Path) -> None:
    plt = _harness.pyplot()
    import numpy as np

    models = list(dict.fromkeys(r["model"] for r in recs))
    fig, axes = plt.subplots(1, len(NETWORKS), figsize=(14, 4.5), sharey=True)
    colors = {"none": "tab:gray", "wfbp": "tab:red", "mg": "tab:orange", "asc": "tab:green"}
    for ax, net in zip(np.atleast_1d(axes), NETWORKS):
        labels, x = [], 0
        for model in models:
            for sync in SYNCS:
                for j, method in enumerate(PLANS):
                    r = next((r for r in recs if r["model"] == model and r["network"] == net
                              and r["sync"] == sync and r["plan"] == method), None)
                    if r:
                        ax.bar(x + (j - 1.5) * 0.2, 100 * r["s_over_s_max"], 0.2,
                               color=colors[method], label=method if x == 0 else None)
                labels.append(f"{model.split('_')[0][:9]}\n{sync}")
                x += 1
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_title(f"{net}: S / S_max per plan")
        ax.set_ylim(0, 105)
        ax.grid(axis="y", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("S / S_max (%)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    _harness.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"
                                         / "grouping_projection.json"))
    args = ap.parse_args(argv)
    recs = project(args.models)
    if set(args.models) == set(MODELS):
        out = Path(args.out)
        data = {"benchmark": "grouping_projection", "machine": _harness.machine_info(mpi=False),
                "parameters": {"alpha_s": ALPHA_S, "networks": NETWORKS, "gamma": 1.5,
                               "max_concurrent": 2, "gpu_topk_fixed_s": GPU_TOPK_FIXED_S,
                               "gpu_topk_per_entry_s": GPU_TOPK_PER_ENTRY_S,
                               "lm_batch": LM_BATCH},
                "records": recs}
        _harness.write_record(data, out)
        plot(recs, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
