"""Compression benchmark: block scan and QSGD against XLA and the bandwidth floor.

Times, side by side on float32 inputs of N entries, all jitted and warmed up, the
repeats interleaved: ours (``block_scan_sparse`` / ``block_scan_dense``:
``jax_sparse_sync.bindings.block_scan.block_scan(x, 256)`` on an x with 1 % of its
blocks nonzero / on a dense x; ``qsgd_quantize`` at 4 bits, bucket 1024, and
``qsgd_dequantize``), the same work in jnp (``xla_*``), and the floors ``elementwise``
(``jnp.abs(x) * 2``) and ``read_pass`` (``jnp.max(jnp.abs(x))``). Correctness is
asserted on every size before timing.

  python benchmarks/compression.py                   # 1M 4M 16M 64M
  python benchmarks/compression.py --quick           # 1M 4M, 3 repeats
  python benchmarks/compression.py --plot-only       # redraw from the JSON

Writes ``benchmarks/results/compression_<backend>[_quick].{json,png}`` (results:
benchmarks/README.md).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from _harness import (add_quiet_options, add_record_options, cpu_busy, fmt_size,
                      kernel_bench_start, loadavg, parse_size, parser, print_header, pyplot,
                      record_or_replot, save_kernel_figure, time_per_call, wait_for_quiet)

RESULTS = Path(__file__).resolve().parent / "results"
BLOCK = 256
BITS = 4
BUCKET = 1024
OURS = ["block_scan_sparse", "block_scan_dense", "qsgd_quantize", "qsgd_dequantize"]
PAIRS = {  # ours -> XLA's version of the same work
    "block_scan_sparse": "xla_block_scan_sparse", "block_scan_dense": "xla_block_scan_dense",
    "qsgd_quantize": "xla_qsgd_quantize", "qsgd_dequantize": "xla_qsgd_dequantize",
}


def xla_qsgd_quantize(x, key):
    """4-bit QSGD in jnp: per-bucket scale, stochastic rounding, codes packed in pairs."""
    import jax
    import jax.numpy as jnp

    s = 2 ** (BITS - 1) - 1
    xb = x.reshape(-1, BUCKET)
    scale = jnp.max(jnp.abs(xb), axis=1, keepdims=True)
    r = jnp.abs(xb) * jnp.where(scale > 0, s / scale, 0.0)
    level = jnp.floor(r)
    level = level + (jax.random.uniform(key, xb.shape) < r - level)
    code = (level.astype(jnp.uint8) | jnp.where((xb < 0) & (level > 0), 8, 0).astype(jnp.uint8))
    code = code.reshape(-1, 2)
    return code[:, 0] | (code[:, 1] << 4), scale[:, 0]


def xla_qsgd_dequantize(packed, scales):
    import jax.numpy as jnp

    s = 2 ** (BITS - 1) - 1
    code = jnp.stack([packed & 15, packed >> 4], axis=1).reshape(-1, BUCKET)
    mag = (code & 7).astype(jnp.float32) * (scales[:, None] / s)
    return jnp.where(code & 8, -mag, mag).reshape(-1)


def build_methods(n: int, seed: int):
    import jax
    import jax.numpy as jnp

    import jax_sparse_sync as jss
    from jax_sparse_sync.bindings.block_scan import block_scan

    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k1, (n,), jnp.float32)
    nonzero_blocks = jax.random.uniform(k2, (n // BLOCK, 1)) < 0.01
    x_sparse = jnp.where(nonzero_blocks, x.reshape(-1, BLOCK), 0.0).reshape(-1)
    x, x_sparse = jax.block_until_ready((x, x_sparse))
    packed, scales = jax.block_until_ready(jss.qsgd_quantize(x, bits=BITS, bucket=BUCKET))
    xla_packed, xla_scales = jax.block_until_ready(jax.jit(xla_qsgd_quantize)(x, k3))

    scan = jax.jit(lambda v: block_scan(v, BLOCK))
    xla_scan = jax.jit(lambda v: jnp.any(v.reshape(-1, BLOCK) != 0, axis=1))
    quantize = jax.jit(lambda v: jss.qsgd_quantize(v, bits=BITS, bucket=BUCKET))
    dequantize = jax.jit(lambda p, s: jss.qsgd_dequantize(p, s, size=n, bits=BITS, bucket=BUCKET))
    xla_quantize = jax.jit(xla_qsgd_quantize)
    xla_dequantize = jax.jit(xla_qsgd_dequantize)
    elementwise = jax.jit(lambda v: jnp.abs(v) * 2)
    read_pass = jax.jit(lambda v: jnp.max(jnp.abs(v)))
    calls = {
        "block_scan_sparse": lambda: scan(x_sparse),
        "block_scan_dense": lambda: scan(x),
        "qsgd_quantize": lambda: quantize(x),
        "qsgd_dequantize": lambda: dequantize(packed, scales),
        "xla_block_scan_sparse": lambda: xla_scan(x_sparse),
        "xla_block_scan_dense": lambda: xla_scan(x),
        "xla_qsgd_quantize": lambda: xla_quantize(x, k3),
        "xla_qsgd_dequantize": lambda: xla_dequantize(xla_packed, xla_scales),
        "elementwise": lambda: elementwise(x),
        "read_pass": lambda: read_pass(x),
    }
    return calls, {"x": x, "x_sparse": x_sparse, "packed": packed, "scales": scales,
                   "xla_packed": xla_packed, "xla_scales": xla_scales}


def check_correct(calls: dict, ctx: dict) -> dict:
    """Asserts our kernels' results before timing (and XLA's, which we compare with)."""
    import numpy as np

    x = np.asarray(ctx["x"])
    for name in ("sparse", "dense"):
        ours = np.asarray(calls[f"block_scan_{name}"]())
        xla = np.asarray(calls[f"xla_block_scan_{name}"]())
        np.testing.assert_array_equal(ours.astype(bool), xla)
    step = np.repeat(np.abs(x).reshape(-1, BUCKET).max(axis=1) / (2 ** (BITS - 1) - 1), BUCKET)
    for name in ("qsgd_dequantize", "xla_qsgd_dequantize"):
        err = np.abs(np.asarray(calls[name]()) - x)
        assert np.all(err <= step * 1.0001), f"{name}: an entry is more than one step off"
    return {"block_masks_equal_xla": True, "qsgd_within_one_step": True,
            "nonzero_blocks": int(np.asarray(calls["block_scan_sparse"]()).sum())}


def run(sizes, repeats: int, seed: int, quiet_wait_s: float,
        calls_per_sample: int | None = None) -> dict:
    import jax

    info, calls_per_sample = kernel_bench_start("compression", calls_per_sample)
    records, checks = [], []
    for n in sizes:
        calls, ctx = build_methods(n, seed)
        for f in calls.values():
            jax.block_until_ready(f())
        checks.append({"N": n, **check_correct(calls, ctx)})
        busy, waited = wait_for_quiet(quiet_wait_s) if quiet_wait_s else (cpu_busy(0.5), 0.0)
        load = loadavg()
        times = {m: [] for m in calls}
        for _ in range(repeats):
            for name, f in calls.items():
                times[name].append(time_per_call(f, calls_per_sample))
        for name, ts in times.items():
            med = statistics.median(ts)
            records.append({"N": n, "method": name, "kind": "ours" if name in OURS else "baseline",
                            "median_s": med, "min_s": min(ts), "times_s": ts,
                            "input_GBps": 4 * n / med / 1e9, "cpu_busy_before": busy,
                            "quiet_waited_s": waited, "loadavg_1min_before": load})
        print(f"N={fmt_size(n):>4}: " + " ".join(
            f"{m}={statistics.median(t) * 1e3:.2f}ms" for m, t in times.items())
            + f"  [busy {busy}, waited {waited}s]", flush=True)
        del calls, ctx
    return {"benchmark": "compression",
            "description": f"block_scan (block {BLOCK}) and QSGD ({BITS} bits, bucket {BUCKET}) "
                           f"vs the same work in jnp and the bandwidth floors, float32, jitted; "
                           f"median of {repeats} interleaved repeats, each {calls_per_sample} "
                           "call(s) queued back to back, per call",
            "machine": info, "repeats": repeats, "seed": seed, "block": BLOCK, "bits": BITS,
            "bucket": BUCKET, "calls_per_sample": calls_per_sample, "correctness": checks,
            "records": records}


def summary_rows(data: dict):
    rows = []
    for n in sorted({r["N"] for r in data["records"]}):
        med = {r["method"]: r["median_s"] for r in data["records"] if r["N"] == n}
        row = {"N": n, **{f"{m}_ms": t * 1e3 for m, t in med.items()}}
        for ours, xla in PAIRS.items():
            row[f"{xla}_over_{ours}"] = med[xla] / med[ours]
            row[f"{ours}_over_elementwise"] = med[ours] / med["elementwise"]
        rows.append(row)
    return rows


def print_table(data: dict) -> None:
    print(f"\nmedian ms per call ({data['machine']['device']}); x = XLA's time / ours, "
          "e = ours / elementwise pass")
    print_header(f"{'N':>5} | " + " ".join(f"{m:>26}" for m in OURS)
                 + f" | {'elemwise':>8} {'read':>6}")
    for r in summary_rows(data):
        cells = [f"{r[m + '_ms']:8.2f} x{r[PAIRS[m] + '_over_' + m]:5.1f} "
                 f"e{r[m + '_over_elementwise']:5.2f}" for m in OURS]
        print(f"{fmt_size(r['N']):>5} | " + " ".join(f"{c:>26}" for c in cells)
              + f" | {r['elementwise_ms']:8.2f} {r['read_pass_ms']:6.2f}")


def plot(data: dict, path: Path) -> None:
    plt = pyplot()

    recs = data["records"]
    colors = {"block_scan_sparse": "tab:green", "block_scan_dense": "tab:olive",
              "qsgd_quantize": "tab:red", "qsgd_dequantize": "tab:purple"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    for ax, group in zip(axes, (("block_scan_sparse", "block_scan_dense"),
                                ("qsgd_quantize", "qsgd_dequantize"))):
        for m in group + tuple(PAIRS[g] for g in group) + ("elementwise", "read_pass"):
            pts = sorted((r["N"], r["median_s"]) for r in recs if r["method"] == m)
            if m in colors:
                style = dict(color=colors[m], marker="o", lw=2)
            elif m.startswith("xla_"):
                style = dict(color=colors[m[4:]], marker="s", ls="--", alpha=0.7)
            else:
                style = dict(color="gray" if m == "elementwise" else "black", marker="x", ls=":")
            ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], label=m, **style)
        ns = sorted({r["N"] for r in recs})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns)
        ax.set_xticklabels([fmt_size(n) for n in ns])
        ax.set_xlabel("N (float32 entries)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, title="solid: ours, dashed: jnp/XLA, dotted: floors",
                  title_fontsize=7)
    axes[0].set_title(f"block scan (block {data['block']}; sparse = 1% of blocks nonzero)")
    axes[1].set_title(f"QSGD ({data['bits']} bits, bucket {data['bucket']})")
    axes[0].set_ylabel("time per call, ms (median)")
    save_kernel_figure(fig, path, "Compression kernels vs XLA", data["machine"])


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--sizes", nargs="+", default=None, help="default 1M 4M 16M 64M")
    p.add_argument("--repeats", type=int, default=None, help="default 7 (3 with --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="1M 4M, 3 repeats")
    p.add_argument("--calls-per-sample", type=int, default=None,
                   help="calls queued per timed sample (default 1 on CPU, 20 on GPU)")
    add_quiet_options(p, busy=False)
    add_record_options(p, None)  # default results/compression_<backend>[_quick].json
    args = p.parse_args(argv)
    if args.out is None:
        import jax

        suffix = "_quick" if args.quick else ""
        args.out = RESULTS / f"compression_{jax.default_backend()}{suffix}.json"

    def measure():
        sizes = args.sizes or (["1M", "4M"] if args.quick else ["1M", "4M", "16M", "64M"])
        data = run([parse_size(s) for s in sizes], args.repeats or (3 if args.quick else 7),
                   args.seed, args.quiet_wait, args.calls_per_sample)
        data["summary"] = summary_rows(data)
        return data
    return record_or_replot(args, measure, print_table, plot)


if __name__ == "__main__":
    sys.exit(main())
