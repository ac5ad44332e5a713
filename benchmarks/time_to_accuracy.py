"""Time to accuracy, measured: every mode trained, then timed on the link, the ideal beside it.

One command per (model, link, P): (1) **trains** every mode of ``convergence.MODES``
(``convergence.run_one``: one seeded ``mpiexec -n P`` run of the example each, on shared
memory under ``nice -n 19``); (2) **times** every mode's training step, the example's own
optimizer and sync built from the mode's arguments, on ``step_time.py``'s model, in ONE
MPI job on the emulated link (``emulated_network.py``; needs root): compiled at
``--compile-nice``, then timed under ``flock /tmp/jss_measure.lock``, each step on its
own, a warm-up mode's phases ``--steps-per-phase`` steps each, the modes interleaved over
``--timing-repeats`` repeats (median), with ``none`` (no sync) beside them; (3) **joins**
them (``convergence.elapsed``, ``mode_record``): time to dense's final metric,
``ideal_time_s`` (the no-sync step x dense's steps) and ``fraction_of_ideal``, also
against ``dense_bf16`` (``*_bf16``) and, with ``--smooth K``, on K-evaluation means
(``*_smoothed``). The method and the results: docs/topics/time_to_accuracy.md.

Commands (from the repository root; root for the emulated link)::

    python benchmarks/time_to_accuracy.py --model lm --link 1000 --procs 4
    python benchmarks/time_to_accuracy.py --model lm --link 200 --resume  # reuse the runs
    python benchmarks/time_to_accuracy.py --model lm --link 1000 --plot-only

Writes ``benchmarks/results/time_to_accuracy_<model>_<link>_p<P>.{json,png}``. The runs
and the timing stay in ``--work-dir`` for ``--resume``; ``--train-only`` and
``--timing-only`` split one command into jobs.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence  # noqa: E402  (the training runs, their modes and the time axis)
import step_time  # noqa: E402  (the timed model, the step and the MPI job launcher)
from step_timing.models import setup  # noqa: E402
from _harness import (load_record, machine_info, pyplot, save_figure, write_fragment,  # noqa: E402
                      write_record)

ROOT = HERE.parent
RESULTS = HERE / "results"
#: the mode timed for the ideal: the dense mode's optimizer around no sync
NO_SYNC = "none"
BASELINE = "dense"
BASELINE_BF16 = "dense_bf16"
#: the default modes: the two dense baselines, the best configuration of issue 32's
#: measurements (Adam direction, momentum masking, DGC ramp) and its warm-up variants
DEFAULT_MODES = ("dense", "dense_bf16", "topk_1pct_adamdir_mask_ramp",
                 "topk_1pct_adamdir_mask_ramp_bf16", "topk_1pct_adamdir_mask_ramp_start6_bf16",
                 "topk_1pct_adamdir_mask_ramp10_bf16")
#: the example's model in step_time.py
STEP_TIME_MODEL = {"lm": "transformer", "cnn": "cnn"}
MEASURE_LOCK = "/tmp/jss_measure.lock"


def link_name(rate_mbit: float) -> str:
    """A link's name in file names: 1000 -> ``"1gbit"``, 200 -> ``"200mbit"``."""
    if rate_mbit >= 1000 and rate_mbit % 1000 == 0:
        return f"{rate_mbit / 1000:g}gbit"
    return f"{rate_mbit:g}mbit"


def result_base(out_dir: Path, model: str, rate_mbit: float, procs: int, tag: str = "") -> Path:
    """``<out_dir>/time_to_accuracy_<model>_<link>_p<P>[_<tag>]`` (no suffix)."""
    return Path(out_dir) / (f"time_to_accuracy_{model}_{link_name(rate_mbit)}_p{procs}"
                            + (f"_{tag}" if tag else ""))


# --------------------------------------------------------------------------- the join


def timing_argv(mode: str, steps_per_phase: int) -> list[str]:
    """The example arguments of ``mode``'s timed step: its training arguments with every
    warm-up phase shortened to ``steps_per_phase`` steps (the program is the same; the
    phase boundaries move), and ``--steps`` covering them (the learning-rate schedule's
    length, which does not change the step's work)."""
    if steps_per_phase < 1:
        raise ValueError(f"time_to_accuracy: --steps-per-phase must be >= 1, got "
                         f"{steps_per_phase}")
    argv = list(convergence.MODES[BASELINE if mode == NO_SYNC else mode][0])
    for flag in ("--density-ramp", "--dense-warmup"):
        if flag in argv:
            i = argv.index(flag)
            if int(argv[i + 1]) > 0:
                argv[i + 1] = str(steps_per_phase)
    return [*argv, "--steps", str(8 * steps_per_phase)]


def phase_step_times(run_phases: list, timed: dict, mode: str) -> tuple[list, float]:
    """Joins a training run's warm-up (``[[steps, density], ...]``) with its mode's timing
    (``phases``: ``[{"density", "step_s"}, ...]``, the warm-up phases, then the mode's own
    steps): ``([(steps, step_s), ...] of the warm-up, the step time after it)``; a
    ValueError where the timed phases are not the trained ones."""
    phases = timed["phases"]
    if len(phases) != len(run_phases) + 1 or any(
            abs(float(p["density"]) - float(d)) > 1e-12 for p, (_, d) in zip(phases, run_phases)):
        raise ValueError(f"time_to_accuracy: {mode}: the timed phases "
                         f"{[p['density'] for p in phases]} are not the trained warm-up "
                         f"{run_phases} + the mode's own steps; re-run the timing")
    return ([(int(n), float(p["step_s"])) for (n, _), p in zip(run_phases, phases)],
            float(phases[-1]["step_s"]))


