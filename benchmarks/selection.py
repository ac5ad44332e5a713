"""Selection benchmark: every selection and sparse-update kernel against XLA.

Times, side by side on the same float32 random-normal input of N entries with
``k = round(density * N)``, all jitted and warmed up (:func:`build_methods`): ours
(``topk``, ``threshold_select``, ``kth_exact``, ``kth_sampled``, ``bucket_topk``,
``residual_update``, ``scatter_add``, and ``select_local(policy="threshold_reuse")`` with
1.5 k, 3 k and 6 k entries over the threshold: ``reuse_within``, ``reuse_overflow``,
``reuse_beyond_list``) and XLA's (``lax.top_k``, ``approx_max_k``, ``xla_scatter_set``,
``xla_scatter_add``, and the bandwidth floors ``elementwise`` and ``read_pass``). The
repeats are interleaved; medians (and mins) are reported; above ``--lax-full-max`` the
XLA top-k get ``--lax-repeats`` repeats. Correctness is asserted on every point before
timing. Runs on any JAX backend; a kernel without an implementation there is recorded
as unavailable.

  python benchmarks/selection.py                       # 1M 4M 16M 64M x 0.1%, 1%
  python benchmarks/selection.py --quick               # 1M 4M x 1%, 3 repeats (a smoke run)
  python benchmarks/selection.py --large               # also 256M (for a GPU)
  python benchmarks/selection.py --plot-only           # redraw table and PNG from the JSON

Writes ``benchmarks/results/selection_*.{json,png}`` (results: benchmarks/README.md).
"""

from __future__ import annotations

import resource
import statistics
import sys
from pathlib import Path

from _harness import (add_quiet_options, add_record_options, add_timing_options, cpu_busy,
                      fmt_size, kernel_bench_start, loadavg, parse_size, parser, print_header,
                      pyplot, record_or_replot, save_kernel_figure, time_per_call, wait_for_quiet)

RESULTS = Path(__file__).resolve().parent / "results"

OURS = ["topk", "threshold_select", "kth_exact", "kth_sampled", "bucket_topk",
        "residual_update", "scatter_add", "reuse_within", "reuse_overflow", "reuse_beyond_list"]
#: the threshold-reuse selections: how many k pass their threshold (capacity 2 k, the
#: overflow list OVERFLOW_LIST_FACTOR = 4 k)
REUSE_PASSING = {"reuse_within": 1.5, "reuse_overflow": 3.0, "reuse_beyond_list": 6.0}
REUSE_CAPACITY = 2
BASELINES = ["lax.top_k", "approx_max_k", "xla_scatter_set", "xla_scatter_add", "elementwise",
             "read_pass"]
SLOW_BASELINES = ("lax.top_k", "approx_max_k")
BUCKET = 512
SAMPLE_STRIDE = 64


class Chained:
    """A jitted function whose first argument is donated: every call feeds the
    previous output back in, so the update really happens in place."""

    def __init__(self, fn, state, *args):
        import jax

        self.fn = jax.jit(fn, donate_argnums=0)
        self.state = jax.block_until_ready(jax.numpy.array(state, copy=True))
        self.args = args

    def __call__(self, x=None):
        self.state = self.fn(self.state, *self.args)
        return self.state


