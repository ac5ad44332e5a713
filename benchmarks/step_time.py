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
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (add_bind_option, bind_args, cpu_busy, find_mpiexec,  # noqa: E402
                      fmt_bytes, machine_info, run_fragment, wait_for_quiet, write_fragment)
# MPI progress throttling, as the emulated-network benchmark settled on: 8 ranks on
# 2 cores otherwise spin in MPI and starve the ranks that work.
from sparcml_fig3 import DEFAULT_MPI_ENV  # noqa: E402

RESULTS = HERE / "results"
MODELS = ("mlp", "transformer", "cnn")
ALGORITHMS = ("auto", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather")
DENSITIES = {"1pct": 0.01, "0.1pct": 0.001}
ALL_MODES = (("none", "dense", "dense_bf16")
             + tuple(f"topk_{d}_{a}" for d in DENSITIES for a in ALGORITHMS)
             + tuple(f"oktopk_{d}" for d in DENSITIES)
             + tuple(f"adamdir_{d}" for d in DENSITIES) + ("psum",))
# what the psum job records (all for the one "psum" of --modes)
PSUM_MODES = ("psum_none", "psum", "psum_jss_dense")
NO_SYNC = ("none", "psum_none")
DENSE_KINDS = ("dense", "dense_bf16", "psum", "psum_jss_dense")
#: mode -> the sync's ``wire_dtype`` (the others send float32 values)
WIRE_DTYPES = {"dense_bf16": "bfloat16"}
PLOT_ORDER = ALL_MODES + ("psum_jss_dense",)
QUICK_MODES = ("none", "dense", "topk_1pct_auto")
#: mode kind -> the cost model's local-work kind (jss.planning.cost_model.LOCAL_WORK_KINDS)
#: (adamdir's Adam passes have no kind of their own: its prediction counts topk_sync's)
#: (psum_jss_dense is jss.dense_sync on the axis transport: the same transform's O(N)
#: passes, predicted with the calibration of the MPI job of the same repeat)
#: (dense_bf16 is priced with dense_sync's calibration, which is float32's: its two
#: roundings to bf16 are not in that term)
LOCAL_KIND = {"dense": "dense_sync", "dense_bf16": "dense_sync", "topk": "topk_sync",
              "oktopk": "oktopk_sync", "adamdir": "topk_sync", "psum_jss_dense": "dense_sync"}
DEFAULT_ALPHA_S = 20e-6   # used on an emulated link when the ping probe failed
LR = 0.01
# glibc malloc: keep big buffers on the heap and reuse them. The step allocates several
# N-float buffers per call (gradient, flat vector, sync result: 35 MB for the mlp), and
# above the mmap threshold each is mmap'ed and page-faulted anew on every step. The
# 32 MiB of sparcml_fig3.py's TUNED_MALLOC_ENV is below these buffers; measured, one
# process, jnp x * 2 on 8.67M floats: 79 ms (glibc default), 14 ms (32 MiB), 2 ms (1 GiB).
# MALLOC_ARENA_MAX=1: XLA runs the step's thunks on its worker threads, whose own
# arenas unmap their heaps when they empty whatever the thresholds; with one arena
# they reuse the main heap (jax_sparse_sync/host_allocator.py: the TTA LM's step
# went from 21,000-35,000 page faults to none, one rank).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
              "MALLOC_ARENA_MAX": "1"}
# MPICH: yield the core in the progress loop while waiting. With more ranks than cores a
# rank that reaches a collective first otherwise spins on a core that a rank still in its
# backward pass needs; the step then costs the network's time plus the others' lost CPU,
# which no cluster with a core per rank pays (measured: cnn, P = 4 on 2 cores,
# topk_sync(0.1 %) 1.33x the cost model's step without it, 1.05x with it;
# results/step_time_model_p4_cnn2 against step_time_model_p4_yield). Used only where
# the ranks oversubscribe the cores (``--heavy-yield auto``): with a core each it only
# adds a system call to every wait.
HEAVY_YIELD_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


# --------------------------------------------------------------------------- modes


def parse_mode(mode: str) -> dict:
    """The pieces of a mode name.

    Args:
      mode: e.g. ``"none"``, ``"dense"``, ``"dense_bf16"``, ``"topk_0.1pct_auto"``,
        ``"oktopk_1pct"``,
        ``"adamdir_1pct"`` (``jss.adam_direction_sync(jss.topk_sync(...))`` with momentum
        masking, as the convergence runs' ``*_adamdir_mask*`` modes use it; any density
        as ``<percent>pct``, e.g. ``adamdir_6.25pct`` for a density-ramp stage), ``"psum"``
        (or ``"psum_none"``, ``"psum_jss_dense"``: the psum job's others).

    Returns:
      ``{"kind": the mode for the dense and no-sync modes, else topk|oktopk|adamdir,
      "density": float | None,
      "algorithm": str | None}``.

    Raises:
      ValueError: for an unknown name.
    """
    if mode in ("none", "dense", "dense_bf16") + PSUM_MODES:
        return {"kind": mode, "density": None,
                "algorithm": "dense" if mode in DENSE_KINDS else None}
    parts = mode.split("_", 2)
    density = _density(parts[1]) if len(parts) > 1 else None
    if parts[0] == "topk" and len(parts) == 3 and density and parts[2] in ALGORITHMS:
        return {"kind": "topk", "density": density, "algorithm": parts[2]}
    if parts[0] == "oktopk" and len(parts) == 2 and density:
        return {"kind": "oktopk", "density": density, "algorithm": "oktopk"}
    if parts[0] == "adamdir" and len(parts) == 2 and density:
        return {"kind": "adamdir", "density": density, "algorithm": "auto"}
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(ALL_MODES)} "
                     "(or any density as <percent>pct, e.g. adamdir_6.25pct)")