def time_to(step: int | None, run_phases: list, timed: dict, mode: str) -> float | None:
    """Seconds on the link to ``step`` of a run (None: never reached)."""
    warm, step_s = phase_step_times(run_phases, timed, mode)
    return convergence.elapsed(step, step_s, warm)


def repeats_of(*timed: dict) -> int:
    """How many timing repeats every phase of every ``timed`` record holds
    (``repeats_step_s``); 0 where any lacks them or their counts differ."""
    counts = {len(p.get("repeats_step_s") or ()) for t in timed for p in t["phases"]}
    return counts.pop() if len(counts) == 1 else 0


def in_repeat(timed: dict, r: int) -> dict:
    """``timed`` with each phase's ``step_s`` taken from repeat ``r`` alone."""
    return {"phases": [dict(p, step_s=p["repeats_step_s"][r]) for p in timed["phases"]]}


def paired_fractions(mode: str, run: dict, base_run: dict, base: str, timing: dict,
                     steps: int | None, base_steps: int | None, suffix: str = "") -> dict:
    """The fraction of the ideal and the speed-up over ``base`` within each timing repeat
    (modes timed back to back), then their median over repeats with the quartiles;
    ``suffix``: the keys' suffix (``"_bf16"`` against the bf16 baseline)."""
    import statistics

    reps = repeats_of(timing[mode], timing[NO_SYNC], timing[base])
    if not reps or not steps or not base_steps:
        return {f"fraction_of_ideal{suffix}_paired": None,
                f"fraction_of_ideal{suffix}_paired_quartiles": None,
                f"fraction_of_ideal{suffix}_per_repeat": None,
                f"speedup_over_dense{suffix}_paired": None, "timing_repeats_paired": reps}
    fractions, speedups = [], []
    for r in range(reps):
        t = time_to(steps, run.get("warmup_phases", []), in_repeat(timing[mode], r), mode)
        dense_t = time_to(base_steps, base_run.get("warmup_phases", []),
                          in_repeat(timing[base], r), base)
        ideal = float(timing[NO_SYNC]["phases"][-1]["repeats_step_s"][r]) * base_steps
        fractions.append(ideal / t)
        speedups.append(dense_t / t)
    q = statistics.quantiles(fractions, n=4) if reps > 1 else [fractions[0]] * 3
    return {f"fraction_of_ideal{suffix}_paired": statistics.median(fractions),
            f"fraction_of_ideal{suffix}_paired_quartiles": [q[0], q[2]],
            f"fraction_of_ideal{suffix}_per_repeat": fractions,
            f"speedup_over_dense{suffix}_paired": statistics.median(speedups),
            "timing_repeats_paired": reps}


def eval_grid(history, metric: str) -> int | None:
    """The steps between a run's evaluations: the smallest gap between two steps of
    ``history`` that hold ``metric`` (None with fewer than two)."""
    steps = sorted(h["step"] for h in history if h.get(metric) is not None)
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    return min(gaps) if gaps else None


def smoothed_history(history: list, metric: str, evaluations: int) -> list:
    """``history`` with ``metric`` replaced by its mean over the last ``evaluations``
    evaluations (after step 0), from the first step that has that many; 1: as it is."""
    if evaluations <= 1:
        return history
    points = [(h["step"], h[metric]) for h in history
              if h.get(metric) is not None and h["step"] > 0]
    return [{"step": points[i][0],
             metric: sum(v for _, v in points[i + 1 - evaluations:i + 1]) / evaluations}
            for i in range(evaluations - 1, len(points))]