def build_methods(x, k: int, density: float):
    import jax
    import jax.numpy as jnp

    import jax_sparse_sync as jss

    kb = max(1, int(round(density * BUCKET)))
    # the inputs of the threshold selection and the updates: the exact answers
    try:
        threshold = jax.block_until_ready(jss.kth_magnitude(x, k))
        _, idx = jax.block_until_ready(jss.topk(x, k))
    except Exception:  # noqa: BLE001 - no kernel on this backend: ask XLA (slower)
        top, idx = jax.lax.top_k(jnp.abs(x), k)
        threshold, idx = top[-1], jnp.sort(idx).astype(jnp.int32)
    values = jnp.ones((k,), x.dtype)
    from jax_sparse_sync.transforms.selection_policy import select_local
    n = x.shape[0]

    def kth(m):  # the m-th magnitude: round(m) entries pass it
        try:
            return jss.kth_magnitude(x, m)
        except Exception:  # noqa: BLE001 - no kernel on this backend: ask XLA
            return jax.lax.top_k(jnp.abs(x), m)[0][-1]
    reuse_t = {name: kth(int(round(m * k)))
               for name, m in REUSE_PASSING.items() if int(round(m * k)) <= n}

    def reuse(x, t):  # a reuse step (step 1 of tau 32), as oktopk_sync's
        return select_local(x, k=k, policy="threshold_reuse", threshold=t,
                            step=jnp.int32(1), tau=32, capacity=min(n, REUSE_CAPACITY * k))
    methods = {
        "topk": jax.jit(lambda x: jss.topk(x, k)),
        "threshold_select": jax.jit(lambda x, t: jss.threshold_select(x, t, 2 * k)),
        "kth_exact": jax.jit(lambda x: jss.kth_magnitude(x, k)),
        "kth_sampled": jax.jit(lambda x: jss.estimate_threshold(x, k, "sampled",
                                                               sample_stride=SAMPLE_STRIDE)),
        "bucket_topk": jax.jit(lambda x: jss.bucket_topk(x, kb, BUCKET)),
        "residual_update": Chained(jss.residual_update, x, idx),
        "scatter_add": Chained(jss.scatter_add, x, values, idx),
        "lax.top_k": jax.jit(lambda x: jax.lax.top_k(jnp.abs(x), k)),
        "approx_max_k": jax.jit(lambda x: jax.lax.approx_max_k(jnp.abs(x), k)),
        "xla_scatter_set": Chained(lambda a, i: a.at[i].set(0, unique_indices=True), x, idx),
        "xla_scatter_add": Chained(lambda a, v, i: a.at[i].add(v), x, values, idx),
        "elementwise": jax.jit(lambda x: jnp.abs(x) * 2),
        "read_pass": jax.jit(lambda x: jnp.max(jnp.abs(x))),
    }
    thresholds = {"threshold_select": threshold}
    for name, t in reuse_t.items():
        methods[name], thresholds[name] = jax.jit(reuse), t
    calls = {name: ((lambda f=f, t=thresholds[name]: f(x, t)) if name in thresholds
                    else (lambda f=f: f(x))) for name, f in methods.items()}
    return calls, {"threshold": threshold, "idx": idx, "values": values, "k_per_bucket": kb,
                   "reuse_thresholds": reuse_t}


