"""grouped_topk_sync with adam_direction_sync, warm-up phases, flushes and a leaky
residual, in one process: a one-group plan is the ungrouped step bit for bit, the
phases' switch copies no buffer of N entries, the Adam-direction step's groups write
the flat state in place (no slice or concatenation), every group keeps its phase's k,
and bad arguments name themselves (the multi-rank checks against NumPy:
tests/mpi/test_grouped_phases_mpi.py)."""

import collections
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_sparse_sync as jss
from compiled_step import compiled_step_text

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import step_local_work  # noqa: E402

PARAMS = {"a": jnp.zeros((6, 7)), "b": jnp.zeros(13), "c": jnp.zeros((2, 3, 4)),
          "d": jnp.zeros(50)}  # N = 129, tree order a, b, c, d
N = 129
ONE = [((0, 1, 2, 3), "normal")]
GROUPS = [((3,), "normal"), ((1, 2), "simultaneous"), ((0,), "normal")]


def gradients(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [jax.tree_util.tree_map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), PARAMS)
        for _ in range(steps)]


def run(tx, steps=7):
    state = tx.init(PARAMS)
    update = jax.jit(tx.update)
    outs = []
    for g in gradients(steps):
        u, state = update(g, state, PARAMS)
        outs.append(u)
    return outs, state


