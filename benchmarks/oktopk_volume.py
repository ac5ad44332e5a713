"""Ok-Topk's wire volume per rank against its bounds, next to TopkA and DSAR.

What. The words each rank sends and receives in ``jss.oktopk_allreduce`` against the
bounds of Li and Hoefler (PPoPP'22), ``2k(P-1)/P <= volume <= 6k(P-1)/P``, and against
TopkA and DSAR on the same inputs (a word is 4 bytes, a COO entry 2 words; bytes from
the C++ counters). Each rank's gradient (:func:`make_gradient`: ``--layers`` layers of
log-uniform scales, a shared and an own Student-t part) gives its exact local top-k,
on which run ``oktopk`` (threshold and boundaries recomputed), ``oktopk_reuse`` (those
passed back in), ``oktopk_even`` (even boundaries), ``topka`` and ``dsar``.

How. The script asserts, on every rank, measured bytes == control (the C++ code's
formulas, :func:`control_bytes`) + payload (from the inputs and the result), the rest
being the balancing step; every result is checked against a float64 NumPy reference
and for bitwise equality across ranks. Times: ``--repeats`` interleaved rounds, each
call after a barrier, the max over ranks, median (and min) over rounds.

    mpiexec -n 4 python benchmarks/oktopk_volume.py --size 1M --density 0.01   # one P
    python benchmarks/oktopk_volume.py --sweep --procs 2 3 4 5 6 7 8       # one job per P

writes ``benchmarks/results/oktopk_volume.{json,png}`` (results: benchmarks/README.md,
"oktopk_volume.py"); ``--plot-only`` redraws them from the JSON.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

from _harness import (add_launch_options, add_record_options, add_timing_options,  # noqa: E402
                      driver_or_worker, fmt_size, launch, loadavg, machine_info, machine_line,
                      parse_size, parser, print_header, pyplot, record_or_replot, save_figure,
                      shade_oversubscribed, sweep_fields, time_rounds, timing_args, write_fragment)

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("oktopk", "oktopk_reuse", "oktopk_even", "topka", "dsar")
LABELS = {
    "oktopk": "Ok-Topk (exact threshold, balanced regions)",
    "oktopk_reuse": "Ok-Topk (reused threshold + regions)",
    "oktopk_even": "Ok-Topk (exact threshold, even regions)",
    "topka": "TopkA (allgather)",
    "dsar": "DSAR (split + dense allgather)",
}
from jax_sparse_sync.model.cost_model import ENTRY_BYTES, HEADER_BYTES  # noqa: E402
from jax_sparse_sync.model.cost_model import THRESHOLD_HISTOGRAM_BINS as RADIX_HISTS  # noqa: E402

WORD = 4
NOTE = ("MPICH over shared memory on one host, 2 cores: P > 2 ranks are oversubscribed, so times "
        "for P > 2 include scheduler noise; the byte counts do not depend on it. "
        "1 word = 4 bytes; one COO entry = 2 words.")


# --------------------------------------------------------------------------- formulas


def bounds_words(k: int, p: int) -> dict:
    """The paper's bounds and TopkA's volume, in words (k entries = 2k words)."""
    return {"lower_2k": 2 * k * (p - 1) / p, "upper_6k": 6 * k * (p - 1) / p,
            "topka_2k_p": 2 * k * (p - 1)}


def control_bytes(variant: str, p: int) -> dict:
    """Control traffic of one call on one rank, in bytes, by part (sent == received), as
    the C++ counters count it (mpi_comm.cc, oktopk.cc, split_allgather.cc)."""
    if p < 2:
        return {"header": 0}
    parts = {"header": HEADER_BYTES * (p - 1)}
    if variant.startswith("oktopk"):
        parts["sizes"] = 8 * (p - 1) + 8 * (p - 1)  # slice sizes alltoall + selected sizes
        if variant == "oktopk":  # recomputed boundaries
            parts["boundaries"] = 2 * (p - 1) * (p - 1) * 8 // p
        if variant in ("oktopk", "oktopk_even"):  # exact threshold: 3 allreduces
            parts["threshold"] = sum(2 * (p - 1) * h * 8 // p for h in RADIX_HISTS)
    elif variant == "dsar":
        parts["sizes"] = 8 * (p - 1)
    return parts


# --------------------------------------------------------------------------- worker


def make_gradient(n: int, *, rank: int, seed: int, layers: int, noise: float):
    """Rank ``rank``'s synthetic gradient (float32) and the layer scale vector."""
    import numpy as np

    shared = np.random.default_rng([seed, 0xC0FFEE])
    cuts = np.sort(shared.choice(np.arange(1, n), size=layers - 1, replace=False))
    scale_per_layer = 10.0 ** shared.uniform(-1.0, 0.5, size=layers)
    scale = np.repeat(scale_per_layer, np.diff(np.concatenate([[0], cuts, [n]])))
    signal_ = shared.standard_t(3, size=n)
    own = np.random.default_rng([seed, 1 + rank]).standard_t(3, size=n)
    return (scale * (signal_ + noise * own)).astype(np.float32)


