"""End-to-end training-step time: one jitted data-parallel step per gradient-sync mode.

What. One training step in ONE ``jax.jit``, parameters and optimizer state donated::

    grads = jax.grad(loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)   # the sync happens in here
    params = optax.apply_updates(params, updates)

on P MPI ranks (each rank its own synthetic batches, ``--batches`` taken in turn),
``tx = optax.chain(<sync>, optax.sgd(lr))``, ``<sync>`` a mode of
``step_timing/modes.py`` (``none``, ``dense``, ``dense_bf16``, ``topk_<d>pct_<alg>``,
``oktopk_<d>pct``, ``adamdir_<d>pct``; ``psum``: ``jax.lax.pmean`` over P host devices),
for the models of ``step_timing/models.py`` (``mlp``, ``transformer``, ``cnn``), on
``shm`` (plain ``mpiexec``) and emulated links of R Mbit/s (``emulated_network.py``).

How. One ``python -m mpi4py`` job per (model, link, P) runs every mode in turn
(``step_timing/worker.py``: T timed steps, each ending in an ``MPI_Barrier``; ``step_s``
the median over ranks of each rank's median); ``--repeats R`` keeps, per mode, the
median repeat whole. Breakdown: ``compute`` = the ``none`` step; ``local`` = the same
step on ``MPI.COMM_SELF`` - compute; ``wire`` = the rest. Prediction
(``step_timing/report.py``): compute + the local-work term calibrated in the same job
(``jss.planning.calibrate``) + the alpha-beta time of the cost model's bytes.

Commands (from the repository root; the emulated links need root)::

    python benchmarks/step_time.py --quick           # mlp, shm + 1000 Mbit/s, P=4, 3 modes
    python benchmarks/step_time.py --models mlp --links shm 1000 --procs 4 \\
        --modes none dense topk_0.1pct_auto topk_1pct_auto oktopk_0.1pct --tag mlp_p4
    python benchmarks/step_time.py --tag mlp_p4 --plot-only

Writes ``benchmarks/results/step_time_<tag>.{json,png}``; the results are in
benchmarks/README.md ("step_time.py") and docs/performance.md. The rest of the code is in
``benchmarks/step_timing/``: ``modes``, ``models``, ``worker``, ``launch``, ``report``.
"""

from __future__ import annotations

import argparse
import json
import os  # noqa: F401  (tests patch step_time.os.cpu_count)
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import add_bind_option  # noqa: E402
# MPI progress throttling, as the emulated-network benchmark settled on: 8 ranks on
# 2 cores otherwise spin in MPI and starve the ranks that work.
from sparcml_fig3 import DEFAULT_MPI_ENV  # noqa: E402
from step_timing.launch import (MALLOC_ENV, driver, heavy_yield, launch,  # noqa: E402,F401
                                probe_link, rank_env)
from step_timing.models import (MODELS, _shared_models, build_model, fresh,  # noqa: E402,F401
                                init_params, model_config)
from step_timing.modes import (ALL_MODES, LOCAL_KIND, LR, OPTIMIZERS,  # noqa: E402,F401
                               PLOT_ORDER, QUICK_MODES, WEIGHT_DECAY, density_name, make_tx,
                               mode_k, parse_mode, wire_dtype_index)
from step_timing.report import (finish, link_alpha_beta, median_records,  # noqa: E402,F401
                                predict_sync_time, predicted_volume)
from step_timing.worker import make_step, psum_worker, time_steps, worker  # noqa: E402,F401

RESULTS = HERE / "results"