def density_name(density: float) -> str:
    """A density as mode names spell it: 0.01 -> ``"1pct"``, 0.0625 -> ``"6.25pct"``."""
    return f"{100 * density:g}pct"


def _density(name: str) -> float | None:
    """``"1pct"`` -> 0.01, any ``"<percent>pct"`` in (0, 100]; None otherwise."""
    if name in DENSITIES:
        return DENSITIES[name]
    if not name.endswith("pct"):
        return None
    try:
        d = float(name[:-3]) / 100
    except ValueError:
        return None
    return d if 0 < d <= 1 else None


def mode_k(mode: str, size: int) -> int | None:
    """Entries kept per step (k) of a sparse mode at N = ``size``; None for the dense ones."""
    import jax_sparse_sync as jss

    spec = parse_mode(mode)
    if spec["density"] is None:
        return None
    return jss.planning.resolve_k(size=size, density=spec["density"], k=None)


def run_algorithm(mode: str, nranks: int, size: int) -> str | None:
    """The allreduce algorithm a mode runs at P = ``nranks`` (``auto`` resolved, as the
    library resolves it at trace time: by ``cost_model.current_alpha_beta()``)."""
    import jax_sparse_sync as jss

    spec = parse_mode(mode)
    if spec["algorithm"] != "auto":
        return spec["algorithm"]
    return jss.planning.resolve_algorithm("auto", nranks=nranks, size=size, k=mode_k(mode, size))


# --------------------------------------------------------------------------- prediction


def predict_sync_time(mode: str, nranks: int, size: int, k: int | None, link,
                      local_seconds: float | None = None, volume: str = "typical") -> float:
    """Predicted seconds the gradient sync adds to a step, from ``jss.planning.cost_model``.

    ``cost_model.sync_wire_time``: ``messages * alpha + bytes * beta`` with
    ``volume``'s bytes (``WireVolume.bytes_typical`` by default: the worst case
    but for split-allgather's, whose worst case is P times what a top-k of gradients
    sends; ``"max"`` for the worst case) of the algorithm the mode runs (``auto``
    resolved the way the library does, by the worst case); Ok-Topk's from
    ``cost_model.oktopk_sync_volume``, its transform's bound, for a step that reuses
    its regions and threshold (the timed steps are between the tau / tau'
    recomputations).

    Args:
      mode: a mode name (see :func:`parse_mode`); ``none`` predicts 0.
      nranks: P.
      size: N, parameters in the model.
      k: entries kept per rank (ignored by the dense modes).
      link: ``jss.planning.cost_model.AlphaBeta`` of the transport: alpha in seconds per
        message, beta in seconds per byte.
      local_seconds: local work to add (the measured one, for
        ``predicted_with_local_s``).
      volume: ``"typical"`` or ``"max"`` (``cost_model.VOLUMES``).

    Returns:
      Seconds.
    """
    from jax_sparse_sync.planning import cost_model

    mode_kind = parse_mode(mode)["kind"]
    if mode_kind in NO_SYNC:
        t = 0.0
    else:  # psum has no transform of its own: its bytes are the dense allreduce's
        t = cost_model.sync_wire_time(LOCAL_KIND.get(mode_kind, "dense_sync"), nranks=nranks,
                                      size=size, k=k or size,
                                      algorithm=run_algorithm(mode, nranks, size) or "auto",
                                      params=link, volume=volume,
                                      wire_dtype=wire_dtype_index(mode))
    return t + (local_seconds or 0.0)


def predicted_volume(mode: str, nranks: int, size: int, k: int | None):
    """``cost_model`` WireVolume (rank 0) of a mode's sync; None for the no-sync modes."""
    from jax_sparse_sync.planning import cost_model

    kind = parse_mode(mode)["kind"]
    if kind in NO_SYNC:
        return None
    if kind == "oktopk":
        return cost_model.oktopk_sync_volume(nranks=nranks, k=k)
    return cost_model.wire_volume(run_algorithm(mode, nranks, size), nranks=nranks, size=size,
                                  k=k or 0, wire_dtype=wire_dtype_index(mode))


def wire_dtype_index(mode: str) -> int:
    """The cost model's id of a mode's value dtype on the wire (0 float32, 1 bfloat16)."""
    from jax_sparse_sync.base.arguments import wire_dtype_id

    return wire_dtype_id(WIRE_DTYPES.get(mode), "step_time")


def link_alpha_beta(link: dict):
    """alpha/beta of a link record: measured latency and the configured rate (emulated);
    the library's current parameters (shm)."""
    from jax_sparse_sync.planning import cost_model

    if link["rate_mbit"] is None:
        return cost_model.current_alpha_beta()
    return cost_model.AlphaBeta(alpha=link["alpha_s"], beta=8.0 / (link["rate_mbit"] * 1e6))


# --------------------------------------------------------------------------- models