def check_correct(x, k: int, ctx: dict, outs: dict) -> dict:
    """Asserts that our kernels agree with XLA on this input (before timing)."""
    import jax.numpy as jnp
    import numpy as np

    import jax_sparse_sync as jss

    checked = {}
    x_np = np.asarray(x)
    if "topk" in outs and "lax.top_k" in outs:
        v, i = (np.asarray(a) for a in outs["topk"])
        assert v.shape == (k,) and np.all(np.diff(i) > 0)
        np.testing.assert_array_equal(x_np[i], v)
        np.testing.assert_array_equal(np.sort(np.abs(v))[::-1], np.asarray(outs["lax.top_k"][0]))
        checked["topk_equals_lax_top_k"] = True
    if "threshold_select" in outs and "topk" in outs:
        _, ti, count = (np.asarray(a) for a in outs["threshold_select"])
        assert int(count) >= k
        if int(count) == k:  # no ties at the k-th magnitude: the same set
            np.testing.assert_array_equal(ti[:k], np.asarray(outs["topk"][1]))
        checked["threshold_select_count"] = int(count)
    for name, passing in REUSE_PASSING.items():
        if name in outs and "topk" in outs:
            sel = outs[name]
            t = float(ctx["reuse_thresholds"][name])
            passed = int(np.count_nonzero(np.abs(x_np) >= t))
            assert passed >= round(passing * k), name
            count, idx = int(sel.count), np.asarray(sel.indices)
            if passed <= REUSE_CAPACITY * k:  # the list itself: every entry passed
                assert count == passed and not bool(sel.exact), name
                assert np.all(np.diff(idx[:count]) > 0) and np.all(np.abs(x_np[idx[:count]]) >= t)
            else:  # an overflow: the exact top-k, bit for bit
                assert count == k and bool(sel.exact), name
                np.testing.assert_array_equal(idx[:k], np.asarray(outs["topk"][1]))
            checked[f"{name}_checked"] = True
    if "kth_exact" in outs and "lax.top_k" in outs:
        assert float(outs["kth_exact"]) == float(np.asarray(outs["lax.top_k"][0])[-1])
        checked["kth_exact_equals_lax"] = True
    if "kth_sampled" in outs:
        kept = int(np.count_nonzero(np.abs(x_np) >= float(outs["kth_sampled"])))
        checked["kth_sampled_kept_over_k"] = kept / k
    if "approx_max_k" in outs and "lax.top_k" in outs:
        approx_idx = np.asarray(outs["approx_max_k"][1])
        checked["approx_max_k_recall"] = len(np.intersect1d(approx_idx, np.asarray(outs["lax.top_k"][1]))) / k
    try:  # one un-donated call of each update against XLA's scatter
        idx, values = ctx["idx"], ctx["values"]
        ours = np.asarray(jss.residual_update(x, idx))
        xla = np.asarray(jnp.asarray(x).at[idx].set(0))
        np.testing.assert_array_equal(ours.view(np.uint32), xla.view(np.uint32))
        ours = np.asarray(jss.scatter_add(x, values, idx))
        xla = np.asarray(jnp.asarray(x).at[idx].add(values))
        np.testing.assert_array_equal(ours.view(np.uint32), xla.view(np.uint32))
        checked["updates_equal_xla_scatter"] = True
    except Exception as e:  # noqa: BLE001 - a backend without the kernels
        checked["updates_equal_xla_scatter"] = f"not run: {type(e).__name__}"
    return checked