def mode_record(mode: str, run: dict, timing: dict, runs: dict, metric: str,
                lower: bool, smooth: int = 1) -> dict:
    """One mode's time-to-accuracy record from its training ``run`` (the example's JSON),
    every mode's ``timing`` (with :data:`NO_SYNC`, :data:`BASELINE`, optionally
    :data:`BASELINE_BF16`) and ``runs``: ``steps_to_target``, ``time_to_target_s``,
    ``dense_time_s``, ``ideal_time_s``, ``fraction_of_ideal``, the speed-ups, the same
    against :data:`BASELINE_BF16` (``*_bf16``) and, with ``smooth`` > 1, against dense
    with every metric read as the mean of its last ``smooth`` evaluations
    (``*_smoothed``). ``lower``: whether lower ``metric`` is better."""
    no_sync_s = float(timing[NO_SYNC]["phases"][-1]["step_s"])
    rec = {"mode": mode, "sync": run.get("sync"), "k": run.get("k"),
           "steps": run["config"]["steps"], "example_args": convergence.MODES[mode][0],
           "final_metric": run["final"][metric],
           "eval_every": eval_grid(run["history"], metric),
           "warmup_phases": run.get("warmup_phases", []),
           "timed_as": convergence.schedule_base(mode) or mode,
           "phase_step_s": [p["step_s"] for p in timing[mode]["phases"]],
           "step_s": timing[mode]["phases"][-1]["step_s"], "no_sync_step_s": no_sync_s,
           "replicas_identical": run["final"].get("replicas_identical"),
           "run_source": run.get("run_source", "trained by this command")}
    against = [("", BASELINE, 1), ("_bf16", BASELINE_BF16, 1)]
    if smooth > 1:
        against.append(("_smoothed", BASELINE, smooth))
        rec["smooth_evaluations"] = smooth
    for suffix, base, evaluations in against:
        # the bf16 baseline timed but not trained: its step time with dense's
        # convergence (flagged: rounding the sum to 16 bits may change it slightly)
        assumed = base == BASELINE_BF16 and base not in runs and base in timing
        rec[f"baseline{suffix}_convergence"] = (
            "dense's run (no dense_bf16 run: its convergence assumed equal)" if assumed
            else base if base in runs else None)
        if (base not in runs and not assumed) or base not in timing:
            rec.update({f"target{suffix}": None, f"steps_to_target{suffix}": None,
                        f"time_to_target{suffix}_s": None, f"dense_time{suffix}_s": None,
                        f"ideal_time{suffix}_s": None, f"fraction_of_ideal{suffix}": None,
                        f"speedup_over_dense{suffix}": None,
                        f"ideal_speedup_over_dense{suffix}": None})
            continue
        brun = runs[BASELINE] if assumed else runs[base]
        base_history = smoothed_history(brun["history"], metric, evaluations)
        history = smoothed_history(run["history"], metric, evaluations)
        if evaluations > 1 and not (base_history and history):
            raise ValueError(f"time_to_accuracy: --smooth {evaluations} needs at least "
                             f"{evaluations} evaluations in every run")
        target = brun["final"][metric] if evaluations == 1 else base_history[-1][metric]
        base_steps = convergence.first_reach(base_history, metric, target, lower)
        dense_time = time_to(base_steps, brun.get("warmup_phases", []), timing[base], base)
        ideal = no_sync_s * base_steps if base_steps else None
        steps = convergence.first_reach(history, metric, target, lower)
        t = time_to(steps, run.get("warmup_phases", []), timing[mode], mode)
        final = run["final"][metric] if evaluations == 1 else history[-1][metric]
        rec.update({
            f"target{suffix}": target, f"steps_to_target{suffix}": steps,
            f"time_to_target{suffix}_s": t, f"dense_time{suffix}_s": dense_time,
            f"ideal_time{suffix}_s": ideal,
            f"fraction_of_ideal{suffix}": ideal / t if ideal and t else None,
            f"speedup_over_dense{suffix}": dense_time / t if dense_time and t else None,
            f"ideal_speedup_over_dense{suffix}": dense_time / ideal if dense_time and ideal
            else None,
            # relative for a loss (> 0: worse than the baseline), points for an accuracy
            f"gap_to_dense{suffix}": (final - target) / target if lower else final - target})
        # the same ratios within each timing repeat, then their median
        rec.update(paired_fractions(mode, run, brun, base, timing, steps, base_steps, suffix))
    return rec


def build_result(model: str, rate_mbit: float, procs: int, runs: dict, timing: dict,
                 link: dict | None = None, smooth: int = 1) -> dict:
    """The JSON of one (model, link, P): per-mode records (:func:`mode_record`; with
    ``smooth`` > 1 also its ``*_smoothed`` fields), each with ``model``, ``link``,
    ``P``, and the histories for the plot."""
    spec = convergence.MODELS[model]
    metric, lower = spec["metric"], spec["lower_is_better"]
    if BASELINE not in runs:
        raise ValueError("time_to_accuracy: the dense mode is the target and the baseline; "
                         "add `dense` to --modes")
    for needed in (NO_SYNC, BASELINE):
        if needed not in timing:
            raise ValueError(f"time_to_accuracy: no timing of {needed!r}")
    grids = {mode: eval_grid(run["history"], metric) for mode, run in runs.items()}
    if len(set(grids.values())) > 1:
        # steps to target are rounded up to each run's grid: a coarser grid would
        # charge its mode up to a grid's worth of steps more than another's
        raise ValueError(f"time_to_accuracy: the runs were evaluated on different grids "
                         f"(steps between evaluations: {grids}); train them with one "
                         f"--eval-every")
    name = link_name(rate_mbit)
    records = [dict({"model": model, "link": name, "link_mbit": rate_mbit, "P": procs},
                    **mode_record(mode, run, timing, runs, metric, lower, smooth))
               for mode, run in runs.items()]
    return {"benchmark": "time_to_accuracy", "model": model, "link": name,
            "link_mbit": rate_mbit, "P": procs, "metric": metric, "lower_is_better": lower,
            "records": records, "link_probe": link, "timing": timing,
            "series": {m: [[h["step"], h[metric]] for h in r["history"]
                           if h.get(metric) is not None] for m, r in runs.items()}}


# --------------------------------------------------------------------------- timing


