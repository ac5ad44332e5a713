"""Convergence and time to accuracy: dense vs Top-k vs Ok-Topk on a transformer LM and a CNN.

For each model, every mode of :data:`MODES` (with :data:`MASKED_RAMP_VARIANTS` and the
``_sched<D>`` schedules) trains from the same initial parameters on the same data in
the same order, with the same optimizer and schedule: one seeded ``mpiexec -n P`` run of
the example per mode (``lm``: ``examples/train_lm.py``, validation loss; ``cnn``:
``examples/train_resnet.py``, test accuracy). Why the ``_adamdir`` modes sync each
rank's Adam direction: docs/choosing.md.

The runs train on shared memory under ``nice -n 19``; the time axis is ``step x step_s``,
``step_s`` the mode's median step time on the emulated 1 Gbit/s link from
``benchmarks/step_time.py``'s records (:data:`STEP_TIMES`, same P and model; per row
``step_time_mode``, ``step_time_source`` and ``approximation``); evaluation time is left
out and "steps to target" is on the ``--log-every`` grid. Table (``table``, printed as
markdown): final metric per mode, its gap to dense, steps and seconds to dense's final
metric and to its metric at half its steps (``*_dense_halfway``), the speed-ups, and
``result_nnz`` / ``global_count`` (the allreduce's result size).

    nice -n 19 python benchmarks/convergence.py                    # both models, P = 4
    python benchmarks/convergence.py --plot-only                   # redo JSON/plots from runs
    python benchmarks/convergence.py --models cnn --modes dense topk_1pct --steps 100 \\
        --tag smoke

``--seeds 0 1 2`` trains every mode once per seed (the record's ``seed_finals``; its
table is the first seed's). Writes ``benchmarks/results/convergence_<model>[_<tag>].{json,png}``
(results: benchmarks/README.md, "convergence.py"); each run's JSON and log stay in
``--work-dir``, stamped with the commit it trained at (``trained_at_commit``; the record's
``trained_at``). ``--resume`` reuses a run found there only while the code it trained with
(``headlines.TRAIN``, less the CUDA sources, which no CPU run executes) is unchanged since
that commit, and says so; otherwise it trains again. The run's file name does not hold
``--steps``: give a different step count its own ``--work-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (git_commit, load_record, machine_info, pyplot, save_figure,  # noqa: E402
                      write_record)
from headlines import TRAIN, changed_since, commit_problem  # noqa: E402
from step_time import density_name  # noqa: E402  (one spelling of densities in mode names)
ROOT = HERE.parent
RESULTS = HERE / "results"
#: step_time.py records the time axis reads by default, a later file's records overriding
#: an earlier one's: none since time_to_accuracy.py times each trained mode itself (its
#: records retired with the rule that every record names its commit); pass --step-times
STEP_TIMES: tuple[Path, ...] = ()
#: a step_time mode not measured for a model falls back to the mode that stands in for
#: it (flagged ``step_time_approximation``): the Adam-direction sync's to its sync's
STEP_TIME_FALLBACK = {"adamdir_1pct": "topk_1pct_auto", "adamdir_0.1pct": "topk_0.1pct_auto"}

def _a(*parts: str) -> list[str]:
    """An example's arguments, written as on its command line (in parts)."""
    return " ".join(parts).split()