def _shared_models():
    """``examples/models.py`` (TransformerLM, ResNet), imported by path."""
    examples = str(HERE.parent / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import models

    return models


def build_model(name: str, cfg: dict):
    """A Flax model, its loss and a synthetic batch maker.

    Args:
      name: ``mlp``, ``transformer`` or ``cnn``.
      cfg: the model's sizes (see ``model_config``).

    Returns:
      ``(module, loss_fn(params, batch) -> scalar, make_batch(rng, batch_size) -> tuple
      of numpy arrays)``.
    """
    import flax.linen as nn
    import numpy as np
    import optax

    if name == "mlp":
        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                for _ in range(cfg["layers"]):
                    x = nn.relu(nn.Dense(cfg["hidden"])(x))
                return nn.Dense(cfg["classes"])(x)

        def make_batch(rng, b):
            return (rng.standard_normal((b, cfg["input"]), np.float32),
                    rng.integers(0, cfg["classes"], b).astype(np.int32))
        module = MLP()
    elif name == "transformer":
        # the model classes live in examples/models.py, shared with the convergence runs
        # (examples/train_lm.py, train_resnet.py), so both measure the same models
        def make_batch(rng, b):
            tok = rng.integers(0, cfg["vocab"], (b, cfg["seq"] + 1)).astype(np.int32)
            return tok[:, :-1], tok[:, 1:]
        module = _shared_models().TransformerLM(cfg)
    elif name == "cnn":
        def make_batch(rng, b):
            return (rng.standard_normal((b, cfg["image"], cfg["image"], 3), np.float32),
                    rng.integers(0, cfg["classes"], b).astype(np.int32))
        module = _shared_models().ResNet(cfg)
    else:
        raise ValueError(f"unknown model {name!r}")

    def loss_fn(params, batch):
        x, y = batch
        logits = module.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return module, loss_fn, make_batch


def init_params(module, make_batch, seed: int):
    """The same initial parameters on every rank (same key)."""
    import jax
    import numpy as np

    x, _ = make_batch(np.random.default_rng(0), 1)
    return module.init(jax.random.key(seed), x)["params"]


def model_config(args, name: str) -> dict:
    """A model's sizes from the command line (``batch`` is per rank / device)."""
    if name == "mlp":
        return {"input": args.mlp_input, "hidden": args.mlp_hidden, "layers": args.mlp_layers,
                "classes": 10, "batch": args.mlp_batch}
    if name == "transformer":
        return {"vocab": 256, "dim": args.tf_dim, "heads": args.tf_heads,
                "layers": args.tf_layers, "mlp_ratio": 4, "seq": args.tf_seq,
                "batch": args.tf_batch}
    return {"widths": args.cnn_widths, "blocks": args.cnn_blocks, "image": 32, "classes": 10,
            "batch": args.cnn_batch}


# --------------------------------------------------------------------------- timing


#: ``--optimizer`` choices: what follows the sync in the timed step
OPTIMIZERS = ("sgd", "adamw")
WEIGHT_DECAY = 0.01


def make_tx(mode: str, comm=None, algorithm: str | None = None, optimizer: str = "sgd"):
    """The timed step's transformation; ``algorithm`` overrides the mode's.

    ``optimizer="sgd"``: ``optax.chain(<sync of mode>, optax.sgd(LR))``.
    ``optimizer="adamw"``: the optimizer of ``examples/train_lm.py``, so the step is the
    one the convergence runs take: ``chain(<sync>, clip_by_global_norm(1), adamw(LR))``,
    and for ``adamdir`` ``chain(adam_direction_sync(<sync>, max_grad_norm=1),
    add_decayed_weights, scale_by_learning_rate(LR))`` (the clipping inside the fused
    Adam pass, as the example builds it: ``clip_by_global_norm(1)`` in front, bit for bit).

    ``adamdir``: ``jss.adam_direction_sync(topk_sync, momentum_masking="restart")``, the
    convergence runs' Adam-direction sync (its Adam passes included; with ``sgd`` it is
    followed by the learning rate only).
    """
    import optax

    import jax_sparse_sync as jss

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"step_time: --optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    spec = parse_mode(mode)
    kind = spec["kind"]
    if kind in NO_SYNC:
        sync = optax.identity()
    elif kind == "psum":
        sync = pmean_sync("data")
    elif kind == "psum_jss_dense":
        sync = jss.dense_sync(comm=jss.axis("data"))
    elif kind in ("dense", "dense_bf16"):
        sync = jss.dense_sync(comm=comm, wire_dtype=WIRE_DTYPES.get(kind))
    elif kind in ("topk", "adamdir"):
        sync = jss.topk_sync(density=spec["density"], algorithm=algorithm or spec["algorithm"],
                             comm=comm)
    else:
        sync = jss.oktopk_sync(density=spec["density"], comm=comm)
    if kind == "adamdir":
        if optimizer == "sgd":
            return optax.chain(jss.adam_direction_sync(sync, momentum_masking="restart"),
                               optax.scale_by_learning_rate(LR))
        ads = jss.adam_direction_sync(sync, momentum_masking="restart", max_grad_norm=1.0)
        return optax.chain(ads, optax.add_decayed_weights(WEIGHT_DECAY),
                           optax.scale_by_learning_rate(LR))
    if optimizer == "sgd":
        return optax.chain(sync, optax.sgd(LR))
    return optax.chain(sync, optax.clip_by_global_norm(1.0),
                       optax.adamw(LR, weight_decay=WEIGHT_DECAY))


def pmean_sync(axis_name: str):
    """XLA's own dense gradient average over a mesh axis (``jax.lax.pmean``) as an Optax
    transform: the reference the shard_map transport is compared with."""
    import jax
    import optax

    def update_fn(updates, state, params=None):
        del params
        return jax.lax.pmean(updates, axis_name), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_step(loss_fn, tx, wrap=None):
    """The jitted training step, params and opt_state donated (updated in place).

    ``wrap`` (for psum) turns the per-device step into a shard_map before the jit.
    """
    import jax
    import optax

    def step(params, opt_state, batch):
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(wrap(step) if wrap else step, donate_argnums=(0, 1))


def time_steps(step, params, opt_state, batches, *, warmup: int, steps: int,
               max_seconds: float, agree=lambda t: t, lockstep=lambda: None):
    """Compiles, warms up and times a step; returns timings and the final state.

    Step i takes ``batches[i % len(batches)]``, as a training loop takes a new batch
    every step (with one fixed batch the gradient barely changes, the residuals grow
    linearly and the selections behave unlike training's: Ok-Topk's reused threshold
    then overflowed into the exact top-k on every step).

    The number of timed steps T = max_seconds / (warm-up step time), clipped to
    [3, steps]; ``agree`` turns this process's warm-up time into the one every rank
    uses (the max over ranks under MPI), so all ranks run the same number of steps.
    ``lockstep`` is called at the end of every step, inside its time (a barrier under
    MPI).

    Returns:
      ``({"compile_s", "warmup_s": [...], "times_s": [...]}, opt_state)``.
    """
    import jax

    draws = itertools.cycle(batches)

    def one():
        nonlocal params, opt_state
        batch = next(draws)
        t0 = time.perf_counter()
        params, opt_state = jax.block_until_ready(step(params, opt_state, batch))
        lockstep()
        return time.perf_counter() - t0

    compile_s = one()
    warm = [one() for _ in range(max(1, warmup))]
    est = agree(statistics.median(warm))
    n = int(min(steps, max(3, max_seconds // max(est, 1e-6))))
    times = [one() for _ in range(n)]
    return {"compile_s": compile_s, "warmup_s": warm, "times_s": times}, opt_state


def sync_stats(mode: str, opt_state) -> dict | None:
    """This rank's wire statistics of the last step, from the sync transform's state."""
    import jax_sparse_sync as jss

    if parse_mode(mode)["kind"] in NO_SYNC:
        return None
    sync_state = next(x for x in opt_state if hasattr(x, "last_stats"))
    return jss.SyncStats.from_vector(sync_state.last_stats).as_dict()


def fresh(tree):
    """Copies of the initial parameters: every mode donates (consumes) its own."""
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(jnp.copy, tree)


def worker(cfg: dict) -> int:
    """One MPI job: every mode of ``cfg["modes"]`` for one (model, link, P)."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree
    from mpi4py import MPI

    import jax_sparse_sync as jss

    # The opt_state leaves no output can reuse (e.g. SGD's empty state) make jit warn on
    # every compile; the step's real buffers (params, residuals) are donated and reused.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    # Timing bookkeeping uses COMM_WORLD; the library syncs on its own clone of it.
    world = MPI.COMM_WORLD
    rank, nranks = world.Get_rank(), world.Get_size()
    t_start = time.monotonic()
    tag = f"[{cfg['model']} {cfg['link']} P={nranks}]"
    module, loss_fn, make_batch = build_model(cfg["model"], cfg["model_cfg"])
    params0 = init_params(module, make_batch, cfg["seed"])
    size = int(ravel_pytree(params0)[0].size)
    leaves = len(jax.tree_util.tree_leaves(params0))
    batches = [jax.device_put(make_batch(np.random.default_rng([cfg["seed"], rank, i]),
                                         cfg["model_cfg"]["batch"]))
               for i in range(cfg.get("batches", 1))]
    if rank == 0:
        print(f"{tag} N={size:,} parameters in {leaves} leaves, batch "
              f"{cfg['model_cfg']['batch']} per rank; modes: {' '.join(cfg['modes'])}",
              flush=True)

    def agree(x):
        return world.allreduce(x, op=MPI.MAX)

    def run(mode, comm=None, algorithm=None):
        tx = make_tx(mode, comm=comm, algorithm=algorithm,
                     optimizer=cfg.get("optimizer", "sgd"))
        params = fresh(params0)
        state = tx.init(params)
        world.Barrier()  # start every rank's phase together: the same CPU contention
        res, state = time_steps(make_step(loss_fn, tx), params, state, batches,
                                warmup=cfg["warmup"], steps=cfg["steps"],
                                max_seconds=cfg["max_seconds"], agree=agree,
                                lockstep=world.Barrier)
        res["stats"] = sync_stats(mode, state)
        return res

    records = []
    for mode in cfg["modes"]:
        spec = parse_mode(mode)
        res = run(mode)
        local = None
        if spec["kind"] != "none":
            # the same step on a one-rank communicator: the local work of the sync; for
            # auto, the algorithm auto picks at P (at one rank it would pick another)
            local = run(mode, comm=MPI.COMM_SELF, algorithm=run_algorithm(mode, nranks, size))
        mine = {"rank": rank, "res": res, "local": local}
        everyone = world.gather(mine, root=0)
        if rank == 0:
            rec = raw_record(mode, everyone, size, leaves, nranks)
            records.append(rec)
            loc = (f"local step {rec['local_step_s']:.3f} s, " if rec["local_step_s"] is not None
                   else "")
            sent = (f"sent {fmt_bytes(max(rec['bytes_sent']))}/rank, "
                    if rec["bytes_sent"] else "")
            print(f"{tag} {mode:>26}: step {rec['step_s']:.3f} s (median of "
                  f"{rec['timed_steps']}, ranks {min(rec['per_rank_median_s']):.3f}-"
                  f"{max(rec['per_rank_median_s']):.3f}), {loc}{sent}compile "
                  f"{rec['compile_s']:.1f} s [t+{time.monotonic() - t_start:.0f}s]", flush=True)
    # The cost model's local-work term, calibrated the library's way (jss.planning.calibrate:
    # a synthetic 16-leaf tree at N/4 and N entries, every rank at once), not taken
    # from the breakdown above, so the prediction is independent of the measurement.
    kinds = sorted({LOCAL_KIND[parse_mode(m)["kind"]] for m in cfg["modes"]
                    if parse_mode(m)["kind"] in LOCAL_KIND})
    local_work = []
    if kinds and not cfg.get("no_local_calibration"):
        ab = jss.planning.calibrate(sizes=(8, 4096), bandwidth_seconds=0, repeats=5,
                                    local=tuple(kinds), local_sizes=(size // 4, size),
                                    density=0.01, install=False)
        local_work = [list(t) for t in ab.local]
        if rank == 0:
            print(f"{tag} local work calibrated: " + ", ".join(
                f"{k_} {1e3 * f:.1f} ms + {1e9 * e:.2f} ns/entry + {1e9 * kp:.1f} ns/kept"
                for k_, f, e, kp in ab.local)
                + f" [t+{time.monotonic() - t_start:.0f}s]", flush=True)
    if rank == 0:
        write_fragment({"model": cfg["model"], "link": cfg["link"], "P": nranks, "N": size,
                        "leaves": leaves, "records": records, "local_work": local_work,
                        "worker_wall_s": round(time.monotonic() - t_start, 1)},
                       cfg["fragment"])
    world.Barrier()
    return 0


def raw_record(mode: str, everyone: list[dict], size: int, leaves: int, nranks: int) -> dict:
    """One mode's measurements over all ranks (the breakdown is added by the driver)."""
    per_rank = [statistics.median(m["res"]["times_s"]) for m in everyone]
    has_local = everyone[0]["local"] is not None
    local_per_rank = ([statistics.median(m["local"]["times_s"]) for m in everyone]
                      if has_local else None)
    stats = [m["res"]["stats"] for m in everyone]
    return {
        "mode": mode, **parse_mode(mode), "algorithm_run": stats[0]["algorithm"]
        if stats[0] else None, "P": nranks, "N": size, "k": mode_k(mode, size),
        "leaves": leaves,
        "step_s": statistics.median(per_rank), "per_rank_median_s": per_rank,
        "timed_steps": len(everyone[0]["res"]["times_s"]),
        "rank0_times_s": everyone[0]["res"]["times_s"],
        "compile_s": max(m["res"]["compile_s"] for m in everyone),
        "local_step_s": statistics.median(local_per_rank) if has_local else None,
        "local_per_rank_median_s": local_per_rank,
        "local_timed_steps": len(everyone[0]["local"]["times_s"]) if has_local else None,
        "bytes_sent": [s["bytes_sent"] for s in stats] if stats[0] else None,
        "bytes_received": [s["bytes_received"] for s in stats] if stats[0] else None,
        "messages": [s["messages"] for s in stats] if stats[0] else None,
        "result_nnz": stats[0]["result_nnz"] if stats[0] else None,
        "switched_to_dense": [s["switched_to_dense"] for s in stats] if stats[0] else None,
    }


def psum_worker(cfg: dict) -> int:
    """``psum`` (``lax.pmean``) and ``psum_jss_dense`` in one process with P host devices
    (shard_map over "data"), and the same step with no collective (``psum_none``: that
    process's compute baseline)."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_sparse_sync as jss

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    nranks = cfg["P"]
    if jax.device_count() != nranks:
        raise SystemExit(f"psum worker: expected {nranks} devices, JAX has "
                         f"{jax.device_count()} (XLA_FLAGS set too late?)")
    t_start = time.monotonic()
    tag = f"[{cfg['model']} shm P={nranks}]"
    mesh = jax.make_mesh((nranks,), ("data",))
    module, loss_fn, make_batch = build_model(cfg["model"], cfg["model_cfg"])
    params0 = init_params(module, make_batch, cfg["seed"])
    size = int(ravel_pytree(params0)[0].size)
    leaves = len(jax.tree_util.tree_leaves(params0))
    # device i gets the batches rank i gets under MPI

    def global_batch(i):
        parts = [make_batch(np.random.default_rng([cfg["seed"], r, i]),
                            cfg["model_cfg"]["batch"]) for r in range(nranks)]
        return jax.device_put(tuple(np.concatenate(a) for a in zip(*parts)),
                              NamedSharding(mesh, P("data")))
    batches = [global_batch(i) for i in range(cfg.get("batches", 1))]
    params0 = jax.device_put(params0, NamedSharding(mesh, P()))

    def per_device(tree):   # per-device state travels with a leading axis of size P
        return jax.tree_util.tree_map(lambda a: a[None], tree)

    def local(tree):
        return jax.tree_util.tree_map(lambda a: a[0], tree)

    records = []
    for mode in PSUM_MODES:
        tx = make_tx(mode)
        init = jax.jit(jax.shard_map(lambda p: per_device(tx.init(p)), mesh=mesh,
                                     in_specs=P(), out_specs=P("data")))

        def wrap(step):
            # psum_none's params differ per device (no sync); check_vma=False lets them
            # leave as P() anyway: that mode is only the compute baseline
            def body(params, opt_state, b):
                params, opt_state = step(params, local(opt_state), b)
                return params, per_device(opt_state)
            return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                 out_specs=(P(), P("data")), check_vma=False)

        params = fresh(params0)
        res, state = time_steps(make_step(loss_fn, tx, wrap), params, init(params), batches,
                                warmup=cfg["warmup"], steps=cfg["steps"],
                                max_seconds=cfg["max_seconds"])
        stats = None
        if mode == "psum_jss_dense":
            # row 0 of the per-device stats (every device sends the same); read on the
            # host: indexing a sharded global array outside shard_map is refused
            stats = jss.SyncStats.from_vector(np.asarray(state[0].last_stats)[0]).as_dict()
        elif mode == "psum":  # lax.pmean keeps no statistics: the model's dense volume
            vol = predicted_volume(mode, nranks, size, None).bytes_max
            stats = {"bytes_sent": vol, "bytes_received": vol, "messages": None,
                     "result_nnz": size, "algorithm": "psum"}
        med = statistics.median(res["times_s"])
        records.append({
            "mode": mode, **parse_mode(mode), "bytes_from_model": mode == "psum",
            "algorithm_run": stats["algorithm"] if stats else None,
            "P": nranks, "N": size, "k": None, "leaves": leaves, "step_s": med,
            "per_rank_median_s": [med], "timed_steps": len(res["times_s"]),
            "rank0_times_s": res["times_s"], "compile_s": res["compile_s"],
            "local_step_s": None, "local_per_rank_median_s": None, "local_timed_steps": None,
            "bytes_sent": [stats["bytes_sent"]] * nranks if stats else None,
            "bytes_received": [stats["bytes_received"]] * nranks if stats else None,
            "messages": [stats["messages"]] * nranks if stats else None,
            "result_nnz": stats["result_nnz"] if stats else None, "switched_to_dense": None,
            "process": f"one process, {nranks} host devices (shard_map)"})
        print(f"{tag} {mode:>26}: step {med:.3f} s (median of {len(res['times_s'])}), compile "
              f"{res['compile_s']:.1f} s [t+{time.monotonic() - t_start:.0f}s]", flush=True)
    write_fragment({"model": cfg["model"], "link": "shm", "P": nranks, "N": size,
                    "leaves": leaves, "records": records,
                    "worker_wall_s": round(time.monotonic() - t_start, 1)}, cfg["fragment"])
    return 0


# --------------------------------------------------------------------------- driver


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
    """Runs one worker job (``kind`` ``mpi`` or ``psum``) and returns its fragment
    (``{"error": ..., "records": []}`` on failure or timeout). ``script``: another
    benchmark whose ``--worker CONFIG`` runs the job (default this one's)."""
    with tempfile.TemporaryDirectory(prefix="jss_step_time") as tmp:
        os.chmod(tmp, 0o755)
        frag = Path(tmp) / "fragment.json"
        cfg = dict(cfg, fragment=str(frag), P=nranks)
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(cfg))
        me = str(script or Path(__file__).resolve())
        env = {**os.environ, **rank_env(args, nranks)}
        if kind == "psum":
            flags = os.environ.get("XLA_FLAGS", "")
            env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={nranks}"
            return run_fragment([sys.executable, me, "--psum-worker", str(cfg_path)], frag,
                                args.timeout, env=env)
        wargs = ["-m", "mpi4py", me, "--worker", str(cfg_path)]
        if net is None:
            return run_fragment([find_mpiexec(), *bind_args(args), "-n", str(nranks),
                                 sys.executable, *wargs],
                                frag, args.timeout, env=env)
        t0 = time.monotonic()
        try:
            proc = net.launch(wargs, timeout=args.timeout, nranks=nranks,
                              env=rank_env(args, nranks),
                              capture=False, stream=True)
        except Exception as e:  # timeouts: record and go on with the next job
            return {"error": f"{type(e).__name__}: {str(e)[:400]}", "records": []}
        if proc.returncode != 0 or not frag.exists():
            return {"error": f"mpiexec exited with {proc.returncode}", "records": []}
        data = json.loads(frag.read_text())
        data["wall_s"] = round(time.monotonic() - t0, 1)
        return data


def probe_link(net) -> dict:
    """Latency and achieved rate of an emulated link (emulated_network's MPI probe)."""
    try:
        pr = net.measure_rate(4 << 20, repeats=3, timeout=180, allreduce=False)
        return {"one_way_latency_s": pr.get("one_way_latency_s"),
                "achieved_mbit": pr.get("achieved_mbit"), "probe": pr}
    except Exception as e:  # the benchmark can go on with --alpha-us / the default
        return {"one_way_latency_s": None, "achieved_mbit": None, "probe_error": str(e)[:400]}


def median_records(runs: list[dict]) -> list[dict]:
    """One record per (model, link, P, mode): with ``--repeats R`` the repeat whose step
    time is the median of the R (the upper median for even R), whole, so its breakdown,
    bytes and prediction stay one job's; ``repeats_step_s`` lists all R step times,
    ``repeats_measured_over_predicted`` each repeat's measured / predicted (each
    against its own job's compute step and calibration) and
    ``measured_over_predicted_median`` their median."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["link"], r["P"], r["mode"]), []).append(r)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r["step_s"])
        rec = dict(ordered[len(ordered) // 2])
        rec["repeats_step_s"] = [r["step_s"] for r in group]
        ratios = [r.get("measured_over_predicted") for r in group]
        rec["repeats_measured_over_predicted"] = ratios
        known = [x for x in ratios if x is not None]
        rec["measured_over_predicted_median"] = statistics.median(known) if known else None
        out.append(rec)
    return out


def finish(data: dict) -> None:
    """Adds the breakdown and the predictions to every run, each against its own job's
    compute step (the same repeat's), then picks the median records (idempotent)."""
    runs = data.get("runs") or data["records"]
    by_repeat: dict[int, list[dict]] = {}
    for r in runs:
        by_repeat.setdefault(r.get("repeat", 0), []).append(r)
    links = {lk["name"]: lk for lk in data["links"]}
    for group in by_repeat.values():
        _predict(group, links)
    if data.get("runs"):
        data["records"] = median_records(data["runs"])


def _predict(recs: list[dict], links: dict) -> None:
    """The breakdown and the predictions of the records of one repeat."""
    from jax_sparse_sync.planning import cost_model

    compute = {(r["model"], r["link"], r["P"], r["mode"]): r["step_s"] for r in recs
               if r["mode"] in NO_SYNC}
    # the MPI job's local-work calibration, for the psum job's records of the same repeat
    calibration = {(r["model"], r["link"], r["P"]): r["local_work_calibrated"] for r in recs
                   if r.get("local_work_calibrated")}
    for r in recs:
        base = "psum_none" if r["kind"] in PSUM_MODES else "none"
        c = compute.get((r["model"], r["link"], r["P"], base))
        r["compute_s"] = c
        r["compute_from"] = base if c is not None else None
        if c is None:
            r["local_raw_s"] = r["local_s"] = r["wire_s"] = None
        elif r["kind"] in NO_SYNC:
            r["local_raw_s"], r["local_s"], r["wire_s"] = 0.0, 0.0, 0.0
        else:
            lr = r["local_step_s"] - c if r["local_step_s"] is not None else None
            r["local_raw_s"] = lr
            r["local_s"] = max(0.0, lr) if lr is not None else None
            r["wire_s"] = max(0.0, r["step_s"] - c - (r["local_s"] or 0.0))
        ab = link_alpha_beta(links[r["link"]])
        r["alpha_s"], r["beta_s_per_byte"] = ab.alpha, ab.beta
        sync = predict_sync_time(r["mode"], r["P"], r["N"], r["k"], ab)
        vol = predicted_volume(r["mode"], r["P"], r["N"], r["k"])
        r["predicted_algorithm"] = (None if vol is None
                                    else run_algorithm(r["mode"], r["P"], r["N"]))
        r["predicted_bytes_max"] = vol.bytes_max if vol else 0
        r["predicted_bytes_typical"] = vol.bytes_typical if vol else 0
        r["predicted_sync_s"] = sync
        r["predicted_sync_measured_bytes_s"] = (
            vol.messages * ab.alpha + max(r["bytes_sent"]) * ab.beta
            if vol and r["bytes_sent"] else sync)
        # the cost model's local-work term, calibrated in the same job (jss.planning.calibrate)
        local = (r.get("local_work_calibrated")
                 or calibration.get((r["model"], r["link"], r["P"])) or ())
        calibrated = cost_model.AlphaBeta(alpha=ab.alpha, beta=ab.beta,
                                          local=tuple(tuple(t) for t in local))
        kind = LOCAL_KIND.get(r["kind"])
        r["predicted_local_s"] = (cost_model.local_work_time(kind, size=r["N"], k=r["k"] or 0,
                                                             params=calibrated)
                                  if kind else 0.0)
        r["predicted_wire_only_s"] = c + sync if c is not None else None
        r["predicted_s"] = c + r["predicted_local_s"] + sync if c is not None else None
        r["predicted_worst_case_s"] = (
            c + r["predicted_local_s"] + predict_sync_time(r["mode"], r["P"], r["N"], r["k"],
                                                           ab, volume="max")
            if c is not None else None)
        r["predicted_with_local_s"] = (
            c + predict_sync_time(r["mode"], r["P"], r["N"], r["k"], ab,
                                  local_seconds=r["local_s"])
            if c is not None else None)
        r["measured_over_predicted"] = r["step_s"] / r["predicted_s"] if c else None


def print_table(data: dict) -> None:
    """The records as a table (milliseconds; bytes are the max over ranks)."""
    hdr = (f"{'model':>11} {'link':>8} {'P':>2} {'mode':>26} | {'step':>8} {'compute':>8} "
           f"{'local':>8} {'wire':>8} | {'sent':>9} {'k':>8} | {'pred':>8} {'no-local':>8} "
           f"{'meas/pred':>9} {'median':>6}")
    print("\n" + hdr + "\n" + "-" * len(hdr))

    def ms(v):
        return f"{v * 1e3:8.1f}" if v is not None else f"{'-':>8}"
    for r in data["records"]:
        ratio = r.get("measured_over_predicted")
        med = r.get("measured_over_predicted_median")
        print(f"{r['model']:>11} {r['link']:>8} {r['P']:>2} {r['mode']:>26} | {ms(r['step_s'])} "
              f"{ms(r.get('compute_s'))} {ms(r.get('local_s'))} {ms(r.get('wire_s'))} | "
              f"{fmt_bytes(max(r['bytes_sent']) if r['bytes_sent'] else None):>9} "
              f"{r['k'] if r['k'] is not None else '-':>8} | {ms(r.get('predicted_s'))} "
              f"{ms(r.get('predicted_wire_only_s'))} "
              f"{f'{ratio:.2f}' if ratio else '-':>9} "
              f"{f'{med:.2f}' if med else '-':>6}")
    for f in data["failures"]:
        print(f"!! {f['model']} {f['link']} P={f['P']} {f['kind']}: {f['error']}")


def plot(data: dict, path: Path) -> None:
    """Per model (rows) and P (columns): bars per mode, one per link, stacked
    compute / local / wire, the prediction as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    recs = [r for r in data["records"] if r["mode"] != "psum_none"]
    if not recs:
        return
    models = [m for m in MODELS if any(r["model"] == m for r in recs)]
    procs = sorted({r["P"] for r in recs})
    links = [lk["name"] for lk in data["links"]]
    hatches = dict(zip(links, ("", "//", "xx", "..", "\\\\")))
    colors = {"compute": "#9e9e9e", "local": "#f28e2b", "wire": "#4e79a7",
              "unattributed": "#c7c7c7"}
    height = 4.6 * len(models) + 0.8  # for the title and the legend
    fig, axes = plt.subplots(len(models), len(procs), squeeze=False,
                             figsize=(max(8, 0.3 * len(PLOT_ORDER) * len(links)) * len(procs),
                                      height))
    width = 0.8 / len(links)
    for i, model in enumerate(models):
        for j, p in enumerate(procs):
            ax = axes[i][j]
            here = [r for r in recs if r["model"] == model and r["P"] == p]
            modes = [m for m in PLOT_ORDER if any(r["mode"] == m for r in here)]
            for x, mode in enumerate(modes):
                for li, link in enumerate(links):
                    r = next((r for r in here if r["mode"] == mode and r["link"] == link), None)
                    if r is None:
                        continue
                    xb = x - 0.4 + width * (li + 0.5)
                    if r.get("compute_s") is None:
                        parts = [("unattributed", r["step_s"])]
                    else:
                        # the stack adds up to the step: a local measured above
                        # step - compute (noise) is drawn up to the step only
                        comp = min(r["compute_s"], r["step_s"])
                        loc = min(r["local_s"] or 0.0, r["step_s"] - comp)
                        parts = [("compute", comp), ("local", loc), ("wire", r["wire_s"] or 0.0)]
                    bottom = 0.0
                    for name, v in parts:
                        ax.bar(xb, v, width, bottom=bottom, color=colors[name],
                               hatch=hatches[link], edgecolor="k", linewidth=0.4)
                        bottom += v
                    if r.get("predicted_s") is not None:
                        ax.plot(xb, r["predicted_s"], marker="_", color="k", ms=9, mew=2)
                        ax.plot(xb, r["predicted_with_local_s"], marker="o", mfc="none",
                                color="k", ms=4, mew=0.8)
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels(modes, rotation=60, ha="right", fontsize=7)
            n = here[0]["N"] if here else 0
            ax.set_title(f"{model}: N = {n:,} parameters, P = {p}"
                         + (" (oversubscribed: P > cores)" if p > data["machine"]["cpu_count"]
                            else ""), fontsize=9)
            ax.set_ylabel("step time (s), median over ranks")
            ax.grid(True, axis="y", alpha=0.3)
    handles = [Patch(facecolor=colors[c], edgecolor="k", label=c)
               for c in ("compute", "local", "wire")]
    handles += [Patch(facecolor="white", edgecolor="k", hatch=hatches[lk],
                      label=f"link {lk}" + (" Mbit/s" if lk != "shm" else " (shared memory)"))
                for lk in links]
    handles += [plt.Line2D([], [], color="k", marker="_", ls="", ms=9, mew=2,
                           label="predicted: compute + cost-model local + wire"),
                plt.Line2D([], [], color="k", marker="o", mfc="none", ls="", ms=4,
                           label="compute + measured local + model wire")]
    info = data["machine"]
    fig.suptitle(f"Training-step time by gradient sync: {info['cpu_count']}-core "
                 f"{info['cpu_model']}, jax {info['jax_version']}, {info['date'][:10]}",
                 fontsize=10, y=1 - 0.1 / height)
    fig.legend(handles=handles, loc="upper center", ncol=(len(handles) + 1) // 2, fontsize=8,
               bbox_to_anchor=(0.5, 1 - 0.3 / height))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / height))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def driver(args) -> int:
    """Runs every (link, P, model) job, merges the fragments, writes JSON and PNG."""
    out = args.out_dir / f"step_time_{args.tag}.json"
    png = out.with_suffix(".png")
    if args.plot_only:
        data = json.loads(out.read_text())
        finish(data)
        out.write_text(json.dumps(data, indent=1) + "\n")
        print_table(data)
        plot(data, png)
        print(f"# wrote {out} and {png}")
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
            lk = {"name": link, "rate_mbit": rate}
            if net is not None:
                lk["network"] = net.describe()
                lk.update(probe_link(net))
                lk["alpha_s"] = (args.alpha_us * 1e-6 if args.alpha_us is not None
                                 else lk["one_way_latency_s"] or DEFAULT_ALPHA_S)
                print(f"# link {link} Mbit/s: one-way latency "
                      f"{(lk['one_way_latency_s'] or 0) * 1e6:.1f} us, 2-rank Sendrecv "
                      f"{lk['achieved_mbit'] or 0:.0f} Mbit/s; model alpha "
                      f"{lk['alpha_s'] * 1e6:.1f} us", flush=True)
            else:
                lk["network"] = {"transport": "MPICH shared memory (plain mpiexec)"}
            data["links"].append(lk)
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
                    busy, waited = (wait_for_quiet(args.quiet_wait) if args.quiet_wait
                                    else (cpu_busy(0.5), 0.0))
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
                    finish(data)
                    out.write_text(json.dumps(data, indent=1) + "\n")  # partial results
    finish(data)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print_table(data)
    plot(data, png)
    print(f"# wrote {out} and {png} (total {time.monotonic() - t0:.0f}s)")
    return 1 if data["failures"] else 0


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
