"""benchmarks/selection.py and compression.py on the CPU."""

from __future__ import annotations

from .common import M, Table, md_table, measured_at, selection_entry

def median_ms(records: list[dict], method: str, n: int, density=None):
    r = selection_entry(records, method, n, density)
    return None if r is None else r["median_s"] * 1e3


def ms(v) -> str:
    return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.0f}")


def quiet_phrase(data: dict) -> str:
    """Where the record was measured and how busy the CPUs were just before each point."""
    rs = data["records"]
    busy = [r["cpu_busy_before"] for r in rs if r.get("cpu_busy_before") is not None]
    loads = [r["loadavg_1min_before"] for r in rs if r.get("loadavg_1min_before") is not None]
    return (f"measured {measured_at(data)} with the CPUs {100 * min(busy):.1f}-"
            f"{100 * max(busy):.1f} % busy in the second before each point (1-min load average "
            f"{min(loads):.1f}-{max(loads):.1f}, decaying from the job before)")


def selection_cpu(recs: dict) -> str:
    data = recs["selection_cpu.json"]
    rs, rows = data["records"], []
    for n, d in ((M, .01), (4 * M, .01), (16 * M, .01), (64 * M, .01), (16 * M, .001), (64 * M, .001)):
        t, th, lax, el = (median_ms(rs, m, n, d) for m in ("topk", "threshold_select", "lax.top_k",
                                                            "elementwise"))
        rows.append([f"{n // M}M", f"{d * 100:g} %", ms(t), ms(th), ms(lax), ms(el),
                     f"{lax / t:.1f}x", f"{th / el:.2f}"])
    read = [median_ms(rs, "threshold_select", n, d) / median_ms(rs, "read_pass", n, d)
            for n in (16 * M, 64 * M) for d in (.01, .001)]
    return "\n".join([
        "**Result**, CPU (`benchmarks/results/selection_cpu.json`, plot",
        f"`benchmarks/results/selection_cpu.png`; {quiet_phrase(data)}; median ms):", "",
        md_table(["N", "density", "`topk`", "`threshold_select`", "`lax.top_k`", "elementwise",
                  "`lax.top_k` / `topk`", "`threshold_select` / elementwise"], rows), "",
        "From 16M on the elementwise pass page-faults its fresh output buffer on every",
        f"call; `threshold_select` runs at {min(read):.2f}-{max(read):.2f}x the read-only pass there."])


def selection_reuse(recs: dict) -> str:
    rs, rows = recs["selection_cpu.json"]["records"], []
    for n, d in ((4 * M, .01), (16 * M, .01), (64 * M, .01), (64 * M, .001)):
        rows.append([f"{n // M}M, {d * 100:g} %"] + [f"{median_ms(rs, m, n, d):.2f}" for m in (
            "topk", "threshold_select", "reuse_within", "reuse_overflow", "reuse_beyond_list")])
    return md_table(["N, density", "`topk`", "`threshold_select`", "1.5 k pass",
                     "3 k (from the list)", "6 k (full selection)"], rows)


def compression_cpu(recs: dict) -> str:
    data = recs["compression_cpu.json"]
    rs, rows = data["records"], []
    for n in (M, 4 * M, 16 * M, 64 * M):
        cells = []
        for m in ("block_scan_sparse", "block_scan_dense", "qsgd_quantize", "qsgd_dequantize"):
            ours, xla = median_ms(rs, m, n), median_ms(rs, "xla_" + m, n)
            cells.append(f"{ours:.2f} ({xla / ours:.1f}x)")
        rows.append([f"{n // M}M", *cells, f"{median_ms(rs, 'elementwise', n):.2f}"])
    return "\n".join([
        "**Result** (`benchmarks/results/compression_cpu.json`, plot",
        f"`benchmarks/results/compression_cpu.png`; {quiet_phrase(data)}; ms, then XLA's time / ours):",
        "", md_table(["N", "block scan, sparse", "block scan, dense", "QSGD quantize",
                      "QSGD dequantize", "elementwise pass"], rows)])


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("selection_cpu", "benchmarks/README.md", ("selection_cpu.json",), selection_cpu),
    Table("selection_cpu_reuse", "benchmarks/README.md", ("selection_cpu.json",), selection_reuse),
    Table("compression_cpu", "benchmarks/README.md", ("compression_cpu.json",), compression_cpu),
)