def worker(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_sparse_sync as jss

    comm = jss.mpi.default_comm()
    rank, p = comm.Get_rank(), comm.Get_size()
    n = parse_size(args.size)
    k = max(1, int(round(args.density * n)))
    ncpu = os.cpu_count()
    info = machine_info() if rank == 0 else None
    if rank == 0:
        print(f"# oktopk volume P={p} N={fmt_size(n)} k={k} "
              f"({'oversubscribed: ' if p > ncpu else ''}{p} ranks on {ncpu} cores)", flush=True)

    g = make_gradient(n, rank=rank, seed=args.seed, layers=args.layers, noise=args.noise)
    values, indices = jax.block_until_ready(jax.jit(lambda x: jss.topk(x, k))(jnp.asarray(g)))
    v_np, i_np = np.asarray(values), np.asarray(indices)
    assert np.all(np.diff(i_np) > 0) and np.array_equal(g[i_np], v_np)

    # ---- reference (float64) and input statistics
    everything = comm.allgather((i_np, v_np))
    dense_ref = np.zeros(n, np.float64)
    for ri, rv in everything:
        np.add.at(dense_ref, ri, rv.astype(np.float64))
    union = np.unique(np.concatenate([ri for ri, _ in everything]))
    mags = np.abs(dense_ref[union])
    kth = float(np.partition(mags, len(mags) - k)[len(mags) - k]) if len(mags) >= k else 0.0
    overlap = [len(np.intersect1d(everything[0][0], ri, assume_unique=True)) / k
               for ri, _ in everything[1:]]
    del everything

    # ---- the five variants, jitted
    def okt(v, i, *, bnd=None, thr=0.0, rb=True, rt=True):
        return jss.oktopk_allreduce(v, i, size=n, k=k, boundaries=bnd, global_threshold=thr,
                                    recompute_boundaries=rb, recompute_threshold=rt)

    f_okt = jax.jit(lambda v, i: okt(v, i))
    f_reuse = jax.jit(lambda v, i, b, t: okt(v, i, bnd=b, thr=t, rb=False, rt=False))
    f_even = jax.jit(lambda v, i: okt(v, i, rb=False))  # boundaries=None: even split
    f_topka = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=n, algorithm="allgather",
                                                        return_stats=True))
    f_dsar = jax.jit(lambda v, i: jss.sparse_allreduce(
        v, i, size=n, algorithm="dsar_split_allgather", return_stats=True))

    comm.Barrier()
    first = jax.block_until_ready(f_okt(values, indices))
    bnd, thr = first.boundaries, first.threshold
    calls = {
        "oktopk": lambda: f_okt(values, indices),
        "oktopk_reuse": lambda: f_reuse(values, indices, bnd, thr),
        "oktopk_even": lambda: f_even(values, indices),
        "topka": lambda: f_topka(values, indices),
        "dsar": lambda: f_dsar(values, indices),
    }

    def unpack(name, res):
        if name.startswith("oktopk"):
            return res.sum, res.stats, res
        out, stats = res
        return out, stats, None

    results = {}
    for name, call in calls.items():
        res = None
        for _ in range(args.warmup):
            comm.Barrier()
            res = jax.block_until_ready(call())
        results[name] = unpack(name, res)

    # ---- correctness
    def digest(a):
        return hashlib.sha1(np.asarray(a).tobytes()).hexdigest()

    checks = {}
    for name, (out, stats, okres) in results.items():
        out_np = np.asarray(out)
        identical = len(set(comm.allgather(digest(out_np)))) == 1
        assert identical, f"P={p} {name}: results differ bitwise across ranks"
        if okres is None:
            err = float(np.max(np.abs(out_np - dense_ref)))
            assert np.allclose(out_np, dense_ref, rtol=1e-5, atol=1e-5), f"P={p} {name}: wrong sum"
            checks[name] = {"max_abs_err_vs_float64": err, "identical_across_ranks": True}
            continue
        t = float(okres.threshold)
        kept = np.flatnonzero(out_np)
        tol = 1e-5 * kth
        must = np.flatnonzero(np.abs(dense_ref) > kth + tol)
        may = np.flatnonzero(np.abs(dense_ref) >= kth - tol)
        assert np.all(np.isin(must, kept)), f"P={p} {name}: an entry above the k-th |sum| is missing"
        assert np.all(np.isin(kept, may)), f"P={p} {name}: an entry below the k-th |sum| was kept"
        assert np.allclose(out_np[kept], dense_ref[kept], rtol=1e-5, atol=1e-5), \
            f"P={p} {name}: kept values differ from the float64 sum"
        assert abs(t - kth) <= tol, f"P={p} {name}: threshold {t} != reference k-th |sum| {kth}"
        assert int(stats.result_nnz) == len(kept) and k <= len(kept) <= k + 2 * p
        contrib = np.asarray(okres.contributed)
        assert np.array_equal(contrib, out_np[i_np] != 0), f"P={p} {name}: `contributed` is wrong"
        checks[name] = {"threshold": t, "reference_kth_abs_sum": kth, "result_nnz": len(kept),
                        "max_abs_err_vs_float64": float(np.max(np.abs(out_np[kept] - dense_ref[kept]))),
                        "identical_across_ranks": True,
                        "balancing_ran": bool(int(stats.switched_to_dense))}

    # ---- payload from the inputs and the result; control from the formulas
    def oktopk_payload(okres):
        b = np.asarray(okres.boundaries).astype(np.int64)
        per_region = np.diff(np.searchsorted(i_np, b, side="left"))  # my entries per region
        matrix = np.array(comm.allgather(per_region))  # [sender, region]
        split_sent = int(per_region.sum() - per_region[rank])
        split_recv = int(matrix[:, rank].sum() - matrix[rank, rank])
        out_np = np.asarray(okres.sum)
        total = int(np.count_nonzero(out_np))
        mine = int(np.count_nonzero(out_np[b[rank]:b[rank + 1]]))
        if bool(int(okres.stats.switched_to_dense)):  # balanced: even shares of the concatenation
            mine = total * (rank + 1) // p - total * rank // p
        return {
            "split_sent": split_sent * ENTRY_BYTES, "split_received": split_recv * ENTRY_BYTES,
            "allgatherv_sent": mine * (p - 1) * ENTRY_BYTES,
            "allgatherv_received": (total - mine) * ENTRY_BYTES,
            "entries_into_region": split_recv, "selected_in_region": mine,
        }

    def allgather_payload(out_np):
        total = comm.allreduce(k)
        return {"allgatherv_sent": k * (p - 1) * ENTRY_BYTES,
                "allgatherv_received": (total - k) * ENTRY_BYTES}

    def dsar_payload():
        b = np.array([n * q // p for q in range(p + 1)], np.int64)
        per_region = np.diff(np.searchsorted(i_np, b, side="left"))
        matrix = np.array(comm.allgather(per_region))
        slot = -(-n // p)  # every range padded to ceil(N / P): one plain MPI_Allgather
        return {"split_sent": int(per_region.sum() - per_region[rank]) * ENTRY_BYTES,
                "split_received": int(matrix[:, rank].sum() - matrix[rank, rank]) * ENTRY_BYTES,
                "dense_allgather_sent": slot * (p - 1) * WORD,
                "dense_allgather_received": slot * (p - 1) * WORD}

    volumes = {}
    for name, (out, stats, okres) in results.items():
        ctrl = control_bytes(name, p)
        if okres is not None:
            pay = oktopk_payload(okres)
        elif name == "topka":
            pay = allgather_payload(np.asarray(out))
        else:
            pay = dsar_payload()
        sent, recv = int(stats.bytes_sent), int(stats.bytes_received)
        pay_sent = sum(v for kk, v in pay.items() if kk.endswith("_sent"))
        pay_recv = sum(v for kk, v in pay.items() if kk.endswith("_received"))
        c = sum(ctrl.values())
        balancing = {"sent": sent - c - pay_sent, "received": recv - c - pay_recv}
        if not (okres is not None and bool(int(stats.switched_to_dense))):
            assert balancing == {"sent": 0, "received": 0}, (
                f"P={p} rank {rank} {name}: measured bytes {sent}/{recv} != control {c} + payload "
                f"{pay_sent}/{pay_recv}")
        volumes[name] = {"bytes_sent": sent, "bytes_received": recv, "messages": int(stats.messages),
                         "control_bytes": ctrl, "control_total_bytes": c,
                         "payload": pay, "payload_sent_bytes": pay_sent,
                         "payload_received_bytes": pay_recv, "balancing_bytes": balancing}

    # ---- timing, interleaved
    times = time_rounds(calls, args.repeats, comm)

    mine = {"rank": rank, "volumes": volumes, "times": times, "overlap_with_rank0": overlap,
            "boundaries": np.asarray(bnd).tolist()}
    allr = comm.gather(mine, root=0)
    if rank == 0:
        records = []
        bw = bounds_words(k, p)
        for name in calls:
            per = [r["volumes"][name] for r in allr]
            rounds = [max(r["times"][name][j] for r in allr) for j in range(args.repeats)]

            def words(key, per=per):
                return [x[key] / WORD for x in per]

            rec = {
                "P": p, "N": n, "k": k, "variant": name, "label": LABELS[name],
                "oversubscribed": p > ncpu,
                "words_sent": words("bytes_sent"), "words_received": words("bytes_received"),
                "payload_words_sent": words("payload_sent_bytes"),
                "payload_words_received": words("payload_received_bytes"),
                "control_words": [x["control_total_bytes"] / WORD for x in per],
                "control_parts_bytes": per[0]["control_bytes"],
                "balancing_words_sent": [x["balancing_bytes"]["sent"] / WORD for x in per],
                "balancing_words_received": [x["balancing_bytes"]["received"] / WORD for x in per],
                "payload_parts_bytes": [x["payload"] for x in per],
                "messages": [x["messages"] for x in per],
                "bounds_words": bw,
                "median_s": statistics.median(rounds), "min_s": min(rounds), "times_s": rounds,
                "check": checks[name],
            }
            for key in ("words_sent", "words_received", "payload_words_sent",
                        "payload_words_received"):
                rec[key + "_mean"] = statistics.fmean(rec[key])
                rec[key + "_max"] = max(rec[key])
            rec["within_bounds_payload"] = (
                name.startswith("oktopk")
                and bw["lower_2k"] * 0.999 <= rec["payload_words_received_mean"]
                and max(rec["payload_words_sent_max"], rec["payload_words_received_max"])
                <= bw["upper_6k"])
            records.append(rec)
        frag = {
            "P": p, "N": n, "k": k, "density": args.density, "layers": args.layers,
            "noise": args.noise, "seed": args.seed, "repeats": args.repeats,
            "warmup": args.warmup, "oversubscribed": p > ncpu, "cpu_count": ncpu,
            "machine": info, "loadavg_1min": loadavg(),
            "inputs": {"union_of_local_topk": int(len(union)),
                       "mean_overlap_of_local_topk_with_rank0": (statistics.fmean(
                           allr[0]["overlap_with_rank0"]) if p > 1 else None),
                       "reference_kth_abs_sum": kth},
            "balanced_boundaries": allr[0]["boundaries"],
            "records": records,
        }
        for r in records:
            print(f"  {r['variant']:>13}: sent mean {r['words_sent_mean']:10.0f} max "
                  f"{r['words_sent_max']:10.0f} | recv mean {r['words_received_mean']:10.0f} max "
                  f"{r['words_received_max']:10.0f} words | control {r['control_words'][0]:7.0f} | "
                  f"median {r['median_s'] * 1e3:7.2f} ms", flush=True)
        write_fragment(frag, args.fragment or RESULTS / f"oktopk_volume_P{p}.json.tmp")
    comm.Barrier()
    return 0


# --------------------------------------------------------------------------- driver


def run_one(p: int, args) -> dict:
    # next to the output (benchmarks/results/ by default; git ignores *.tmp there)
    return launch(Path(__file__).resolve(), p, [
        "--size", args.size, "--density", args.density, "--layers", args.layers, "--noise",
        args.noise, *timing_args(args)],
        Path(args.out).parent / f"oktopk_volume_P{p}.json.tmp", args.timeout,
        mpiexec_args=args.mpiexec_args)


def print_table(data: dict) -> None:
    print(f"\n# {data['note']}")
    print(f"# N = {fmt_size(data['N'])}, k = {data['k']} ({data['density']:.1%}); words per rank "
          "per call (sent / received: mean, max over ranks); control = header + sizes "
          "(+ boundaries + radix-select threshold when recomputed)")
    print_header(f"{'P':>2} {'variant':>13} | {'sent mean':>9} {'sent max':>9} | {'recv mean':>9} "
                 f"{'recv max':>9} | {'payload recv':>12} {'control':>8} | {'2k(P-1)/P':>9} "
                 f"{'6k(P-1)/P':>9} {'2k(P-1)':>8} | {'median ms':>9} {'min ms':>7}")
    for r in sorted(data["records"], key=lambda r: (r["P"], VARIANTS.index(r["variant"]))):
        b = r["bounds_words"]
        print(f"{r['P']:>2}{'*' if r['oversubscribed'] else ' '}{r['variant']:>13} | "
              f"{r['words_sent_mean']:>9.0f} {r['words_sent_max']:>9.0f} | "
              f"{r['words_received_mean']:>9.0f} {r['words_received_max']:>9.0f} | "
              f"{r['payload_words_received_mean']:>12.0f} {r['control_words'][0]:>8.0f} | "
              f"{b['lower_2k']:>9.0f} {b['upper_6k']:>9.0f} {b['topka_2k_p']:>8.0f} | "
              f"{r['median_s'] * 1e3:>9.2f} {r['min_s'] * 1e3:>7.2f}")
    print("(* = oversubscribed)")
    print("\nOk-Topk (exact threshold, balanced regions), in units of k(P-1)/P words:")
    for r in sorted(data["records"], key=lambda r: r["P"]):
        if r["variant"] != "oktopk":
            continue
        unit = r["k"] * (r["P"] - 1) / r["P"]
        print(f"  P={r['P']}: sent mean {r['words_sent_mean'] / unit:.2f} (payload "
              f"{r['payload_words_sent_mean'] / unit:.2f}, max {r['payload_words_sent_max'] / unit:.2f}),"
              f" received mean {r['words_received_mean'] / unit:.2f} (payload "
              f"{r['payload_words_received_mean'] / unit:.2f}, max "
              f"{r['payload_words_received_max'] / unit:.2f}); control "
              f"{r['control_words'][0] / unit:.2f}; bounds [2, 6]")


def plot(data: dict, path: Path) -> None:
    import numpy as np

    plt = pyplot()

    recs = data["records"]
    ps = sorted({r["P"] for r in recs})
    k = data["k"]
    color = {"oktopk": "tab:red", "oktopk_reuse": "tab:orange", "oktopk_even": "tab:pink",
             "topka": "tab:blue", "dsar": "tab:gray"}
    marker = {"oktopk": "o", "oktopk_reuse": "D", "oktopk_even": "v", "topka": "s", "dsar": "^"}

    def series(v, key):
        pts = sorted((r["P"], r[key]) for r in recs if r["variant"] == v)
        return [x for x, _ in pts], [y for _, y in pts]

    pfine = np.linspace(min(ps), max(ps), 100)
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5))
    for ax, direction in ((axes[0][0], "sent"), (axes[0][1], "received")):
        ax.fill_between(pfine, 2 * k * (pfine - 1) / pfine, 6 * k * (pfine - 1) / pfine,
                        color="tab:green", alpha=0.12)
        ax.plot(pfine, 2 * k * (pfine - 1) / pfine, color="tab:green", ls="--",
                label="2k(P-1)/P (lower bound)")
        ax.plot(pfine, 6 * k * (pfine - 1) / pfine, color="tab:green", ls="-.",
                label="6k(P-1)/P (Ok-Topk upper bound)")
        ax.plot(pfine, 2 * k * (pfine - 1), color="tab:blue", ls=":", lw=1,
                label="2k(P-1) (TopkA model)")
        for v in VARIANTS:
            x, mean = series(v, f"words_{direction}_mean")
            _, mx = series(v, f"words_{direction}_max")
            if not x:
                continue
            ax.plot(x, mean, color=color[v], marker=marker[v], label=f"{LABELS[v]}: mean")
            ax.plot(x, mx, color=color[v], marker=marker[v], mfc="none", ls="none", ms=10,
                    label=None)
        ax.plot([], [], color="k", marker="o", mfc="none", ls="none", ms=10,
                label="hollow marker: max over ranks")
        ax.set_yscale("log")
        ax.set_xticks(ps)
        ax.set(xlabel="P (ranks)", ylabel=f"words {direction} per rank per call (1 word = 4 B)",
               title=f"words {direction} per rank, N={fmt_size(data['N'])}, k={k} "
                     f"({data['density']:.1%}); control traffic included")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7.5, loc="upper left")

    # Ok-Topk's volume broken down, in units of k(P-1)/P words (the bounds are 2 and 6).
    ax = axes[1][0]
    width = 0.38
    for j, (v, hatch) in enumerate((("oktopk", ""), ("oktopk_reuse", "//"))):
        rows = sorted((r for r in recs if r["variant"] == v), key=lambda r: r["P"])
        x = np.array([r["P"] for r in rows], float) + (j - 0.5) * width
        unit = np.array([r["k"] * (r["P"] - 1) / r["P"] for r in rows])

        def mean_part(key, rows=rows):
            return np.array([statistics.fmean(pp[key] for pp in r["payload_parts_bytes"]) / WORD
                             for r in rows])
        split = mean_part("split_received")
        gath = mean_part("allgatherv_received")
        bal = np.array([statistics.fmean(r["balancing_words_received"]) for r in rows])
        thr = np.array([r["control_parts_bytes"].get("threshold", 0) / WORD for r in rows])
        other = np.array([r["control_words"][0] for r in rows]) - thr
        bottom = np.zeros(len(rows))
        for vals, lab, col in ((split, "split and reduce (entries)", "tab:red"),
                               (gath, "allgatherv (entries)", "tab:orange"),
                               (bal, "balancing (entries)", "tab:purple"),
                               (thr, "radix-select threshold (3 allreduces)", "tab:cyan"),
                               (other, "header + sizes + boundaries", "tab:gray")):
            ax.bar(x, vals / unit, width, bottom=bottom, color=col, hatch=hatch,
                   edgecolor="k", lw=0.5, label=lab if j == 0 else None)
            bottom += vals / unit
    ax.axhline(2, color="tab:green", ls="--", label="2k(P-1)/P")
    ax.axhline(6, color="tab:green", ls="-.", label="6k(P-1)/P")
    from matplotlib.patches import Patch
    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(facecolor="w", edgecolor="k", label="left bar: exact threshold + balanced regions"),
                Patch(facecolor="w", edgecolor="k", hatch="//",
                      label="right bar (hatched): reused threshold + regions (steady state)")]
    ax.set_xticks(ps)
    ax.set(xlabel="P (ranks)",
           ylabel="words received per rank, mean over ranks, in units of k(P-1)/P",
           title="Ok-Topk: what a rank receives, by phase (control traffic included)")
    ax.set_ylim(0, 8.5)
    ax.legend(handles=handles, fontsize=7.5, loc="upper center", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1][1]
    for v in VARIANTS:
        pts = sorted((r["P"], r["median_s"], r["min_s"]) for r in recs if r["variant"] == v)
        if not pts:
            continue
        ax.plot([q[0] for q in pts], [q[1] * 1e3 for q in pts], color=color[v], marker=marker[v],
                label=LABELS[v])
        ax.plot([q[0] for q in pts], [q[2] * 1e3 for q in pts], color=color[v], marker=marker[v],
                mfc="none", ls=":", lw=0.8)
    shade_oversubscribed(ax, ps, data["machine"]["cpu_count"])
    ax.set_yscale("log")
    ax.set_xticks(ps)
    ax.set(xlabel="P (ranks)", ylabel="ms per call (median of max over ranks; dotted: min)",
           title="time per call (shared memory, one host; indicative only)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5)
    info = data["machine"]
    save_figure(fig, path, "jss.oktopk_allreduce vs TopkA and DSAR: bytes per rank from the C++ "
                f"counters; MPICH shared memory, {machine_line(info)}", dpi=100)


def sweep(args) -> int:
    def run():
        t0 = time.monotonic()
        frags = [run_one(p, args) for p in args.procs]
        ok = [f for f in frags if f.get("records")]
        if not ok:
            return None
        return {
            "benchmark": "oktopk_volume",
            "note": NOTE,
            "N": ok[0]["N"], "k": ok[0]["k"], "density": args.density, "layers": args.layers,
            "noise": args.noise, "seed": args.seed, "repeats": args.repeats, "warmup": args.warmup,
            "procs": args.procs,
            "workload": ("per rank: layer scale * (shared Student-t(3) signal + noise * own "
                         "Student-t(3)); exact local top-k (jss.topk); every variant on the "
                         "same (values, indices)"),
            "units": "1 word = 4 bytes; one COO entry (int32 index, float32 value) = 2 words",
            "timing": ("per round: barrier, one jitted call per rank, time = max over ranks; "
                       "variants interleaved; median and min over rounds"),
            "inputs": {str(f["P"]): f["inputs"] for f in ok},
            "balanced_boundaries": {str(f["P"]): f["balanced_boundaries"] for f in ok},
            **sweep_fields(frags),
            "total_wall_s": round(time.monotonic() - t0, 1),
            "loadavg_1min": {str(f["P"]): f.get("loadavg_1min") for f in ok},
            "records": [r for f in ok for r in f["records"]],
        }
    return record_or_replot(args, run, print_table, plot)


def main(argv=None) -> int:
    ap = parser(__doc__, procs=[2, 3, 4, 5, 6, 7, 8])
    ap.add_argument("--size", default="1M", help="dense size N (K/M suffix); default 1M")
    ap.add_argument("--density", type=float, default=0.01, help="k = density * N (default 0.01)")
    ap.add_argument("--layers", type=int, default=16, help="layers of different scale (default 16)")
    ap.add_argument("--noise", type=float, default=1.0,
                    help="per-rank noise relative to the shared signal (default 1.0)")
    add_timing_options(ap, repeats=7, minimum=1)
    add_launch_options(ap, timeout=150)
    add_record_options(ap, RESULTS / "oktopk_volume.json")
    return driver_or_worker(ap.parse_args(argv), sweep, worker)


if __name__ == "__main__":
    sys.exit(main())
