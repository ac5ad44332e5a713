"""SparCML Figure 3, reproduced in shape: sparse allreduce time against P and density.

SparCML (Renggli et al., SC'19) Fig. 3 plots the time of one sparse allreduce of an
N = 16M vector against the number of nodes P (at density 0.78 %) and against d, for its
algorithms and the dense MPI_Allreduce. Here the "cluster" is P network namespaces on
one host (``emulated_network.py``) at ``--rates`` Mbit/s, then shared memory (unless
``--no-shm``). Per transport the driver probes what it delivers (latency, Sendrecv and
MPI_Allreduce rates), then runs one MPI job per P, timing every algorithm at
``--p-density`` (the job at ``--density-p`` also sweeps ``--densities``). Worker: every
rank draws k = d N distinct random indices; every algorithm's jitted
``jss.sparse_allreduce`` is checked against a float64 NumPy reference and across ranks,
then timed over ``--repeats`` interleaved calls after a barrier (the max over ranks;
median and fastest repeat), the ranks under ``--mpi-env``. The model:
``cost_model.predict_time`` with the measured latency and beta = 8 / link rate
(``configured`` or the probe's ``fitted``) on each rank's predicted bytes and messages
(``model_measured_bytes``: the bytes actually sent).

Commands (root for the emulated network; every launch has a timeout and the namespaces
are deleted afterwards)::

    sudo -E .venv/bin/python benchmarks/sparcml_fig3.py                 # full: 500, 200 Mbit/s, shm
    .venv/bin/python benchmarks/sparcml_fig3.py --size 1M --procs 2 4 --rates 200 \\
        --densities 0.01 --repeats 2 --out benchmarks/results/sparcml_fig3_small.json
    .venv/bin/python benchmarks/sparcml_fig3.py --plot-only             # redraw from the JSON

Results: benchmarks/README.md ("sparcml_fig3.py").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import (add_quiet_options, add_record_options, add_timing_options,  # noqa: E402
                      find_mpiexec, fmt_bytes, fmt_size, load_record, machine_info, parse_size,
                      parser, plain_ticks, print_header, pyplot, quiet_before, run_fragment,
                      save_figure, time_rounds, timing_args, write_record)
from allreduce import TUNED_MALLOC_ENV, gather_volumes, random_sparse  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = HERE / "results"
ALGORITHMS = ("dense", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather")
SPARSE = ALGORITHMS[1:]
LABEL = {"dense": "dense (MPI_Allreduce)", "allgather": "allgather (TopkA)",
         "recursive_doubling": "recursive doubling (SSAR_Rec_dbl)",
         "split_allgather": "split allgather (SSAR_Split_ag)",
         "dsar_split_allgather": "DSAR split allgather"}
COLOR = {"dense": "tab:gray", "allgather": "tab:blue", "recursive_doubling": "tab:red",
         "split_allgather": "tab:green", "dsar_split_allgather": "tab:purple"}
MARKER = {"dense": "s", "allgather": "o", "recursive_doubling": "^", "split_allgather": "D",
          "dsar_split_allgather": "v"}
# TUNED_MALLOC_ENV (allreduce.py's --tuned-malloc): glibc malloc recycles big buffers instead
# of mmap + page-faulting them on every call; applied to every transport alike.
# oversubscribed ranks waiting in MPI otherwise spin and take the CPU from the ranks that
# compute or move data (results/sparcml_fig3.json is measured with it)
DEFAULT_MPI_ENV = ("MPIR_CVAR_CH4_PROGRESS_THROTTLE=1",)


# --------------------------------------------------------------------------- worker


def worker(args) -> int:
    import jax
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss

    comm = jss.mpi.default_comm()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    n = parse_size(args.size)
    t_start = time.monotonic()
    densities = args.densities
    if rank == 0:
        print(f"  [{args.transport} P={nranks}] N={fmt_size(n)} densities "
              f"{', '.join(f'{d:.2%}' for d in densities)}; {MPI.Get_processor_name()}",
              flush=True)

    records = []
    dense_done = False
    for density in densities:
        k, idx, vals = random_sparse(n, density, args.seed, rank)
        gathered = comm.gather((idx, vals), root=0)
        ref = union = None
        if rank == 0:
            all_idx = np.concatenate([g[0] for g in gathered])
            all_val = np.concatenate([g[1] for g in gathered]).astype(np.float64)
            ref = np.bincount(all_idx, weights=all_val, minlength=n)
            union = int(np.count_nonzero(np.bincount(all_idx, minlength=n)))
            del all_idx, all_val
        del gathered
        v_dev, i_dev = jax.device_put(vals), jax.device_put(idx)

        algos = [a for a in args.algorithms if a != "dense" or not dense_done]
        fns, checked = {}, {}
        for algo in algos:
            f = jax.jit(lambda v, i, algo=algo: jss.sparse_allreduce(
                v, i, size=n, algorithm=algo, return_stats=True))
            first = stats = None
            for w in range(max(1, args.warmup)):
                comm.Barrier()
                out, stats = jax.block_until_ready(f(v_dev, i_dev))
                if w == 0:
                    first = np.asarray(out)
                del out
            digest = hashlib.sha1(first.tobytes()).hexdigest()
            digests = comm.gather(digest, root=0)
            ok, err = True, 0.0
            if rank == 0:
                err = float(np.max(np.abs(first - ref)))
                ok = bool(np.allclose(first, ref, rtol=1e-5, atol=1e-5)) and len(set(digests)) == 1
            ok = comm.bcast(ok, root=0)
            if not ok:
                if rank == 0:
                    print(f"!! P={nranks} {algo} d={density}: WRONG (max err {err}, "
                          f"{len(set(digests))} distinct results)", flush=True)
                comm.Abort(3)
            fns[algo] = f
            checked[algo] = (stats.as_dict(), err)
            del first

        times = time_rounds({a: lambda f=f: f(v_dev, i_dev) for a, f in fns.items()}, args.repeats,
                            comm)

        for algo in algos:
            st, err = checked[algo]
            g = gather_volumes(comm, algo, times[algo], st, n, k)
            if rank != 0:
                continue
            allr, per_rep = g["ranks"], g["times_s"]
            rec = {
                "transport": args.transport, "P": nranks, "N": n, "k": k,
                "density": density, "algorithm": algo,
                "density_independent": algo == "dense",
                "median_s": statistics.median(per_rep), "min_s": min(per_rep),
                "max_s": max(per_rep), "times_s": per_rep,
                **{key: g[key] for key in ("bytes_sent", "bytes_received", "messages")},
                "switched_to_dense": [r["stats"]["switched_to_dense"] for r in allr],
                "result_nnz": allr[0]["stats"]["result_nnz"],
                "union_nnz_reference": union,
                **{key: g[key] for key in ("predicted_bytes_min", "predicted_bytes_max",
                                           "predicted_messages")},
                "correct": True, "max_abs_err": err,
            }
            rec["bytes_within_predicted"] = all(
                lo <= s <= hi for s, lo, hi in zip(rec["bytes_sent"], rec["predicted_bytes_min"],
                                                   rec["predicted_bytes_max"]))
            records.append(rec)
            print(f"  [{args.transport} P={nranks}] d={density:6.2%} k={k:>8} {algo:>20}: "
                  f"median {rec['median_s'] * 1e3:9.2f} ms (min {rec['min_s'] * 1e3:8.2f})  "
                  f"sent max {fmt_bytes(max(rec['bytes_sent'])):>9}  "
                  f"[t+{time.monotonic() - t_start:.0f}s]", flush=True)
        dense_done = dense_done or "dense" in algos
        del fns

    if rank == 0:
        frag = {"P": nranks, "N": n, "records": records, "cpu_count": os.cpu_count(),
                "repeats": args.repeats, "warmup": args.warmup,
                "worker_wall_s": time.monotonic() - t_start}
        Path(args.fragment).write_text(json.dumps(frag) + "\n")
    comm.Barrier()
    return 0


# --------------------------------------------------------------------------- driver


def _kv(pairs) -> dict:
    return dict(kv.split("=", 1) for kv in pairs)


def probe_shm(nranks: int, timeout: float = 120, env: dict | None = None) -> dict:
    """Latency and rates of MPICH shared memory, with the probe of emulated_network."""
    from emulated_network import PROBE_SCRIPT

    res = {"configured_mbit": None}
    with tempfile.TemporaryDirectory(prefix="jssprobe") as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text(PROBE_SCRIPT)
        for mode, p, size in (("pingpong", 2, 8), ("sendrecv", 2, 16 << 20),
                              ("allreduce", nranks, 16 << 20)):
            out = Path(tmp) / f"{mode}.json"
            cmd = [find_mpiexec(), "-n", str(p), sys.executable, str(script), mode, str(size),
                   "3", str(out)]
            subprocess.run(cmd, timeout=timeout, capture_output=True,
                           env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})
            if out.exists():
                res[mode] = json.loads(out.read_text())
    res["achieved_mbit"] = res.get("sendrecv", {}).get("mbit")
    res["one_way_latency_s"] = res.get("pingpong", {}).get("one_way_latency_s")
    return res


def model_params(transport: dict) -> dict:
    """alpha/beta per model variant for one transport."""
    probe = transport["probe"]
    alpha = probe.get("one_way_latency_s") or 10e-6
    out = {}
    if transport.get("rate_mbit"):
        out["configured"] = {"alpha": alpha, "beta": 8 / (transport["rate_mbit"] * 1e6)}
    if probe.get("achieved_mbit"):
        out["fitted"] = {"alpha": alpha, "beta": 8 / (probe["achieved_mbit"] * 1e6)}
    return out


def add_model(records: list[dict], transport: dict) -> None:
    params = model_params(transport)
    for r in records:
        for name, ab in params.items():
            a, b = ab["alpha"], ab["beta"]
            r[f"model_{name}_s"] = max(m * a + by * b for m, by in
                                       zip(r["predicted_messages"], r["predicted_bytes_max"]))
            r[f"model_{name}_measured_bytes_s"] = max(
                m * a + by * b for m, by in zip(r["messages"], r["bytes_sent"]))
        # the headline model: the configured link rate. Shared memory has no link, and
        # its "fitted" numbers (memcpy rate, us latency) are recorded but not used.
        r["model_s"] = r.get("model_configured_s")
        r["measured_over_model"] = r["median_s"] / r["model_s"] if r.get("model_s") else None


def launch_jobs(transport: dict, args, net=None) -> list[dict]:
    frags = []
    maxp = max(args.procs)
    for p in args.procs:
        dens = args.densities if p == args.density_p else [args.p_density]
        if p == args.density_p and args.p_density not in dens:
            dens = [args.p_density, *dens]
        with tempfile.TemporaryDirectory(prefix="jssfig3") as tmp:
            os.chmod(tmp, 0o777)
            frag = Path(tmp) / "frag.json"
            wargs = [str(Path(__file__).resolve()), "--worker", "--transport", transport["name"],
                     "--size", str(args.size), "--densities", *map(str, dens),
                     "--algorithms", *args.algorithms, *map(str, timing_args(args)),
                     "--fragment", str(frag)]
            busy, waited = quiet_before(args.quiet_wait)
            t0 = time.monotonic()
            print(f"[{time.strftime('%H:%M:%S')}] {transport['name']}: P={p} "
                  f"({'oversubscribed, ' if p > os.cpu_count() else ''}cpu busy before {busy}, "
                  f"waited {waited}s)", flush=True)
            env = dict(TUNED_MALLOC_ENV, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
                       **_kv(args.mpi_env))
            try:
                if net is not None:
                    rc = net.launch(wargs, timeout=args.timeout, nranks=p, env=env,
                                    capture=False, stream=True).returncode
                    err = None if rc == 0 and frag.exists() else f"exit code {rc}"
                else:  # mpiexec -n P python ... on shared memory
                    err = run_fragment([find_mpiexec(), "-n", p, sys.executable, *wargs], frag,
                                       args.timeout, env=dict(os.environ, **env),
                                       keep=True).get("error")
            except Exception as e:  # timeouts and setup failures: record, go on
                err = f"{type(e).__name__}: {str(e)[:500]}"
            wall = time.monotonic() - t0
            if err:
                print(f"!! {transport['name']} P={p} failed: {err}", flush=True)
                frags.append({"P": p, "error": err, "records": [], "wall_s": wall})
                continue
            data = json.loads(frag.read_text())
            data.update(wall_s=wall, cpu_busy_before=busy, quiet_waited_s=waited)
            if net is not None and p == maxp:
                data["veth_counters_after"] = net.counters()
            frags.append(data)
    return frags


def run_transport(name: str, rate: float | None, args) -> dict:
    from emulated_network import EmulatedNetwork

    maxp = max(args.procs)
    t0 = time.monotonic()
    tr = {"name": name, "rate_mbit": rate, "kind": "emulated" if rate else "shm"}
    if rate:
        with EmulatedNetwork(maxp, rate, delay_ms=0.0, env=_kv(args.mpi_env)) as net:
            tr["network"] = net.describe()
            print(f"[{time.strftime('%H:%M:%S')}] {name}: {maxp} namespaces up ({net.prefix}); "
                  f"probing the links ...", flush=True)
            tr["probe"] = net.measure_rate(16 << 20, repeats=3, timeout=180)
            _print_probe(name, tr["probe"])
            before = net.counters()
            tr["fragments"] = launch_jobs(tr, args, net)
            after = net.counters()
            tr["veth_tx_bytes_during_jobs"] = {k: after[k]["tx_bytes"] - before[k]["tx_bytes"]
                                               for k in after}
        tr["torn_down"] = not any(ns.startswith(net.prefix + "_")
                                  for ns in __import__("emulated_network").list_namespaces())
    else:
        tr["network"] = {"transport": "MPICH shared memory (plain mpiexec, one host)"}
        tr["probe"] = probe_shm(maxp, env=_kv(args.mpi_env))
        _print_probe(name, tr["probe"])
        tr["fragments"] = launch_jobs(tr, args, None)
    tr["records"] = [r for f in tr["fragments"] for r in f.get("records", [])]
    tr["failures"] = [{"P": f["P"], "error": f["error"]} for f in tr["fragments"] if f.get("error")]
    tr["wall_s"] = round(time.monotonic() - t0, 1)
    add_model(tr["records"], tr)
    return tr


def _print_probe(name: str, probe: dict) -> None:
    ar = probe.get("allreduce", {})
    lat = probe.get("one_way_latency_s")
    print(f"  {name}: one-way latency {lat * 1e6 if lat else float('nan'):.1f} us, 2-rank "
          f"Sendrecv {probe.get('achieved_mbit') or 0:.0f} Mbit/s per direction (configured "
          f"{probe.get('configured_mbit')}), 16 MiB MPI_Allreduce over P={ar.get('P')}: "
          f"{ar.get('mbit', 0):.0f} Mbit/s bus rate"
          + ("" if probe.get("sendrecv", {}).get("went_over_veth", True)
             else "  !! bytes did NOT go over the veths"), flush=True)


def speedups(data: dict, p: int, density: float) -> dict:
    out = {}
    for tr in data["transports"]:
        recs = tr["records"]
        dense = [r for r in recs if r["algorithm"] == "dense" and r["P"] == p]
        ds = sorted({r["density"] for r in recs if r["P"] == p and r["algorithm"] != "dense"},
                    key=lambda d: abs(d - density))
        if not dense or not ds:
            continue
        d = ds[0]
        row = {"density": d, "dense_ms": dense[0]["median_s"] * 1e3}
        for r in recs:
            if r["P"] == p and r["density"] == d and r["algorithm"] != "dense":
                row[r["algorithm"]] = {
                    "ms": r["median_s"] * 1e3,
                    "speedup": dense[0]["median_s"] / r["median_s"],
                    # on the fastest repeats: less of the other jobs on a shared machine
                    "speedup_min": dense[0]["min_s"] / r["min_s"],
                    "model_speedup": (dense[0]["model_s"] / r["model_s"]
                                      if r.get("model_s") and dense[0].get("model_s") else None)}
        out[tr["name"]] = row
    return out


def print_summary(data: dict) -> None:
    for tr in data["transports"]:
        pr = tr["probe"]
        print(f"\n# {tr['name']}: achieved {pr.get('achieved_mbit') or 0:.0f} Mbit/s "
              f"(configured {tr['rate_mbit']}), latency "
              f"{(pr.get('one_way_latency_s') or 0) * 1e6:.1f} us")
        print_header(f"{'P':>2} {'dens':>6} {'algorithm':>20} | {'median ms':>10} {'model ms':>9} "
                     f"{'meas/model':>10} | {'sent max':>9} {'pred max':>9} ok")
        for r in sorted(tr["records"], key=lambda r: (r["P"], r["density"],
                                                      ALGORITHMS.index(r["algorithm"]))):
            ratio = f"{r['measured_over_model']:.2f}" if r.get("measured_over_model") else "-"
            model = f"{r['model_s'] * 1e3:9.2f}" if r.get("model_s") else f"{'-':>9}"
            print(f"{r['P']:>2} {r['density']:>6.2%} {r['algorithm']:>20} | "
                  f"{r['median_s'] * 1e3:>10.2f} {model} {ratio:>10} | "
                  f"{fmt_bytes(max(r['bytes_sent'])):>9} "
                  f"{fmt_bytes(max(r['predicted_bytes_max'])):>9} "
                  f"{'yes' if r['bytes_within_predicted'] else 'NO'}")
        for f in tr["failures"]:
            print(f"!! P={f['P']}: {f['error']}")
        print("dense MPI_Allreduce achieved (bytes sent per rank * 8 / time), Mbit/s by P: "
              + ", ".join(f"{p}: {v:.0f}" for p, v in tr.get("dense_achieved_mbit_by_P",
                                                               {}).items()))
    sp = data.get("speedup_P_density")
    if sp:
        print(f"\n# speedup over dense MPI_Allreduce at P={sp['P']}, density ~{sp['density']:.2%}"
              " (measured medians [fastest repeats]; model in parentheses)")
        for name, row in sp["by_transport"].items():
            parts = [f"{a} {row[a]['speedup']:.1f}x [min {row[a]['speedup_min']:.1f}x]"
                     + (f" ({row[a]['model_speedup']:.1f}x)" if row[a]['model_speedup'] else "")
                     for a in SPARSE if a in row]
            print(f"  {name} (d={row['density']:.2%}, dense {row['dense_ms']:.0f} ms): "
                  + ", ".join(parts))
    for name, st in data.get("model_fit", {}).items():
        print(f"  {name}: measured/model median {st['median']:.2f} "
              f"(range {st['min']:.2f}..{st['max']:.2f}, n={st['n']}; where the model says "
              f">= 500 ms: {st.get('median_model_ge_500ms', float('nan')):.2f}); per algorithm: "
              + ", ".join(f"{a} {v:.2f}" for a, v in st["per_algorithm"].items())
              + "; with the bytes actually sent: "
              + ", ".join(f"{a} {v:.2f}" for a, v in st["per_algorithm_measured_bytes"].items()))


def model_fit(data: dict) -> dict:
    """measured / model: over all records, per algorithm, and with the bytes actually sent."""
    out = {}
    for tr in data["transports"]:
        recs = [r for r in tr["records"] if r.get("measured_over_model")]
        if not recs:
            continue
        ratios = [r["measured_over_model"] for r in recs]
        st = out[tr["name"]] = {"median": statistics.median(ratios), "min": min(ratios),
                                "max": max(ratios), "n": len(ratios), "per_algorithm": {},
                                "per_algorithm_measured_bytes": {}}
        for a in ALGORITHMS:
            ra = [r for r in recs if r["algorithm"] == a]
            if ra:
                st["per_algorithm"][a] = statistics.median(r["measured_over_model"] for r in ra)
                st["per_algorithm_measured_bytes"][a] = statistics.median(
                    r["median_s"] / r["model_configured_measured_bytes_s"] for r in ra)
        # the large-message regime, where the links should dominate (model >= 500 ms)
        big = [r["measured_over_model"] for r in recs if r["model_s"] >= 0.5]
        if big:
            st["median_model_ge_500ms"] = statistics.median(big)
    return out


def _time_series(ax, a: str, pts) -> None:
    """One algorithm's (x, median, min, max, model) points: ms, min..max bars, the model dashed."""
    x = [p[0] for p in pts]
    ax.errorbar(x, [p[1] * 1e3 for p in pts],
                yerr=[[(p[1] - p[2]) * 1e3 for p in pts], [(p[3] - p[1]) * 1e3 for p in pts]],
                color=COLOR[a], marker=MARKER[a], capsize=3, label=LABEL[a])
    if all(p[4] for p in pts):
        ax.plot(x, [p[4] * 1e3 for p in pts], color=COLOR[a], ls="--", lw=1, alpha=0.8)


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    trs = data["transports"]
    fig, axes = plt.subplots(len(trs), 3, figsize=(19, 5.2 * len(trs)), squeeze=False)
    for row, tr in enumerate(trs):
        recs = tr["records"]
        pr = tr["probe"]
        title = (f"{tr['name']}: {'emulated, ' + format(tr['rate_mbit'], 'g') + ' Mbit/s links' if tr['rate_mbit'] else 'shared memory'}"
                 f" (achieved {pr.get('achieved_mbit') or 0:.0f} Mbit/s, "
                 f"latency {(pr.get('one_way_latency_s') or 0) * 1e6:.0f} us)")
        # (a) time vs P
        ax = axes[row][0]
        pd = data["p_density"]
        for a in ALGORITHMS:
            pts = sorted((r["P"], r["median_s"], r["min_s"], r["max_s"], r.get("model_s"))
                         for r in recs if r["algorithm"] == a
                         and (r["density"] == pd or a == "dense"))
            pts = list({p[0]: p for p in pts}.values())
            if not pts:
                continue
            _time_series(ax, a, pts)
        if any(r.get("model_s") for r in recs):
            ax.plot([], [], color="k", ls="--", lw=1, label="model (alpha-beta, configured rate)")
        ax.set_yscale("log")
        plain_ticks(ax.yaxis)
        ax.set(xlabel="P (ranks)", ylabel="ms per call (median of max over ranks)")
        ax.set_title(f"time vs P, N={fmt_size(data['N'])}, d={pd:.2%}\n{title}", fontsize=9)
        ax.set_xticks(sorted({r["P"] for r in recs}) or [2])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        # (b) time vs density
        ax = axes[row][1]
        dp = data["density_p"]
        ds = sorted({r["density"] for r in recs if r["P"] == dp and r["algorithm"] != "dense"})
        for a in ALGORITHMS:
            if a == "dense":
                dr = [r for r in recs if r["P"] == dp and a == r["algorithm"]]
                if dr and ds:
                    ax.plot(ds, [dr[0]["median_s"] * 1e3] * len(ds), color=COLOR[a],
                            marker=MARKER[a], label=LABEL[a] + " (independent of d)")
                    if dr[0].get("model_s"):
                        ax.plot(ds, [dr[0]["model_s"] * 1e3] * len(ds), color=COLOR[a], ls="--",
                                lw=1)
                continue
            pts = sorted((r["density"], r["median_s"], r["min_s"], r["max_s"], r.get("model_s"))
                         for r in recs if r["P"] == dp and r["algorithm"] == a)
            if not pts:
                continue
            _time_series(ax, a, pts)
        ax.set(xscale="log", yscale="log")
        plain_ticks(ax.xaxis, lambda v: f"{v * 100:g}%")
        ax.set_xticks(ds)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        plain_ticks(ax.yaxis)
        ax.set(xlabel="density d = k / N (per rank)", ylabel="ms per call")
        ax.set_title(f"time vs density, P={dp}, N={fmt_size(data['N'])} (dashed: model)",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        # (c) measured vs model
        ax = axes[row][2]
        allv = []
        for a in ALGORITHMS:
            pts = [(r["model_s"] * 1e3, r["median_s"] * 1e3,
                    r["model_configured_measured_bytes_s"] * 1e3) for r in recs
                   if r["algorithm"] == a and r.get("model_s")]
            if pts:
                allv += [v for p in pts for v in p]
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=COLOR[a],
                           marker=MARKER[a], label=LABEL[a], alpha=0.8)
                if a in ("split_allgather", "recursive_doubling"):  # volume not exact a priori
                    ax.scatter([p[2] for p in pts], [p[1] for p in pts], facecolors="none",
                               edgecolors=COLOR[a], marker=MARKER[a], alpha=0.8)
        if allv:
            lo, hi = min(allv) / 1.5, max(allv) * 1.5
            ax.plot([lo, hi], [lo, hi], color="k", lw=1, label="measured = model")
            ax.plot([lo, hi], [2 * lo, 2 * hi], color="k", lw=0.6, ls=":", label="2x model")
            ax.scatter([], [], facecolors="none", edgecolors="k",
                       label="hollow: model from the bytes actually sent")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set(xscale="log", yscale="log")
            ax.xaxis.set_major_formatter(fmt)
            ax.yaxis.set_major_formatter(fmt)
            mf = data.get("model_fit", {}).get(tr["name"])
            ax.set_title(f"measured vs model (all P and d): median ratio "
                         f"{mf['median']:.2f}" if mf else "measured vs model", fontsize=9)
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no model for shared memory\n(alpha-beta of a link does not apply)"
                    if not tr["rate_mbit"] else "no data", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_title("measured vs model", fontsize=9)
        ax.set_xlabel("model ms: messages * alpha + worst-case bytes * beta (max over ranks)",
                      fontsize=8)
        ax.set_ylabel("measured ms")
        ax.grid(True, which="both", alpha=0.3)
    info = data["machine"]
    save_figure(fig, path, "SparCML Fig. 3 (shape): jss.sparse_allreduce on one "
                f"{info['cpu_count']}-core host, ranks in network namespaces behind tc-shaped "
                f"veths (TCP) or on shared memory; jax {info['jax_version']}, {info['date'][:10]}",
                dpi=90, fontsize=11, rect=(0, 0, 1, 0.98))