def run(sizes, densities, repeats: int, warmup: int, seed: int, lax_full_max: int,
        lax_repeats: int, quiet_wait_s: float = 0.0, quiet_busy: float = 0.25,
        calls_per_sample: int | None = None) -> dict:
    import jax
    import jax.numpy as jnp

    info, calls_per_sample = kernel_bench_start("selection", calls_per_sample)
    records, checks, unavailable = [], [], {}
    key = jax.random.key(seed)
    for n in sizes:
        key, sub = jax.random.split(key)
        x = jax.block_until_ready(jax.random.normal(sub, (n,), jnp.float32))
        for density in densities:
            k = max(1, int(round(n * density)))
            calls, ctx = build_methods(x, k, density)
            outs = {}
            for name, f in list(calls.items()):
                try:
                    for _ in range(warmup):
                        outs[name] = jax.block_until_ready(f())
                except Exception as e:  # noqa: BLE001 - e.g. no kernel for this backend
                    unavailable[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    del calls[name]
                    outs.pop(name, None)
            # the chained updates' outputs are their own state: keep the first result only
            chk = check_correct(x, k, ctx, {m: o for m, o in outs.items()
                                            if m not in ("residual_update", "scatter_add",
                                                         "xla_scatter_set", "xla_scatter_add")})
            checks.append({"N": n, "k": k, "density": density, **chk})
            del outs
            busy_before, waited = (wait_for_quiet(quiet_wait_s, quiet_busy) if quiet_wait_s
                                   else (cpu_busy(0.5), 0.0))
            load_before = loadavg()
            reps = {m: (lax_repeats if m in SLOW_BASELINES and n > lax_full_max else repeats)
                    for m in calls}
            times = {m: [] for m in calls}
            faults = {m: [] for m in calls}
            for r in range(repeats):
                for name, f in calls.items():
                    if r >= reps[name]:
                        continue
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    times[name].append(time_per_call(f, calls_per_sample))
                    faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            load_after = loadavg()
            for name, ts in times.items():
                med = statistics.median(ts)
                records.append({
                    "N": n, "k": k, "density": density, "method": name,
                    "kind": "ours" if name in OURS else "baseline",
                    "median_s": med, "min_s": min(ts), "times_s": ts,
                    "minor_faults_per_call": statistics.median(faults[name]),
                    # input bytes / time: the effective read bandwidth of a pass over x
                    "input_GBps": 4 * n / med / 1e9,
                    "loadavg_1min_before": load_before, "loadavg_1min_after": load_after,
                    "cpu_busy_before": busy_before, "quiet_waited_s": waited,
                })
            r = {name: statistics.median(ts) for name, ts in times.items()}
            print(f"N={fmt_size(n):>4} k={k:>8} ({density:.1%}): "
                  + " ".join(f"{m}={t * 1e3:.2f}ms" for m, t in r.items())
                  + f"  [busy {busy_before}, waited {waited}s, load {load_before}->{load_after}]",
                  flush=True)
            del calls, ctx
        del x
    return {
        "benchmark": "selection",
        "description": "selection and sparse-update kernels vs XLA on float32 random normal, "
                       f"jitted; median of {repeats} interleaved repeats after {warmup} warm-up "
                       f"call(s); lax.top_k/approx_max_k: {lax_repeats} repeats above "
                       f"N={fmt_size(lax_full_max)}; each sample is {calls_per_sample} call(s) "
                       "queued back to back, timed to the last one's completion, per call",
        "machine": info,
        "repeats": repeats, "warmup": warmup, "seed": seed,
        "lax_full_max": lax_full_max, "lax_repeats": lax_repeats,
        "calls_per_sample": calls_per_sample,
        "bucket": BUCKET, "sample_stride": SAMPLE_STRIDE,
        "unavailable": unavailable,
        "correctness": checks,
        "records": records,
    }


def summary_rows(data: dict):
    recs = data["records"]
    keys = sorted({(r["N"], r["k"], r["density"]) for r in recs}, key=lambda t: (t[2], t[0]))
    rows = []
    for n, k, d in keys:
        med = {r["method"]: r["median_s"] for r in recs if (r["N"], r["k"]) == (n, k)}
        mn = {r["method"]: r["min_s"] for r in recs if (r["N"], r["k"]) == (n, k)}

        def ratio(a, b, m=med):
            return m[a] / m[b] if a in m and b in m else None

        rows.append({
            "N": n, "k": k, "density": d,
            **{f"{name}_ms": t * 1e3 for name, t in med.items()},
            **{f"{name}_min_ms": t * 1e3 for name, t in mn.items()},
            "lax_top_k_over_topk": ratio("lax.top_k", "topk"),
            "lax_top_k_over_topk_min": ratio("lax.top_k", "topk", mn),
            "approx_over_topk": ratio("approx_max_k", "topk"),
            "topk_over_elementwise": ratio("topk", "elementwise"),
            "threshold_over_elementwise": ratio("threshold_select", "elementwise"),
            "threshold_over_elementwise_min": ratio("threshold_select", "elementwise", mn),
            "threshold_over_read_pass": ratio("threshold_select", "read_pass"),
            "kth_exact_over_read_pass": ratio("kth_exact", "read_pass"),
            "kth_sampled_over_kth_exact": ratio("kth_sampled", "kth_exact"),
            "xla_set_over_residual_update": ratio("xla_scatter_set", "residual_update"),
            "xla_add_over_scatter_add": ratio("xla_scatter_add", "scatter_add"),
            "reuse_overflow_over_topk": ratio("reuse_overflow", "topk"),
            "reuse_beyond_list_over_topk": ratio("reuse_beyond_list", "topk"),
        })
    return rows


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def print_table(data: dict) -> None:
    rows = summary_rows(data)
    cols = ["topk", "threshold_select", "kth_exact", "kth_sampled", "bucket_topk",
            "residual_update", "scatter_add", "lax.top_k", "approx_max_k", "xla_scatter_set",
            "xla_scatter_add", "elementwise", "read_pass", "reuse_within", "reuse_overflow",
            "reuse_beyond_list"]
    short = {"reuse_within": "re_1.5k", "reuse_overflow": "re_3k", "reuse_beyond_list": "re_6k",
             "threshold_select": "thresh", "kth_exact": "kth", "kth_sampled": "kth_smp",
             "bucket_topk": "bucket", "residual_update": "resid", "scatter_add": "scat_add",
             "lax.top_k": "lax.topk", "approx_max_k": "approx", "xla_scatter_set": "xla_set",
             "xla_scatter_add": "xla_add", "elementwise": "elemwise", "read_pass": "read"}
    print(f"\nmedian ms per call ({data['machine']['device']}, {data['machine']['jax_backend']})")
    print_header(f"{'N':>5} {'dens':>5} {'k':>8} | "
                 + " ".join(f"{short.get(c, c):>9}" for c in cols))
    for r in rows:
        print(f"{fmt_size(r['N']):>5} {r['density']:>5.1%} {r['k']:>8} | "
              + " ".join(f"{_f(r.get(c + '_ms')):>9}" for c in cols))
    print("\nratios (medians; 'min' = fastest repeats): lax.top_k/topk > 1 means ours is faster; "
          "thresh/elemwise < 1.5 is the goal")
    print_header(f"{'N':>5} {'dens':>5} | {'lax/topk':>8} {'(min)':>6} {'apx/topk':>8} | "
                 f"{'thr/elem':>8} {'(min)':>6} {'thr/read':>8} | {'kth/read':>8} {'smp/kth':>7} | "
                 f"{'xlaset/res':>10} {'xlaadd/sca':>10}")
    for r in rows:
        print(f"{fmt_size(r['N']):>5} {r['density']:>5.1%} | {_f(r['lax_top_k_over_topk']):>8} "
              f"{_f(r['lax_top_k_over_topk_min'], '{:.1f}'):>6} {_f(r['approx_over_topk']):>8} | "
              f"{_f(r['threshold_over_elementwise']):>8} "
              f"{_f(r['threshold_over_elementwise_min']):>6} {_f(r['threshold_over_read_pass']):>8} | "
              f"{_f(r['kth_exact_over_read_pass']):>8} {_f(r['kth_sampled_over_kth_exact']):>7} | "
              f"{_f(r['xla_set_over_residual_update']):>10} {_f(r['xla_add_over_scatter_add']):>10}")
    if data.get("unavailable"):
        print("\nunavailable on this backend:")
        for m, why in data["unavailable"].items():
            print(f"  {m}: {why}")


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    recs = data["records"]
    densities = sorted({r["density"] for r in recs})
    style = {
        "topk": dict(color="tab:red", marker="o", lw=2.2),
        "threshold_select": dict(color="tab:orange", marker="D", lw=2),
        "kth_exact": dict(color="tab:purple", marker="v"),
        "kth_sampled": dict(color="tab:pink", marker="^"),
        "bucket_topk": dict(color="tab:brown", marker="s"),
        "residual_update": dict(color="tab:green", marker="P"),
        "scatter_add": dict(color="tab:olive", marker="X"),
        "lax.top_k": dict(color="tab:blue", marker="s", ls="--"),
        "approx_max_k": dict(color="tab:cyan", marker="^", ls="--"),
        "xla_scatter_set": dict(color="tab:green", marker="P", ls="--", alpha=0.6),
        "xla_scatter_add": dict(color="tab:olive", marker="X", ls="--", alpha=0.6),
        "elementwise": dict(color="gray", marker="x", ls=":"),
        "read_pass": dict(color="black", marker="+", ls=":"),
        "reuse_within": dict(color="tab:gray", marker="<", lw=1.5),
        "reuse_overflow": dict(color="goldenrod", marker=">", lw=1.5),
        "reuse_beyond_list": dict(color="darkred", marker="*", lw=1.2, alpha=0.7),
    }
    fig, axes = plt.subplots(1, len(densities), figsize=(7 * len(densities), 5.6),
                             sharey=True, squeeze=False)
    for ax, d in zip(axes[0], densities):
        for m, st in style.items():
            pts = sorted((r["N"], r["median_s"]) for r in recs
                         if r["density"] == d and r["method"] == m)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], label=m, **st)
        for n in sorted({r["N"] for r in recs if r["density"] == d}):
            med = {r["method"]: r["median_s"] for r in recs if r["density"] == d and r["N"] == n}
            if "topk" in med and "lax.top_k" in med:
                ax.annotate(f"{med['lax.top_k'] / med['topk']:.0f}x", (n, med["lax.top_k"] * 1e3),
                            textcoords="offset points", xytext=(5, 5), fontsize=8, color="tab:blue")
        ns = sorted({r["N"] for r in recs})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns)
        ax.set_xticklabels([fmt_size(n) for n in ns])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set(xlabel="N (float32 entries)",
               title=f"density {d:.1%}  (k = {d:.1%} of N; updates touch k entries)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per call, ms (median)")
    axes[0][0].legend(loc="upper left", fontsize=7, ncol=2,
                      title="solid: ours, dashed: XLA, dotted: floors (blue: lax.top_k/topk)",
                      title_fontsize=7)
    save_kernel_figure(fig, path, "Selection kernels vs XLA", data["machine"])


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--sizes", nargs="+", default=None,
                   help="sizes N (K/M/G = 2**10/2**20/2**30); default 1M 4M 16M 64M")
    p.add_argument("--large", action="store_true", help="add N = 256M (meant for a GPU)")
    p.add_argument("--densities", nargs="+", type=float, default=None,
                   help="k / N; default 0.001 0.01")
    add_timing_options(p, repeats=None, warmup=1, help="default 7 (3 with --quick)")
    p.add_argument("--lax-full-max", default="16M",
                   help="above this N, lax.top_k and approx_max_k get --lax-repeats repeats")
    p.add_argument("--lax-repeats", type=int, default=3)
    p.add_argument("--calls-per-sample", type=int, default=None,
                   help="calls queued per timed sample (default 1 on CPU, 20 on GPU: hides the "
                        "dispatch latency)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1M 4M, density 1%%, 3 repeats (unless given)")
    add_quiet_options(p)
    add_record_options(p, None)  # default results/selection_<backend>[_quick].json
    args = p.parse_args(argv)

    if args.out is None:
        import jax

        args.out = RESULTS / f"selection_{jax.default_backend()}{'_quick' if args.quick else ''}.json"

    def measure():
        sizes = args.sizes or (["1M", "4M"] if args.quick else ["1M", "4M", "16M", "64M"])
        if args.large:
            sizes = sizes + ["256M"]
        densities = args.densities or ([0.01] if args.quick else [0.001, 0.01])
        repeats = args.repeats or (3 if args.quick else 7)
        data = run([parse_size(s) for s in sizes], densities, repeats, args.warmup, args.seed,
                   parse_size(args.lax_full_max), args.lax_repeats, args.quiet_wait,
                   args.quiet_busy, args.calls_per_sample)
        data["summary"] = summary_rows(data)
        return data
    return record_or_replot(args, measure, print_table, plot)


if __name__ == "__main__":
    sys.exit(main())
