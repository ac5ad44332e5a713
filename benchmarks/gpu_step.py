"""The sparse training step on accelerator arrays: the sync against the step without it.

One jitted data-parallel step whose parameters live on the default device (a GPU where
there is one), with params and optimizer state donated, beside the same step without a
sync, per sync mode and model, at P ranks (P > 1 shares the one GPU). Two models: an MLP
of four square layers (``--sizes``), ``grad -> sync -> SGD``; and ``--models lm``,
``examples/models.py``'s TransformerLM scaled to about 101.6M parameters (d_model 1024, 8
blocks of 16 heads, sequence 256; ``--lm-*`` for other sizes), with ``topk_sync`` + SGD
against SGD and ``adam_direction_sync(topk_sync)`` + AdamW's decay and rate against
``optax.adamw``. The breakdown times the step's parts alone: ``grad``, ``topk`` (the
selection), ``allreduce`` (the exchange: ``jss.sparse_allreduce``) and ``update`` (the
sync's ``tx.update``) beside ``step``; ``ratio_to_baseline`` is a mode's step over its
baseline's in the same job (``none``, or ``adamw`` for the Adam modes). The replicas are
checked bitwise after the timed steps and the sparse updates against a NumPy reference on
the first step.

``--transports mpi axis`` adds, at P = 1, each sync mode through the mesh transport:
``comm=jss.axis("data")`` inside ``jax.shard_map`` over a one-device mesh (the fully
on-device step: selection and exchange are device code, no host stage), timed and broken
down the same way (the exchange is ``jss.sparse_allreduce`` on the axis), recorded with
``"transport": "axis"`` beside the MPI record (``"transport": "mpi"``). Its updates are
checked against the MPI transport's bit for bit (three updates from the same state on the
same gradients: the axis transport's promise, docs/transports.md), and whether the whole
run's parameters equal the MPI run's is recorded (``params_identical_to_mpi``: the
gradient is compiled inside another program there). P > 1 runs MPI only (one device per
rank: no mesh to span).

  python benchmarks/gpu_step.py                              # 16M 64M, P = 1 2, every mode
  python benchmarks/gpu_step.py --models lm --procs 1        # the LM, its four modes
  python benchmarks/gpu_step.py --sizes 1M --procs 1 2 --steps 3 --out /tmp/s.json  # smoke
  python benchmarks/gpu_step.py --procs 1 --transports mpi axis   # and the mesh transport

Results: docs/topics/gpu_campaign.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (fmt_size, launch_worker, machine_info, median_time, parse_size,  # noqa: E402
                      parser, pyplot, save_figure, write_fragment, write_record)
from step_timing.models import build_model, init_params  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: the MLP's modes: "none" is the step without a sync (SGD), the others a sync + SGD
MODES = ("none", "topk_1pct", "topk_0.1pct", "oktopk_1pct")
#: the LM's: SGD with and without topk_sync; AdamW, and AdamW's update of each rank's
#: Adam direction synced by topk_sync (examples/models.py's adam_then_sync)
LM_MODES = ("none", "topk_1pct", "adamw", "adam_topk_1pct")
#: each mode's step without a sync: its ratio's denominator
BASELINES = {"adam_topk_1pct": "adamw"}
LR = 0.01
ADAM_LR, WEIGHT_DECAY = 1e-3, 1e-4
LAYERS = 4
#: the LM at about 101.6M parameters (examples/models.py's TransformerLM)
LM_SIZES = {"dim": 1024, "layers": 8, "heads": 16, "seq": 256, "batch": 16}


def mode_density(mode: str) -> float | None:
    if mode in ("none", "adamw"):
        return None
    pct = mode.rsplit("_", 1)[1].removesuffix("pct")
    return float(pct) / 100.0


def make_tx(mode: str, comm=None):
    """The mode's transform; ``comm``: the sync's transport (None: MPI's world)."""
    import optax

    import jax_sparse_sync as jss

    if mode == "none":
        return optax.sgd(LR)
    if mode == "adamw":
        return optax.adamw(ADAM_LR, weight_decay=WEIGHT_DECAY)
    density = mode_density(mode)
    if mode.startswith("adam_"):
        return optax.chain(jss.adam_direction_sync(jss.topk_sync(density=density, comm=comm)),
                           optax.add_decayed_weights(WEIGHT_DECAY),
                           optax.scale_by_learning_rate(ADAM_LR))
    sync = (jss.oktopk_sync(density=density, comm=comm) if mode.startswith("oktopk")
            else jss.topk_sync(density=density, comm=comm))
    return optax.chain(sync, optax.sgd(LR))


def width_for(n: int) -> int:
    """The MLP width d with LAYERS square layers of about n parameters in all."""
    return max(8, int(round((n / LAYERS) ** 0.5 / 8)) * 8)


def build(n: int, batch: int, seed: int):
    """An MLP of LAYERS d x d layers (about n parameters), its loss and a batch maker."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    d = width_for(n)
    rng = np.random.default_rng(seed)
    params = {f"w{i}": jnp.asarray(rng.standard_normal((d, d), np.float32) / np.sqrt(d))
              for i in range(LAYERS)}
    params.update({f"b{i}": jnp.zeros((d,), jnp.float32) for i in range(LAYERS)})

    def loss_fn(p, batch):
        x, y = batch
        for i in range(LAYERS):
            x = x @ p[f"w{i}"] + p[f"b{i}"]
            if i < LAYERS - 1:
                x = jax.nn.relu(x)
        return jnp.mean((x - y) ** 2)

    def make_batch(r):
        return (jnp.asarray(r.standard_normal((batch, d), np.float32)),
                jnp.asarray(r.standard_normal((batch, d), np.float32)))

    return params, loss_fn, make_batch


def build_lm(sizes: dict, seed: int):
    """``examples/models.py``'s TransformerLM at ``sizes`` (``dim``, ``layers``,
    ``heads``, ``seq``, ``batch`` per rank): its parameters, loss and batch maker."""
    import jax.numpy as jnp

    cfg = {"vocab": 256, "mlp_ratio": 4, **sizes}
    module, loss_fn, make_tokens = build_model("transformer", cfg)
    params = init_params(module, make_tokens, seed)

    def make_batch(r):
        return tuple(jnp.asarray(a) for a in make_tokens(r, sizes["batch"]))

    return params, loss_fn, make_batch


def check_first_update(tx, grads, params, k: int, world) -> None:
    """topk_sync's first update (zero residual) against the NumPy reference: ``-LR`` times
    the sum over ranks of each rank's k largest-magnitude gradient entries, over P."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree

    u, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    flat_u = np.asarray(ravel_pytree(u)[0], np.float64)
    flat_g = np.asarray(ravel_pytree(grads)[0])
    kept = np.zeros(flat_g.size, np.float64)
    keep = np.argpartition(np.abs(flat_g), flat_g.size - k)[flat_g.size - k:]
    kept[keep] = flat_g[keep]
    total = np.zeros_like(kept)
    world.Allreduce(kept, total)
    ref = -LR * total / world.Get_size()
    err = float(np.max(np.abs(flat_u - ref)))
    scale = float(np.max(np.abs(ref)))
    assert err <= 1e-5 * scale, f"first update differs from the reference: {err} (scale {scale})"


