"""Where a training step's local (non-network) work goes: the LM of the TTA benchmark.

One process (a 1-rank MPI world), XLA on one thread: the step of
``benchmarks/time_to_accuracy.py``'s modes (``none``: the AdamW step with no sync; e.g.
``topk_1pct_adamdir_mask``; ``<mode>:chain_clip``: the clipping outside the Adam pass),
then, per mode: ``--count`` (the compiled step's N-sized buffers written by top-level
instructions, by opcode, and the floats written per step in units of N), ``--time``
(CPU seconds per step, median of ``--rounds`` interleaved rounds of ``--steps``),
``--profile`` (XLA:CPU op times from a ``jax.profiler`` trace), ``--passes`` (the
update's N-float passes alone, :func:`pass_runners`) and ``--selection`` (the fused
Adam + accumulate call's top-k on the LM's trained state, with hints of 0.9, 0.95 and
1.0 of the last k-th magnitude and without).

Run (on a loaded machine, compare CPU times and relative splits, not wall)::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
    JSS_NUM_THREADS=1 taskset -c 1 python benchmarks/step_local_work.py \\
        --modes none topk_1pct_adamdir_mask --count --time --profile

Results: docs/topics/adam_direction.md and docs/topics/time_to_accuracy.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

#: opcodes whose outputs are views or bookkeeping, not memory written
_NO_WRITE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
             "opt-barrier", "partition-id", "replica-id"}
_INSTR = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\(")
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def _fusion_bodies(hlo_text: str) -> set:
    """Names of the computations that are fusion bodies (their values stay in registers)."""
    bodies = set()
    for line in hlo_text.splitlines():
        if " fusion(" in line:
            bodies.update(_CALLS.findall(line))
    return bodies


def written_buffers(hlo_text: str, *, min_entries: int):
    """``[(computation, instruction, opcode, dtype, entries)]`` of the arrays (not views)
    that the top-level instructions of a compiled module write, outside fusion bodies;
    only those of at least ``min_entries`` entries."""
    bodies = _fusion_bodies(hlo_text)
    out, comp = [], None
    for line in hlo_text.splitlines():
        m = _COMP.match(line)
        if m:
            comp = m.group(1)
            continue
        if comp in bodies:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, shapes, opcode = m.groups()
        if opcode in _NO_WRITE:
            continue
        for dtype, dims in _SHAPE.findall(shapes):
            entries = int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
            if entries >= min_entries:
                out.append((comp, name, opcode, dtype, entries))
    return out


def build(mode: str, phase_steps: int = 1):
    """``(step, params, state, batches)`` of ``mode``'s timed LM step (as the TTA
    benchmark builds it; warm-up phases, if any, shortened to ``phase_steps`` steps, so
    a large value keeps every timed step in the first phase, e.g. the ramp's 25 %); a
    ``:chain_clip`` suffix: the Adam-direction optimizer with the clipping in front
    (its own pass) instead of folded into the Adam pass."""
    import optax

    import convergence
    import step_time
    import time_to_accuracy as tta

    st_defaults = tta.step_time_defaults()
    mcfg = step_time.model_config(st_defaults, tta.STEP_TIME_MODEL["lm"])
    example = tta.load_example(convergence.MODELS["lm"]["script"])
    models = step_time._shared_models()
    module, loss_fn, make_batch = step_time.build_model(tta.STEP_TIME_MODEL["lm"], mcfg)
    params = step_time.init_params(module, make_batch, 0)
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, mcfg["batch"]) for _ in range(2)]
    base, _, variant = mode.partition(":")
    a = example.parse_args(tta.timing_argv(base, phase_steps))
    sync = optax.identity() if base == tta.NO_SYNC else models.make_sync(a)
    if variant == "chain_clip":
        if a.sync_what != "adam_direction":
            raise SystemExit(f"{mode}: ':chain_clip' applies to the adam_direction modes")
        tx = optax.chain(optax.clip_by_global_norm(1.0), *models.adam_then_sync(
            a, sync, example_schedule(a), a.weight_decay))
    elif variant:
        raise SystemExit(f"{mode}: the only variant is ':chain_clip'")
    else:
        tx = example.make_optimizer(a, sync)
    step = step_time.make_step(loss_fn, tx)
    state = tx.init(params)
    return step, params, state, batches


def example_schedule(a):
    """examples/train_lm.py's learning-rate schedule for its arguments ``a``."""
    import step_time

    return step_time._shared_models().lr_schedule(a, end_value=a.lr / 10)