def load_example(script: str):
    """The example module (``examples/train_lm.py`` / ``train_resnet.py``) by path."""
    path = ROOT / script
    spec = importlib.util.spec_from_file_location(f"_tta_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def worker(cfg: dict) -> int:
    """One MPI job: every mode's training step compiled, then timed phase by phase in
    ``cfg["repeats"]`` interleaved repeats."""
    import jax
    import numpy as np
    import optax
    from mpi4py import MPI

    import jax_sparse_sync as jss

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    world = MPI.COMM_WORLD
    rank, nranks = world.Get_rank(), world.Get_size()
    t_start = time.monotonic()
    example = load_example(cfg["example"])
    models = step_time._shared_models()
    _, loss_fn, make_batch, params0, _, _ = setup(dict(cfg, model=cfg["step_time_model"]))
    batches = [jax.device_put(make_batch(np.random.default_rng([cfg["seed"], rank, i]),
                                         cfg["model_cfg"]["batch"])) for i in range(4)]
    per_phase = cfg["steps_per_phase"]

    def log(msg):
        if rank == 0:
            print(f"[timing {cfg['model']} P={nranks}] {msg} "
                  f"[t+{time.monotonic() - t_start:.0f}s]", flush=True)

    # compiling is not timed: at cfg["compile_nice"] and outside the measurement lock
    if cfg.get("compile_nice") is not None:
        set_niceness(cfg["compile_nice"])
    built = {}
    for mode, argv in cfg["modes"].items():
        tx, step, densities, own = timed_step(example, models, mode, argv, loss_fn)
        params = step_time.fresh(params0)
        state = tx.init(params)
        world.Barrier()
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, state, batches[0]))  # compiles every phase
        built[mode] = (tx, step, densities + [own])
        log(f"{mode}: compiled in {time.perf_counter() - t0:.1f} s; phases at densities "
            f"{densities + [own]}")
    # the timing: under the measurement lock (rank 0 holds it), at normal priority
    lock = open(cfg["lock"], "a") if cfg.get("lock") and rank == 0 else None
    if lock:
        log(f"waiting for the measurement lock {cfg['lock']}")
        fcntl.flock(lock, fcntl.LOCK_EX)
        log("holding the measurement lock")
    world.Barrier()
    if cfg.get("compile_nice") is not None:
        set_niceness(0)
    # times[mode][repeat][phase]: this rank's step times
    times = {m: [] for m in built}
    stats = {}
    for repeat in range(cfg["repeats"]):
        for mode, (tx, step, densities) in built.items():
            params = step_time.fresh(params0)
            state = tx.init(params)
            phase_times = [[] for _ in densities]
            world.Barrier()
            for i in range(per_phase * len(densities)):
                t0 = time.perf_counter()
                params, state = jax.block_until_ready(
                    step(params, state, batches[i % len(batches)]))
                world.Barrier()
                phase_times[i // per_phase].append(time.perf_counter() - t0)
            times[mode].append(phase_times)
            if mode != NO_SYNC:
                stats[mode] = jss.SyncStats.from_vector(jss.last_stats(state)).as_dict()
            log(f"repeat {repeat + 1}/{cfg['repeats']} {mode}: " + ", ".join(
                f"{100 * d:g}% {statistics.median(t):.3f} s"
                for d, t in zip(densities, phase_times)))
    world.Barrier()
    if lock:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    everyone = world.gather({"times": times, "stats": stats}, root=0)
    if rank == 0:
        out = {}
        for mode, (_, _, densities) in built.items():
            phases = []
            for p, density in enumerate(densities):
                # per repeat: median over the phase's steps on each rank, then over ranks
                per_repeat = [statistics.median(
                    [statistics.median(e["times"][mode][r][p]) for e in everyone])
                    for r in range(cfg["repeats"])]
                phases.append({"density": density, "step_s": statistics.median(per_repeat),
                               "repeats_step_s": per_repeat,
                               "rank0_times_s": [t for r in times[mode] for t in r[p]]})
            out[mode] = {"phases": phases, "argv": cfg["modes"][mode],
                         "bytes_sent_last_step": [e["stats"].get(mode, {}).get("bytes_sent")
                                                  for e in everyone]}
        write_fragment({"timing": out, "worker_wall_s": round(time.monotonic() - t_start, 1)},
                       cfg["fragment"])
    world.Barrier()
    return 0


def timed_step(example, models, mode: str, argv: list, loss_fn):
    """``(tx, jitted step, warm-up densities, own density)`` of one timed mode. With
    ``--every H`` (an outer-step mode, benchmarks/outer_step.py) the example's
    ``jss.diloco`` around its optimizer, applied by ``jss.diloco_apply_updates`` as the
    example does: timed at ``--every 1`` that step is an inner step plus the outer
    exchange, the cost of every H-th step."""
    import jax
    import optax

    import jax_sparse_sync as jss

    a = example.parse_args(argv)
    if mode != NO_SYNC and getattr(a, "every", 0):
        tx = models.make_diloco(a, example.make_optimizer(a, optax.identity()))

        def step(params, state, batch):
            updates, state = tx.update(jax.grad(loss_fn)(params, batch), state, params)
            return jss.diloco_apply_updates(params, updates, state), state

        sparse = a.outer_sync in ("topk", "chunked_topk")
        return (tx, jax.jit(step, donate_argnums=(0, 1)), [],
                float(a.outer_density) if sparse else 1.0)
    sync = optax.identity() if mode == NO_SYNC else models.make_sync(a)
    tx = example.make_optimizer(a, sync)
    densities = [float(d) for _, d in models.warmup_phases(a)] if mode != NO_SYNC else []
    own = 1.0 if mode == NO_SYNC or a.sync == "dense" else float(a.density)
    return tx, step_time.make_step(loss_fn, tx), densities, own


def set_niceness(value: int) -> None:
    """Every thread of this process at niceness ``value`` (Linux niceness is per thread;
    lowering it needs root, as the emulated network does)."""
    import os

    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), value)
        except (PermissionError, ProcessLookupError):
            pass