def models_of(cfg: dict):
    """``(model, params0, loss_fn, make_batch, modes)`` of each model the job measures:
    the MLP at each of ``sizes``, then the LM (``models``)."""
    for model in cfg["models"]:
        if model == "mlp":
            for n in cfg["sizes"]:
                yield ("mlp", *build(n, cfg["batch"], cfg["seed"]), cfg["modes"])
        else:
            yield ("lm", *build_lm(cfg["lm"], cfg["seed"]), cfg["lm_modes"])


def time_parts(tx, k: int, size: int, g0, params0, cfg: dict, world) -> dict:
    """A sync mode's parts alone: the selection of k of N (``topk_s``), the exchange of
    k entries per rank into N (``allreduce_s``), the sync's whole update (``update_s``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_sparse_sync as jss

    rank = world.Get_rank()
    rec = {}
    sel = jax.jit(lambda x, k=k: jss.topk(x, k))
    x = jnp.asarray(np.random.default_rng(cfg["seed"]).standard_normal(size, np.float32))
    jax.block_until_ready(sel(x))
    rec["topk_s"] = median_time(lambda: jax.block_until_ready(sel(x)), cfg["steps"])
    # the collective alone: k sorted entries per rank, summed into N floats
    idx = jnp.asarray(np.sort(np.random.default_rng([cfg["seed"], rank]).choice(
        size, k, replace=False)).astype(np.int32))
    vals = jnp.asarray(np.random.default_rng(rank).standard_normal(k, np.float32))
    allreduce = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=size))
    jax.block_until_ready(allreduce(vals, idx))
    world.Barrier()
    rec["allreduce_s"] = median_time(lambda: jax.block_until_ready(allreduce(vals, idx)),
                                     cfg["steps"])
    upd_d = jax.jit(tx.update, donate_argnums=(1,))
    st = tx.init(params0)
    u, st = upd_d(g0, st, params0)
    jax.block_until_ready(u)

    def one_update():
        nonlocal st
        u, st = upd_d(g0, st, params0)
        jax.block_until_ready(u)

    world.Barrier()
    rec["update_s"] = median_time(one_update, cfg["steps"])
    return rec


def time_steps(step, tx, params0, batches, cfg: dict, world, init=None):
    """The donated step's compile time, then ``steps`` timed steps after ``warmup``;
    the job's step time is the slowest rank's median. Returns (fields, params, state).
    ``init``: the state's initializer (``tx.init``; the mesh's for the axis transport)."""
    import statistics

    import jax
    import jax.numpy as jnp

    params = jax.tree_util.tree_map(jnp.copy, params0)
    opt_state = (init or tx.init)(params)
    t0 = time.perf_counter()
    params, opt_state = jax.block_until_ready(step(params, opt_state, batches[0]))
    rec = {"compile_s": time.perf_counter() - t0}
    for _ in range(cfg["warmup"]):
        params, opt_state = jax.block_until_ready(step(params, opt_state, batches[1]))
    world.Barrier()
    times = []
    for i in range(cfg["steps"]):
        t0 = time.perf_counter()
        params, opt_state = jax.block_until_ready(step(params, opt_state, batches[i % 2]))
        times.append(time.perf_counter() - t0)
    rec["step_s"] = float(max(world.allgather(statistics.median(times))))
    rec["step_times_s"] = times
    return rec, params, opt_state


# --- the mesh transport: comm=jss.axis("data") in shard_map over a one-device mesh ------
AXIS = "data"


def one_device_mesh():
    import jax

    return jax.make_mesh((1,), (AXIS,), devices=jax.devices()[:1])


def per_device(tree):
    """The mesh's per-device state: a leading axis of size P (here 1)."""
    import jax

    return jax.tree_util.tree_map(lambda a: a[None], tree)