def time_interleaved(built, steps, rounds):
    """CPU ms per step of every mode in ``built`` ({mode: (step, params, state,
    batches)}), the modes taking turns: each round runs ``steps`` steps of each."""
    states = {}
    for mode, (step, params, state, batches) in built.items():
        states[mode] = run_steps(step, params, state, batches, 2)  # compile, warm
    per_step = {mode: [] for mode in built}
    for r in range(rounds):
        for mode, (step, _, _, batches) in built.items():
            c0 = time.process_time()
            states[mode] = run_steps(step, *states[mode], batches, steps)
            per_step[mode].append((time.process_time() - c0) / steps)
        print(f"# round {r + 1}/{rounds}: " + ", ".join(
            f"{m} {1e3 * v[-1]:.1f}" for m, v in per_step.items()) + " CPU ms/step", flush=True)
    first = next(iter(per_step))
    for mode, v in per_step.items():
        print(f"{mode}: CPU ms per step, median of {rounds} interleaved rounds of {steps}: "
              f"{1e3 * statistics.median(v):.1f}  (all: {', '.join(f'{1e3 * t:.1f}' for t in v)})")
        if mode != first:  # the same round's steps: paired, less of the load's drift
            diff = [a - b for a, b in zip(v, per_step[first])]
            print(f"   minus {first}, median of the rounds' differences: "
                  f"{1e3 * statistics.median(diff):+.1f} ms")
    return per_step


def pass_runners(params, density=0.01, max_norm=1.0):
    """The update's passes alone, on the LM's leaf shapes (``--passes``): {name: Runner}."""
    import jax
    import jax.numpy as jnp
    import optax

    import jax_sparse_sync as jss
    from adam_fused import Runner, fused_runner, gradient_pool
    from jax_sparse_sync.transforms import adam_pass, flat

    n = flat.flat_size(params)
    k = max(1, round(density * n))
    pool = gradient_pool(params)

    def zeros():  # separate buffers, donated
        return jnp.zeros((n,), jnp.float32)

    indices = jnp.asarray(np.sort(np.random.default_rng(0).choice(n, k, replace=False)),
                          jnp.int32)
    values = jnp.ones((k,), jnp.float32)

    def dense_sum(previous, g):
        del previous, g
        return (jss.sparse_allreduce(values, indices, size=n),)

    def residual_update(residual, g):
        del g
        return (jss.residual_update(residual, indices),)

    def apply_update(p, summed, g):
        del g
        tx = optax.chain(optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(1e-3))
        u, _ = tx.update(flat.split_like(summed, p, scale=1), tx.init(p), p)
        return optax.apply_updates(p, u), summed

    adamw = optax.chain(optax.clip_by_global_norm(max_norm), optax.adamw(1e-3,
                                                                          weight_decay=0.1))

    def adamw_step(p, s, g):
        u, s = adamw.update(g, s, p)
        return optax.apply_updates(p, u), s

    def norm_only(previous, g):
        del previous
        return (adam_pass.global_norm(g),)

    def norm_and_clip(previous, g):
        del previous
        return (adam_pass.clip_leaves(g, adam_pass.global_norm(g), max_norm),)

    p0 = jax.tree_util.tree_map(jnp.array, params)
    p1 = jax.tree_util.tree_map(jnp.array, params)
    return {
        "global norm (read N)": Runner(jax.jit(norm_only), (jnp.float32(0),), pool),
        "global norm + clipped gradient (+ read N, write N)": Runner(
            jax.jit(norm_and_clip), (None,), pool),
        "adam_accumulate + top-k": fused_runner(params, k, pool),
        "adam_accumulate + top-k, clip folded": fused_runner(params, k, pool, max_norm),
        "sparse allreduce's dense sum (P = 1)": Runner(jax.jit(dense_sum), (None,), pool),
        "residual update (k entries, in place)": Runner(
            jax.jit(residual_update, donate_argnums=(0,)), (zeros(),), pool),
        "weight decay + lr + apply (read 2N, write N)": Runner(
            jax.jit(apply_update, donate_argnums=(0,)), (p1, zeros()), pool),
        "AdamW: clip + adamw + apply": Runner(jax.jit(adamw_step, donate_argnums=(0, 1)),
                                             (p0, adamw.init(p0)), pool),
    }


