"""step_time.py's workers: one MPI job times every mode of a (model, link, P), rank 0
writes the job's records; the psum job does the same in one process of P devices."""

from __future__ import annotations

import itertools
import statistics
import time
import warnings

from _harness import fmt_bytes, write_fragment

from .modes import LOCAL_KIND, NO_SYNC, PSUM_MODES, make_tx, mode_k, parse_mode, run_algorithm
from .models import fresh, setup
from .report import predicted_volume


def make_step(loss_fn, tx, wrap=None):
    """The jitted training step, params and opt_state donated; ``wrap`` (for psum) turns
    the per-device step into a shard_map before the jit."""
    import jax
    import optax

    def step(params, opt_state, batch):
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(wrap(step) if wrap else step, donate_argnums=(0, 1))


def time_steps(step, params, opt_state, batches, *, warmup: int, steps: int,
               max_seconds: float, agree=lambda t: t, lockstep=lambda: None):
    """Compiles, warms up and times a step: ``({"compile_s", "warmup_s", "times_s"},
    opt_state)``. Step i takes ``batches[i % len(batches)]``; T = max_seconds / (warm-up
    step time, made every rank's by ``agree``), clipped to [3, steps]; ``lockstep`` (a
    barrier) ends every step, inside its time."""
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


def worker(cfg: dict) -> int:
    """One MPI job: every mode of ``cfg["modes"]`` for one (model, link, P)."""
    import jax
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss

    # jit warns of the opt_state leaves no output can reuse (e.g. SGD's empty state)
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    # Timing bookkeeping uses COMM_WORLD; the library syncs on its own clone of it.
    world = MPI.COMM_WORLD
    rank, nranks = world.Get_rank(), world.Get_size()
    t_start = time.monotonic()
    tag = f"[{cfg['model']} {cfg['link']} P={nranks}]"
    _, loss_fn, make_batch, params0, size, leaves = setup(cfg)
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
    # the cost model's local-work term, calibrated the library's way (jss.planning.calibrate),
    # not from the breakdown above: the prediction is independent of the measurement
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
    _, loss_fn, make_batch, params0, size, leaves = setup(cfg)
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
                     "result_nnz": size, "algorithm": "psum", "switched_to_dense": None}
        # one record as the MPI job's (every device's the same), with no local step
        rec = raw_record(mode, [{"res": dict(res, stats=stats), "local": None}] * nranks,
                         size, leaves, nranks)
        med = rec["step_s"]
        records.append({"mode": mode, **parse_mode(mode), "bytes_from_model": mode == "psum",
                        **rec, "per_rank_median_s": [med], "switched_to_dense": None,
                        "process": f"one process, {nranks} host devices (shard_map)"})
        print(f"{tag} {mode:>26}: step {med:.3f} s (median of {len(res['times_s'])}), compile "
              f"{res['compile_s']:.1f} s [t+{time.monotonic() - t_start:.0f}s]", flush=True)
    write_fragment({"model": cfg["model"], "link": "shm", "P": nranks, "N": size,
                    "leaves": leaves, "records": records,
                    "worker_wall_s": round(time.monotonic() - t_start, 1)}, cfg["fragment"])
    return 0