def local(tree):
    import jax

    return jax.tree_util.tree_map(lambda a: a[0], tree)


def on_mesh(fn, mesh, in_specs, out_specs, donate=()):
    """``jit(shard_map(fn))`` over ``mesh``; ``P("data")`` rows for per-device state."""
    import jax

    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=False), donate_argnums=donate)


def axis_program(tx, loss_fn, mesh):
    """``tx`` on the mesh: ``init``, ``update`` (also ``update_donated``: the state
    donated) and the training ``step`` (parameters and state donated, as the MPI one);
    the state per device, the parameters, gradients and batch replicated."""
    import jax
    import optax
    from jax.sharding import PartitionSpec as P

    rows = P(AXIS)
    init = on_mesh(lambda p: per_device(tx.init(p)), mesh, P(), rows)

    def update(g, s, p):
        u, s = tx.update(g, local(s), p)
        return u, per_device(s)

    def step(p, s, batch):
        u, s = update(jax.grad(loss_fn)(p, batch), s, p)
        return optax.apply_updates(p, u), s

    specs = ((P(), rows, P()), (P(), rows))
    return {"init": init, "update": on_mesh(update, mesh, *specs),
            "update_donated": on_mesh(update, mesh, *specs, donate=(1,)),
            "step": on_mesh(step, mesh, *specs, donate=(0, 1))}


def sync_leaves(tree) -> dict:
    """``tree``'s leaves as NumPy by path, without the wire statistics (each transport
    counts its messages its own way) and the MPI state's ``world`` (its communicator's
    rank mask; ``None`` on a mesh axis)."""
    import jax
    import numpy as np

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    paths = ((jax.tree_util.keystr(path), leaf) for path, leaf in flat)
    return {path: np.asarray(leaf) for path, leaf in paths
            if "stats" not in path and not path.endswith(".world")}


