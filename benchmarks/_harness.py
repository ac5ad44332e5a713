"""The benchmarks' one driver library: sizes and byte formatting, the machine
description, launching ranks (mpiexec jobs that leave a JSON fragment), timing
(calls taking turns, medians), records (JSON stamped with commit, machine and
command; ``--plot-only`` redraws) and figures (matplotlib on Agg, titled with
the machine).

Every script records what ran (machine, extension build, load) next to its numbers and
can wait for the CPUs to go quiet first. Scripts import it as ``_harness`` (they run as
``python benchmarks/<script>.py``, so ``benchmarks/`` is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = [
    "parse_size", "fmt_size", "fmt_bytes", "loadavg", "cpu_busy", "wait_for_quiet", "quiet_before",
    "file_sha1", "extension_info", "git_commit", "command_line", "driver_machine",
    "machine_info", "machine_line", "parser",
    "driver_or_worker", "add_record_options", "add_timing_options", "timing_args",
    "add_quiet_options", "add_launch_options", "add_bind_option", "bind_args", "write_record",
    "load_record", "record_or_replot", "print_header", "pyplot", "save_figure",
    "save_kernel_figure", "grouped_bars", "plain_ticks", "shade_oversubscribed", "find_mpiexec",
    "write_fragment", "kill_group", "run_fragment", "launch", "launch_worker", "sweep_fields",
    "median_time", "time_rounds", "time_per_call", "kernel_bench_start",
]


# --------------------------------------------------------------------------- sizes and the machine


def parse_size(s) -> int:
    """``"16M"`` -> 16777216 (binary K/M/G suffixes), ``"1000"`` -> 1000."""
    s = str(s).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def fmt_size(n: int) -> str:
    """Inverse of :func:`parse_size` where exact: 16777216 -> ``"16M"``."""
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


def fmt_bytes(b) -> str:
    """Decimal byte count for tables: 2570000 -> ``"2.57MB"``; None -> ``"-"``."""
    if b is None:
        return "-"
    b = float(b)
    for unit, m in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= m:
            return f"{b / m:.2f}{unit}"
    return f"{b:.0f}B"


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover
        return None


def cpu_busy(interval: float = 1.0) -> float | None:
    """Fraction of all CPUs busy (any process) over ``interval`` seconds, from /proc/stat."""
    def read():
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, total
    try:
        i0, t0 = read()
        time.sleep(interval)
        i1, t1 = read()
    except (OSError, ValueError, IndexError):  # pragma: no cover
        return None
    return round(1.0 - (i1 - i0) / max(1, t1 - t0), 3)


def wait_for_quiet(max_wait_s: float, threshold: float = 0.25) -> tuple[float | None, float]:
    """Waits up to ``max_wait_s`` until the CPUs are quiet (busy fraction below
    ``threshold`` in two consecutive 1-s samples); (last busy fraction, seconds waited)."""
    t0 = time.monotonic()
    quiet, busy = 0, cpu_busy()
    while busy is not None and time.monotonic() - t0 < max_wait_s:
        quiet = quiet + 1 if busy < threshold else 0
        if quiet >= 2:
            break
        busy = cpu_busy()
    return busy, round(time.monotonic() - t0, 1)


def quiet_before(max_wait_s: float, threshold: float = 0.25) -> tuple[float | None, float]:
    """:func:`wait_for_quiet` when ``max_wait_s`` is set, else the busy fraction over 0.5 s
    (not waited): what a measurement records of the load it started under."""
    if max_wait_s:
        return wait_for_quiet(max_wait_s, threshold)
    return cpu_busy(0.5), 0.0


def file_sha1(path) -> str:
    """The first 12 hex digits of a file's SHA-1: which version of a file ran."""
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]