T1, T01 = "--sync topk --density 0.01", "--sync topk --density 0.001"
AD, MASK = "--sync-what adam_direction", "--mask-momentum restart"
MEANV = "--second-moment mean --second-moment-warmup 300"
#: mode -> (example arguments, step_time.py mode whose 1 Gbit/s step time is used,
#: True if that time is an approximation (no measurement of this mode itself))
MODES: dict[str, tuple[list[str], str, bool]] = {
    "dense": (_a("--sync dense"), "dense", False),
    # each rank's Adam direction averaged densely: the *_adamdir modes' lossless sync
    "dense_adamdir": (_a("--sync dense", AD), "dense", True),
    "dense_adamdir_meanv": (_a("--sync dense", AD, "--second-moment mean"), "dense", True),
    "topk_1pct": (_a(T1, "--selection exact"), "topk_1pct_auto", False),
    "topk_0.1pct": (_a(T01, "--selection exact"), "topk_0.1pct_auto", False),
    "topk_1pct_reuse": (_a(T1, "--selection threshold_reuse"), "topk_1pct_auto", True),
    "topk_0.1pct_reuse": (_a(T01, "--selection threshold_reuse"), "topk_0.1pct_auto", True),
    "oktopk_1pct": (_a("--sync oktopk --density 0.01"), "oktopk_1pct", False),
    "oktopk_0.1pct": (_a("--sync oktopk --density 0.001"), "oktopk_0.1pct", False),
    # each rank's own Adam direction synced instead of the gradient
    "topk_1pct_adamdir": (_a(T1, AD), "topk_1pct_auto", True),
    "topk_0.1pct_adamdir": (_a(T01, AD), "topk_0.1pct_auto", True),
    "oktopk_1pct_adamdir": (_a("--sync oktopk --density 0.01", AD), "oktopk_1pct", True),
    "oktopk_0.1pct_adamdir": (_a("--sync oktopk --density 0.001", AD), "oktopk_0.1pct", True),
    # DGC's warm-up (jss.density_ramp); its steps are timed as run_warmup_phases says
    "topk_1pct_adamdir_ramp": (_a(T1, AD, "--density-ramp 25"),
                               "topk_1pct_auto", True),
    "topk_0.1pct_adamdir_ramp": (_a(T01, AD, "--density-ramp 25"),
                                 "topk_0.1pct_auto", True),
    "topk_1pct_ramp": (_a(T1, "--density-ramp 25"), "topk_1pct_auto", True),
    # DGC's momentum factor masking, timed as step_time.py's adamdir_* modes
    "topk_1pct_adamdir_mask": (_a(T1, AD, MASK),
                               "adamdir_1pct", False),
    "topk_0.1pct_adamdir_mask": (_a(T01, AD, MASK),
                                 "adamdir_0.1pct", False),
    "topk_1pct_adamdir_mask_ramp": (_a(T1, AD, MASK, "--density-ramp 25"), "adamdir_1pct", False),
    "topk_0.1pct_adamdir_mask_ramp": (_a(T01, AD, MASK, "--density-ramp 25"),
                                      "adamdir_0.1pct", False),
    # twice the density: the bytes of selection="union" at 1 %
    "topk_2pct_adamdir_mask_ramp": (_a("--sync topk --density 0.02", AD, MASK, "--density-ramp 25"),
                                    "adamdir_1pct", True),
    # selection="union" without momentum masking
    "topk_1pct_adamdir_ramp_union": (_a(T1, AD, "--density-ramp 25 --selection union"),
                                     "adamdir_1pct", True),
    "topk_1pct_adamdir_mask_ramp10": (_a(T1, AD, MASK, "--density-ramp 10"), "adamdir_1pct", False),
    # the dense baseline on a 16-bit wire
    "dense_bf16": (_a("--sync dense --wire-dtype bfloat16"), "dense", True),
    "shared_support_1pct": (_a("--sync shared_support --density 0.01"), "topk_1pct_auto", True),
    "shared_support_1pct_adamdir": (_a("--sync shared_support --density 0.01", AD),
                                    "topk_1pct_auto", True),
    # Hook: e.g. "topk_1pct_grouped": ([..., "--grouping", "best"], "<step_time mode>", True)
}
#: Variants of the masked ramp (``<mode>_adamdir_mask_ramp_<suffix>``, ``ramp*``: its own
#: ramp instead): extra example arguments (see the examples' ``--help``) and whether the
#: ramp mode's step time only approximates theirs.
BF16, ENC = "--wire-dtype bfloat16", "--index-encoding auto"
MASKED_RAMP_VARIANTS = {
    "lrin": (_a("--lr-before-sync"), False),
    "meanv": (_a("--second-moment mean"), True),
    "lrin_meanv": (_a("--lr-before-sync --second-moment mean"), True),
    "meanvwarm": (_a(MEANV), True),
    "flush100": (_a("--flush-every 100"), True),
    "densesmall": (_a("--dense-below 10000"), True),
    "cyclic": (_a("--selection cyclic"), True),
    "union": (_a("--selection union"), True),
    **{f"meanvwarm_decay{g}": (_a(MEANV, f"--residual-decay 0.{g}"), True)
       for g in ("999", "99", "98", "95")},
    "decay99": (_a("--residual-decay 0.99"), True),
    **{f"meanvwarm_decayfade{g}": (_a(MEANV, f"--residual-decay 0.{g} --residual-decay-steps 300"),
                                   True) for g in ("95", "99")},
    "lrin_meanvwarm": (_a("--lr-before-sync", MEANV), True),
    "lrin_meanvwarm450": (_a("--lr-before-sync --second-moment mean --second-moment-warmup 450"),
                          True),
    "lrin_meanvwarm_decay99": (_a("--lr-before-sync", MEANV, "--residual-decay 0.99"), True),
    "union_meanvwarm": (_a("--selection union", MEANV), True),
    "ramp40": (_a("--density-ramp 40"), False),
    "bf16": (_a(BF16), True),
    "ramp10_bf16": (_a("--density-ramp 10", BF16), True),
    "start6_bf16": (_a("--ramp-start 0.07", BF16), True),
    # the indices encoded: the same training run bit for bit, fewer bytes
    "enc": (_a(ENC), True),
    "ramp10_enc": (_a("--density-ramp 10", ENC), True),
    "warmbf16": (_a("--warmup-wire-dtype bfloat16"), True),
    "warmbf16_enc": (_a("--warmup-wire-dtype bfloat16", ENC), True),
    "start6_warmbf16_enc": (_a("--ramp-start 0.07 --warmup-wire-dtype bfloat16", ENC), True)}