def timed_modes(modes) -> list[str]:
    """The modes timed: the no-sync step and both dense baselines (dense_bf16 timed even
    where it is not trained), then ``modes`` (a shorter schedule's mode as its base:
    :func:`with_schedule_timings`)."""
    return list(dict.fromkeys([NO_SYNC, BASELINE, BASELINE_BF16,
                               *(convergence.schedule_base(m) or m for m in modes)]))


def with_schedule_timings(timing: dict, modes) -> dict:
    """``timing`` with each shorter-schedule mode (``<base>_sched<D>``) given its base's
    timing: the same compiled step, only the learning rate's values differ."""
    return {**timing, **{m: timing[b] for m in modes
                         if (b := convergence.schedule_base(m)) and b in timing}}


def timed_model_config(args) -> dict:
    """The timed step's model: ``step_time.py``'s sizes of ``args.model``, with
    ``--batch-size`` as its per-rank batch where given."""
    cfg = step_time.model_config(step_time_defaults(), STEP_TIME_MODEL[args.model])
    return dict(cfg, **({"batch": args.batch_size} if args.batch_size else {}))


def measure(args, modes: list[str], argvs: dict | None = None) -> tuple[dict, dict]:
    """Times ``modes`` (and :data:`NO_SYNC`) on the emulated link (one-way latency
    ``args.delay_ms`` where given); returns ``(timing, link record)``. ``argvs``: the
    timed modes' example arguments instead of :func:`timing_argv`'s."""
    from emulated_network import EmulatedNetwork, usable

    ok, why = usable()
    if not ok:
        raise SystemExit(f"time_to_accuracy: the emulated network is not usable: {why}")
    st_args = SimpleNamespace(
        rank_env=[*step_time.DEFAULT_MPI_ENV,
                  *(f"{k}={v}" for k, v in step_time.MALLOC_ENV.items())],
        heavy_yield="auto", timeout=args.timing_timeout, bind_to=None)
    st_model = STEP_TIME_MODEL[args.model]
    cfg = {"model": args.model, "example": convergence.MODELS[args.model]["script"],
           "step_time_model": st_model, "model_cfg": timed_model_config(args),
           "modes": argvs or {m: timing_argv(m, args.steps_per_phase)
                              for m in timed_modes(modes)},
           "repeats": args.timing_repeats, "steps_per_phase": args.steps_per_phase,
           "seed": args.seed, "lock": args.lock, "compile_nice": args.compile_nice}
    with EmulatedNetwork(args.procs, args.link, getattr(args, "delay_ms", 0.0)) as net:
        # the probe (a few 4 MB messages: informational) runs unlocked; the worker
        # takes the lock for its timing
        probe = step_time.probe_link(net)
        link = {"rate_mbit": args.link, "network": net.describe(), **probe,
                "rank_env": st_args.rank_env,
                "heavy_yield": step_time.heavy_yield(st_args, args.procs)}
        print(f"# link {args.link:g} Mbit/s: one-way latency "
              f"{(link['one_way_latency_s'] or 0) * 1e6:.1f} us, 2-rank Sendrecv "
              f"{link['achieved_mbit'] or 0:.0f} Mbit/s", flush=True)
        frag = step_time.launch("mpi", cfg, args.procs, st_args, net,
                                script=Path(__file__).resolve())
    if frag.get("error"):
        raise RuntimeError(f"time_to_accuracy: the timing job failed: {frag['error']}")
    link["worker_wall_s"] = frag.get("worker_wall_s")
    link["model_config"] = cfg["model_cfg"]
    link["repeats"] = cfg["repeats"]  # the record's count, also when read back by --resume
    return frag["timing"], link


def step_time_defaults() -> argparse.Namespace:
    """step_time.py's defaults (its measured model sizes)."""
    return step_time.build_parser().parse_args([])


# --------------------------------------------------------------------------- output


