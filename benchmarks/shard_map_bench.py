"""Sparse allreduce over a mesh axis (jss.axis): time and bytes per device on 8 CPU devices.

Every algorithm of the JAX-collective transport runs inside ``jax.shard_map`` over
``--devices`` host CPU devices (threads of one process: the collectives are memcpys);
each device picks ``k = density * N`` distinct random indices with random normal
values. Per (N, density) and algorithm the result is checked once against a NumPy
reference and across devices, ``--repeats`` interleaved calls are timed (median and
min), and the bytes each device sent stand next to ``cost_model.wire_volume``; also
``oktopk`` / ``oktopk_reuse`` against ``cost_model.oktopk_volume`` and ``block``
against ``cost_model.block_volume``.

    python benchmarks/shard_map_bench.py                        # N = 1M 4M, d = 1% 0.1%
    python benchmarks/shard_map_bench.py --sizes 1M --densities 0.01 --repeats 5
    python benchmarks/shard_map_bench.py --plot-only

Writes ``benchmarks/results/shard_map_cpu8.{json,png}`` (results: benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (add_quiet_options, add_record_options, add_timing_options,  # noqa: E402
                      fmt_size, loadavg, machine_info, parse_size, pyplot, record_or_replot,
                      save_figure, time_rounds, wait_for_quiet)

RESULTS = Path(__file__).resolve().parent / "results"
ALGORITHMS = ("dense", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather")
EXTRA = ("oktopk", "oktopk_reuse", "block")  # own entry points: oktopk_allreduce, block_allreduce
BLOCK_SIZE = 256


def pick_indices(n: int, k: int, p: int, overlap: float, seed: int):
    """Each device's k sorted distinct indices; ``round(overlap * k)`` of them are the
    same on every device (top-k of similar gradients overlap), the rest its own."""
    import numpy as np

    common_n = round(overlap * k)
    common = np.random.default_rng([seed, 999]).choice(n, common_n, replace=False)
    rest = np.setdiff1d(np.arange(n), common) if common_n else np.arange(n)
    out = []
    for r in range(p):
        own = np.random.default_rng([seed, r]).choice(rest, k - common_n, replace=False)
        out.append(np.sort(np.concatenate([common, own])).astype(np.int32))
    return np.stack(out)


def run(devices: int, sizes, densities, overlaps, repeats: int, warmup: int, seed: int,
        quiet_wait_s: float, quiet_busy: float,
        algorithms=ALGORITHMS + ("oktopk", "block")) -> dict:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_sparse_sync as jss
    from jax_sparse_sync.planning import cost_model

    p = jax.device_count()
    if p != devices:
        raise SystemExit(f"expected {devices} devices, JAX has {p} (XLA_FLAGS set too late?)")
    mesh = jax.make_mesh((p,), ("data",))
    rows = NamedSharding(mesh, P("data"))
    points = []
    for n, density, overlap in [(n, d, o) for n in sizes for d in densities for o in overlaps]:
        k = max(1, round(density * n))
        idx = pick_indices(n, k, p, overlap, seed)
        val = np.stack([np.random.default_rng([seed, r, 1]).standard_normal(k)
                        .astype(np.float32) for r in range(p)])
        ref = np.zeros(n, np.float64)
        np.add.at(ref, idx.reshape(-1), val.reshape(-1).astype(np.float64))
        v_dev, i_dev = jax.device_put(val, rows), jax.device_put(idx, rows)
        timed, checks = {}, {}
        for algorithm in (a for a in ALGORITHMS if a in algorithms):
            def body(v, i, full, algorithm=algorithm):
                out, stats = jss.sparse_allreduce(v[0], i[0], size=n, algorithm=algorithm,
                                                  comm=jss.axis("data"), return_stats="vector")
                return (out[None] if full else out[:1][None]), stats[None]

            fns = {full: jax.jit(jax.shard_map(
                lambda v, i, full=full: body(v, i, full), mesh=mesh,
                in_specs=(P("data"), P("data")), out_specs=(P("data"), P("data")),
                check_vma=False)) for full in (True, False)}
            out, stats = (np.asarray(x) for x in fns[True](v_dev, i_dev))
            identical = all(out[r].tobytes() == out[0].tobytes() for r in range(p))
            max_err = float(np.abs(out[0] - ref).max())
            assert identical and max_err < 1e-4, (algorithm, identical, max_err)
            vol = cost_model.wire_volume(algorithm, nranks=p, size=n, k=k)
            checks[algorithm] = {
                "identical_on_all_devices": identical, "max_abs_error": max_err,
                "bytes_sent_per_device": stats[:, 0].tolist(),
                "messages": int(stats[0, 2]), "switched_to_dense": int(stats[0, 4]),
                "model_bytes_min": vol.bytes_min, "model_bytes_max": vol.bytes_max,
                "model_messages": vol.messages,
            }
            fast = fns[False]
            for _ in range(warmup):
                jax.block_until_ready(fast(v_dev, i_dev))
            timed[algorithm] = lambda f=fast: f(v_dev, i_dev)
        for name, fn, check in extra_algorithms(jax, jss, cost_model, mesh, rows, n, k, p, idx,
                                                val, ref, algorithms):
            checks[name] = check
            for _ in range(warmup):
                jax.block_until_ready(fn())
            timed[name] = fn
        busy, waited = (wait_for_quiet(quiet_wait_s, quiet_busy) if quiet_wait_s
                        else (None, 0.0))
        load = loadavg()
        for algorithm, times in time_rounds(timed, repeats).items():
            checks[algorithm].update(median_ms=1e3 * statistics.median(times),
                                     min_ms=1e3 * min(times),
                                     times_ms=[1e3 * t for t in times])
        points.append({"size": n, "density": density, "k": k, "overlap": overlap,
                       "algorithms": checks,
                       "cpu_busy_before": busy, "quiet_waited_s": waited,
                       "loadavg_before": load})
        print_point(points[-1], p, flush=True)
    return {"devices": p, "machine": machine_info(), "repeats": repeats, "warmup": warmup,
            "seed": seed, "points": points,
            "note": ("shard_map over host CPU devices of one process (threads sharing the "
                     "cores); bytes from the transport's statistics (static shapes), model = "
                     "cost_model.wire_volume of the MPI transport")}


def extra_algorithms(jax, jss, cost_model, mesh, rows, n, k, p, idx, val, ref, algorithms):
    """Ok-Topk (exact and reused state) and block-sparse on this point's data, those of
    them in ``algorithms``: yields (name, timed call, checks) after checking each result
    once."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    v_dev, i_dev = jax.device_put(val, rows), jax.device_put(idx, rows)

    def oktopk(v, i, b, thr, recompute, full):
        r = jss.oktopk_allreduce(v[0], i[0], size=n, k=k, boundaries=b, global_threshold=thr,
                                 recompute_boundaries=recompute, recompute_threshold=recompute,
                                 comm=jss.axis("data"))
        out = r.sum if full else r.sum[:1]
        return out[None], jnp.stack(r.stats)[None], r.boundaries[None], r.threshold[None]

    fns = {full: jax.jit(jax.shard_map(
        lambda v, i, b, t, rc, full=full: oktopk(v, i, b, t, rc, full), mesh=mesh,
        in_specs=(P("data"), P("data"), P(), P(), P()), out_specs=P("data"), check_vma=False))
        for full in (True, False)}
    even = jnp.asarray([n * q // p for q in range(p + 1)], jnp.int32)
    first = None
    for name, recompute in (("oktopk", True), ("oktopk_reuse", False)) if "oktopk" in algorithms \
            else ():
        b, t = (even, jnp.float32(0)) if first is None else first
        out, stats, bounds, thr = (np.asarray(x) for x in fns[True](
            v_dev, i_dev, b, t, jnp.asarray(recompute)))
        if first is None:
            first = (jnp.asarray(bounds[0]), jnp.asarray(thr[0]))
        identical = all(out[r].tobytes() == out[0].tobytes() for r in range(p))
        kept = out[0] != 0
        # the kept entries are the sum's; nothing larger than the threshold was left out
        max_err = float(np.abs(out[0][kept] - ref[kept]).max()) if kept.any() else 0.0
        assert identical and max_err < 1e-4, (name, identical, max_err)
        assert not (np.abs(ref[~kept]) > thr[0] * (1 + 1e-6)).any(), name
        vol = cost_model.oktopk_volume(nranks=p, k=k, recompute_boundaries=recompute,
                                       recompute_threshold=recompute)
        check = {"identical_on_all_devices": identical, "max_abs_error": max_err,
                 "bytes_sent_per_device": stats[:, 0].tolist(), "messages": int(stats[0, 2]),
                 "switched_to_dense": int(stats[0, 4]), "global_count": int(stats[0, 3]),
                 "model_bytes_min": vol.bytes_min, "model_bytes_max": vol.bytes_max,
                 "model_messages": vol.messages}
        yield name, (lambda rc=recompute, b=b, t=t: fns[False](v_dev, i_dev, b, t,
                                                               jnp.asarray(rc))), check

    if "block" not in algorithms:
        return
    # block-sparse: each device's selection as a dense vector
    dense = np.zeros((p, n), np.float32)
    for r in range(p):
        dense[r, idx[r]] = val[r]
    x_dev = jax.device_put(dense, rows)

    def block(x, full):
        out, stats = jss.block_allreduce(x[0], block_size=BLOCK_SIZE, comm=jss.axis("data"),
                                         return_stats="vector")
        return (out if full else out[:1])[None], stats[None]

    bfns = {full: jax.jit(jax.shard_map(lambda x, full=full: block(x, full), mesh=mesh,
                                        in_specs=P("data"), out_specs=P("data"),
                                        check_vma=False)) for full in (True, False)}
    out, stats = (np.asarray(x) for x in bfns[True](x_dev))
    identical = all(out[r].tobytes() == out[0].tobytes() for r in range(p))
    max_err = float(np.abs(out[0] - ref).max())
    assert identical and max_err < 1e-4, ("block", identical, max_err)
    nb = -(-n // BLOCK_SIZE)

    def nonzero_blocks(x):
        return int(np.pad(x != 0, (0, nb * BLOCK_SIZE - n)).reshape(nb, BLOCK_SIZE).any(1).sum())

    vols = [cost_model.block_volume(nranks=p, size=n, block_size=BLOCK_SIZE,
                                    nonzero_blocks=nonzero_blocks(dense[r]),
                                    result_blocks=nonzero_blocks(out[0])) for r in range(p)]
    check = {"identical_on_all_devices": identical, "max_abs_error": max_err,
             "bytes_sent_per_device": stats[:, 0].tolist(), "messages": int(stats[0, 2]),
             "switched_to_dense": int(stats[0, 4]), "result_blocks": int(stats[0, 3]),
             "model_bytes_min": min(v.bytes_min for v in vols),
             "model_bytes_max": max(v.bytes_max for v in vols), "model_messages": vols[0].messages}
    yield "block", (lambda: bfns[False](x_dev)), check


def print_point(pt: dict, p: int, flush: bool = False) -> None:
    print(f"\nN = {fmt_size(pt['size'])}, density {pt['density']:g} (k = {pt['k']}), "
          f"overlap {pt.get('overlap', 0.0):g}, {p} devices", flush=flush)
    print(f"{'algorithm':22}{'median ms':>10}{'min ms':>9}{'sent/device B':>15}"
          f"{'model min..max B':>24}{'msgs':>6}{'dense':>6}", flush=flush)
    for a, r in pt["algorithms"].items():
        sent = r["bytes_sent_per_device"]
        s = f"{sent[0]}" if len(set(sent)) == 1 else f"{min(sent)}..{max(sent)}"
        model = (f"{r['model_bytes_min']}" if r["model_bytes_min"] == r["model_bytes_max"]
                 else f"{r['model_bytes_min']}..{r['model_bytes_max']}")
        print(f"{a:22}{r.get('median_ms', float('nan')):10.2f}{r.get('min_ms', float('nan')):9.2f}"
              f"{s:>15}{model:>24}{r['messages']:6d}{r['switched_to_dense']:6d}", flush=flush)


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    import numpy as np

    pts = data["points"]
    labels = [f"N={fmt_size(p['size'])}\nd={p['density']:g}\nov={p.get('overlap', 0):g}"
              for p in pts]
    x = np.arange(len(pts))
    names = list(pts[0]["algorithms"])
    w = 0.8 / len(names)
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.5))
    for j, a in enumerate(names):
        med = [p["algorithms"][a]["median_ms"] for p in pts]
        lo = [p["algorithms"][a]["min_ms"] for p in pts]
        axes[0].bar(x + j * w, med, w, label=a)
        axes[0].scatter(x + j * w, lo, color="k", s=8, zorder=3)
        sent = [max(p["algorithms"][a]["bytes_sent_per_device"]) for p in pts]
        axes[1].bar(x + j * w, sent, w, label=a)
        mmin = [p["algorithms"][a]["model_bytes_min"] for p in pts]
        mmax = [p["algorithms"][a]["model_bytes_max"] for p in pts]
        axes[1].vlines(x + j * w, mmin, mmax, color="k", lw=2, zorder=3)
        axes[1].scatter(x + j * w, mmax, color="k", marker="_", s=60, zorder=3)
    axes[0].set(ylabel="ms per call (median; dots: min)", yscale="log",
                title=f"time, {data['devices']} CPU devices, shard_map")
    axes[1].set(ylabel="bytes sent per device (bars; black: cost model min..max)",
                yscale="log", title="bytes per device vs cost model")
    for a in axes:
        a.set_xticks(x + 0.4 - w / 2, labels)
        a.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--sizes", nargs="+", default=["1M", "4M"])
    ap.add_argument("--densities", nargs="+", type=float, default=[0.01, 0.001])
    ap.add_argument("--overlaps", nargs="+", type=float, default=[0.0, 0.9],
                    help="fraction of each device's indices shared by all devices")
    add_timing_options(ap, repeats=7)
    add_quiet_options(ap)
    add_record_options(ap, RESULTS / "shard_map_cpu8.json")
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS) + ["oktopk", "block"],
                    choices=list(ALGORITHMS) + ["oktopk", "block"],
                    help="which to run (default all; oktopk runs its exact and reused state)")
    args = ap.parse_args(argv)

    def measure():
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                                       f"{args.devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        return run(args.devices, [parse_size(s) for s in args.sizes], args.densities,
                   args.overlaps, args.repeats, args.warmup, args.seed, args.quiet_wait,
                   args.quiet_busy, tuple(args.algorithms))

    def show(data):
        for pt in data["points"]:
            print_point(pt, data["devices"])
    return record_or_replot(args, measure, show, plot, indent=2)


if __name__ == "__main__":
    sys.exit(main())