def selection_cost(train_steps: int, rounds: int, density: float = 0.01):
    """``--selection``: {variant: median wall s per call} of the fused Adam + accumulate
    call on the LM's trained state, and the list's length (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    import step_time
    import time_to_accuracy as tta
    from jax_sparse_sync.transforms import adam_accumulate, adam_pass, flat

    step, params, state, _ = build("topk_1pct_adamdir_mask")
    mcfg = step_time.model_config(tta.step_time_defaults(), tta.STEP_TIME_MODEL["lm"])
    _, loss_fn, make_batch = step_time.build_model(tta.STEP_TIME_MODEL["lm"], mcfg)
    rng = np.random.default_rng(1)
    batches = [make_batch(rng, mcfg["batch"]) for _ in range(8)]
    params, state = run_steps(step, params, state, batches, train_steps)
    adam = state[0]  # adam_direction_sync's state: mu, nu, age, the sync's residual
    last = adam.sync.threshold  # the last step's k-th magnitude
    grads = jax.grad(loss_fn)(params, batches[0])
    n = int(adam.mu.shape[0])
    k = max(1, round(density * n))

    def call(kk, hint_scale):
        def f(g, mu, nu, age, residual, count):
            out = adam_accumulate.adam_accumulate(
                g, mu, nu, age, residual, count + 1, k=kk,
                last_kth=None if hint_scale is None else last * hint_scale,
                clip=(adam_pass.global_norm(g), 1.0), b1=0.9, b2=0.999, eps=1e-8,
                masking="restart")
            return out[:3] + out[4:6] + out[7:]
        return jax.jit(f, donate_argnums=(1, 2, 3, 4))

    def fresh_args():
        args = (grads, *(jnp.array(x, copy=True) for x in
                         (adam.mu, adam.nu, adam.age, adam.sync.residual)), adam.count)
        return jax.block_until_ready(args)

    variants = {"no top-k": call(None, None), "top-k, hint (the default)": call(k, 1.0),
                "top-k, no hint (whole accumulator)": call(k, None),
                "top-k, hint at 1.0 x the last k-th": call(k, 1 / flat.HINT_FACTOR),
                "top-k, hint at 0.9 x the last k-th": call(k, 0.9 / flat.HINT_FACTOR)}
    for f in variants.values():
        jax.block_until_ready(f(*fresh_args()))  # compile, warm
    acc = np.abs(np.asarray(variants["top-k, hint (the default)"](*fresh_args())[3]))
    listed = {f: float(np.sum(acc >= np.float32(f * flat.HINT_FACTOR) * float(last)) / k)
              for f in (1 / flat.HINT_FACTOR, 1.0, 0.9 / flat.HINT_FACTOR)}
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, f in variants.items():
            args = fresh_args()
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[name].append(time.perf_counter() - t0)
    print(f"selection: N = {n}, k = {k}, after {train_steps} steps; the new k-th magnitude "
          f"is {float(np.sort(acc)[-k]) / float(last):.4f} x the last; listed above "
          f"1.0 / 0.95 / 0.9 of the last k-th: "
          + " / ".join(f"{v:.2f} k" for v in listed.values()))
    base = statistics.median(times["no top-k"])
    for name, v in times.items():
        print(f"   {name:38s} {1e3 * statistics.median(v):7.1f} ms "
              f"({1e3 * (statistics.median(v) - base):+6.1f} over no top-k; min "
              f"{1e3 * min(v):.1f})")
    return {name: statistics.median(v) for name, v in times.items()}, listed


def count(mode, step, params, state, batch, min_entries):
    import jax

    text = step.lower(params, state, batch).compile().as_text()
    n = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
    big = written_buffers(text, min_entries=min_entries)
    everything = written_buffers(text, min_entries=1)
    by_op = collections.Counter((comp == _entry_name(text), op) for comp, _, op, _, _ in big)
    print(f"{mode}: N = {n}; top-level arrays of >= {min_entries} entries written "
          f"(in ENTRY / in called computations):")
    for op in sorted({op for _, op in by_op}):
        print(f"   {op:24s} {by_op[(True, op)]:3d} / {by_op[(False, op)]:3d}")
    entry = _entry_name(text)
    total = sum(e for comp, *_, e in everything if comp == entry)
    print(f"   entries written by ENTRY's instructions: {total / n:.2f} N")
    for comp, name, op, dtype, e in big:
        print(f"     {comp[:28]:28s} {name[:40]:40s} {op:22s} {dtype}[{e}]")
    return text


def _entry_name(text):
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            return _COMP.match(line).group(1)
    return None


def run_steps(step, params, state, batches, steps):
    import jax

    for i in range(steps):
        params, state = step(params, state, batches[i % len(batches)])
    jax.block_until_ready((params, state))
    return params, state


def time_cpu(mode, step, params, state, batches, steps, rounds):
    params, state = run_steps(step, params, state, batches, 2)  # compile, warm
    per_step, faults = [], []
    for _ in range(rounds):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0 = time.process_time()
        params, state = run_steps(step, params, state, batches, steps)
        per_step.append((time.process_time() - c0) / steps)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps)
    print(f"{mode}: CPU ms per step, median of {rounds} rounds of {steps}: "
          f"{1e3 * statistics.median(per_step):.1f}  (all: "
          f"{', '.join(f'{1e3 * t:.1f}' for t in per_step)}); minor page faults per step: "
          f"{statistics.median(faults):.0f}")
    return params, state


def profile(mode, step, params, state, batches, steps, text, top):
    import jax

    import grouping

    params, state = run_steps(step, params, state, batches, 2)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        params, state = run_steps(step, params, state, batches, steps)
        jax.profiler.stop_trace()
        files = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        pdata = jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime))
        events = grouping.profile_events(pdata)
    opcode, phase, source = {}, {}, {}
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m:
            opcode[m.group(1)] = m.group(3)
            op_name = re.search(r'op_name="([^"]*)"', line)
            op_name = op_name.group(1) if op_name else ""
            phase[m.group(1)] = _phase(op_name)
            source[m.group(1)] = op_name.removeprefix("jit(step)/")
    by_name, by_op, by_phase = (collections.Counter() for _ in range(3))
    for name, s, e, _ in events:
        by_name[name] += (e - s) / steps
        by_op[opcode.get(name, "?")] += (e - s) / steps
        by_phase[phase.get(name, "update")] += (e - s) / steps
    total = sum(by_name.values())
    print(f"{mode}: XLA op time per step {total * 1e-6:.1f} ms (profile, {steps} steps, "
          "wall: compare the shares); by phase:")
    for ph, t in by_phase.most_common():
        print(f"   {ph:24s} {t * 1e-6:7.2f} ms  {100 * t / total:5.1f} %")
    print("  by opcode:")
    for op, t in by_op.most_common():
        print(f"   {op:24s} {t * 1e-6:7.2f} ms  {100 * t / total:5.1f} %")
    print(f"   top {top} instructions of the update phase:")
    upd = collections.Counter({n: t for n, t in by_name.items()
                               if phase.get(n, "update") == "update"})
    for name, t in upd.most_common(top):
        print(f"     {name[:36]:36s} {opcode.get(name, '?'):12s} {t * 1e-6:7.2f} ms "
              f"{100 * t / total:5.1f} %  {source.get(name, '')[:70]}")
    return params, state


def _phase(op_name: str) -> str:
    """``forward``, ``backward`` or ``update`` (the optimizer and the sync) from an
    instruction's ``op_name`` metadata."""
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "update"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["none", "topk_1pct_adamdir_mask"])
    p.add_argument("--count", action="store_true")
    p.add_argument("--time", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--passes", action="store_true")
    p.add_argument("--selection", action="store_true")
    p.add_argument("--train-steps", type=int, default=60,
                   help="--selection: steps trained before the fused call is timed")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--min-entries", type=int, default=1_000_000)
    p.add_argument("--phase-steps", type=int, default=1,
                   help="steps of each warm-up phase of a ramp mode (1: the timed steps are "
                        "the mode's own after 2 warm steps; e.g. 100000: all in the first "
                        "stage, the ramp's 25 %%)")
    p.add_argument("--tune-allocator", action="store_true",
                   help="jss.mpi.tune_host_allocator() explicitly first (import jax_sparse_sync "
                        "applies it already unless JSS_TUNE_HOST_ALLOCATOR=0)")
    args = p.parse_args(argv)
    if args.tune_allocator:
        import jax_sparse_sync as jss
        jss.mpi.tune_host_allocator()
    if args.passes:
        import adam_fused
        import step_time
        import time_to_accuracy as tta
        mcfg = step_time.model_config(tta.step_time_defaults(), tta.STEP_TIME_MODEL["lm"])
        module, _, make_batch = step_time.build_model(tta.STEP_TIME_MODEL["lm"], mcfg)
        res = adam_fused.interleave(pass_runners(step_time.init_params(module, make_batch, 0)),
                                    args.rounds, args.steps, 2, "passes")
        for name, r in res.items():
            print(f"pass {name:48s} CPU {1e3 * r['cpu_median_s']:7.1f} ms   "
                  f"wall {1e3 * r['median_s']:7.1f} ms")
    if args.selection:
        selection_cost(args.train_steps, args.rounds)
        return 0
    if args.time and len(args.modes) > 1:
        built = {mode: build(mode, args.phase_steps) for mode in args.modes}
        for mode, (step, params, state, batches) in built.items():
            if args.count or args.profile:
                count(mode, step, params, state, batches[0], args.min_entries)
        time_interleaved(built, args.steps, args.rounds)
        return 0
    for mode in args.modes:
        step, params, state, batches = build(mode, args.phase_steps)
        text = count(mode, step, params, state, batches[0], args.min_entries) \
            if args.count or args.profile else None
        if args.time:
            params, state = time_cpu(mode, step, params, state, batches, args.steps, args.rounds)
        if args.profile:
            params, state = profile(mode, step, params, state, batches, args.steps, text,
                                    args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