def markdown_table(result: dict) -> str:
    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    def paired(r):
        q = r.get("fraction_of_ideal_paired_quartiles")
        return "-" if not q else (f"{r['fraction_of_ideal_paired']:.3f} "
                                  f"({q[0]:.3f}-{q[1]:.3f})")
    lines = [f"{result['model']}, {result['link']}, P = {result['P']}: target = dense's final "
             f"{result['metric']}",
             "",
             "| mode | final | gap | step s | steps to target | s to target | x dense | "
             "fraction of ideal | paired by repeat (quartiles) | x dense bf16 | "
             "fraction (bf16 target) |",
             "|" + " --- |" * 11]
    for r in result["records"]:
        gap = r["gap_to_dense"]
        gap_s = "-" if gap is None else (f"{100 * gap:+.2f}%" if result["lower_is_better"]
                                         else f"{gap:+.2f} pt")
        lines.append(
            f"| {r['mode']} | {f(r['final_metric'], '.4f')} | {gap_s} | {f(r['step_s'])} | "
            f"{r['steps_to_target'] or 'never'} | {f(r['time_to_target_s'], '.1f')} | "
            f"{f(r['speedup_over_dense'], '.2f')} | {f(r['fraction_of_ideal'], '.3f')} | "
            f"{paired(r)} | {f(r['speedup_over_dense_bf16'], '.2f')} | "
            f"{f(r['fraction_of_ideal_bf16'], '.3f')} |")
    r0 = result["records"][0]
    lines += ["", f"no-sync step {r0['no_sync_step_s']:.3f} s; ideal (free sync, dense's "
              f"steps) {f(r0['ideal_time_s'], '.1f')} s = {f(r0['ideal_speedup_over_dense'], '.2f')}x "
              f"dense ({f(r0['dense_time_s'], '.1f')} s)"
              + (f", {f(r0['ideal_speedup_over_dense_bf16'], '.2f')}x dense bf16 "
                 f"({f(r0['dense_time_bf16_s'], '.1f')} s)" if r0.get("dense_time_bf16_s")
                 else "")]
    smooth = r0.get("smooth_evaluations")
    if smooth:
        lines += ["", f"The same against dense, each run's {result['metric']} read as the mean "
                  f"of its last {smooth} evaluations:", "",
                  "| mode | target (dense's last mean) | steps to target | s to target | "
                  "x dense | fraction of ideal | paired (quartiles) |", "|" + " --- |" * 7]
        for r in result["records"]:
            q = r.get("fraction_of_ideal_smoothed_paired_quartiles")
            lines.append(
                f"| {r['mode']} | {f(r['target_smoothed'], '.4f')} | "
                f"{r['steps_to_target_smoothed'] or 'never'} | "
                f"{f(r['time_to_target_smoothed_s'], '.1f')} | "
                f"{f(r['speedup_over_dense_smoothed'], '.2f')} | "
                f"{f(r['fraction_of_ideal_smoothed'], '.3f')} | "
                + ("-" if not q else f"{r['fraction_of_ideal_smoothed_paired']:.3f} "
                   f"({q[0]:.3f}-{q[1]:.3f})") + " |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Metric against seconds on the link per mode; the free sync's curve (dense's
    metric at the no-sync step time) and its time to the target marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 5.5))
    by_mode = {r["mode"]: r for r in result["records"]}
    timing = result["timing"]
    for mode, series in result["series"].items():
        r = by_mode[mode]
        warm, step_s = phase_step_times(r["warmup_phases"], timing[mode], mode)
        xs = [convergence.elapsed(s, step_s, warm) or 0.0 for s, _ in series]
        kw = convergence.plot_style(mode)
        kw["label"] = (f"{mode}: {r['fraction_of_ideal']:.2f} of ideal"
                       if r["fraction_of_ideal"] else f"{mode}: target not reached")
        ax.plot(xs, [v for _, v in series], **kw)
    dense = by_mode[BASELINE]
    ax.plot([s * dense["no_sync_step_s"] for s, _ in result["series"][BASELINE]],
            [v for _, v in result["series"][BASELINE]], color="gray", lw=3, alpha=0.35,
            label="ideal: dense's curve at the no-sync step time")
    ax.axhline(dense["target"], color="gray", lw=0.8, ls=":")
    if dense["ideal_time_s"]:
        ax.axvline(dense["ideal_time_s"], color="gray", lw=1.2, ls="--")
        ax.annotate(f"ideal {dense['ideal_time_s']:.0f} s", (dense["ideal_time_s"],
                                                             dense["target"]),
                    textcoords="offset points", xytext=(4, 12), fontsize=8)
    label = convergence.MODELS[result["model"]]["label"]
    ax.set(ylabel=label,
           xlabel=f"seconds on the emulated {result['link_mbit']:g} Mbit/s link (each phase's "
                  "step time measured in the same run)")
    lo = [v for s in result["series"].values() for _, v in s]
    if result["lower_is_better"]:
        ax.set_ylim(min(lo) - 0.05, dense["target"] + 0.6)
    else:
        ax.set_ylim(dense["target"] - 15, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"time to accuracy: {result['model']}, P = {result['P']}, "
                 f"{result['link']}; dashed: the ideal's time to dense's final", fontsize=10)
    save_figure(fig, path)


# --------------------------------------------------------------------------- main


def eval_argv(eval_every) -> list:
    """The example's arguments for evaluating every ``eval_every`` steps ([] for its
    default)."""
    return [] if eval_every is None else ["--log-every", str(int(eval_every))]


def batch_argv(batch_size) -> list:
    """The example's arguments for ``batch_size`` samples a rank a step ([] for its
    default)."""
    return [] if batch_size is None else ["--batch-size", str(int(batch_size))]


def check_batches(runs: dict, timed_batch: int) -> None:
    """Refuses to join runs trained on another per-rank batch than the timed step's
    (a run's JSON records its ``config.batch_size``; runs from records that predate it
    are the examples' default, which the timing's default is)."""
    for mode, run in runs.items():
        trained = (run.get("config") or {}).get("batch_size")
        if trained is not None and int(trained) != int(timed_batch):
            raise ValueError(f"time_to_accuracy: {mode} was trained with {trained} samples a "
                             f"rank a step, the timed step takes {timed_batch}; pass the "
                             f"same --batch-size to both")