def build_parser() -> argparse.ArgumentParser:
    """The command line (its defaults are the measured configuration, e.g. the model
    sizes that ``time_to_accuracy.py`` reuses)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    ap.add_argument("--psum-worker", metavar="CONFIG", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--links", nargs="+", default=["shm", "1000", "200"],
                    help="shm and/or emulated link rates in Mbit/s (default: shm 1000 200)")
    ap.add_argument("--procs", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--modes", nargs="+", default=list(ALL_MODES), metavar="MODE",
                    help=f"subset of: {' '.join(ALL_MODES)} (default all)")
    ap.add_argument("--steps", type=int, default=20, help="most timed steps per mode")
    ap.add_argument("--warmup", type=int, default=2, help="steps after the compiling one")
    ap.add_argument("--max-seconds-per-mode", type=float, default=10.0,
                    help="stop timing a mode after about this long (at least 3 steps)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per launched job")
    ap.add_argument("--alpha-us", type=float, default=None,
                    help="model latency of the emulated links (default: the measured ping)")
    ap.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                    help="wait up to S seconds for an idle CPU before each job (default 0)")
    ap.add_argument("--rank-env", nargs="*", metavar="KEY=VALUE",
                    default=[*DEFAULT_MPI_ENV, *(f"{k}={v}" for k, v in MALLOC_ENV.items())],
                    help="environment of the ranks and the psum process (default: MPI "
                         "progress throttling and malloc keeping buffers of up to 1 GiB; "
                         "pass --rank-env alone for none)")
    add_bind_option(ap)
    ap.add_argument("--out-dir", type=Path, default=RESULTS,
                    help="where the JSON and plots go (default benchmarks/results)")
    ap.add_argument("--heavy-yield", choices=("auto", "on", "off"), default="auto",
                    help="add MPICH's heavy yield (HEAVY_YIELD_ENV) to --rank-env: auto "
                         "(default) where the ranks outnumber the cores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=4,
                    help="distinct batches per rank, one a step in turn, as training draws a "
                         "new one every step (default 4; 1: the same batch every step)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="jobs per (link, P, model), interleaved; each mode's record is the "
                         "repeat with the median step time (default 1)")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                    help="what follows the sync: sgd (default) or adamw, the LM example's "
                         "clip + AdamW (the step the convergence runs take)")
    ap.add_argument("--tag", default=None, help="output name step_time_<tag> (default cpu)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: mlp, shm + 1000, P=4, none/dense/topk_1pct_auto, 4 steps")
    ap.add_argument("--plot-only", action="store_true", help="redraw table and PNG from the JSON")
    g = ap.add_argument_group("model sizes (batch sizes are per rank)")
    g.add_argument("--mlp-input", type=int, default=256)
    g.add_argument("--mlp-hidden", type=int, default=1536)
    g.add_argument("--mlp-layers", type=int, default=4, help="hidden layers")
    g.add_argument("--mlp-batch", type=int, default=32)
    g.add_argument("--tf-dim", type=int, default=384)
    g.add_argument("--tf-heads", type=int, default=6)
    g.add_argument("--tf-layers", type=int, default=6)
    g.add_argument("--tf-seq", type=int, default=128)
    g.add_argument("--tf-batch", type=int, default=2)
    g.add_argument("--cnn-widths", type=int, nargs="+", default=[32, 64, 128],
                   help="channels of the stages")
    g.add_argument("--cnn-blocks", type=int, default=3, help="residual blocks per stage")
    g.add_argument("--cnn-batch", type=int, default=16)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))
    if args.psum_worker:
        return psum_worker(json.loads(Path(args.psum_worker).read_text()))
    if args.quick:
        args.models, args.links, args.procs = ["mlp"], ["shm", "1000"], [4]
        args.modes, args.steps, args.warmup = list(QUICK_MODES), 4, 1
        args.max_seconds_per_mode = min(args.max_seconds_per_mode, 3.0)
        args.tag = args.tag or "quick"
    args.tag = args.tag or "cpu"
    for m in args.modes:
        parse_mode(m)
    for lk in args.links:
        if lk != "shm" and not lk.replace(".", "", 1).isdigit():
            ap.error(f"--links: {lk!r} is neither shm nor a rate in Mbit/s")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
