"""jss.diloco in one process: DiLoCo's arithmetic against NumPy (one worker, and P workers
simulated with vmap and a mean over the vmapped axis), the exact merge, the sync called on
outer steps only, an Orbax checkpoint between two outer steps, and the argument errors.

The same transform across MPI ranks: tests/mpi/test_diloco_mpi.py; on a mesh axis:
tests/axis/diloco_cases.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from diloco_reference import diloco_reference, leaf_groups

import jax_sparse_sync as jss
from jax_sparse_sync.transforms.diloco_config import DiLoCoConfig, balanced_groups

SHAPES = {"a": (3, 4), "b": (5,), "c": (2, 3)}
SIZES = [int(np.prod(s)) for s in SHAPES.values()]
SIZE = sum(SIZES)
LR = 0.1


def unflatten(flat):
    out, o = {}, 0
    for name, shape in SHAPES.items():
        n = int(np.prod(shape))
        out[name] = jnp.asarray(flat[o:o + n].reshape(shape))
        o += n
    return out


def flatten(tree):
    return np.concatenate([np.asarray(tree[name]).reshape(-1) for name in SHAPES])


def targets(nranks):
    return np.random.default_rng(3).standard_normal((nranks, SIZE)).astype(np.float32)


def start():
    return np.random.default_rng(4).standard_normal(SIZE).astype(np.float32)


def grad_fns(nranks):
    return [lambda p, s, t=t: (p - t) * np.float32(1 + s % 3) for t in targets(nranks)]


def mean_over(axis):
    """A sync that averages over a vmapped axis: P workers in one process."""
    def update(updates, state, params=None):
        del params
        return jax.tree_util.tree_map(lambda x: jax.lax.pmean(x, axis), updates), state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def simulated_trainer(tx, nranks):
    """``train(steps, params=None, state=None, start=0) -> (params, state)`` of ``nranks``
    workers in one vmapped step (the workers' axis first), applied with
    jss.diloco_apply_updates."""
    t = {name: jnp.stack([unflatten(row)[name] for row in targets(nranks)]) for name in SHAPES}

    def one(p, s, tt, i):
        scale = (1 + i % 3).astype(jnp.float32)
        grads = jax.tree_util.tree_map(lambda x, y: (x - y) * scale, p, tt)
        updates, s = tx.update(grads, s, p)
        return jss.diloco_apply_updates(p, updates, s), s

    step = jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None), axis_name="ranks"),
                   donate_argnums=(0, 1))

    def train(steps, params=None, state=None, begin=0, each=None):
        if params is None:
            params = jax.tree_util.tree_map(lambda x: jnp.stack([x] * nranks),
                                            unflatten(start()))
            state = jax.vmap(tx.init)(params)
        for i in range(begin, begin + steps):
            params, state = step(params, state, t, jnp.int32(i))
            if each is not None:  # copies: the next step donates these buffers
                each(i + 1, *jax.tree_util.tree_map(np.asarray, (params, state)))
        return params, state

    return train


@pytest.mark.parametrize("nranks,every,fragments,delay,mix", [
    (1, 3, 1, 0, 0.0),    # DiLoCo at one worker
    (3, 4, 1, 0, 0.0),    # three workers, the outer Nesterov step on their mean
    (3, 4, 2, 1, 0.0),    # two fragments taking turns, each merged a step later
    (2, 6, 3, 2, 0.5)])   # Streaming DiLoCo's mixing merge
def test_matches_numpy_diloco(nranks, every, fragments, delay, mix):
    steps = 2 * every + 1
    tx = jss.diloco(optax.sgd(LR), every=every, sync=mean_over("ranks"), fragments=fragments,
                    delay=delay, mix=mix)
    seen = {}
    train = simulated_trainer(tx, nranks)
    params, state = train(steps, each=lambda t, p, s: seen.setdefault(t, (p, s)))
    groups = leaf_groups(SIZES, balanced_groups(SIZES, fragments))
    _, _, _, history = diloco_reference(start(), grad_fns(nranks), steps=steps, every=every,
                                        inner_lr=LR, groups=groups, delay=delay, mix=mix)
    for t in range(1, steps + 1):
        p, s = seen[t]
        ref_params, ref_anchor = history[t]
        for r in range(nranks):
            np.testing.assert_allclose(flatten({k: v[r] for k, v in p.items()}), ref_params[r],
                                       rtol=1e-5, atol=1e-6, err_msg=f"step {t} worker {r}")
            anchor = flatten({k: v[r] for k, v in s.anchor.items()})
            np.testing.assert_allclose(anchor, ref_anchor, rtol=1e-5, atol=1e-6)
            # the shared parameters are the same bits on every worker, always
            assert anchor.tobytes() == flatten({k: v[0] for k, v in s.anchor.items()}).tobytes()
        assert np.asarray(s.count).tolist() == [t] * nranks
    # the run moved (the comparison above is not of two unchanged starts)
    assert np.abs(flatten({k: v[0] for k, v in params.items()}) - start()).max() > 0.1


def test_after_each_outer_step_every_worker_holds_the_anchor_bit_for_bit():
    nranks, every = 3, 3
    tx = jss.diloco(optax.adam(0.05), every=every, sync=mean_over("ranks"))
    outer_steps = []

    def check(t, p, s):
        flat = [flatten({k: v[r] for k, v in p.items()}) for r in range(nranks)]
        if t % every:
            assert not np.asarray(s.snapped).any()
            assert flat[0].tobytes() != flat[1].tobytes()  # the workers went their own ways
            return
        anchor = flatten({k: v[0] for k, v in s.anchor.items()})
        assert np.asarray(s.snapped).all()
        assert all(f.tobytes() == anchor.tobytes() for f in flat), t
        outer_steps.append(t)

    simulated_trainer(tx, nranks)(3 * every, each=check)
    assert outer_steps == [3, 6, 9]


def test_diloco_apply_updates_is_exact_where_params_plus_difference_rounds():
    # working parameters far from an anchor of smaller magnitude: params + (anchor - params)
    # rounds away from the anchor on some entries, diloco_apply_updates on none
    rng = np.random.default_rng(0)
    n = 1000
    params = {"w": jnp.asarray(rng.standard_normal(n).astype(np.float32))}
    anchor = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 0, n)).astype(np.float32)
    tx = jss.diloco(optax.sgd(0.0), every=1, sync=jss.dense_sync())  # the default outer step
    updates, state = tx.update({"w": jnp.zeros(n)}, tx.init({"w": jnp.asarray(anchor)}), params)
    target = np.asarray(state.anchor["w"])
    plain = np.asarray(optax.apply_updates(params, updates)["w"])
    exact = np.asarray(jss.diloco_apply_updates(params, updates, state)["w"])
    assert np.count_nonzero(plain != target) > 0
    assert exact.tobytes() == target.tobytes()
    # found in an optax.chain's state too; without a DiLoCoState it says what it needs
    chained = jss.diloco_apply_updates(params, updates, (optax.EmptyState(), state))
    assert np.asarray(chained["w"]).tobytes() == exact.tobytes()
    with pytest.raises(ValueError, match="exactly one DiLoCoState"):
        jss.diloco_apply_updates(params, updates, optax.sgd(1.0).init(params))


def counting_sync(calls):
    """dense_sync, counting (at run time) the steps that call it."""
    dense = jss.dense_sync()

    def update(updates, state, params=None):
        jax.debug.callback(lambda: calls.append(1))
        return dense.update(updates, state, params)

    return optax.GradientTransformation(dense.init, update)


def test_the_sync_runs_on_outer_steps_only_and_stats_are_zero_between():
    calls = []
    tx = jss.diloco(optax.sgd(LR), every=4, sync=counting_sync(calls), fragments=2)
    params = unflatten(start())
    state = tx.init(params)

    @jax.jit
    def step(p, s):
        u, s = tx.update(jax.tree_util.tree_map(jnp.ones_like, p), s, p)
        return jss.diloco_apply_updates(p, u, s), s

    for t in range(1, 9):
        params, state = step(params, state)
        jax.block_until_ready(params)
        assert len(calls) == t // 2, t  # fragments 0 and 1 after steps 2, 4, 6, 8
        assert jss.last_stats(state) is state.last_stats
    assert int(state.count) == 8


def test_sparseloco_topk_residual_in_place_of_outer_momentum():
    # one worker: the outer step sends the top-k of residual + pseudo-gradient, keeps the rest
    k, every = 4, 2
    tx = jss.diloco(optax.sgd(LR), optax.sgd(1.0), every=every, sync=jss.topk_sync(k=k))
    params = unflatten(start())
    state = tx.init(params)
    step = jax.jit(lambda p, s, g: (lambda u, s: (jss.diloco_apply_updates(p, u, s), s))(
        *tx.update(g, s, p)))
    anchor0 = flatten(state.anchor)
    local = start().copy()
    for t in range(1, every + 1):
        g = (local - targets(1)[0]) * np.float32(1 + (t - 1) % 3)
        params, state = step(params, state, unflatten(g))
        local = local - np.float32(LR) * g
    moved = anchor0 - flatten(state.anchor)
    pseudo = anchor0 - local
    assert np.count_nonzero(moved) == k
    top = np.argsort(-np.abs(pseudo))[:k]
    np.testing.assert_allclose(moved[top], pseudo[top], rtol=1e-5)
    residual = np.asarray(state.sync[0].residual)
    np.testing.assert_allclose(residual + moved, pseudo, rtol=1e-5, atol=1e-7)
    assert flatten(params).tobytes() == flatten(state.anchor).tobytes()


def test_orbax_checkpoint_between_outer_steps_continues_bit_for_bit(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint", reason="Orbax is not installed")
    tx = jss.diloco(optax.adamw(0.05), every=4, sync=jss.topk_sync(k=5), fragments=2, delay=1)
    params = unflatten(start())
    t = unflatten(targets(1)[0])

    @jax.jit
    def step(p, s, i):
        g = jax.tree_util.tree_map(lambda x, y: (x - y) * (1 + i % 3).astype(jnp.float32), p, t)
        u, s = tx.update(g, s, p)
        return jss.diloco_apply_updates(p, u, s), s

    def run(p, s, first, last):
        for i in range(first, last):
            p, s = step(p, s, jnp.int32(i))
        return p, s

    straight = run(params, tx.init(params), 0, 11)
    halfway = run(params, tx.init(params), 0, 6)  # between fragment 0's steps 6 and 10
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "ckpt", halfway)
    ckpt.wait_until_finished()
    restored = ckpt.restore(tmp_path / "ckpt", (params, tx.init(params)))
    resumed = run(*restored, 6, 11)
    for a, b in zip(jax.tree_util.tree_leaves(resumed), jax.tree_util.tree_leaves(straight)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert int(resumed[1].count) == 11


def test_donated_state_is_not_copied():
    tx = jss.diloco(optax.sgd(LR), every=2, sync=jss.topk_sync(k=3))
    params = {"w": jnp.zeros(1 << 15)}

    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return jss.diloco_apply_updates(p, u, s), s

    good = jax.jit(step, donate_argnums=(0, 1))
    assert jss.check_donation(good, params, tx.init(params), params) == []
    p, s = good(params, tx.init(params), {"w": jnp.ones(1 << 15)})
    p, s = good(p, s, {"w": jnp.ones(1 << 15)})
    assert int(s.count) == 2 and s.snapped.tolist() == [True]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(every=0), ValueError, "`every` must be an int >= 1"),
    (dict(every=True), ValueError, "`every` must be an int >= 1"),
    (dict(every=2.0), ValueError, "`every` must be an int >= 1"),
    (dict(every=4, sync=lambda g: g), TypeError, "`sync` must be an optax.GradientTransformation"),
    (dict(every=4, sync=None), TypeError, "`sync` must be an optax.GradientTransformation"),
    (dict(every=4, fragments=5), ValueError, r"`fragments` \(5\) must be at most `every`"),
    (dict(every=4, fragments=0), ValueError, "`fragments` must be an int >= 1"),
    (dict(every=4, fragments="layers"), TypeError, "`fragments` must be an int"),
    (dict(every=4, delay=4), ValueError, r"`delay` \(4\) must be less than `every`"),
    (dict(every=4, delay=-1), ValueError, "`delay` must be an int >= 0"),
    (dict(every=4, mix=1.5), ValueError, r"`mix` must be a float in \[0, 1\]"),
])
def test_bad_arguments_fail_at_construction(kwargs, error, match):
    kwargs = {"sync": jss.dense_sync(), **kwargs}
    with pytest.raises(error, match=match):
        jss.diloco(optax.sgd(0.1), **kwargs)
    with pytest.raises(TypeError, match="`inner` must be an optax.GradientTransformation"):
        jss.diloco(0.1, every=2, sync=jss.dense_sync())


@pytest.mark.parametrize("fragments,match", [
    (4, r"`fragments` \(4\) is more than the parameters' 3 leaves"),
    ([0, 1], "does not cover the parameters: 2 ids for 3 leaves"),
    ({"a": 0, "b": 1}, "does not cover the parameters"),
    ([0, 2, 2], "ids must be 0 .. F-1, each used by at least one leaf"),
])
def test_fragments_that_do_not_cover_the_parameters_fail_at_init(fragments, match):
    tx = jss.diloco(optax.sgd(0.1), every=8, sync=jss.dense_sync(), fragments=fragments)
    with pytest.raises(ValueError, match=match):
        tx.init(unflatten(start()))


def test_fragment_ids_per_leaf_or_as_a_tree():
    build = lambda f: DiLoCoConfig.build(inner=optax.sgd(1.0), outer=None, every=4,  # noqa: E731
                                         sync=jss.dense_sync(), fragments=f, delay=0, mix=0.0)
    params = unflatten(start())
    assert build([1, 0, 1]).groups(params) == ((1,), (0, 2))
    assert build({"a": 1, "b": 0, "c": 1}).groups(params) == ((1,), (0, 2))
    assert build(2).groups(params) == ((0,), (1, 2))  # 12 | 5 + 6 entries


def test_a_sync_that_cannot_take_a_pseudo_gradient_and_missing_params():
    bad = optax.GradientTransformation(lambda p: optax.EmptyState(),
                                       lambda u, s, p=None: ({"x": u[0]}, s))
    tx = jss.diloco(optax.sgd(0.1), every=1, sync=bad)
    params = unflatten(start())
    with pytest.raises(ValueError, match="`sync` cannot take a pseudo-gradient"):
        tx.update(params, tx.init(params), params)
    tx = jss.diloco(optax.sgd(0.1), every=1, sync=jss.dense_sync())
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update(params, tx.init(params))
    state = tx.init(params)
    other = jss.diloco(optax.sgd(0.1), every=2, sync=jss.dense_sync(), fragments=2)
    with pytest.raises(ValueError, match="the state has 1 fragments but `fragments` gives 2"):
        other.update(params, state, params)


def test_an_inner_step_copies_no_state_buffer():
    # XLA copied every buffer an int-indexed lax.switch passed through (the anchor and the
    # outer momentum, each step); the boolean conditionals run in place
    params = {f"l{i}": jnp.zeros((4096,)) for i in range(3)}
    for fragments in (1, 3):
        tx = jss.diloco(optax.adamw(1e-3), every=6, sync=jss.dense_sync(), fragments=fragments)

        def step(p, s, g):
            u, s = tx.update(g, s, p)
            return jss.diloco_apply_updates(p, u, s), s

        text = jax.jit(step, donate_argnums=(0, 1)).lower(
            params, tx.init(params), params).compile().as_text()
        entry = text[text.index("ENTRY"):]
        copies = [line for line in entry.splitlines() if " copy(" in line and "f32[4096]" in line]
        assert copies == [], (fragments, copies)


@pytest.mark.parametrize("every,fragments,delay", [(4, 1, 0), (6, 3, 2), (5, [1, 0, 1], 1)])
def test_inner_update_on_inner_only_steps_is_update_bit_for_bit(every, fragments, delay):
    # a loop that compiles the inner step without the outer step's conditional (and
    # applies it with optax.apply_updates) trains the same bits as tx.update throughout
    tx = jss.diloco(optax.adamw(0.05), every=every, sync=mean_over("ranks"),
                    fragments=fragments, delay=delay)
    t = {name: jnp.stack([unflatten(row)[name] for row in targets(2)]) for name in SHAPES}

    def grads(p, tt, i):
        return jax.tree_util.tree_map(lambda x, y: (x - y) * (1 + i % 3).astype(jnp.float32),
                                      p, tt)

    def full(p, s, tt, i):
        u, s = tx.update(grads(p, tt, i), s, p)
        return jss.diloco_apply_updates(p, u, s), s

    def inner(p, s, tt, i):
        u, s = tx.inner_update(grads(p, tt, i), s, p)
        return optax.apply_updates(p, u), s

    full = jax.jit(jax.vmap(full, in_axes=(0, 0, 0, None), axis_name="ranks"))
    inner = jax.jit(jax.vmap(inner, in_axes=(0, 0, 0, None), axis_name="ranks"))
    start_params = jax.tree_util.tree_map(lambda x: jnp.stack([x] * 2), unflatten(start()))
    a = b = (start_params, jax.vmap(tx.init)(start_params))
    schedule = []
    for i in range(2 * every + 1):
        a = full(*a, t, jnp.int32(i))
        only = tx.inner_only(i)
        schedule.append(only)
        b = (inner if only else full)(*b, t, jnp.int32(i))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), i
        if only:  # no merge on an inner-only step
            assert not np.asarray(a[1].snapped).any(), i
    groups = len(set(fragments)) if isinstance(fragments, list) else fragments
    assert schedule.count(False) >= 2 * groups  # the outer steps (and merges) ran in full


# dense_sync (float32 and bfloat16 wires), topk_sync and chunked_topk_sync run across
# ranks in tests/mpi/test_diloco_mpi.py
@pytest.mark.parametrize("sync", [
    lambda: jss.topk_sync(k=6, selection="threshold_reuse", tau=2),
    lambda: jss.oktopk_sync(k=6),
    lambda: jss.block_sync(block_size=4),
    lambda: jss.shared_support_sync(k=6),
], ids=["threshold_reuse", "oktopk", "block", "shared_support"])
def test_the_other_syncs_take_the_pseudo_gradient(sync):
    # one rank: each sync's step traced inside the outer step's conditional, its state
    # carried across two outer steps, the parameters landing on the anchor
    tx = jss.diloco(optax.sgd(LR), optax.sgd(1.0), every=2, sync=sync())
    params = unflatten(start())

    @jax.jit
    def step(p, s):
        u, s = tx.update(jax.tree_util.tree_map(jnp.ones_like, p), s, p)
        return jss.diloco_apply_updates(p, u, s), s

    state = tx.init(params)
    for _ in range(4):
        params, state = step(params, state)
    assert flatten(params).tobytes() == flatten(state.anchor).tobytes()
    assert np.abs(flatten(state.anchor) - start()).max() > 0  # the outer steps moved it
    assert int(state.count) == 4
