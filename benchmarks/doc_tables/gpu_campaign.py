"""The GPU campaign's records: selection, the step on GPU arrays, the hosts' cores."""

from __future__ import annotations

import statistics

from .common import Table, fill, md_table, met, selection_entry, short_commit, size_label, span

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


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("selection_gpu", "docs/topics/gpu_campaign.md", (GPU_SELECTION,), selection_gpu),
    Table("gpu_step_lm", "docs/topics/gpu_campaign.md", (GPU_STEP_LM,), gpu_step_lm),
    Table("gpu_step_mlp", "docs/topics/gpu_campaign.md", GPU_STEP_MLP, gpu_step_mlp),
    Table("host_campaign", "docs/topics/gpu_campaign.md", HOST_CAMPAIGN, host_campaign),
)
