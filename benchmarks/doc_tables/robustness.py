"""Reliability: injected faults, the watchdog's cost, the fuzz runs."""

from __future__ import annotations

import statistics

from .common import Table, fill, md_table, measured_at

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


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("reliability", "docs/topics/reliability.md", ("reliability.json",), reliability),
    Table("watchdog_cost", "docs/topics/reliability.md", ("watchdog_cpu.json",), watchdog_cost),
    Table("fuzz_runs", "docs/topics/test_suite.md", ("fuzz_runs.json",), fuzz_runs),
)