def runs_from_record(path, data: dict) -> dict:
    """``{mode: run}`` from an earlier time_to_accuracy.py record: the runs it joined
    (each mode's evaluations, final metric, warm-up and command, as recorded)."""
    metric = data["metric"]
    commit = (data.get("machine") or {}).get("commit", "?")
    out = {}
    for rec in data["records"]:
        mode = rec["mode"]
        out[mode] = {
            "config": {"steps": rec["steps"],
                       **({"batch_size": data["batch_per_rank"]}
                          if data.get("batch_per_rank") else {})},
            "sync": rec.get("sync"), "k": rec.get("k"),
            "warmup_phases": [list(p) for p in rec.get("warmup_phases") or ()],
            "history": [{"step": s, metric: v} for s, v in data["series"][mode]],
            "final": {metric: rec["final_metric"],
                      "replicas_identical": rec.get("replicas_identical")},
            "command": (data.get("commands") or {}).get(mode),
            "run_source": f"{convergence._rel(path)} (joined by commit {commit}; "
                          f"{rec.get('run_source', 'trained by its command')})"}
    return out


def runs_from(paths, model: str, procs: int) -> dict:
    """``{mode: run}`` from earlier ``convergence.py`` results or ``time_to_accuracy.py``
    records (``--runs-from``), flagged with ``run_source``; later files win."""
    out = {}
    for path in paths or ():
        data = load_record(path)
        is_record = data.get("benchmark") == "time_to_accuracy"
        file_procs = data.get("P") if is_record else data.get("procs")
        if data.get("model") != model or file_procs != procs:
            raise ValueError(f"time_to_accuracy: --runs-from {path}: model "
                             f"{data.get('model')} at P = {file_procs}, not {model} "
                             f"at P = {procs}")
        if is_record:
            out.update(runs_from_record(path, data))
            continue
        metric = data["metric"]
        for row in data["table"]:
            mode = row["mode"]
            phases = row.get("warmup_phases")
            if phases is None:
                phases = convergence.mode_warmup_phases(mode)
            provenance = data.get("provenance") or {}
            out[mode] = {
                "config": {"steps": row["steps"]}, "sync": row["sync"], "k": row["k"],
                "warmup_phases": [list(p) for p in phases],
                "history": data["series"][mode]["history"],
                "final": {metric: row[f"final_{metric}"],
                          "replicas_identical": row.get("replicas_identical")},
                "command": (data.get("commands") or {}).get(mode),
                "run_source": f"{convergence._rel(path)} (recorded by commit "
                              f"{provenance.get('recorded_by_commit', '?')})"}
    # a mode that only adds the index encoding trains the same run bit for bit (the
    # same values summed; convergence.MASKED_RAMP_VARIANTS "enc"): its base's run
    for mode in convergence.MODES:
        base = same_run_as(mode)
        if mode not in out and base in out:
            out[mode] = dict(out[base], run_source=f"{out[base]['run_source']}: the run of "
                             f"{base}, which {mode} trains bit for bit (only the index "
                             f"encoding on the wire differs)")
    return out


#: the arguments that change only the bytes on the wire, not the values summed
ENCODING_ONLY = ("--index-encoding", "auto")


def same_run_as(mode: str) -> str | None:
    """The mode whose training run ``mode`` repeats bit for bit: the one whose
    arguments are ``mode``'s without :data:`ENCODING_ONLY` (None if there is none)."""
    args = list(convergence.MODES.get(mode, ((),))[0])
    for i in range(len(args) - 1):
        if tuple(args[i:i + 2]) == ENCODING_ONLY:
            rest = args[:i] + args[i + 2:]
            return next((m for m, (a, _, _) in convergence.MODES.items() if list(a) == rest),
                        None)
    return None