def axis_matches_mpi(tx, programs, grads, params0) -> bool:
    """Three updates of the MPI transform and of its axis twin (``programs``) from the
    same state on the same gradients: the updates and states bit for bit."""
    import jax

    init, update = programs["init"], programs["update"]
    upd = jax.jit(tx.update)
    s, s_axis = tx.init(params0), init(params0)
    same = True
    for i in range(3):
        u, s = upd(grads[i % len(grads)], s, params0)
        u_axis, s_axis = update(grads[i % len(grads)], s_axis, params0)
        mpi, axis = sync_leaves((u, s)), sync_leaves((u_axis, local(s_axis)))
        same &= mpi.keys() == axis.keys() and all(
            mpi[p].shape == axis[p].shape and mpi[p].tobytes() == axis[p].tobytes() for p in mpi)
    return bool(same)


def axis_parts(update, init, k: int, size: int, g0, params0, cfg: dict, mesh) -> dict:
    """:func:`time_parts` on the mesh: the selection, ``jss.sparse_allreduce`` on the
    axis (its ``"auto"``), and the sync's ``update`` (its state donated)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import jax_sparse_sync as jss

    rec = {}
    sel = on_mesh(lambda x: jss.topk(x, k), mesh, P(), P())
    x = jnp.asarray(np.random.default_rng(cfg["seed"]).standard_normal(size, np.float32))
    jax.block_until_ready(sel(x))
    rec["topk_s"] = median_time(lambda: jax.block_until_ready(sel(x)), cfg["steps"])
    idx = jnp.asarray(np.sort(np.random.default_rng([cfg["seed"], 0]).choice(
        size, k, replace=False)).astype(np.int32))
    vals = jnp.asarray(np.random.default_rng(0).standard_normal(k, np.float32))
    allreduce = on_mesh(lambda v, i: jss.sparse_allreduce(v, i, size=size, comm=jss.axis(AXIS)),
                        mesh, (P(), P()), P())
    jax.block_until_ready(allreduce(vals, idx))
    rec["allreduce_s"] = median_time(lambda: jax.block_until_ready(allreduce(vals, idx)),
                                     cfg["steps"])
    st = init(params0)

    def one_update():
        nonlocal st
        u, st = update(g0, st, params0)
        jax.block_until_ready(u)

    one_update()
    rec["update_s"] = median_time(one_update, cfg["steps"])
    return rec


def axis_record(mode: str, mpi: dict, params_mpi, model, cfg: dict, world) -> dict:
    """The mode's sync through ``jss.axis`` on a one-device mesh: checked against the
    MPI transport (:func:`axis_matches_mpi`, asserted), its parts and its step timed;
    ``mpi``: the MPI record of the same mode, ``params_mpi`` its run's parameters."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree

    import jax_sparse_sync as jss

    params0, loss_fn, batches, grads = model
    mesh = one_device_mesh()
    tx, tx_axis = make_tx(mode), make_tx(mode, comm=jss.axis(AXIS))
    programs = axis_program(tx_axis, loss_fn, mesh)
    same = axis_matches_mpi(tx, programs, grads, params0)
    assert same, f"{mode}: the axis transport's updates differ from the MPI transport's"
    rec = {**{key: mpi[key] for key in ("model", "N", "P", "mode", "k", "grad_s",
                                        "host_allocator_tuned")},
           "transport": "axis", "updates_identical_to_mpi": same}
    rec.update(axis_parts(programs["update_donated"], programs["init"], mpi["k"], mpi["N"],
                          grads[0], params0, cfg, mesh))
    timed, params, opt_state = time_steps(programs["step"], tx_axis, params0, batches, cfg,
                                          world, programs["init"])
    rec.update(timed)
    a, b = (np.asarray(ravel_pytree(t)[0]) for t in (params, params_mpi))
    rec["params_identical_to_mpi"] = bool(a.tobytes() == b.tobytes())
    rec["params_max_abs_diff_to_mpi"] = float(np.max(np.abs(a - b))) if a.size else 0.0
    rec["stats"] = jss.SyncStats.from_vector(jss.last_stats(local(opt_state))).as_dict()
    return rec


def replicas_identical(params, world) -> bool:
    """Whether every rank holds rank 0's parameters, bit for bit."""
    import numpy as np
    from jax.flatten_util import ravel_pytree
    from mpi4py import MPI

    flat = np.asarray(ravel_pytree(params)[0])
    ref = world.bcast(flat if world.Get_rank() == 0 else None, root=0)
    return bool(world.allreduce(int(np.array_equal(flat.view(np.uint32), ref.view(np.uint32))),
                                op=MPI.MIN))