for _density in ("1pct", "0.1pct", "2pct"):
    _args, _step_mode, _ = MODES[f"topk_{_density}_adamdir_mask_ramp"]
    for _suffix, (_extra, _approx) in MASKED_RAMP_VARIANTS.items():
        _own_ramp = _suffix.startswith("ramp")  # its own --density-ramp
        _name = f"topk_{_density}_adamdir_mask_{_suffix}" if _own_ramp else \
            f"topk_{_density}_adamdir_mask_ramp_{_suffix}"
        assert _args[-2] == "--density-ramp", _args
        _base = _args[:-2] if _own_ramp else _args
        MODES[_name] = ([*_base, *_extra], _step_mode, _approx)

#: A shorter learning-rate schedule (``<mode>_sched<D>``: the example's ``--decay-steps D``;
#: trained for the model's full steps), timed as ``<mode>``.
SCHEDULE_BASES = ("dense", "dense_bf16", "topk_1pct_adamdir_mask_ramp_enc",
                  "topk_1pct_adamdir_mask_ramp_warmbf16_enc")
SCHEDULE_STEPS = (240, 250, 260, 270, 280, 300, 320, 340, 360)
for _base in SCHEDULE_BASES:
    _args, _step_mode, _approx = MODES[_base]
    for _d in SCHEDULE_STEPS:
        MODES[f"{_base}_sched{_d}"] = ([*_args, "--decay-steps", str(_d)], _step_mode, _approx)


def schedule_base(mode: str) -> str | None:
    """The mode that ``mode`` is with a shorter schedule (``<base>_sched<D>``), else None."""
    base, sep, d = mode.rpartition("_sched")
    return base if sep and d.isdigit() and base in MODES else None


#: the issue's modes (the *_adamdir ones are run on request: --modes ...)
DEFAULT_MODES = ("dense", "topk_1pct", "topk_0.1pct", "topk_1pct_reuse", "topk_0.1pct_reuse",
                 "oktopk_1pct", "oktopk_0.1pct")

MODELS = {
    "lm": {"script": "examples/train_lm.py", "step_time_model": "transformer",
           "metric": "val_loss", "lower_is_better": True, "steps": 300,
           "label": "validation loss (nats/byte)"},
    "cnn": {"script": "examples/train_resnet.py", "step_time_model": "cnn",
            "metric": "test_accuracy", "lower_is_better": False, "steps": 400,
            "label": "test accuracy (%)", "secondary": "test_loss"},
}
RUN_ENV = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1", "JAX_PLATFORMS": "cpu",
           "PYTHONUNBUFFERED": "1"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    p.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(DEFAULT_MODES))
    p.add_argument("--procs", type=int, default=4, help="P (default 4)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per run (default: lm 300, cnn 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="train every mode once per seed (default: --seed only)")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where the record goes")
    p.add_argument("--link", default="1000", help="step_time.py link of the time axis")
    p.add_argument("--step-times", nargs="+", default=[str(f) for f in STEP_TIMES],
                   help="step_time.py result files (a later file's records override)")
    p.add_argument("--work-dir", default="/tmp/jss_convergence",
                   help="per-run JSON and logs (default /tmp/jss_convergence)")
    p.add_argument("--resume", action="store_true", help="skip runs whose JSON exists")
    p.add_argument("--plot-only", action="store_true",
                   help="no training: rebuild the JSON and plots from --work-dir")
    p.add_argument("--retime", default=None, metavar="RESULTS_JSON",
                   help="no training: recompute the time axis of this results file from "
                        "--step-times, written as convergence_<model>_<tag>.{json,png}")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--tag", default="", help="suffix of the output names")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                   help="arguments passed on to every run of the example")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- running


def run_path(args, model: str, mode: str, seed: int | None = None) -> Path:
    """A run's JSON in ``--work-dir`` (seeds other than 0 named with ``_seed<s>``)."""
    seed = args.seed if seed is None else seed
    return Path(args.work_dir) / (f"{model}_P{args.procs}_{mode}"
                                  + (f"_seed{seed}" if seed else "") + ".json")


def reuse_problem(run: dict) -> str | None:
    """Why a run found in ``--work-dir`` cannot stand for a new one (None: it can): no
    training commit, a modified tree, or the training code changed since its commit."""
    commit = run.get("trained_at_commit")
    if (why := commit_problem(commit)) is not None:
        return f"trained at {why}"
    changed = changed_since(commit, TRAIN)
    if changed:
        return f"{len(changed)} file(s) of its code changed since {commit} ({changed[0]}, ...)"
    return None


