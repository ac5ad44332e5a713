"""The allreduce alone: SparCML's Figure 3, shared memory, Ok-Topk's volume, the host and dense paths."""

from __future__ import annotations

from .common import Table, ceil2, fill, md_table, measured_at, pct, span

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


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("allreduce_shm", "benchmarks/README.md", ("allreduce_shm.json",), allreduce_shm),
    Table("oktopk_volume", "benchmarks/README.md", ("oktopk_volume.json",), oktopk_volume),
    Table("dense_allreduce_shm", "docs/topics/dense_sync.md", ("dense_allreduce_shm.json",),
          dense_allreduce_shm),
    Table("sparse_allreduce_host", "docs/performance.md", ("sparse_allreduce_host_shm.json",),
          sparse_allreduce_host),
    Table("sparcml_fig3", "benchmarks/README.md",
          tuple(dict.fromkeys(r for _, r in FIG3_ROWS)), sparcml_fig3),
)