def finish(data: dict, args) -> None:
    data["speedup_P_density"] = {
        "P": args.density_p if args.density_p in data["procs"] else max(data["procs"]),
        "density": args.speedup_density, "by_transport": None}
    data["speedup_P_density"]["by_transport"] = speedups(
        data, data["speedup_P_density"]["P"], args.speedup_density)
    data["model_fit"] = model_fit(data)
    for tr in data["transports"]:
        # what MPI_Allreduce (dense) actually moved per rank and second, at each P: the
        # rate each run reached, to compare with the link rate (CPU- vs link-bound)
        tr["dense_achieved_mbit_by_P"] = {
            str(r["P"]): round(max(r["bytes_sent"]) * 8 / r["median_s"] / 1e6, 1)
            for r in tr["records"] if r["algorithm"] == "dense"}


def driver(args) -> int:
    from emulated_network import usable

    out = Path(args.out)
    png = Path(args.png) if args.png else out.with_suffix(".png")
    if args.plot_only:
        data = load_record(out)
        for tr in data["transports"]:
            add_model(tr["records"], tr)
        finish(data, args)
        write_record(data, out)  # the derived fields, recomputed
        print_summary(data)
        plot(data, png)
        return 0
    t0 = time.monotonic()
    rates = [r for r in args.rates if r]
    ok, why = usable() if rates else (False, "no rates")
    if rates and not ok:
        print(f"!! emulated network not usable: {why}; running shared memory only", flush=True)
        rates = []
    plan = [(f"{r:g}Mbit", r) for r in rates] + ([] if args.no_shm else [("shm", None)])
    data = {
        "benchmark": "sparcml_fig3", "N": parse_size(args.size), "procs": args.procs,
        "p_density": args.p_density, "density_p": args.density_p, "densities": args.densities,
        "algorithms": args.algorithms, "repeats": args.repeats, "warmup": args.warmup,
        "seed": args.seed, "machine": machine_info(), "emulated_network_usable": [ok, why],
        "malloc_env": TUNED_MALLOC_ENV, "mpi_env": args.mpi_env,
        "timing": "per repeat: barrier, one jitted call on every rank; the repeat's time is the "
                  "max over ranks; median over repeats; algorithms interleaved",
        "model": "cost_model.wire_volume per rank (worst case) -> max_r(messages_r * alpha + "
                 "bytes_r * beta); alpha = measured 8-byte one-way latency, beta = 8 / rate "
                 "(configured: tc rate, fitted: 2-rank Sendrecv payload rate)",
        "note": f"{os.cpu_count()} cores: P > {os.cpu_count()} ranks are oversubscribed. The "
                "emulated links use tc tbf (no netem in this kernel: no added delay).",
        "transports": [],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.append and out.exists():
        # keep the other transports of an earlier run (same N, P and densities)
        old = load_record(out)
        names = {n for n, _ in plan}
        data["transports"] = [t for t in old["transports"] if t["name"] not in names]
        data["appended_to"] = old["machine"]["date"]
    try:
        for name, rate in plan:
            print(f"[{time.strftime('%H:%M:%S')}] === {name} === (t+{time.monotonic() - t0:.0f}s)",
                  flush=True)
            data["transports"].append(run_transport(name, rate, args))
            data["transports"].sort(key=lambda t: (t["rate_mbit"] is None, -(t["rate_mbit"] or 0)))
            data["wall_s"] = round(time.monotonic() - t0, 1)
            finish(data, args)
            write_record(data, out)   # partial results survive
    finally:
        if data["transports"]:
            finish(data, args)
            write_record(data, out)
    print_summary(data)
    plot(data, png)
    print(f"# wrote {out} and {png} (total {time.monotonic() - t0:.0f}s)")
    return 0 if all(not tr["failures"] for tr in data["transports"]) else 1


def main(argv=None) -> int:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", default="shm", help=argparse.SUPPRESS)
    ap.add_argument("--fragment", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="16M", help="N (default 16M = 16 * 2^20)")
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    ap.add_argument("--p-density", type=float, default=0.0078,
                    help="density of the time-vs-P sweep (default 0.78%%)")
    ap.add_argument("--density-p", type=int, default=8, help="P of the time-vs-density sweep")
    ap.add_argument("--densities", type=float, nargs="+",
                    default=[0.001, 0.0039, 0.0078, 0.01, 0.0156, 0.031, 0.0625])
    ap.add_argument("--speedup-density", type=float, default=0.01,
                    help="density of the reported speedups (nearest measured)")
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    ap.add_argument("--rates", type=float, nargs="*", default=[500.0, 200.0],
                    help="emulated link rates in Mbit/s (default 500 200); none: shm only")
    ap.add_argument("--no-shm", action="store_true", help="skip the shared-memory transport")
    add_timing_options(ap, repeats=3, warmup=1)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per MPI job")
    add_quiet_options(ap, default=10, busy=False)
    add_record_options(ap, RESULTS / "sparcml_fig3.json")
    ap.add_argument("--mpi-env", nargs="*", default=list(DEFAULT_MPI_ENV), metavar="KEY=VALUE",
                    help="environment for the ranks and the probes (default: "
                         f"{' '.join(DEFAULT_MPI_ENV)}; pass --mpi-env alone for none)")
    ap.add_argument("--append", action="store_true",
                    help="keep the transports of --out not run now (run transports separately)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
