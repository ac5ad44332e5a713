"""step_time.py's launcher: the ranks' environment, one worker job (plain mpiexec, the
emulated network or the psum process) and the sweep over links, P, models and repeats."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _harness import bind_args, launch_worker, machine_info, quiet_before, run_fragment

from .modes import LR
from .models import model_config
from .report import finish, plot, print_table

#: the script whose ``--worker`` / ``--psum-worker`` runs a job
ENTRY = Path(__file__).resolve().parent.parent / "step_time.py"
DEFAULT_ALPHA_S = 20e-6   # used on an emulated link when the ping probe failed
# glibc malloc: keep the step's N-float buffers (above sparcml_fig3.py's 32 MiB threshold)
# on the heap instead of mmap'ing and page-faulting them anew every step; one arena, as
# XLA's worker threads' own arenas unmap their heaps (docs/performance.md)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
              "MALLOC_ARENA_MAX": "1"}
# MPICH: yield the core while waiting, so that a rank in a collective does not spin on a
# core that a rank still computing needs (oversubscribed only, ``--heavy-yield auto``;
# results/step_time_model_p4_yield.json)
HEAVY_YIELD_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


def heavy_yield(args, nranks: int) -> bool:
    """Whether a job of ``nranks`` ranks runs with ``HEAVY_YIELD_ENV`` (``--heavy-yield``:
    ``on``, ``off``, or ``auto``: when the ranks outnumber the cores)."""
    if args.heavy_yield == "auto":
        return nranks > (os.cpu_count() or 1)
    return args.heavy_yield == "on"


def rank_env(args, nranks: int | None = None) -> dict:
    """Environment of every rank (and of the psum process) of a job of ``nranks`` ranks
    (None: the part common to every job)."""
    env = dict(kv.split("=", 1) for kv in args.rank_env)
    if nranks is not None and heavy_yield(args, nranks):
        env.update(HEAVY_YIELD_ENV)
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    return env


def launch(kind: str, cfg: dict, nranks: int, args, net=None, script=None) -> dict:
    """Runs one worker job (``kind`` ``mpi``: :func:`_harness.launch_worker`, or ``psum``)
    and returns its fragment (``{"error": ..., "records": []}`` on failure or timeout).
    ``script``: another benchmark whose ``--worker CONFIG`` runs the job (default
    step_time.py)."""
    script, cfg = str(script or ENTRY), dict(cfg, P=nranks)
    if kind == "mpi":
        return launch_worker(script, nranks, cfg, args.timeout, net=net,
                             env=rank_env(args, nranks), mpiexec_args=bind_args(args))
    with tempfile.TemporaryDirectory(prefix="jss_step_time") as tmp:
        frag, cfg_path = Path(tmp) / "fragment.json", Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(dict(cfg, fragment=str(frag))))
        flags = os.environ.get("XLA_FLAGS", "")
        env = {**os.environ, **rank_env(args, nranks),
               "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={nranks}"}
        return run_fragment([sys.executable, script, "--psum-worker", str(cfg_path)], frag,
                            args.timeout, env=env)


def probe_link(net) -> dict:
    """Latency and achieved rate of an emulated link (emulated_network's MPI probe)."""
    try:
        pr = net.measure_rate(4 << 20, repeats=3, timeout=180, allreduce=False)
        return {"one_way_latency_s": pr.get("one_way_latency_s"),
                "achieved_mbit": pr.get("achieved_mbit"), "probe": pr}
    except Exception as e:  # the benchmark can go on with --alpha-us / the default
        return {"one_way_latency_s": None, "achieved_mbit": None, "probe_error": str(e)[:400]}


def link_record(link: str, rate: float | None, net, args) -> dict:
    """A link's record: its network, and on an emulated one the probe and the model's
    alpha (``--alpha-us``, else the measured latency)."""
    lk = {"name": link, "rate_mbit": rate}
    if net is None:
        lk["network"] = {"transport": "MPICH shared memory (plain mpiexec)"}
        return lk
    lk["network"] = net.describe()
    lk.update(probe_link(net))
    lk["alpha_s"] = (args.alpha_us * 1e-6 if args.alpha_us is not None
                     else lk["one_way_latency_s"] or DEFAULT_ALPHA_S)
    print(f"# link {link} Mbit/s: one-way latency "
          f"{(lk['one_way_latency_s'] or 0) * 1e6:.1f} us, 2-rank Sendrecv "
          f"{lk['achieved_mbit'] or 0:.0f} Mbit/s; model alpha "
          f"{lk['alpha_s'] * 1e6:.1f} us", flush=True)
    return lk


def save(data: dict, out: Path, png: Path | None = None, note: str = "") -> None:
    """Adds the breakdown and predictions (:func:`finish`) and writes the JSON; with
    ``png``, prints the table and draws the figure too."""
    finish(data)
    out.write_text(json.dumps(data, indent=1) + "\n")
    if png is not None:
        print_table(data)
        plot(data, png)
        print(f"# wrote {out} and {png}{note}")


def driver(args) -> int:
    """Runs every (link, P, model) job, merges the fragments, writes JSON and PNG."""
    out = args.out_dir / f"step_time_{args.tag}.json"
    png = out.with_suffix(".png")
    if args.plot_only:
        save(json.loads(out.read_text()), out, png)
        return 0
    from emulated_network import EmulatedNetwork, usable

    ncpu = os.cpu_count() or 1
    mpi_modes = [m for m in args.modes if m != "psum"]
    data = {
        "benchmark": "step_time", "command": [sys.executable, *sys.argv],
        "machine": machine_info(), "models": {m: model_config(args, m) for m in args.models},
        "modes": args.modes, "procs": args.procs, "steps": args.steps, "warmup": args.warmup,
        "max_seconds_per_mode": args.max_seconds_per_mode, "seed": args.seed, "lr": LR,
        "optimizer": args.optimizer, "batches": args.batches,
        "rank_env": rank_env(args), "heavy_yield": args.heavy_yield, "bind_to": args.bind_to,
        "heavy_yield_env": HEAVY_YIELD_ENV,
        "note": (f"{ncpu} cores: runs with P > {ncpu} ranks oversubscribe the CPU (accepted; "
                 "the step then measures CPU sharing as much as the network). Emulated links: "
                 "tc tbf, no added delay."),
        "repeats": args.repeats,
        "links": [], "runs": [], "records": [], "failures": [],
    }
    print(f"# step_time: models {' '.join(args.models)}; links {' '.join(args.links)}; P "
          f"{' '.join(map(str, args.procs))}; {len(args.modes)} modes; {data['note']}",
          flush=True)
    emulated = [lk for lk in args.links if lk != "shm"]
    if emulated:
        ok, why = usable()
        if not ok:
            raise SystemExit(f"emulated network not usable: {why}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for link in args.links:
        rate = None if link == "shm" else float(link)
        ctx = (EmulatedNetwork(max(args.procs), rate, delay_ms=0.0) if rate
               else contextlib.nullcontext())
        with ctx as net:
            data["links"].append(link_record(link, rate, net, args))
            for repeat, p, model in itertools.product(range(args.repeats), args.procs,
                                                      args.models):
                # one job per (repeat, P, model): a repeat's jobs run before the next's
                cfg = {"model": model, "model_cfg": model_config(args, model),
                       "link": link, "modes": mpi_modes, "steps": args.steps,
                       "warmup": args.warmup, "max_seconds": args.max_seconds_per_mode,
                       "seed": args.seed, "optimizer": args.optimizer,
                       "batches": args.batches}
                jobs = [("mpi", mpi_modes)] if mpi_modes else []
                if "psum" in args.modes and link == "shm":
                    jobs.append(("psum", ["psum"]))
                for kind, _ in jobs:
                    busy, waited = quiet_before(args.quiet_wait)
                    print(f"[{time.strftime('%H:%M:%S')}] {model} {link} P={p} {kind}"
                          f"{f' repeat {repeat + 1}/{args.repeats}' if args.repeats > 1 else ''}"
                          f"{' (oversubscribed)' if p > ncpu else ''}; cpu busy before "
                          f"{busy} (t+{time.monotonic() - t0:.0f}s)", flush=True)
                    frag = launch(kind, cfg, p, args, net)
                    if frag.get("error"):
                        print(f"!! {model} {link} P={p} {kind}: {frag['error']}", flush=True)
                        data["failures"].append({"model": model, "link": link, "P": p,
                                                 "kind": kind, "error": frag["error"]})
                    for r in frag["records"]:
                        r.update(model=model, link=link, rate_mbit=rate, repeat=repeat,
                                 oversubscribed=p > ncpu, cpu_busy_before=busy,
                                 heavy_yield=heavy_yield(args, p),
                                 job_wall_s=frag.get("wall_s"),
                                 local_work_calibrated=frag.get("local_work", []))
                        data["runs"].append(r)
                    data["wall_s"] = round(time.monotonic() - t0, 1)
                    save(data, out)  # partial results
    save(data, out, png, f" (total {time.monotonic() - t0:.0f}s)")
    return 1 if data["failures"] else 0