def report(rec: dict) -> None:
    extra = "".join(f" {key} {rec[key] * 1e3:.2f} ms" for key in
                    ("grad_s", "topk_s", "allreduce_s", "update_s") if key in rec)
    ratio = (f" ({rec['ratio_to_baseline']:.2f}x {rec['baseline']})"
             if "ratio_to_baseline" in rec else "")
    mode = rec["mode"] + ("@axis" if rec.get("transport") == "axis" else "")
    print(f"P={rec['P']} {rec['model']} N={fmt_size(rec['N'])} {mode:14s} step "
          f"{rec['step_s'] * 1e3:.2f} ms{ratio};{extra}", flush=True)


def add_ratios(rec: dict, baseline_steps: dict) -> None:
    """A mode's step over its baseline's (``none``, or ``adamw`` for the Adam modes)."""
    base = BASELINES.get(rec["mode"], "none")
    if base in baseline_steps and rec["mode"] != base:
        rec["baseline"] = base
        rec["ratio_to_baseline"] = rec["step_s"] / baseline_steps[base]
    if "none" in baseline_steps:
        rec["ratio_to_none"] = rec["step_s"] / baseline_steps["none"]


def measure_mode(mode: str, model: tuple, t_grad: float, cfg: dict, world) -> tuple:
    """One mode on the MPI transport: its record (checks, parts, step) and the timed
    run's parameters."""
    import jax
    import optax
    from jax.flatten_util import ravel_pytree

    import jax_sparse_sync as jss

    params0, loss_fn, batches, grads = model
    size = int(ravel_pytree(params0)[0].size)
    tx = make_tx(mode)
    density = mode_density(mode)
    k = None if density is None else max(1, round(density * size))

    def step(params, opt_state, batch):
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    step = jax.jit(step, donate_argnums=(0, 1))
    rec = {"N": size, "P": world.Get_size(), "mode": mode, "k": k, "transport": "mpi",
           "grad_s": t_grad}
    if k is not None:
        if mode.startswith("topk"):
            check_first_update(tx, grads[0], params0, k, world)
        rec.update(time_parts(tx, k, size, grads[0], params0, cfg, world))
    timed, params, opt_state = time_steps(step, tx, params0, batches, cfg, world)
    rec.update(timed)
    if k is not None:
        same = replicas_identical(params, world)
        rec["replicas_identical"] = same
        assert same, f"{mode}: replicas differ after {cfg['steps']} steps"
        rec["stats"] = jss.SyncStats.from_vector(jss.last_stats(opt_state)).as_dict()
    return rec, params


def worker(cfg: dict) -> int:
    import jax
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    # glibc returns large freed blocks to the OS, so the host side's k-sized
    # vectors fault their pages in again on every call; tuned, they stay. `import
    # jax_sparse_sync` tunes it already unless JSS_TUNE_HOST_ALLOCATOR=0 opted out
    # (default_tuning: what it set); --tune-host-allocator applies it whatever the
    # environment says
    from jax_sparse_sync.host_allocator import default_tuning
    explicitly = bool(cfg.get("tune_host_allocator")) and jss.mpi.tune_host_allocator()
    host_allocator_tuned = explicitly or bool(default_tuning())
    # the mesh transport at P = 1 only: each rank has one device, no mesh spans ranks
    axis = "axis" in cfg.get("transports", ["mpi"]) and world.Get_size() == 1
    records = []
    for name, params0, loss_fn, make_batch, modes in models_of(cfg):
        batches = [make_batch(np.random.default_rng([cfg["seed"], rank, i])) for i in range(2)]
        grad_fn = jax.jit(jax.grad(loss_fn))
        grads = [grad_fn(params0, b) for b in batches]
        t_grad = median_time(lambda: jax.block_until_ready(grad_fn(params0, batches[0])),
                             cfg["steps"])
        model = (params0, loss_fn, batches, grads)
        baseline_steps = {}
        for mode in modes:
            rec, params = measure_mode(mode, model, t_grad, cfg, world)
            recs = [{"model": name, **rec, "host_allocator_tuned": host_allocator_tuned}]
            if rec["k"] is None:
                baseline_steps[mode] = rec["step_s"]
            elif axis:
                recs.append(axis_record(mode, recs[0], params, model, cfg, world))
            del params
            for r in recs:
                add_ratios(r, baseline_steps)
                if rank == 0:
                    report(r)
                records.append(r)
            if rank == 0:  # after every record: a later failure keeps what was measured
                write_fragment({"records": records}, cfg["fragment"])
        del grads, model
    return 0