def timing_file(args, path: Path, machine: dict) -> dict:
    """The modes' timing on the link: measured now and saved to ``path``, or with
    ``--resume`` read from ``path`` when it holds every mode (e.g. a ``--timing-only``
    job run beside the training runs)."""
    if args.resume and path.exists():
        saved = load_record(path)
        if set(timed_modes(args.modes)) <= set(saved["timing"]):
            print(f"# timing found in {path} (measured {saved['machine']['date']})",
                  flush=True)
            return saved
    print(f"# timing {len(timed_modes(args.modes))} steps on the {args.link:g} Mbit/s link",
          flush=True)
    timing, link = measure(args, list(args.modes))
    saved = {"timing": timing, "link": link, "machine": machine}
    write_record(saved, path)
    return saved


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    p.add_argument("--model", choices=tuple(convergence.MODELS), default="lm")
    p.add_argument("--link", type=float, default=1000.0, help="Mbit/s (default 1000)")
    p.add_argument("--procs", type=int, default=4, help="P (default 4)")
    p.add_argument("--modes", nargs="+", choices=tuple(convergence.MODES), metavar="MODE",
                   default=list(DEFAULT_MODES), help="trained and timed (dense is required)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: lm 300, cnn 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default="/tmp/jss_time_to_accuracy",
                   help="training runs' JSON and logs")
    p.add_argument("--runs-from", nargs="+", default=[], metavar="JSON",
                   help="take the runs of the modes these convergence.py results or "
                        "time_to_accuracy.py records hold from them instead of training "
                        "(flagged per record: run_source)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the training runs and the timing found in --work-dir")
    p.add_argument("--eval-every", type=int, default=None, metavar="STEPS",
                   help="evaluate every STEPS steps of training (the example's --log-every; "
                        "default: the example's 25). Steps to target are rounded up to this "
                        "grid: a finer one measures when a mode crosses the target, at the "
                        "cost of more evaluations (not on the time axis)")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="samples a rank a step, for the training runs and the timed step "
                        "(default: the example's, lm 2 sequences, cnn 16 images). More "
                        "compute a step against the same sync: a setting closer to a real "
                        "run's per-device batch")
    p.add_argument("--timeout", type=float, default=2400, help="seconds per training run")
    p.add_argument("--nice", type=int, default=19, help="niceness of the training runs")
    p.add_argument("--compile-nice", type=int, default=19,
                   help="niceness of the timing job while it compiles, outside the lock "
                        "(default 19; lower it where niced work starves)")
    p.add_argument("--timing-repeats", type=int, default=3)
    p.add_argument("--steps-per-phase", type=int, default=5,
                   help="timed steps of each phase per repeat (default 5)")
    p.add_argument("--timing-timeout", type=float, default=3600,
                   help="seconds for the timing job (compiling included)")
    p.add_argument("--lock", default=MEASURE_LOCK, help="the measurement lock (flock)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--tag", default="", help="suffix of the output names")
    p.add_argument("--train-only", action="store_true",
                   help="only the training runs (e.g. several modes' runs side by side; a "
                        "later command with --resume times and joins them)")
    p.add_argument("--timing-only", action="store_true",
                   help="only the timing, saved in --work-dir (a later command with --resume "
                        "trains and joins)")
    p.add_argument("--plot-only", action="store_true",
                   help="redraw the table and plot from the JSON")
    p.add_argument("--smooth", type=int, default=1, metavar="EVALUATIONS",
                   help="also the records' *_smoothed fields: every run's metric read as the "
                        "mean of its last EVALUATIONS evaluations, dense's last such mean the "
                        "target (default 1: only the issue's single-evaluation target)")
    args = p.parse_args(argv)
    if args.smooth < 1:
        p.error(f"--smooth: a number of evaluations >= 1, not {args.smooth}")
    if args.batch_size is not None and args.batch_size < 1:
        p.error(f"--batch-size: a number of samples >= 1, not {args.batch_size}")
    if args.eval_every is not None and args.eval_every < 1:
        p.error(f"--eval-every: a number of steps >= 1, not {args.eval_every}")
    if not (args.worker or args.train_only) and BASELINE not in args.modes:
        p.error("--modes: include dense (the target and the baseline)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(load_record(args.worker))
    base = result_base(args.out_dir, args.model, args.link, args.procs, args.tag)
    if args.plot_only:
        result = load_record(base.with_suffix(".json"))
        print(markdown_table(result), flush=True)
        plot(result, base.with_suffix(".png"))
        return 0
    t0 = time.monotonic()
    machine = machine_info()
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    timing_path = Path(args.work_dir) / (f"timing_{args.model}_{link_name(args.link)}_"
                                         f"p{args.procs}"
                                         f"{f'_b{args.batch_size}' if args.batch_size else ''}"
                                         f".json")
    if args.timing_only:
        timing_file(args, timing_path, machine)
        return 0
    steps = args.steps or convergence.MODELS[args.model]["steps"]
    run_args = SimpleNamespace(work_dir=args.work_dir, procs=args.procs, resume=args.resume,
                               timeout=args.timeout, seed=args.seed, nice=args.nice,
                               extra=[*eval_argv(args.eval_every),
                                      *batch_argv(args.batch_size)])
    runs = {}
    earlier = runs_from(args.runs_from, args.model, args.procs)
    for i, mode in enumerate(args.modes):
        if mode in earlier and not (args.resume and convergence.run_path(
                run_args, args.model, mode).exists()):
            print(f"# {mode}: the run recorded in {earlier[mode]['run_source']}", flush=True)
            runs[mode] = earlier[mode]
            continue
        print(f"# training {i + 1}/{len(args.modes)}: {mode} ({args.model}, P = {args.procs}, "
              f"{steps} steps; t+{time.monotonic() - t0:.0f}s)", flush=True)
        runs[mode] = convergence.run_one(run_args, args.model, mode, steps)
        runs[mode]["run_source"] = (  # run_one reuses a run only where its code is unchanged
            f"reused from {convergence.run_path(run_args, args.model, mode)}, trained at "
            f"{runs[mode]['trained_at_commit']}" if runs[mode].get("reused")
            else "trained by this command")
    if args.train_only:
        return 0
    # before the timing (minutes); a timing file found with --resume names its batch
    check_batches(runs, timed_model_config(args)["batch"])
    saved = timing_file(args, timing_path, machine)
    result = build_result(args.model, args.link, args.procs, runs,
                          with_schedule_timings(saved["timing"], args.modes),
                          saved["link"], smooth=args.smooth)
    result["timing_machine"] = saved["machine"]  # the timing job's commit, date, command
    result.update({"machine": machine, "seed": args.seed, "steps": steps,
                   "batch_per_rank": saved["link"]["model_config"]["batch"],
                   # the timing's own count: a --resume'd timing may hold another
                   "timing_repeats": saved["link"].get("repeats", args.timing_repeats),
                   "trained_at": {m: r.get("trained_at_commit") for m, r in runs.items()},
                   "steps_per_phase": args.steps_per_phase,
                   "training": "shared memory (MPICH shm), nice -n 19; each run's own step "
                               "times are not used",
                   "commands": {m: r.get("command") for m, r in runs.items()},
                   "wall_s": round(time.monotonic() - t0, 1)})
    result["table_markdown"] = markdown_table(result)
    write_record(result, base.with_suffix(".json"))
    plot(result, base.with_suffix(".png"))
    print(result["table_markdown"], flush=True)
    print(f"# wrote {base}.json and .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
