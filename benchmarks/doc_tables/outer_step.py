"""benchmarks/outer_step.py's records: DiLoCo's outer step on slow links, the outer-optimizer sweep."""

from __future__ import annotations

from .common import Table, fill, md_table, measured_at, met, pct, trained_at

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


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("outer_step_sweep", "docs/topics/slow_links.md", (OUTER_SWEEP,), outer_sweep),
    Table("outer_step_intro", "docs/topics/slow_links.md", OUTER_MAIN, outer_intro),
    Table("outer_step_modes", "docs/topics/slow_links.md", OUTER_MAIN, outer_modes),
    Table("outer_step_times", "docs/topics/slow_links.md", OUTER_MAIN, outer_times),
    Table("outer_step_goals", "docs/topics/slow_links.md", OUTER_MAIN, outer_goals),
    Table("outer_step_h5", "docs/topics/slow_links.md", OUTER_MAIN + OUTER_H5, outer_h5),
    Table("outer_step_fastest", "docs/topics/slow_links.md", OUTER_MAIN + OUTER_H5, outer_fastest),
)