def plot(data: dict, png: Path) -> None:
    plt = pyplot()

    recs = data["records"]
    groups = sorted({(r["P"], r.get("model", "mlp"), r["N"]) for r in recs})
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(groups)), 4))
    label = lambda r: r["mode"] + ("@axis" if r.get("transport") == "axis" else "")  # noqa: E731
    modes = [m for m in dict.fromkeys(f"{m}{t}" for m in (*MODES, *LM_MODES) for t in ("", "@axis"))
             if any(label(r) == m for r in recs)]
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, g in enumerate(groups):
            r = next((r for r in recs if (r["P"], r.get("model", "mlp"), r["N"]) == g
                      and label(r) == mode), None)
            if r is not None:
                xs.append(i + j * width)
                ys.append(r["step_s"] * 1e3)
        ax.bar(xs, ys, width, label=mode)
    ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"P={p} {m}\nN={fmt_size(n)}" for p, m, n in groups])
    ax.set_ylabel("step time (ms, median)")
    dev = data["machine"].get("device", "?")
    ax.set_title(f"Training step with and without the sparse sync ({dev})", fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, png)


def main(argv=None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=("mlp", "lm"), default=["mlp"])
    p.add_argument("--sizes", nargs="+", default=["16M", "64M"], help="the MLP's sizes")
    p.add_argument("--procs", nargs="+", type=int, default=[1, 2])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="the MLP's modes")
    p.add_argument("--lm-modes", nargs="+", choices=LM_MODES, default=list(LM_MODES))
    for key, value in LM_SIZES.items():
        p.add_argument(f"--lm-{key}", type=int, default=value,
                       help=f"the LM's {key} (batch: sequences per rank)")
    p.add_argument("--batch", type=int, default=1024, help="the MLP's rows per rank per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per launched job")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON path (default results/gpu_step_<backend>.json)")
    p.add_argument("--transports", nargs="+", choices=("mpi", "axis"), default=["mpi"],
                   help="axis: each sync mode also through jss.axis in shard_map over a "
                        "one-device mesh, checked against the MPI step (P = 1 jobs only)")
    p.add_argument("--tune-host-allocator", action="store_true",
                   help="call jss.mpi.tune_host_allocator() in every rank first")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker.read_text()))
    if "none" not in args.modes:
        args.modes.insert(0, "none")
    if "mpi" not in args.transports:  # the axis records are checked against the MPI step
        args.transports.insert(0, "mpi")
    # each mode after its baseline (a ratio needs it)
    lm_modes = {*args.lm_modes, *(BASELINES.get(m, "none") for m in args.lm_modes)}
    lm_modes = [m for m in LM_MODES if m in lm_modes]
    lm = {key: getattr(args, f"lm_{key}") for key in LM_SIZES}
    # P processes share one GPU: no preallocation of most of its memory by the first
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    data = {"benchmark": "gpu_step", "description": __doc__.split("\n\n")[0],
            "machine": machine_info(), "models": args.models, "sizes": args.sizes,
            "batch": args.batch, "lm": lm, "steps": args.steps, "warmup": args.warmup,
            "layers": LAYERS, "tune_host_allocator": args.tune_host_allocator,
            "transports": args.transports, "records": [], "errors": []}
    print(f"# gpu_step on {data['machine']['device']} ({data['machine']['jax_backend']})",
          flush=True)
    for nranks in args.procs:
        cfg = {"models": args.models, "sizes": [parse_size(s) for s in args.sizes],
               "modes": args.modes, "lm_modes": lm_modes, "lm": lm, "batch": args.batch,
               "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
               "tune_host_allocator": args.tune_host_allocator,
               "transports": args.transports}
        # with partial: what the job measured before it failed
        res = launch_worker(Path(__file__).resolve(), nranks, cfg, args.timeout, env=env,
                            partial=True)
        if res.get("error"):
            data["errors"].append({"P": nranks, "error": res["error"]})
            print(f"# P={nranks}: {res['error']}", flush=True)
        data["records"].extend(res.get("records", []))
    out = args.out or RESULTS / f"gpu_step_{data['machine']['jax_backend']}.json"
    write_record(data, out)
    if data["records"]:
        plot(data, out.with_suffix(".png"))
    return 1 if data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