def run_one(args, model: str, mode: str, steps: int, seed: int | None = None) -> dict:
    """One seeded training run of ``mode`` under mpiexec; returns its JSON (with
    ``--resume``, the run found in ``--work-dir`` where :func:`reuse_problem` allows)."""
    seed = args.seed if seed is None else seed
    out = run_path(args, model, mode, seed)
    if args.resume and out.exists():
        found = json.loads(out.read_text())
        why = reuse_problem(found)
        if why is None:
            print(f"[{model} {mode} seed {seed}] reused {out}: trained at "
                  f"{found['trained_at_commit']}, its code unchanged since", flush=True)
            return dict(found, reused=True)
        print(f"[{model} {mode} seed {seed}] training again ({out}: {why})", flush=True)
    commit = git_commit()  # the code this run trains with (the tree must not change meanwhile)
    mpiexec = ROOT / ".venv" / "bin" / "mpiexec"
    cmd = ["timeout", str(int(args.timeout)), str(mpiexec if mpiexec.exists() else "mpiexec"),
           "-n", str(args.procs), sys.executable, "-m", "mpi4py", MODELS[model]["script"],
           *MODES[mode][0], "--steps", str(steps), "--seed", str(seed),
           "--json", str(out), *args.extra]
    niceness = getattr(args, "nice", 0)  # training runs whose timing is not used
    prefix = ["nice", "-n", str(niceness)] if niceness else []
    log_path = out.with_suffix(".log")
    print(f"[{model} {mode}] {' '.join(cmd[3:])}", flush=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(prefix + cmd, cwd=ROOT, env=dict(os.environ, **RUN_ENV),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if line.startswith(("step", "final", "parameters")):
                print(f"[{model} {mode}] {line.rstrip()}", flush=True)
        rc = proc.wait()
    if rc != 0 or not out.exists():
        raise RuntimeError(f"{model} {mode}: exit status {rc}; see {log_path}")
    result = json.loads(out.read_text())
    result["command"] = cmd[3:]
    result["run_wall_s"] = time.time() - t0
    result["trained_at_commit"] = commit
    out.write_text(json.dumps(result, indent=1))
    return result


# --------------------------------------------------------------------------- analysis


def read_step_time_files(paths) -> list[tuple[str, dict]]:
    """``[(path relative to the repository, parsed JSON)]`` of the step_time.py result
    files that exist, in order (each read once; missing ones are skipped)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    return [(_rel(p), json.loads(Path(p).read_text())) for p in paths if Path(p).exists()]


def load_step_times(files, model: str, link: str, procs: int) -> dict[str, dict]:
    """``{step_time mode: record}`` of one model, link and P from ``files``
    (:func:`read_step_time_files`), a later file's record of a mode replacing an earlier
    one's; each record gets ``_source``."""
    out: dict[str, dict] = {}
    for source, data in files:
        for r in data["records"]:
            if r["model"] == model and str(r["link"]) == str(link) and r["P"] == procs:
                out[r["mode"]] = dict(r, _source=source)
    return out


def _rel(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def first_reach(history: list[dict], metric: str, target: float, lower: bool) -> int | None:
    """The first evaluated step whose metric reaches ``target``; None if never."""
    for h in history:
        v = h.get(metric)
        if v is not None and h["step"] > 0 and (v <= target if lower else v >= target):
            return h["step"]
    return None


def count_summary(run: dict) -> dict | None:
    """result_nnz / k over the second half of training (Ok-Topk: the global count)."""
    import numpy as np

    k = run.get("k")
    nnz = run["per_step"]["result_nnz"]
    if not k or not nnz:
        return None
    late = np.asarray(nnz[len(nnz) // 2:], dtype=np.float64) / k
    return {"k": k, "steps": len(late), "min": float(late.min()), "max": float(late.max()),
            "median": float(np.median(late)), "p05": float(np.quantile(late, 0.05)),
            "p95": float(np.quantile(late, 0.95)),
            "fraction_below_0.5": float(np.mean(late < 0.5)),
            "fraction_above_2": float(np.mean(late > 2.0))}


def run_warmup_phases(run: dict) -> list[list]:
    """A run's warm-up ``[[steps, density], ...]``: the sync's ``warmup=`` phases the
    example reports. On the time axis each is charged its own density's step time
    where step_time.py measured it (``<kind>_<percent>pct``), else dense's."""
    if "warmup_phases" not in run:  # a run file from before the examples reported them
        config = run["config"]
        if config.get("dense_warmup") or config.get("density_ramp"):
            raise ValueError(f"{run.get('sync')}: the run file has no `warmup_phases`; "
                             "re-run this mode (without --resume)")
        return []
    return [[int(n), float(d)] for n, d in run["warmup_phases"]]


def elapsed(step: int | None, step_s: float | None, warm_phases) -> float | None:
    """Emulated seconds to ``step``: the warm-up phases ``[(steps, step_s), ...]`` first
    (a phase's step time None: unknown, so is the result), then ``step_s`` a step."""
    if not step or not step_s:
        return None
    total, left = 0.0, step
    for steps, phase_s in warm_phases:
        n = min(left, steps)
        if n and phase_s is None:
            return None
        total += n * (phase_s or 0.0)
        left -= n
    return total + left * step_s


def mode_warmup_phases(mode: str) -> list[tuple[int, float]]:
    """A mode's warm-up ``[(steps, density), ...]`` from its example arguments
    (``--dense-warmup``, ``--density-ramp``), as the examples build it."""
    import jax_sparse_sync as jss

    args = MODES[mode][0]

    def value(flag):
        return args[args.index(flag) + 1] if flag in args else None
    dense = int(value("--dense-warmup") or 0)
    ramp = int(value("--density-ramp") or 0)
    if not ramp:
        return [(dense, 1.0)] if dense else []
    return [(int(n), float(d)) for n, d in jss.density_ramp(
        float(value("--density")), steps_per_stage=ramp, dense_steps=dense)]


def phase_step_time_mode(st_mode: str, density: float) -> str:
    """The step_time.py mode of a warm-up phase of ``density`` for a run timed as
    ``st_mode``: ``dense`` for density 1, else the same kind at that density
    (``adamdir_1pct`` -> ``adamdir_6.25pct``, ``topk_1pct_auto`` -> ``topk_6.25pct_auto``)."""
    if density >= 1.0:
        return "dense"
    parts = st_mode.split("_")
    if len(parts) < 2 or not parts[1].endswith("pct"):
        return "dense"
    parts[1] = density_name(density)
    return "_".join(parts)


def apply_step_times(rows: list[dict], series: dict, times: dict[str, dict],
                     secondary: str | None = None) -> None:
    """Fills the time axis of the table rows (and series) in place from ``times``
    (:func:`load_step_times`): each mode's step time, emulated seconds to dense's
    final and halfway metric, total, and the speed-ups against dense."""
    dense_s = times["dense"]["step_s"] if "dense" in times else None
    for row in rows:
        st_mode, approx = MODES[row["mode"]][1], MODES[row["mode"]][2]
        if st_mode not in times and st_mode in STEP_TIME_FALLBACK:
            st_mode, approx = STEP_TIME_FALLBACK[st_mode], True
        rec = times.get(st_mode)
        step_s = rec["step_s"] if rec else None
        # each warm-up phase at its own density's step time where measured, else dense's
        phases = row.get("warmup_phases")
        if phases is None:  # a results file from before rows recorded them
            phases = mode_warmup_phases(row["mode"])
        warm = []
        for steps, density in phases:
            phase_mode = phase_step_time_mode(st_mode, density)
            own = times.get(phase_mode)
            warm.append([int(steps), own["step_s"] if own else dense_s,
                         phase_mode if own else "dense"])
        at_dense = sum(n for n, _, m in warm if m == "dense")

        def at(step, step_s=step_s, warm=warm):
            return elapsed(step, step_s, [(n, t) for n, t, _ in warm])
        row.update({"warmup_phases": [list(p) for p in phases], "warmup_phase_step_s": warm,
                    "warmup_steps_at_dense_time": at_dense,
                    "emulated_step_s": step_s, "step_time_mode": st_mode,
                    "step_time_source": rec.get("_source") if rec else None,
                    "step_time_approximation": approx,
                    "time_to_dense_final_s": at(row["steps_to_dense_final"]),
                    "total_emulated_s": at(row["steps"]),
                    "time_to_dense_halfway_s": at(row["steps_to_dense_halfway"])})
        if secondary:
            row[f"time_to_dense_final_{secondary}_s"] = at(
                row[f"steps_to_dense_final_{secondary}"])
        series[row["mode"]].update({"emulated_step_s": step_s,
                                    "warmup_phase_step_s": warm,
                                    "warmup_steps_at_dense_time": at_dense,
                                    "dense_step_s": dense_s})
    dense_time = next((r["time_to_dense_final_s"] for r in rows if r["mode"] == "dense"), None)
    dense_half = next((r["time_to_dense_halfway_s"] for r in rows if r["mode"] == "dense"), None)
    for r in rows:
        t = r["time_to_dense_final_s"]
        r["speedup_to_dense_final"] = dense_time / t if dense_time and t else None
        t = r["time_to_dense_halfway_s"]
        r["speedup_to_dense_halfway"] = dense_half / t if dense_half and t else None


def retime(result: dict, step_time_paths) -> dict:
    """A results JSON of this benchmark with its time axis recomputed from other
    step_time.py measurements (no training: the steps to each target are the
    runs'). Records the files it used in ``time_axis``."""
    result = json.loads(json.dumps(result))  # a deep copy
    spec = MODELS[result["model"]]
    files = read_step_time_files(step_time_paths)
    times = load_step_times(files, spec["step_time_model"], result["time_axis"]["link_mbit"],
                            result["procs"])
    secondary = spec.get("secondary")
    apply_step_times(result["table"], result["series"], times, secondary)
    result["time_axis"].update({
        "source": [source for source, _ in files],
        "step_time_optimizer": {source: data.get("optimizer", "sgd") for source, data in files},
        "retimed_from_runs_of": result["time_axis"].get("retimed_from_runs_of",
                                                        result["time_axis"]["source"])})
    result["table_markdown"] = markdown_table(result["table"], result["metric"],
                                              result["lower_is_better"], secondary)
    return result


def analyze(args, model: str, runs: dict[str, dict]) -> dict:
    """The model's JSON: configuration, per-mode series and the table."""
    spec = MODELS[model]
    metric, lower = spec["metric"], spec["lower_is_better"]
    step_time_files = read_step_time_files(args.step_times)
    times = load_step_times(step_time_files, spec["step_time_model"], args.link, args.procs)
    dense = runs.get("dense")
    target = dense["final"][metric] if dense else None
    secondary = spec.get("secondary")
    sec_target = dense["final"][secondary] if dense and secondary else None
    # a target every reasonable mode reaches: dense's metric at half its steps
    half_target = None
    if dense:
        half_step = dense["config"]["steps"] // 2
        evals = [h for h in dense["history"] if h.get(metric) is not None and h["step"] > 0]
        half_target = min(evals, key=lambda h: abs(h["step"] - half_step))[metric]
    rows, series = [], {}
    for mode, run in runs.items():
        reach = first_reach(run["history"], metric, target, lower) if target is not None \
            else None
        final = run["final"][metric]
        if target is None:
            gap = None
        elif lower:
            gap = (final - target) / target          # relative, > 0: worse than dense
        else:
            gap = final - target                     # points, < 0: worse than dense
        row = {"mode": mode, "sync": run["sync"], "k": run["k"], "steps": run["config"]["steps"],
               f"final_{metric}": final, "gap_to_dense": gap,
               "gap_unit": "relative" if lower else "points",
               "steps_to_dense_final": reach,
               "warmup_phases": run_warmup_phases(run),
               "bytes_sent_per_step": run["final"]["bytes_sent_per_step"],
               "shm_median_step_s": run["final"]["median_step_s"],
               "replicas_identical": run["final"]["replicas_identical"],
               "global_count": count_summary(run)}
        row["dense_halfway_target"] = half_target
        row["steps_to_dense_halfway"] = first_reach(run["history"], metric, half_target, lower) \
            if half_target is not None else None
        if secondary:
            row[f"final_{secondary}"] = run["final"][secondary]
            row[f"steps_to_dense_final_{secondary}"] = first_reach(
                run["history"], secondary, sec_target, True) if sec_target is not None else None
        rows.append(row)
        series[mode] = {"history": run["history"], "per_step": run["per_step"]}
    apply_step_times(rows, series, times, secondary)
    any_run = next(iter(runs.values()))
    return {
        "benchmark": "convergence", "model": model, "procs": args.procs,
        "example": spec["script"], "metric": metric, "lower_is_better": lower,
        "model_config": any_run["model"], "num_params": any_run["num_params"],
        "leaves": any_run["leaves"], "seed": args.seed,
        "data": any_run.get("corpus") or any_run.get("data"),
        "example_config": {k: v for k, v in any_run["config"].items()
                           if k not in ("sync", "density", "selection", "json")},
        "time_axis": {
            "definition": "step index x the mode's median step time on the emulated link, "
                          "from benchmarks/step_time.py; training itself ran on shared memory",
            "source": [source for source, _ in step_time_files],
            "link_mbit": args.link, "step_time_model": spec["step_time_model"],
            "step_time_optimizer": {source: data.get("optimizer", "sgd")
                                    for source, data in step_time_files},
            "step_time_model_config": next(
                (data["models"][spec["step_time_model"]] for _, data in step_time_files
                 if spec["step_time_model"] in data.get("models", {})), None),
            "differences": "step_time.py steps are sync + sgd where the row's "
                           "step_time_source was run with --optimizer sgd (these runs add "
                           "clip + adamw (lm) or adamw (cnn): a few more elementwise passes "
                           "over N floats) and the runs' own optimizer where it was run with "
                           "--optimizer adamw (step_time_optimizer). "
                           "*_reuse modes use the exact-selection mode's time "
                           "(step_time_approximation = true); warm-up steps (*_ramp: "
                           "--density-ramp stages) are charged their own density's step time "
                           "where step_time.py measured it (row: warmup_phase_step_s), "
                           "else dense's.",
        },
        # the default modes count as not run when left out of --modes
        "modes_not_run": [m for m in dict.fromkeys((*DEFAULT_MODES, *args.modes))
                          if m not in runs],
        "table": rows, "table_markdown": markdown_table(rows, metric, lower, secondary),
        "series": series,
        "commands": {m: r.get("command") for m, r in runs.items()},
    }


def _fmt(v, spec=".3f", none="-"):
    return none if v is None else format(v, spec)


def markdown_table(rows, metric, lower, secondary=None) -> str:
    head = (f"| mode | final {metric} | gap to dense | steps to dense's final | "
            f"emulated s to dense's final | speed-up | step s (1 Gbit/s) | kB sent / step |")
    lines = [head, "|" + " --- |" * 8]
    for r in rows:
        gap = r["gap_to_dense"]
        gap_s = "-" if gap is None else (f"{100 * gap:+.2f}%" if lower else f"{gap:+.2f} pt")
        step_s = _fmt(r["emulated_step_s"]) + ("*" if r["step_time_approximation"] else "")
        lines.append(
            f"| {r['mode']} | {_fmt(r[f'final_{metric}'], '.4f' if lower else '.2f')} | "
            f"{gap_s} | {_fmt(r['steps_to_dense_final'], 'd', 'never')} | "
            f"{_fmt(r['time_to_dense_final_s'], '.1f', 'never')} | "
            f"{_fmt(r['speedup_to_dense_final'], '.2f')}x | {step_s} | "
            f"{r['bytes_sent_per_step'] / 1e3:.1f} |")
    target = rows[0].get("dense_halfway_target") if rows else None
    lines.append("")
    lines.append(f"Dense's {metric} at half its steps ({_fmt(target, '.4f')}): steps and "
                 "emulated seconds to reach it, speed-up over dense")
    lines.append("")
    lines.append("| mode | steps | emulated s | speed-up |")
    lines.append("|" + " --- |" * 4)
    for r in rows:
        lines.append(f"| {r['mode']} | {_fmt(r['steps_to_dense_halfway'], 'd', 'never')} | "
                     f"{_fmt(r['time_to_dense_halfway_s'], '.1f', 'never')} | "
                     f"{_fmt(r['speedup_to_dense_halfway'], '.2f')}x |")
    if secondary:
        lines.append("")
        lines.append(f"| mode | final {secondary} | steps to dense's final {secondary} | "
                     "emulated s |")
        lines.append("|" + " --- |" * 4)
        for r in rows:
            lines.append(f"| {r['mode']} | {_fmt(r[f'final_{secondary}'], '.4f')} | "
                         f"{_fmt(r[f'steps_to_dense_final_{secondary}'], 'd', 'never')} | "
                         f"{_fmt(r[f'time_to_dense_final_{secondary}_s'], '.1f', 'never')} |")
    lines.append("")
    lines.append("* step time of the exact-selection mode (no measurement of its own)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots


#: line colour per sync and density (the mode name's first two parts)
COLORS = {"dense": "black", "topk_1pct": "tab:blue", "topk_0.1pct": "tab:cyan",
          "oktopk_1pct": "tab:red", "oktopk_0.1pct": "tab:orange", "topk_2pct": "tab:purple",
          "shared_support": "tab:brown"}
#: ... with selection="union" (every rank's top-k, summed over all ranks on the union)
UNION_COLORS = {"topk_1pct": "tab:green", "topk_0.1pct": "tab:olive", "topk_2pct": "tab:pink"}


def plot_style(mode: str) -> dict:
    """Matplotlib line keywords of a mode: colour from its sync and density, line style
    from what is varied, a marker for a density ramp."""
    parts = mode.split("_")
    base = "_".join(parts[:2]) if parts[0] != "dense" else "dense"
    flags = set(parts[2:] if base != "dense" else parts[1:])
    ramps = [f for f in flags if f.startswith("ramp")]
    if "lrin" in flags:  # the learning rate before the sync
        style = (0, (3, 1, 1, 1, 1, 1))
    elif "mask" in flags:
        style = (0, (5, 1, 1, 1))
    elif "adamdir" in flags:
        style = (0, (1, 1)) if ramps else ":"
    elif "reuse" in flags:
        style = "--"
    else:
        style = "-." if ramps else "-"
    kw = {"color": COLORS.get(base), "ls": style, "lw": 2.2 if style == ":" else 1.6,
          "label": mode}
    if ramps:
        kw.update(marker={"ramp": "o", "ramp40": "s"}.get(ramps[0], "^"), ms=3.5)
    if "meanv" in flags or "meanvwarm" in flags:  # the mean gradient's second moment:
        # thicker (solid without lrin), lighter while ramped in
        kw.update(lw=2.4, **({} if "lrin" in flags else {"ls": "-"}))
        if "meanvwarm" in flags:
            kw.update(alpha=0.6)
    if "union" in flags:
        kw.update(color=UNION_COLORS.get(base, kw["color"]))
    if any(f.startswith("decay") for f in flags):  # a leaky residual: long dashes, opaque
        kw.update(ls=(0, (6, 2)), alpha=1.0)
    return kw


def plot(result: dict, path: Path):
    plt = pyplot()

    metric = result["metric"]
    panels = [metric] + ([s] if (s := MODELS[result["model"]].get("secondary")) else [])
    # a third column, each mode minus dense at the same step: close runs that overlap on
    # the first two are told apart there
    dense = result["series"].get("dense")
    cols = 3 if dense else 2
    fig, axes = plt.subplots(len(panels), cols, figsize=(6.5 * cols, 4.6 * len(panels)),
                             squeeze=False)
    for row, name in enumerate(panels):
        at_step = {h["step"]: h[name] for h in (dense or {}).get("history", [])
                   if h.get(name) is not None}
        for mode, s in result["series"].items():
            hist = [h for h in s["history"] if h.get(name) is not None]
            steps = [h["step"] for h in hist]
            vals = [h[name] for h in hist]
            kw = plot_style(mode)
            axes[row][0].plot(steps, vals, **kw)
            warm = [(n, t) for n, t, _ in s["warmup_phase_step_s"]] \
                if "warmup_phase_step_s" in s else \
                [(s.get("warmup_steps_at_dense_time", 0), s.get("dense_step_s"))]
            times = [elapsed(st, s["emulated_step_s"], warm) for st in steps]
            if all(t is not None for t in times[1:]):
                axes[row][1].plot([t or 0.0 for t in times], vals, **kw)
            if dense and mode != "dense":
                both = [(st, v - at_step[st]) for st, v in zip(steps, vals)
                        if st in at_step and st > 0]
                axes[row][2].plot([b[0] for b in both], [b[1] for b in both], **kw)
        target = next(r for r in result["table"] if r["mode"] == "dense")[f"final_{name}"] \
            if "dense" in result["series"] else None
        for ax in axes[row][:2]:
            if target is not None:
                ax.axhline(target, color="gray", lw=0.8, ls=":")
            ax.set_ylabel(name.replace("_", " "))
            ax.grid(alpha=0.3)
            if name == "test_accuracy":
                ax.set_ylim(40, 100)
        if dense:
            axes[row][2].axhline(0.0, color="black", lw=0.8)
            axes[row][2].set(ylabel=f"{name.replace('_', ' ')} minus dense's at that step",
                             xlabel="step")
            axes[row][2].grid(alpha=0.3)
        axes[row][0].set_xlabel("step")
        axes[row][1].set_xlabel(f"emulated wall time at {result['time_axis']['link_mbit']} "
                                "Mbit/s (s) = step x step_time.py's step time")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{result['model']}: {result['num_params']:,} parameters, P = "
                 f"{result['procs']}, same init/data/steps per mode; trained on shared "
                 "memory, time axis from step_time.py (each row's step_time_mode)\n(dashed: "
                 "threshold reuse; dotted: Adam direction synced; dash-dot: and its momentum "
                 "masked; markers: DGC density ramp (_ramp), its stages timed at their "
                 "density or as dense)",
                 fontsize=9)
    save_figure(fig, path)
    return axes


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.retime:
        result = retime(load_record(args.retime), args.step_times)
        write_result(result, args.tag, args.out_dir)
        return 0
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    seeds = args.seeds or [args.seed]
    for model in args.models:
        steps = args.steps or MODELS[model]["steps"]
        by_seed: dict[int, dict] = {}
        for seed in seeds:  # every mode of a seed before the next seed: a usable record early
            runs = by_seed.setdefault(seed, {})
            for mode in args.modes:
                if args.plot_only:
                    p = run_path(args, model, mode, seed)
                    if p.exists():
                        runs[mode] = load_record(p)
                    continue
                runs[mode] = run_one(args, model, mode, steps, seed)
                write_outputs(args, model, by_seed)
        if args.plot_only and any(by_seed.values()):
            write_outputs(args, model, by_seed)
    return 0


def write_outputs(args, model: str, by_seed: dict[int, dict]) -> None:
    """The record of one model: the first seed's analysis (table, series, plot), each
    mode's final metric per seed (``seed_finals``, with ``--seeds``) and the commit each
    run trained at (``trained_at``: ``mode``, or ``mode/seed<s>`` with ``--seeds``)."""
    first = next(s for s, runs in by_seed.items() if runs)
    result = analyze(argparse.Namespace(**{**vars(args), "seed": first}), model, by_seed[first])
    metric = MODELS[model]["metric"]
    name = (lambda mode, seed: f"{mode}/seed{seed}") if args.seeds else (lambda mode, _: mode)
    result["trained_at"] = {name(mode, seed): run.get("trained_at_commit")
                            for seed, runs in by_seed.items() for mode, run in runs.items()}
    if args.seeds:
        result["seeds"] = sorted(by_seed)
        result["seed_finals"] = {mode: {str(seed): runs[mode]["final"][metric]
                                        for seed, runs in by_seed.items() if mode in runs}
                                 for mode in args.modes}
    result["machine"] = machine_info()  # commit and command of the record
    write_result(result, args.tag, args.out_dir)


def write_result(result: dict, tag: str | None, out_dir: Path = RESULTS) -> None:
    """``<out_dir>/convergence_<model>[_<tag>][_P<P>].{json,png}`` and the table, printed."""
    base = Path(out_dir) / (f"convergence_{result['model']}" + (f"_{tag}" if tag else "")
                      + ("" if result["procs"] == 4 else f"_P{result['procs']}"))
    write_record(result, base.with_suffix(".json"))
    plot(result, base.with_suffix(".png"))
    print(result["table_markdown"], flush=True)


if __name__ == "__main__":
    sys.exit(main())