def extension_info() -> dict:
    """Which build of the C++ extension ran (the library changes between runs)."""
    from jax_sparse_sync import _ext

    path = Path(_ext.cpu_module.__file__)
    st = path.stat()
    return {
        "path": str(path),
        "sha1": file_sha1(path),
        "mtime": datetime.datetime.fromtimestamp(st.st_mtime).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def git_commit() -> str | None:
    """The commit the numbers were measured on, ``+dirty`` when the tree had changes
    (``JSS_COMMIT`` names it in a copy of the tree without its ``.git``). Records in
    ``benchmarks/results/`` are not code: a run that follows another in the same tree
    (``benchmarks/headlines.py``) is still at the commit."""
    if os.environ.get("JSS_COMMIT"):
        return os.environ["JSS_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, check=True,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)benchmarks/results"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def command_line() -> str | None:
    """This process's command as run: the script's name, then its arguments."""
    return " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv else None


def driver_machine(worker_machine: dict | None) -> dict | None:
    """A sweep's ``machine`` entry: its first job's (the ranks' build, versions, commit) with
    the driver's own command as ``command`` (what reproduces the record) and the job's as
    ``worker_command``."""
    if worker_machine is None:
        return None
    return {**worker_machine, "command": command_line(),
            "worker_command": worker_machine.get("command")}


def machine_info(mpi: bool = True) -> dict:
    """Where the numbers come from: commit, command, host, CPU, accelerator, versions, build."""
    import jax
    import numpy as np

    import jax_sparse_sync as jss

    dev = jax.devices()[0]
    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": command_line(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax_version": jax.__version__,
        "jaxlib_version": getattr(__import__("jaxlib"), "__version__", None),
        "numpy_version": np.__version__,
        "jax_backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
        "jax_sparse_sync_version": jss.__version__,
        "extension": extension_info(),
        "x64": bool(jax.config.jax_enable_x64),
    }
    if mpi:
        from mpi4py import MPI

        info["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
        info["mpi4py_version"] = __import__("mpi4py").__version__
    return info


def machine_line(info: dict) -> str:
    """``"2-core AMD EPYC ..., jax 0.4.35, 2026-01-02"``: a figure title's machine."""
    return (f"{info['cpu_count']}-core {info['cpu_model']}, jax {info['jax_version']}, "
            f"{info['date'][:10]}")


# --------------------------------------------------------------------------- options


def parser(doc: str, procs: list[int] | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser, its docstring as the description (as written). With
    ``procs``: a script that runs as a worker under mpiexec and, with ``--sweep``, as the
    driver that launches it for each of ``--procs``."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if procs is not None:
        ap.add_argument("--sweep", action="store_true", help="driver: one mpiexec job per --procs")
        ap.add_argument("--procs", nargs="+", type=int, default=procs)
    return ap


def driver_or_worker(args, driver, worker) -> int:
    """A sweep script's entry (:func:`parser` with ``procs``): ``driver(args)`` with
    ``--sweep`` or ``--plot-only``, else ``worker(args)`` (one job's rank)."""
    return driver(args) if args.sweep or getattr(args, "plot_only", False) else worker(args)


def add_record_options(ap, out, png: bool = True, plot_only: bool = True) -> None:
    """``--out`` (default ``out``; None: the script picks), ``--png`` (default: ``--out`` with
    .png), ``--plot-only``."""
    ap.add_argument("--out", default=None if out is None else str(out))
    if png:
        ap.add_argument("--png", default=None, help="default: --out with .png")
    if plot_only:
        ap.add_argument("--plot-only", action="store_true", help="redraw table and PNG from --out")


def add_timing_options(ap, repeats: int | None, warmup: int = 2, help: str | None = None,
                       minimum: int | None = None) -> None:
    """``--repeats`` (timed rounds; medians are reported), ``--warmup`` (untimed calls
    first; with ``minimum``, both at least that) and ``--seed``; :func:`timing_args` passes
    them on to a worker."""
    def count(text: str) -> int:
        n = int(text)
        if minimum is not None and n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (the first call compiles "
                                             "and provides the checked result)")
        return n

    ap.add_argument("--repeats", type=count, default=repeats, help=help)
    ap.add_argument("--warmup", type=count, default=warmup)
    ap.add_argument("--seed", type=int, default=0)


def timing_args(args) -> list:
    """A worker's ``--repeats --warmup --seed``: the driver's own (:func:`add_timing_options`)."""
    return ["--repeats", args.repeats, "--warmup", args.warmup, "--seed", args.seed]


def add_quiet_options(ap, default: float = 0.0, busy: bool = True) -> None:
    """``--quiet-wait S`` (and ``--quiet-busy``): wait for a quiet machine before measuring."""
    ap.add_argument("--quiet-wait", type=float, default=default, metavar="S",
                    help="before measuring, wait up to S seconds for the CPUs to be quiet "
                         "(busy fraction < --quiet-busy; for shared machines); "
                         f"default {default:g}")
    if busy:
        ap.add_argument("--quiet-busy", type=float, default=0.25)


def add_launch_options(ap, timeout: float, mpiexec_args: bool = True, keep: bool = False) -> None:
    """A sweep driver's options: ``--timeout`` per mpiexec job, ``--mpiexec-args``,
    ``--keep-fragments`` and the worker's ``--fragment``."""
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds per mpiexec job")
    if mpiexec_args:
        ap.add_argument("--mpiexec-args", default="",
                        help="extra mpiexec arguments as one string, e.g. "
                             '--mpiexec-args="-bind-to core"')
    if keep:
        ap.add_argument("--keep-fragments", action="store_true")
    ap.add_argument("--fragment", default=None, help="worker: where rank 0 writes its JSON")


def add_bind_option(ap) -> None:
    """``--bind-to SPEC``: MPICH's ``-bind-to`` for the ranks of a plain ``mpiexec`` job
    (``core:C``: C cores of its own per rank, as on a cluster; unset: no binding)."""
    ap.add_argument("--bind-to", default=None, metavar="SPEC",
                    help="MPICH -bind-to for plain mpiexec jobs, e.g. core:4 (each rank its own "
                         "4 cores); default none")


def bind_args(args) -> list[str]:
    """The mpiexec arguments of ``--bind-to`` (none when unset)."""
    spec = getattr(args, "bind_to", None)
    return ["-bind-to", spec] if spec else []


# --------------------------------------------------------------------------- records and tables


def write_record(data: dict, path, indent: int | None = 1, **dumps) -> Path:
    """Writes a benchmark's JSON record (creating its folder) and says where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, **dumps) + "\n")
    print(f"\nwrote {path}", flush=True)
    return path


def load_record(path) -> dict:
    return json.loads(Path(path).read_text())


def record_or_replot(args, run, show=None, plot=None, indent: int | None = 1) -> int:
    """The common end of a benchmark: measure (``run()`` returns the record, or None when
    nothing succeeded) and write ``args.out``, or with ``args.plot_only`` read it back;
    then print its table (``show(data)``) and draw ``plot(data, png)`` beside it
    (``args.png``, else ``--out`` with ``.png``). Exit status: 0, 1 when nothing ran,
    2 when the record lists failures."""
    out = Path(args.out)
    if getattr(args, "plot_only", False):
        data = load_record(out)
    else:
        data = run()
        if data is None:
            print("nothing succeeded", file=sys.stderr)
            return 1
        write_record(data, out, indent)
    if show is not None:
        show(data)
    if plot is not None:
        png = Path(args.png) if getattr(args, "png", None) else out.with_suffix(".png")
        plot(data, png)
        print(f"wrote {png}", flush=True)
    return 2 if data.get("failures") else 0


def print_header(hdr: str) -> None:
    """A table's header line and a rule under it."""
    print(hdr)
    print("-" * len(hdr))


# --------------------------------------------------------------------------- figures


def pyplot():
    """matplotlib.pyplot on the Agg backend (the benchmarks draw PNGs, never a window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, title: str | None = None, dpi: int = 110, fontsize: float = 10,
                **layout) -> None:
    """Titles (``title``), lays out, saves and closes a figure."""
    if title is not None:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def save_kernel_figure(fig, path, what: str, info: dict, dpi: int = 110) -> None:
    """Titles a kernel benchmark's figure with the machine it ran on, saves and closes it."""
    save_figure(fig, path, f"{what}: {info['device']} ({info['jax_backend']}), {info['cpu_count']} "
                f"CPUs {info['cpu_model']}, jax {info['jax_version']}, {info['date'][:10]}",
                dpi=dpi, fontsize=9)


def grouped_bars(ax, groups, series: dict, width: float = 0.8, **bar) -> dict:
    """Bars side by side: a group per entry of ``groups`` (its tick label), in each a bar
    per ``series`` item (name: one value per group; the legend label). Returns the bars."""
    import numpy as np

    x, w = np.arange(len(groups)), width / len(series)
    bars = {name: ax.bar(x + (j - (len(series) - 1) / 2) * w, values, w, label=name, **bar)
            for j, (name, values) in enumerate(series.items())}
    ax.set_xticks(x, groups)
    return bars


def plain_ticks(axis, fmt=lambda v: f"{v:g}", minor: bool = True) -> None:
    """A log axis's tick labels as plain numbers (``fmt(value)``), the minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    if minor:
        axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def shade_oversubscribed(ax, ps, cpu_count: int) -> None:
    """Shades the ranks counts ``ps`` above ``cpu_count``: those ranks share cores."""
    over = [p for p in ps if p > cpu_count]
    if over:
        ax.axvspan(min(over) - 0.5, max(ps) + 0.5, color="orange", alpha=0.08,
                   label=f"oversubscribed (> {cpu_count} cores)")


# --------------------------------------------------------------------------- launching ranks


def find_mpiexec(error: type[Exception] = SystemExit) -> str:
    """The venv's mpiexec (the `mpich` wheel's) first, else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if not found:
        raise error("mpiexec not found (install the `mpich` wheel or an MPI with mpiexec)")
    return found


def write_fragment(data: dict, path) -> Path:
    """Rank 0's JSON fragment of an mpiexec worker run (the sweep driver merges them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"# wrote fragment {path}", flush=True)
    return path


def kill_group(proc: subprocess.Popen, wait_s: float = 5) -> None:
    """Ends a job started with ``start_new_session=True`` and its process group (mpiexec
    and its ranks): SIGTERM, then SIGKILL after ``wait_s`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_fragment(cmd: list, fragment, timeout: float, env: dict | None = None,
                 keep: bool = False) -> dict:
    """Runs one mpiexec worker command that writes `fragment` and returns its data, with
    ``wall_s``, or ``{"error": ..., "records": []}`` when mpiexec failed or ran past
    `timeout` (its process group is then ended: SIGTERM, then SIGKILL)."""
    fragment = Path(fragment)
    t0 = time.monotonic()
    proc = subprocess.Popen([str(c) for c in cmd], start_new_session=True, env=env)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc, 10)
        return {"error": f"timed out after {timeout}s", "records": []}
    if rc != 0 or not fragment.exists():
        return {"error": f"mpiexec exited with {rc}", "records": []}
    data = json.loads(fragment.read_text())
    data["wall_s"] = round(time.monotonic() - t0, 1)
    if not keep:
        fragment.unlink()
    return data


def launch(script, p: int, script_args, fragment, timeout: float, *, mpiexec_args="",
           env: dict | None = None, keep: bool = False, quiet_wait: float = 0.0,
           quiet_busy: float = 0.25, mpi4py: bool = False) -> dict:
    """One job of a sweep: ``script`` on ``p`` ranks (mpiexec, ``--fragment`` appended to
    ``script_args``) after :func:`quiet_before`, under ``timeout``: its fragment
    (:func:`run_fragment`) with ``P``, the CPU busy fraction before and the seconds waited."""
    import shlex

    fragment = Path(fragment)
    fragment.parent.mkdir(parents=True, exist_ok=True)
    fragment.unlink(missing_ok=True)
    extra = shlex.split(mpiexec_args) if isinstance(mpiexec_args, str) else list(mpiexec_args)
    cmd = [find_mpiexec(), *extra, "-n", str(p), sys.executable,
           *(["-m", "mpi4py"] if mpi4py else []), str(script), *map(str, script_args),
           "--fragment", str(fragment)]
    busy, waited = quiet_before(quiet_wait, quiet_busy)
    print(f"$ {' '.join(cmd)}   [cpu busy before: {busy}, waited {waited}s]", flush=True)
    return {"P": p, **run_fragment(cmd, fragment, timeout, env=env, keep=keep),
            "cpu_busy_before": busy, "quiet_waited_s": waited}


def launch_worker(script, nranks: int, cfg: dict, timeout: float, *, net=None,
                  env: dict | None = None, mpiexec_args=(), partial: bool = False,
                  catch: bool = True) -> dict:
    """One worker job: ``python -m mpi4py script --worker CONFIG`` on ``nranks`` ranks, with
    ``cfg`` (and the ``fragment`` path its rank 0 writes) in CONFIG, a JSON file in a fresh
    temporary folder. Plain mpiexec (shared memory; ``mpiexec_args`` such as
    :func:`bind_args`), or given ``net`` (an ``emulated_network.EmulatedNetwork``) its
    namespaces and links. ``env``: added to the ranks' environment.

    Returns the fragment, or ``{"error": ..., "records": []}`` where the job failed, timed
    out (``net``'s exception raised instead when not ``catch``) or wrote nothing (with
    ``partial``: what it had written, with its ``error``)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jss_worker") as tmp:
        os.chmod(tmp, 0o755)
        frag = Path(tmp) / "fragment.json"
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(dict(cfg, fragment=str(frag))))
        wargs = ["-m", "mpi4py", str(script), "--worker", str(cfg_path)]
        if net is None:
            data = run_fragment([find_mpiexec(), *mpiexec_args, "-n", nranks, sys.executable,
                                 *wargs], frag, timeout, env={**os.environ, **(env or {})},
                                keep=True)
        else:
            t0 = time.monotonic()
            try:
                rc = net.launch(wargs, timeout=timeout, nranks=nranks, env=env or {},
                                capture=False, stream=True).returncode
            except Exception as e:  # timeouts: recorded, the sweep goes on
                if not catch:
                    raise
                return {"error": f"{type(e).__name__}: {str(e)[:400]}", "records": []}
            data = ({**load_record(frag), "wall_s": round(time.monotonic() - t0, 1)}
                    if rc == 0 and frag.exists()
                    else {"error": f"mpiexec exited with {rc}", "records": []})
        if partial and "error" in data and frag.exists():
            data = {**load_record(frag), "error": data["error"]}
        return data


def sweep_fields(frags: list[dict]) -> dict:
    """What a sweep's record says of its jobs (each a :func:`launch` result): the machine
    (of the first that succeeded), failures, wall seconds and CPU load before each."""
    ok = [f for f in frags if f.get("records")]
    return {
        "machine": driver_machine(ok[0]["machine"]) if ok else None,
        "failures": [{"P": f["P"], "error": f["error"]} for f in frags if f.get("error")],
        "wall_s": {str(f["P"]): f.get("wall_s") for f in ok},
        "cpu_busy_before_launch": {str(f["P"]): f.get("cpu_busy_before") for f in ok},
    }


# --------------------------------------------------------------------------- timing


def median_time(fn, repeats: int, warmup: int = 0) -> float:
    """Median seconds of ``fn()`` (which waits for its own result) over ``repeats`` calls,
    after ``warmup`` untimed calls."""
    import statistics

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_rounds(calls: dict, rounds: int, comm=None,
                slowest: bool = False) -> dict[str, list[float]]:
    """Seconds per call of each ``calls[name]()`` (blocked on), over ``rounds`` rounds in
    which the calls take turns (A, B, C, A, B, C, ...) so that the machine's noise and
    drift hit them alike. With ``comm``, a barrier before every call; with ``slowest``,
    each time is the max over ranks (a collective is done when its slowest rank is)."""
    import jax

    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            if comm is not None:
                comm.Barrier()
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            dt = time.perf_counter() - t0
            if slowest:
                from mpi4py import MPI

                dt = comm.allreduce(dt, op=MPI.MAX)
            times[name].append(dt)
    return times


def time_per_call(fn, calls_per_sample: int) -> float:
    """Seconds per call of fn(): `calls_per_sample` calls queued, one wait for the last."""
    import jax

    t0 = time.perf_counter()
    for _ in range(calls_per_sample):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls_per_sample


def kernel_bench_start(name: str, calls_per_sample: int | None) -> tuple[dict, int]:
    """The machine info of a kernel benchmark, printed, and its calls per sample (default
    20 on a GPU, queued back to back before one wait; 1 on the CPU)."""
    import jax

    if calls_per_sample is None:
        calls_per_sample = 1 if jax.default_backend() == "cpu" else 20
    info = machine_info(mpi=False)
    print(f"# {name} benchmark  jax {info['jax_version']}  backend {info['jax_backend']}  "
          f"device {info['device']}  cpus {info['cpu_count']}  ({info['cpu_model']})", flush=True)
    return info, calls_per_sample
