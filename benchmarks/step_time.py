"""End-to-end training-step time: one jitted data-parallel step per gradient-sync mode.

What is measured. One training step, the whole of it in ONE ``jax.jit`` with the
parameters and the optimizer state donated::

    grads = jax.grad(loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)   # the sync happens in here
    params = optax.apply_updates(params, updates)

run data-parallel on P MPI ranks (each rank its own synthetic batches: random inputs and
labels from a fixed seed, ``--batches`` of them (4) taken in turn, one a step, as a
training loop takes a new batch every step: the values do not change the compute, but
they do change what the selections find, e.g. how often Ok-Topk's reused threshold
overflows into the exact top-k), where ``tx`` is
``optax.chain(<sync>, optax.sgd(lr))`` and ``<sync>`` is one of the modes:

===========================  ==========================================================
``none``                     ``optax.identity()``: no communication (the compute baseline)
``dense``                    ``jss.dense_sync()`` (MPI_Allreduce of the flat gradient)
``dense_bf16``               ``jss.dense_sync(wire_dtype=jnp.bfloat16)``: the practitioners'
                             baseline, a dense allreduce of bf16 gradients (half the bytes;
                             summed in float32)
``topk_<d>pct_<alg>``        ``jss.topk_sync(density=d/100, algorithm=alg)``, d in {1, 0.1},
                             alg in auto, allgather, recursive_doubling, split_allgather,
                             dsar_split_allgather
``oktopk_<d>pct``            ``jss.oktopk_sync(density=d/100)``
``adamdir_<d>pct``           ``jss.adam_direction_sync(jss.topk_sync(density=d/100),
                             momentum_masking="restart")``: each rank's Adam direction
                             synced, as the convergence runs' ``*_adamdir_mask*`` modes
``psum``                     not MPI: one process with P host devices
                             (``--xla_force_host_platform_device_count=P``), the step under
                             ``jax.shard_map`` over a mesh axis ``"data"``, gradients
                             averaged by ``jax.lax.pmean`` (XLA's all-reduce); only on the
                             ``shm`` link, in a subprocess of its own. The same job also
                             records ``psum_jss_dense`` (the same step with
                             ``jss.dense_sync(comm=jss.axis("data"))``, the library's
                             dense baseline on that transport) and ``psum_none``
===========================  ==========================================================

Models (Flax linen, sizes from the command line; batches are per rank):

* ``mlp``: input 1024, 4 hidden layers of 1536 with relu, 10 classes, batch 32 (the
  configuration of the issue): 8,672,266 parameters in 10 leaves;
* ``transformer``: a byte-level decoder-only LM (vocab 256, d_model 384, 6 pre-LayerNorm
  blocks of 6 heads and a 4x MLP, learned positions), sequence 128, batch 2: 10.9M
  parameters in 102 leaves. Batch 2, not 8: the no-sync step is then ~0.35 s at P = 4
  on 2 cores (batch 8 would be ~1.4 s);
* ``cnn``: ResNet-style, many small layers: a stride-2 stem, 3 stages (32, 64, 128
  channels) of 3 residual blocks (conv + LayerNorm, twice), 32x32x3 inputs, batch 16:
  1.1M parameters in 80 leaves.

Links: ``shm`` (plain ``mpiexec -n P``: MPICH shared memory) and emulated links of R
Mbit/s per direction (``emulated_network.py``: one network namespace per rank behind a
``tc tbf``-shaped veth, MPICH over TCP; one network per link, probed once for its
latency and rate, then used for every model and P).

How. One ``python -m mpi4py`` job per (model, link, P) runs every mode in turn (an
exception on one rank aborts the whole job). Per mode: jit, the first call (compile +
run), ``--warmup`` more steps, then T timed steps, each timed on its own: the call,
``jax.block_until_ready``, and an ``MPI_Barrier`` on COMM_WORLD. The barrier keeps the
ranks of the steps without communication (``none``, the one-rank steps below) in
lockstep, as the collectives keep the real ones: unsynchronized, ranks on an
oversubscribed CPU drift apart (measured without it, cnn at P = 4, ``none``: per-rank
medians 0.037 to 0.118 s) and the median no longer says what a synchronized step
costs. It is in every mode alike and costs a few message latencies. T = ``--max-seconds-per-mode`` / (the warm-up step time, max
over ranks), clipped to [3, ``--steps``], so slow modes get fewer steps; every rank uses
the same T. A rank's time is the median of its T steps (``per_rank_median_s``); the
mode's step time (``step_s``) is the median over ranks of those. ``--repeats R`` runs every
job R times (all jobs of a link once, then again) and keeps, per mode, the repeat with the
median step time, whole (its breakdown is then one job's; ``repeats_step_s`` lists the R,
``runs`` holds every repeat's record): the job-to-job spread here is larger than the
step-to-step one. The ranks (and the
psum process) run with ``--rank-env``: MPICH progress throttling (as
``sparcml_fig3.py``) and glibc malloc keeping buffers up to 1 GiB on the heap (the
step's N-float buffers are otherwise mmap'ed and page-faulted on every step, which
costs more than a sparse sync; see ``MALLOC_ENV``); where the ranks outnumber the cores
also with MPICH's heavy yield (``--heavy-yield``, ``HEAVY_YIELD_ENV``: a rank waiting in
a collective gives its core to one still computing, as it would not need to on a
cluster with a core per rank; ``heavy_yield`` in each record). ``--quiet-wait S`` waits for an
idle CPU before each job; the busy fraction seen is recorded (``cpu_busy_before``).

Breakdown (same model, link and P; all medians):

* ``compute`` = the ``none`` mode's step time: forward, backward, SGD, no sync;
* ``local`` = (the same jitted step with the same transform on a one-rank communicator,
  ``comm=MPI.COMM_SELF``) - compute: selection, residual update, densifying the result,
  ravel/unravel, the O(N) passes that do not depend on P. For ``topk_*_auto`` the
  one-rank step uses the algorithm ``auto`` picks at P (at one rank it would pick
  another). It is measured in the same job right after the mode, on all ranks at once,
  so the CPU contention is about that of the real step;
* ``wire`` = step - compute - local, clipped at 0: messages, waiting for the slowest
  rank, and the work that grows with P (merging P streams, summing P contributions).

Caveats. These are differences of medians of noisy steps on a shared 2-core machine:
``local`` can come out slightly negative (kept as ``local_raw_s``, clipped to 0 in
``local_s``). In the one-rank step no rank ever waits in MPI, so its CPU contention is
at least that of the real step, whose ranks leave the CPU to the others while they wait
for the network: ``local`` tends to be an upper bound. P = 8 ranks oversubscribe the 2
cores (accepted: it shows how the step scales when the CPU is shared, not a cluster's
P = 8). For ``psum`` and ``psum_jss_dense`` (one process, P devices) ``compute`` is that
process's own no-sync shard_map step (mode ``psum_none``; its parameters drift apart
per device, which does not change the time), ``local`` is not measured (None) and
``wire`` = step - compute. ``psum_jss_dense``'s prediction takes ``dense_sync``'s
local-work term from the MPI job of the same repeat (the same transform's passes, on
the same cores; the psum job does not calibrate); ``psum`` (XLA's own all-reduce) has
none. ``psum`` has no statistics: its bytes are the cost model's
dense volume (``bytes_from_model``).

Bytes: ``bytes_sent`` per rank per step from the transform's state
(``jss.SyncStats.from_vector(<the sync's state>.last_stats)``, the last timed step; the same
for ``oktopk_sync``), next to ``N`` (parameters) and ``k``.

Prediction: ``predicted_s = compute + local + wire`` from ``jss.planning.cost_model``
(``predict_step_time``'s terms): ``compute`` is the measured ``none`` step of the
same job (the same repeat); ``local`` is the cost model's local-work term ``fixed +
per_entry * N + per_kept * k`` of the mode's transform, calibrated in the same job
by ``jss.planning.calibrate(local=...)`` on a synthetic 16-leaf tree at N/4 and N entries
and densities 1 % and 0.1 % (all ranks at once; independent of this script's own
``local`` breakdown); ``wire`` is the alpha-beta time of the typical bytes
(``WireVolume.bytes_typical``: the worst case that ``algorithm="auto"`` ranks by, but
for split-allgather, whose worst case puts every rank's k entries in one range and
sends P times the typical block; ``predicted_worst_case_s`` uses the worst case
throughout; Ok-Topk's from ``cost_model.oktopk_sync_volume``, the transform's own
count bounds): on an emulated link alpha =
the measured 8-byte one-way latency (or ``--alpha-us``) and beta = 8 / (rate_mbit
* 1e6) s per byte; on ``shm`` ``cost_model.current_alpha_beta()``.
``predicted_wire_only_s`` leaves the local term out (what the model predicted
before it had one), ``predicted_with_local_s`` uses the measured ``local``
instead, and ``predicted_sync_measured_bytes_s`` the bytes actually sent.
``measured_over_predicted`` is the record's (one job's) ratio;
``measured_over_predicted_median`` the median over the repeats of each repeat's
ratio: on this shared machine the same program moves by up to 60 % from one job to
the next, and a ratio within one job is what says whether the model is right.

Commands (from the repository root; the emulated links need root)::

    python benchmarks/step_time.py --quick           # mlp, shm + 1000 Mbit/s, P=4, 3 modes
    python benchmarks/step_time.py --models mlp --links shm 1000 --procs 4 \\
        --modes none dense topk_0.1pct_auto topk_1pct_auto oktopk_0.1pct --tag mlp_p4
    python benchmarks/step_time.py                   # everything (hours on 2 cores)
    python benchmarks/step_time.py --tag mlp_p4 --plot-only

Writes ``benchmarks/results/step_time_<tag>.json`` (machine, command line, links and
their probes, every record) and ``step_time_<tag>.png``.

Code: this file is the command line and what other benchmarks import; the rest is in
``benchmarks/step_timing/``: ``modes``, ``models``, ``worker`` (the timed jobs),
``launch`` (jobs and the sweep) and ``report`` (breakdown, prediction, table, figure).
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