def assert_bitwise(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


RAMP = [(2, 1.0), (2, 0.25)]


def _adam(**kw):
    return lambda s: jss.adam_direction_sync(s, **kw)


PLAIN, RAMP_FLUSH, DECAY = {}, {"warmup": RAMP, "flush_every": 5}, {"residual_decay": 0.9}
DGC_RAMP_DECAY = {"warmup": jss.density_ramp(0.05, steps_per_stage=2), "residual_decay": 0.95}


@pytest.mark.parametrize("wrap, options", [
    (lambda s: s, PLAIN), (lambda s: s, RAMP_FLUSH), (lambda s: s, DGC_RAMP_DECAY),
    (_adam(momentum_masking="restart"), PLAIN), (_adam(momentum_masking="restart"), RAMP_FLUSH),
    (_adam(momentum_masking="restart"), DGC_RAMP_DECAY),
    (_adam(momentum_masking="zero", learning_rate=0.1), DECAY),
    (_adam(second_moment="mean", nranks=1), RAMP_FLUSH),
    # a 16-bit residual (no fused selection; adam_direction_sync then hands the sync its
    # direction as leaves) and a 16-bit wire (its rounding kept in the residual)
    (lambda s: s, {"residual_dtype": jnp.bfloat16, **RAMP_FLUSH}),
    (_adam(), {"residual_dtype": jnp.bfloat16, **RAMP_FLUSH}),
    (_adam(), {"wire_dtype": jnp.bfloat16, **RAMP_FLUSH})],
    ids=["sync", "sync_ramp_flush", "sync_dgc_ramp_decay", "adam", "adam_ramp_flush",
         "adam_dgc_ramp_decay", "adam_zero_lr_decay", "adam_mean_moment_ramp_flush",
         "sync_bf16_residual", "adam_bf16_residual", "adam_bf16_wire"])
def test_one_group_is_the_ungrouped_step_bitwise(wrap, options):
    a = run(wrap(jss.grouped_topk_sync(ONE, density=0.05, **options)))
    b = run(wrap(jss.topk_sync(density=0.05, **options)))
    assert_bitwise(a, b)


@pytest.mark.parametrize("options, adam", [
    # the 16-bit wire without masking: the unfused sync (plain update) keeps the wire's
    # rounding in the residual, while under masking the fused one drops it (masking
    # reads residual == 0 as sent: AccumulatorSource.exact_sent)
    ({}, {}), ({"wire_dtype": jnp.bfloat16, "residual_decay": 0.9}, {"momentum_masking": "off"}),
    ({}, {"second_moment": "mean", "nranks": 1}), (RAMP_FLUSH, {})],
    ids=["plain", "bf16_wire_decay", "mean_moment", "ramp_flush"])
def test_adam_direction_sync_takes_the_grouped_flat_entry_point(options, adam):
    # the fused path (each group's moments and accumulator in one pass, in place on
    # the whole flat state; with phases on its slices), not the direction cut into
    # leaves and handed to update: the same steps either way
    grouped = jss.grouped_topk_sync(GROUPS, density=0.05, **options)
    assert grouped.update_from is not None
    fused = run(jss.adam_direction_sync(grouped, **adam))
    unfused_sync = optax.GradientTransformation(grouped.init, grouped.update)  # no update_from
    unfused = run(jss.adam_direction_sync(unfused_sync, **adam))
    assert_bitwise(fused, unfused)  # the fused pass is the unfused arithmetic
    if not options and not adam:  # masking ran: some entries' momentum restarted
        _, age = fused[1].moments()
        assert np.count_nonzero(np.asarray(age) < 7) > 0


def test_every_group_keeps_its_phases_k():
    # k at 0.25 is round(0.25 * 129) = 32: d (50) keeps 12, b + c (37) 9, a (42) 10;
    # at the own 0.05, k = 6: 2 + 2 + 2; the dense phase and the flush keep all 129
    tx = jss.grouped_topk_sync(GROUPS, density=0.05, warmup=RAMP, flush_every=6)
    outs, state = run(tx, steps=7)
    kept = [sum(int(np.count_nonzero(np.asarray(x))) for x in jax.tree_util.tree_leaves(u))
            for u in outs]
    assert kept == [N, N, 31, 31, 6, N, 6]
    assert int(state.last_local_count) == 6
    _, state6 = run(tx, steps=6)
    assert not np.any(np.asarray(state6.residual))  # the flush sent everything
    assert int(state6.last_local_count) == N


def _copies(tx, n_entries):
    """Copies in the compiled, donated step, by length, any dtype (e.g. ``{"[50]": 4}``:
    the float32 state and the int16 ages alike)."""
    params = {"w": jnp.zeros((n_entries - 3,)), "b": jnp.zeros((3,))}
    text = compiled_step_text(tx, params)
    found = (re.search(r"(?:f32|s16)(\[\d+\])\{0\} copy\(", line)
             for line in text.splitlines())
    return collections.Counter(m.group(1) for m in found if m)


@pytest.mark.parametrize("wrap, plain_slices, phased_slices", [
    (lambda s: s, 0, 1), (lambda s: jss.adam_direction_sync(s), 0, 4)],
    ids=["sync", "adam_direction"])
def test_phases_add_no_copy_of_n_entries(wrap, plain_slices, phased_slices):
    # The phases' switch holds each group's selection and start only: the accumulate
    # pass (and the Adam moments) before it, the residual update after it. So a ramp,
    # a dense phase and flushes copy no buffer of N entries. What the grouped step
    # does copy: nothing without phases (the groups' passes chain through the whole
    # residual, and the Adam direction's through the whole flat state: tests below);
    # with phases or flushes, whose branches read the group's accumulator, each
    # group's slice of the residual (the plain sync) or of the residual, mu, nu and
    # age (the Adam direction's) (docs/topics/scheduling.md, "What it costs").
    n = 5003
    plan = [((1,), "normal"), ((0,), "normal")]
    plain = _copies(wrap(jss.grouped_topk_sync(plan, density=0.01)), n)
    assert plain["[5000]"] == plain_slices and plain["[3]"] == plain_slices, plain
    assert plain[f"[{n}]"] == 0
    for options in ({"warmup": jss.density_ramp(0.01, steps_per_stage=2)},
                    {"warmup": [(2, 1.0), (2, 0.1)], "flush_every": 5}):
        phased = _copies(wrap(jss.grouped_topk_sync(plan, density=0.01, **options)), n)
        assert phased["[5000]"] == phased_slices, (options, phased)
        assert phased["[3]"] == phased_slices and phased[f"[{n}]"] == 0, (options, phased)
    # one group: no slices, and none of N entries at all
    assert _copies(wrap(jss.grouped_topk_sync(
        [((0, 1), "normal")], density=0.01, warmup=[(2, 1.0), (2, 0.1)], flush_every=5)),
        n)[f"[{n}]"] == 0


def test_the_grouped_step_writes_the_residual_in_place():
    # Each group's accumulate-and-select reads and writes its range of the whole
    # residual (AccumulatorSource.produce_at, jss_accumulate_topk's offset), the
    # groups' calls chained through it: the grouped step writes the whole buffers the
    # ungrouped one writes (the accumulator in place, the residual update, the
    # parameters' update) and one group's dense sum, with no slice of the residual
    # in and no concatenation of the groups' residuals out (each of those was a copy
    # of N entries: 6 ms a step of the 7.5M MLP)
    n = 5003
    params = {"w": jnp.zeros((n - 3,)), "b": jnp.zeros((3,))}

    def written(tx):
        text = compiled_step_text(tx, params)
        return collections.Counter(
            (op, e) for _, _, op, _, e in step_local_work.written_buffers(text, min_entries=n - 3))

    ungrouped = written(jss.topk_sync(density=0.01))
    grouped = written(jss.grouped_topk_sync([((1,), "normal"), ((0,), "normal")],
                                            density=0.01))
    assert ungrouped == {("custom-call", n): 3, ("fusion", n - 3): 1}, ungrouped
    assert grouped == ungrouped + collections.Counter({("custom-call", n - 3): 1}), grouped
    # a group whose leaves are not one range (the profile's order is not tree order:
    # leaves 0 and 2 of 3): each leaf written at its place, the selection reading the
    # group's entries gathered by the same call (its one extra buffer, n - 2 entries,
    # beside the group's dense sum); still no slice or concatenation
    params = {"a": jnp.zeros((n - 3,)), "b": jnp.zeros((2,)), "c": jnp.zeros((1,))}
    scattered = written(jss.grouped_topk_sync([((1,), "normal"), ((0, 2), "normal")],
                                              density=0.01))
    assert scattered == ungrouped + collections.Counter({("custom-call", n - 2): 2}), scattered


def test_the_grouped_adam_step_writes_the_flat_state_in_place():
    # Each group's Adam pass reads and writes its range of the whole mu, nu, age and
    # residual buffers (AccumulatorSource.produce_at, jss_adam_accumulate's offset),
    # the groups' calls chained through them: no slice, copy or concatenation of
    # the state, as the ungrouped step (tests/test_step_local_work.py)
    n = 5003
    params = {"w": jnp.zeros((n - 3,)), "b": jnp.zeros((3,))}
    plan = [((1,), "normal"), ((0,), "normal")]
    text = compiled_step_text(jss.adam_direction_sync(jss.grouped_topk_sync(plan, density=0.01)),
                              params)
    written = step_local_work.written_buffers(text, min_entries=n - 3)
    by_op = collections.Counter((op, e) for _, _, op, _, e in written)
    # two passes of 4 whole buffers each (mu, nu, age, acc in place), the residual
    # update, the first group's dense sum and the parameters' update
    assert by_op == {("custom-call", n): 9, ("custom-call", n - 3): 1,
                     ("fusion", n - 3): 1}, written
    # a group whose leaves are not one range (leaves 0 and 2 of 3): the same, each leaf's
    # state read and written at its place, and the group's accumulator gathered by the
    # same call for the selection (its one extra buffer, beside the group's dense sum)
    params = {"a": jnp.zeros((n - 3,)), "b": jnp.zeros((2,)), "c": jnp.zeros((1,))}
    text = compiled_step_text(jss.adam_direction_sync(jss.grouped_topk_sync(
        [((1,), "normal"), ((0, 2), "normal")], density=0.01)), params)
    written = step_local_work.written_buffers(text, min_entries=n - 3)
    by_op = collections.Counter((op, e) for _, _, op, _, e in written)
    assert by_op == {("custom-call", n): 9, ("custom-call", n - 2): 2,
                     ("fusion", n - 3): 1}, written


def test_bad_phase_arguments_name_the_argument_and_the_fix():
    with pytest.raises(ValueError, match=r"grouped_topk_sync: `warmup` must be \(steps, density\)"
                       r" pairs.*density_ramp"):
        jss.grouped_topk_sync(GROUPS, density=0.05, warmup=3)
    with pytest.raises(ValueError, match=r"grouped_topk_sync: a `warmup` phase's density"):
        jss.grouped_topk_sync(GROUPS, density=0.05, warmup=[(2, 1.5)])
    with pytest.raises(ValueError, match=r"grouped_topk_sync: `flush_every` must be None or an "
                                         r"int >= 1"):
        jss.grouped_topk_sync(GROUPS, density=0.05, flush_every=0)
    with pytest.raises(ValueError, match=r"grouped_topk_sync: `residual_decay` must be a float "
                                         r"in \(0, 1\]"):
        jss.grouped_topk_sync(GROUPS, density=0.05, residual_decay=1.5)
    # the deprecated topk_sync(grouping=...) names the transform that takes them
    for bad in ({"warmup": RAMP}, {"flush_every": 5}, {"residual_decay": 0.9}):
        with pytest.raises(ValueError, match=r"jss\.grouped_topk_sync\(grouping, "), \
                pytest.warns(DeprecationWarning):
            jss.topk_sync(density=0.05, grouping=GROUPS, **bad)


def test_a_source_that_cannot_be_split_names_the_fix():
    # a producer in front of the grouped sync must cut its operands into groups
    from jax_sparse_sync.transforms.accumulator_source import gradient_source
    tx = jss.grouped_topk_sync(GROUPS, density=0.05)
    whole = gradient_source(jnp.float32)._replace(part=None)
    with pytest.raises(ValueError, match=r"grouped_topk_sync: `update_from`'s accumulator "
                                         r"source cannot be cut into groups.*part\(operands, "
                                         r"leaf_ids, take\).*jss\.topk_sync"):
        tx.update_from(whole, gradients(1)[0], tx.init(PARAMS))


def _syncs_before_backward_end(tx):
    """For each group's sync (its start, or its phases' switch around the start), in
    schedule order: the backward-pass ops (dots and fusions under ``transpose(jvp``)
    XLA placed after it in the compiled step of a 6-layer MLP, one group a layer."""
    layers, width = 6, 64
    keys = jax.random.split(jax.random.PRNGKey(0), layers)
    params = [{"w": jax.random.normal(k, (width, width)) * 0.05, "b": jnp.zeros(width)}
              for k in keys]

    def loss(params, x):
        for p in params:
            x = jnp.tanh(x @ p["w"] + p["b"])
        return jnp.sum(x ** 2)

    def step(params, state, x):
        updates, state = tx.update(jax.grad(loss)(params, x), state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    text = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, jnp.ones((8, width))) \
        .compile().as_text()
    lines = text[text.index("\nENTRY"):].splitlines()
    syncs = [i for i, line in enumerate(lines)
             if 'custom_call_target="jss_sparse_allreduce_start"' in line
             or " conditional(" in line]
    backward = [i for i, line in enumerate(lines)
                if "transpose(jvp(" in line and (" dot(" in line or "fusion(" in line)]
    return [sum(b > s for b in backward) for s in syncs], len(backward)


@pytest.mark.parametrize("make", [
    lambda plan: jss.grouped_topk_sync(plan, density=0.01),
    lambda plan: jss.adam_direction_sync(jss.grouped_topk_sync(plan, density=0.01)),
    lambda plan: jss.adam_direction_sync(jss.grouped_topk_sync(
        plan, density=0.01, warmup=jss.density_ramp(0.01, steps_per_stage=2, dense_steps=1),
        flush_every=100))], ids=["sync", "adam_direction", "adam_direction_ramp_flush"])
def test_the_first_groups_sync_is_scheduled_inside_the_backward_pass(make):
    # The point of grouping: the last layer's group is on the wire while the earlier
    # layers' gradients are computed. Measured on this XLA:CPU: the plain and Adam
    # steps leave [14, 10, 6, 2, 0, 0] of 23 backward ops after each group's start; a
    # phases' switch is placed later, [11, 6, 0, 0, 0, 0] (docs/topics/scheduling.md).
    plan = [((2 * i, 2 * i + 1), "normal") for i in reversed(range(6))]
    after, total = _syncs_before_backward_end(make(plan))
    assert len(after) == 6 and total > 12
    assert after[0] > total // 3 and after[1] > 0, after


def test_after_the_ramp_the_step_can_switch_to_the_transform_without_it():
    # The phases' switch is placed later by XLA (above): once the ramp is over, a
    # transform without `warmup=` takes the same state and continues bit for bit.
    ramp = jss.density_ramp(0.05, steps_per_stage=2, dense_steps=1)  # 5 steps
    with_ramp = jss.adam_direction_sync(jss.grouped_topk_sync(GROUPS, density=0.05,
                                                              warmup=ramp))
    without = jss.adam_direction_sync(jss.grouped_topk_sync(GROUPS, density=0.05))
    grads = gradients(8)
    state = with_ramp.init(PARAMS)
    update = jax.jit(with_ramp.update)
    for g in grads[:5]:
        _, state = update(g, state, PARAMS)
    a, b = state, state
    for g in grads[5:]:
        ua, a = update(g, a, PARAMS)
        ub, b = jax.jit(without.update)(g, b, PARAMS)
        assert_bitwise((ua, a), (ub, b))
