"""How stable is ``jss.planning.calibrate``'s beta on an emulated link (issue 33)?

Runs ``calibrate`` several times in one job on an emulated link (``emulated_network``,
root), each rank pinned to its own core as ``grouping.py --pin-cores`` does, and fits
every calibration's sweep three ways:

* ``old``: one least-squares line through every size of the 8 B - 2 MiB sweep, weighted
  by relative error, on the same medians;
* ``new_2mib``: ``jss.planning.calibration.fit_alpha_beta`` (the large-size slope, the
  small sizes' latency) on the 8 B - 2 MiB part of the sweep only;
* ``new``: what ``calibrate`` returns: that fit on the sweep extended until one exchange
  takes ``bandwidth_seconds``;

each against the link's rate. Writes ``results/calibration_stability_<tag>.{json,png}``::

    python benchmarks/calibration_stability.py --link 200 --procs 2 --calibrations 5 \\
        --pin-cores --autogroup-nice -19 --tag 200mbit_p2 \\
        --rank-env "XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        MPIR_CVAR_ENABLE_HEAVY_YIELD=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE=1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import launch_worker, machine_info, pyplot, save_figure, write_record  # noqa: E402

RESULTS = HERE / "results"
OLD_SWEEP_MAX = 1 << 21  # the 8 B - 2 MiB sweep calibrate measured before issue 33


def old_relative_fit(sizes, times) -> tuple[float, float]:
    """The fit before issue 33: relative-error least squares through every size."""
    import numpy as np
    m = np.asarray(sizes, np.float64)
    t = np.asarray(times, np.float64)
    a = np.stack([np.ones_like(m), m], axis=1)
    w = 1.0 / np.maximum(t, 1e-12)
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 1e-15)


def worker(cfg: dict) -> int:
    from grouping import pin_to_core, set_autogroup_nice
    core = pin_to_core() if cfg["pin_cores"] else None
    if cfg.get("autogroup_nice") is not None:
        set_autogroup_nice(cfg["autogroup_nice"])
    import jax_sparse_sync as jss
    from jax_sparse_sync.planning import calibration
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    out = []
    tmp = Path(tempfile.mkdtemp(prefix="jss_cal_stability_"))
    for i in range(cfg["calibrations"]):
        path = tmp / f"cal{i}.json"
        t0 = time.monotonic()
        params = jss.planning.calibrate(repeats=cfg["repeats"], path=str(path), install=False,
                                        contention=cfg["contention"])
        wall = time.monotonic() - t0
        if rank == 0:
            raw = json.loads(path.read_text())
            sizes, med = raw["sizes"], raw["median_s"]
            short = [(m, t) for m, t in zip(sizes, med) if m <= OLD_SWEEP_MAX]
            old = old_relative_fit(*zip(*short))
            new_short = calibration.fit_alpha_beta(*zip(*short))
            out.append({"calibration": i, "wall_s": round(wall, 2), "sizes": sizes,
                        "median_s": med, "gamma": params.gamma,
                        "fits": {"old": {"alpha_s": old[0], "beta_s_per_byte": old[1]},
                                 "new_2mib": {"alpha_s": new_short.alpha,
                                              "beta_s_per_byte": new_short.beta},
                                 "new": {"alpha_s": params.alpha,
                                         "beta_s_per_byte": params.beta}}})
            print(f"calibration {i} ({wall:.1f} s, up to {max(sizes) >> 20} MiB): beta old "
                  f"{old[1] * 1e9:.1f}, new on 2 MiB {new_short.beta * 1e9:.1f}, new "
                  f"{params.beta * 1e9:.1f} ns/B; alpha new {params.alpha * 1e6:.0f} us; "
                  f"gamma {params.gamma:.2f}", flush=True)
    if rank == 0:
        Path(cfg["fragment"]).write_text(json.dumps({"core": core, "calibrations": out}))
    world.Barrier()
    return 0


def summarize(cals: list, link_beta: float) -> dict:
    summary = {}
    for fit in ("old", "new_2mib", "new"):
        betas = [c["fits"][fit]["beta_s_per_byte"] for c in cals]
        mean = statistics.fmean(betas)
        summary[fit] = {"beta_ns_per_byte": [round(b * 1e9, 2) for b in betas],
                        "spread": (max(betas) - min(betas)) / mean,
                        "max_abs_error_vs_link": max(abs(b - link_beta) / link_beta
                                                     for b in betas)}
    gammas = [c["gamma"] for c in cals]
    summary["gamma"] = gammas
    summary["wall_s"] = [c["wall_s"] for c in cals]
    return summary


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for fit, marker in (("old", "x"), ("new_2mib", "s"), ("new", "o")):
        ys = data["summary"][fit]["beta_ns_per_byte"]
        ax.plot(range(1, len(ys) + 1), ys, marker=marker, label=fit)
    ax.axhline(data["link_beta_s_per_byte"] * 1e9, color="k", ls="--", lw=1,
               label=f"link rate ({data['link']} Mbit/s)")
    ax.set_xticks(range(1, len(data["calibrations"]) + 1))
    ax.set(xlabel="calibration (one job, one after another)", ylabel="beta (ns/B)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"calibrate's beta, emulated {data['link']} Mbit/s, P = {data['P']}")
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--link", type=float, default=200.0, help="emulated rate, Mbit/s")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--calibrations", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="calibrate's repeats (grouping.py's)")
    ap.add_argument("--contention", action="store_true", help="also measure gamma")
    ap.add_argument("--pin-cores", action="store_true")
    ap.add_argument("--autogroup-nice", type=int, default=None)
    ap.add_argument("--rank-env", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--tag", default="200mbit_p2")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))
    from emulated_network import EmulatedNetwork

    data = {"benchmark": "calibration_stability", "machine": machine_info(),
            "command": sys.argv, "link": args.link, "P": args.procs,
            "link_beta_s_per_byte": 8.0 / (args.link * 1e6)}
    cfg = {"calibrations": args.calibrations, "repeats": args.repeats,
           "contention": args.contention, "pin_cores": args.pin_cores,
           "autogroup_nice": args.autogroup_nice}
    with EmulatedNetwork(args.procs, args.link, delay_ms=0.0) as net:
        res = launch_worker(Path(__file__).resolve(), args.procs, cfg, args.timeout, net=net,
                            env=dict(kv.split("=", 1) for kv in args.rank_env), catch=False)
    if "error" in res:
        print(f"worker failed: {res['error']}", file=sys.stderr)
        return 1
    data.update(res)
    data["summary"] = summarize(data["calibrations"], data["link_beta_s_per_byte"])
    out = args.out_dir / f"calibration_stability_{args.tag}.json"
    write_record(data, out)
    plot(data, out.with_suffix(".png"))
    print(json.dumps(data["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
