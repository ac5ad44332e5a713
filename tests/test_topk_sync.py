"""topk_sync and dense_sync on one rank: semantics, composition, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_sparse_sync as jss
from compiled_step import n_entry_copies
from reference import ef_topk_sgd_reference, round_to_wire_reference, topk_reference


def test_single_step_semantics():
    params = {"w": jnp.zeros((3, 3)), "b": jnp.zeros(3)}
    grads = {"b": jnp.array([0.5, -4.0, 0.1]), "w": jnp.arange(9.0).reshape(3, 3) - 4.0}
    tx = jss.topk_sync(k=3)
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state)
    flat = np.concatenate([np.asarray(grads["b"]), np.asarray(grads["w"]).ravel()])  # tree order
    _, idx = topk_reference(flat, 3)
    got = np.concatenate([np.asarray(updates["b"]), np.asarray(updates["w"]).ravel()])
    expect = np.zeros_like(flat)
    expect[idx] = flat[idx]
    np.testing.assert_array_equal(got, expect)
    residual = np.asarray(state.residual)  # flat, in tree order ("b", then "w")
    np.testing.assert_array_equal(residual, flat - expect)  # what was not sent is kept


def test_residual_accumulates_until_sent():
    params = {"w": jnp.zeros(4)}
    tx = jss.topk_sync(k=1)
    state = tx.init(params)
    g = {"w": jnp.array([1.0, 0.6, 0.0, 0.0])}
    u1, state = tx.update(g, state)
    u2, state = tx.update(g, state)  # 0.6 + 0.6 = 1.2 beats the fresh 1.0
    np.testing.assert_array_equal(np.asarray(u1["w"]), [1.0, 0, 0, 0])
    np.testing.assert_allclose(np.asarray(u2["w"]), [0, 1.2, 0, 0])
    np.testing.assert_allclose(np.asarray(state.residual), [1.0, 0, 0, 0])


def test_chains_with_adam_and_converges():
    target = jnp.linspace(-1, 1, 50)
    params = {"x": jnp.zeros(50)}
    tx = optax.chain(jss.topk_sync(density=0.1), optax.adam(0.05))
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda p: jnp.sum((p["x"] - target) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(300):
        params, state = step(params, state)
    assert float(jnp.max(jnp.abs(params["x"] - target))) < 0.05


def test_dense_sync_is_identity_on_one_rank():
    tx = jss.dense_sync()
    g = {"a": jnp.arange(5.0), "b": jnp.ones((2, 2), jnp.bfloat16)}
    updates, state = jax.jit(tx.update)(g, tx.init(g))
    np.testing.assert_array_equal(np.asarray(updates["a"]), np.arange(5.0))
    assert updates["b"].dtype == jnp.bfloat16


@pytest.mark.parametrize("kwargs,exc,match", [
    ({}, ValueError, "pass `density=`"),
    ({"density": 0.1, "k": 3}, ValueError, "exactly one of `density` or `k`"),
    ({"density": 0.0}, ValueError, r"`density` must be in \(0, 1\]"),
    ({"density": 1.5}, ValueError, r"`density` must be in \(0, 1\]"),
    ({"k": 0}, ValueError, r"`k` must be in \[1, 10\]"),
    ({"k": 11}, ValueError, r"`k` must be in \[1, 10\]"),
    ({"k": 2, "nan_policy": "ignore"}, ValueError, "`nan_policy`"),
    ({"k": 2, "algorithm": "ring"}, ValueError, "unknown `algorithm` 'ring'"),
    ({"k": 2, "residual_dtype": jnp.int32}, TypeError, "`residual_dtype`"),
    ({"k": 2, "comm": "world"}, TypeError, "`comm` must be an mpi4py communicator"),
    ({"k": 2, "quantize_bits": 4}, ValueError, "needs algorithm='dsar_split_allgather'"),
    ({"k": 2, "algorithm": "dsar_split_allgather", "quantize_bits": 3}, ValueError,
     "`quantize_bits` must be 0"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        tx = jss.topk_sync(**kwargs)
        tx.init({"w": jnp.zeros(10)})


@pytest.mark.parametrize("warmup,match", [
    ([(2, 0.0)], r"density must be in \(0, 1\]"),
    ([(2, 1.5)], r"density must be in \(0, 1\]"),
    ([(-1, 0.5)], r"steps must be an int >= 0"),
    ([(2.5, 0.5)], r"steps must be an int >= 0"),
    ([(2, 0.5, 1)], r"\(steps, density\) pairs"),
    (3, r"\(steps, density\) pairs"),
])
def test_bad_warmup(warmup, match):
    with pytest.raises(ValueError, match=match):
        jss.topk_sync(k=2, warmup=warmup)


def test_warmup_and_grouping_do_not_combine():
    # (the deprecated topk_sync(grouping=...); jss.grouped_topk_sync takes no warmup)
    with pytest.raises(ValueError, match="`warmup` and `grouping` do not combine"), \
            pytest.warns(DeprecationWarning, match="grouped_topk_sync"):
        jss.topk_sync(k=2, warmup=[(3, 1.0)], grouping=[([0], "normal")])


def test_warmup_keeps_each_phases_k():
    rng = np.random.default_rng(0)
    params = {"w": jnp.zeros((20, 10)), "b": jnp.zeros(10)}  # N = 210
    tx = jss.topk_sync(density=0.01, warmup=[(2, 1.0), (0, 0.5), (3, 0.25)])
    state = tx.init(params)
    update = jax.jit(tx.update)
    kept, residual_zero = [], []
    for _ in range(7):
        g = jax.tree_util.tree_map(
            lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), params)
        updates, state = update(g, state)
        kept.append(sum(int(np.count_nonzero(np.asarray(u)))
                        for u in jax.tree_util.tree_leaves(updates)))
        residual_zero.append(not np.any(np.asarray(state.residual)))
    assert kept == [210, 210, 52, 52, 52, 2, 2]  # the 0-step phase is skipped
    assert residual_zero == [True, True, False, False, False, False, False]


@pytest.mark.parametrize("kwargs,match", [
    (dict(warmup=[(2, 0.25)], warmup_wire_dtype=jnp.int8), "`warmup_wire_dtype` must be"),
    (dict(warmup=[(2, 0.25)], warmup_wire_dtype="float64"), "`warmup_wire_dtype` must be"),
    (dict(warmup_wire_dtype=jnp.bfloat16), "`warmup_wire_dtype` sets the wire of the `warmup`"),
    (dict(warmup=[(2, 0.25)], warmup_wire_dtype=jnp.bfloat16, selection="union"),
     "warmup_wire_dtype"),
    (dict(warmup=[(2, 0.25)], warmup_wire_dtype=jnp.bfloat16, quantize_bits=4,
          algorithm="dsar_split_allgather"), "`quantize_bits` do not combine"),
])
def test_bad_warmup_wire_dtype(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jss.topk_sync(k=2, **kwargs)


@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_warmup_wire_dtype_matches_numpy_on_one_rank(wire):
    # dense for 1 step and 25 % for 2 on the 16-bit wire, then k = 3 in float32: against
    # the NumPy reference whose warm-up values are rounded (the rounding kept in the residual)
    rng = np.random.default_rng(3)
    n, k, lr, steps = 40, 3, 0.1, 6
    p0 = rng.standard_normal(n).astype(np.float32)
    target = rng.standard_normal(n).astype(np.float32)
    tx = optax.chain(jss.topk_sync(k=k, algorithm="allgather", warmup=[(1, 1.0), (2, 0.25)],
                                   warmup_wire_dtype=getattr(jnp, wire)), optax.sgd(lr))

    @jax.jit
    def step(params, state, i):
        grads = {"w": (params["w"] - target) * (1 + i % 3).astype(jnp.float32)}
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = {"w": jnp.asarray(p0)}
    state = tx.init(params)
    for i in range(steps):
        params, state = step(params, state, jnp.int32(i))
        ref, ref_res = ef_topk_sgd_reference(
            p0, [lambda x, s: (x - target) * np.float32(1 + s % 3)],
            lambda s: n if s < 1 else (10 if s < 3 else k), lr, i + 1,
            wire_at=lambda s: wire if s < 3 else None, keep_wire_rounding=False)
        np.testing.assert_allclose(np.asarray(params["w"]), ref, rtol=1e-6, atol=1e-6)
        # (atol: the gradients are of parameters within float32 ulps of the reference's)
        np.testing.assert_allclose(np.asarray(state[0].residual), ref_res[0], rtol=1e-6,
                                   atol=4e-6)
        if i == 0:  # the dense step on the wire: its rounding dropped, the residual empty
            assert not np.any(np.asarray(state[0].residual))
        if i == 1:  # the sent entries' residual is exactly zero (what masking reads)
            assert np.count_nonzero(np.asarray(state[0].residual) == 0) == 10


@pytest.mark.parametrize("wire, name", [(1, "bfloat16"), (2, "float16")])
def test_the_wire_rounding_kept_survives_the_compiler(wire, name):
    # XLA's GPU compiler removes a float32 -> 16-bit -> float32 round trip (excess
    # precision allowed by default): the residual then kept none of the wire's rounding
    # (H100, 2026-11-28). The narrowing sits behind an optimization barrier; the values
    # are checked on whatever device runs this (the GPU campaign runs it under cuda)
    from jax_sparse_sync.transforms.topk_sync_state import wire_rounding_lost
    x = np.random.default_rng(7).standard_normal(4096).astype(np.float32)
    x[:3] = [1e-6, 3e-8, 0.0]  # float16's subnormals too
    lost = jax.jit(lambda v: wire_rounding_lost(v, wire))
    expected = x - round_to_wire_reference(x, name)
    assert np.count_nonzero(expected) > 4000
    np.testing.assert_array_equal(np.asarray(lost(jnp.asarray(x))), expected)
    assert "optimization_barrier" in lost.lower(jnp.asarray(x)).as_text()


def test_warmup_wire_dtype_none_keeps_the_old_behaviour():
    # the default (None): the sparse warm-up phases on wire_dtype (rounding kept in the
    # residual), density-1 phases float32: the same bits as before the option
    rng = np.random.default_rng(4)
    g = {"w": jnp.asarray(rng.standard_normal(64).astype(np.float32))}
    x = np.asarray(g["w"])
    rounded = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))
    dense = jss.topk_sync(k=4, wire_dtype=jnp.bfloat16, warmup=[(1, 1.0)])
    u, state = jax.jit(dense.update)(g, dense.init(g))
    assert not np.any(np.asarray(state.residual))  # float32: the dense step sent it all
    np.testing.assert_array_equal(np.asarray(u["w"]), x)
    sparse = jss.topk_sync(k=4, wire_dtype=jnp.bfloat16, warmup=[(1, 0.25)])
    u, state = jax.jit(sparse.update)(g, sparse.init(g))
    _, sent = topk_reference(x, 16)
    np.testing.assert_array_equal(np.asarray(state.residual)[sent], (x - rounded)[sent])
    np.testing.assert_array_equal(np.asarray(u["w"])[sent], rounded[sent])
    # with warmup_wire_dtype: the same values sent, the rounding dropped
    wired = jss.topk_sync(k=4, warmup=[(1, 0.25)], warmup_wire_dtype=jnp.bfloat16)
    u2, state = jax.jit(wired.update)(g, wired.init(g))
    np.testing.assert_array_equal(np.asarray(u2["w"]), np.asarray(u["w"]))
    assert not np.any(np.asarray(state.residual)[sent])
    # and with the own density on a 16-bit wire too: the warm-up drops its rounding,
    # the own density keeps it
    both = jss.topk_sync(k=4, wire_dtype=jnp.bfloat16, warmup=[(1, 0.25)],
                         warmup_wire_dtype=jnp.bfloat16)
    state = both.init(g)
    u3, state = jax.jit(both.update)(g, state)
    np.testing.assert_array_equal(np.asarray(u3["w"]), np.asarray(u["w"]))
    assert not np.any(np.asarray(state.residual)[sent])
    g2 = {"w": jnp.asarray(rng.standard_normal(64).astype(np.float32))}
    acc = np.asarray(state.residual) + np.asarray(g2["w"])
    _, state = jax.jit(both.update)(g2, state)
    _, sent = topk_reference(acc, 4)
    r = np.asarray(jnp.asarray(acc).astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(state.residual)[sent], (acc - r)[sent])


def test_threshold_policy_recomputes_on_each_phase_start():
    rng = np.random.default_rng(1)
    params = {"w": jnp.zeros(4000)}
    tx = jss.topk_sync(k=40, selection="threshold_reuse", tau=100, warmup=[(3, 0.05)])
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(4):
        g = {"w": jnp.asarray(rng.standard_normal(4000).astype(np.float32))}
        acc = np.asarray(state.residual) + np.asarray(g["w"])
        _, state = update(g, state)
    # step 4 is the main phase's first: its threshold is the exact 40th magnitude
    np.testing.assert_allclose(float(state.threshold), np.sort(np.abs(acc))[-40], rtol=1e-6)
    assert int(state.last_local_count) == 40


def test_density_ramp():
    assert jss.density_ramp(0.01, steps_per_stage=10) == ((10, 0.25), (10, 0.0625), (10, 0.015625))
    assert jss.density_ramp(0.3, steps_per_stage=5, dense_steps=7) == ((7, 1.0),)
    assert jss.density_ramp(0.01, steps_per_stage=0) == ()
    assert jss.density_ramp(0.001, steps_per_stage=1, factor=10) == ((1, 0.1), (1, 0.01))
    with pytest.raises(ValueError, match="`factor` must be > 1"):
        jss.density_ramp(0.01, steps_per_stage=1, factor=1)
    with pytest.raises(ValueError, match="`steps_per_stage` must be an int >= 0"):
        jss.density_ramp(0.01, steps_per_stage=-1)


def test_integer_gradient_is_rejected_with_leaf_name():
    tx = jss.topk_sync(k=1)
    state = tx.init({"w": jnp.zeros(3)})
    with pytest.raises(TypeError, match=r"gradient leaf \['w'\] has dtype int32"):
        tx.update({"w": jnp.arange(3)}, state)


def test_mismatched_state_is_rejected():
    tx = jss.topk_sync(k=1)
    state = tx.init({"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match="gradient has 4 entries but the residual has 3"):
        tx.update({"w": jnp.zeros(4)}, state)


def test_bucket_selection_keeps_k_per_bucket_and_padding_is_harmless():
    params = {"w": jnp.zeros(1000)}
    g = {"w": jnp.asarray(np.random.default_rng(0).standard_normal(1000).astype(np.float32))}
    tx = jss.topk_sync(k=3, selection="bucket", bucket=128)
    updates, state = jax.jit(tx.update)(g, tx.init(params))
    u = np.asarray(updates["w"])
    from reference import bucket_topk_reference
    _, idx = bucket_topk_reference(np.asarray(g["w"]), 3, 128)
    expect = np.zeros(1000, np.float32)
    expect[idx[idx >= 0]] = np.asarray(g["w"])[idx[idx >= 0]]
    np.testing.assert_array_equal(u, expect)
    # the last entry (where index -1 would wrap) keeps its residual unless selected
    np.testing.assert_array_equal(np.asarray(state.residual), np.asarray(g["w"]) - expect)
    assert np.count_nonzero(u) == 3 * 8  # 7 full buckets + one of 104 entries


def test_bucket_selection_with_density():
    tx = jss.topk_sync(density=0.01, selection="bucket", bucket=512)
    g = {"w": jnp.arange(2048.0)}
    updates, _ = tx.update(g, tx.init(g))
    assert np.count_nonzero(np.asarray(updates["w"])) == 4 * 5  # round(0.01 * 512) = 5 per bucket


def test_bad_selection():
    with pytest.raises(ValueError, match="`selection` must be one of"):
        jss.topk_sync(k=1, selection="random")
    with pytest.raises(ValueError, match="`tau` must be a positive int"):
        jss.topk_sync(k=1, selection="threshold_reuse", tau=0)


def test_every_selection_is_one_row_of_the_exchange_table(monkeypatch):
    from jax_sparse_sync.transforms import topk_sync as module
    assert module.SELECTIONS == tuple(module.SELECTION_TABLE)
    assert module.SELECTIONS[-3:] == ("bucket", "cyclic", "union")
    # A new selection is one entry: a local choice and an exchange of the common
    # signature. This one sends half the chosen values, through the sparse allreduce.
    def halved(acc, values, indices, args):
        return module.sparse_exchange(acc, values * 0.5, indices, args)
    monkeypatch.setitem(module.SELECTION_TABLE, "halved", module.Selection("exact", halved))
    params = {"w": jnp.zeros(6)}
    g = {"w": jnp.array([0.5, -4.0, 0.1, 3.0, 0.0, 1.0])}
    exact, _ = jss.topk_sync(k=2).update(g, jss.topk_sync(k=2).init(params))
    tx = jss.topk_sync(k=2, selection="halved")
    got, state = tx.update(g, tx.init(params))
    np.testing.assert_array_equal(np.asarray(got["w"]), 0.5 * np.asarray(exact["w"]))
    np.testing.assert_array_equal(np.asarray(state.residual),
                                  np.float32([0.5, 0, 0.1, 0, 0, 1.0]))


@pytest.mark.parametrize("selection", ["threshold_reuse", "gaussian"])
def test_threshold_policies_select_about_k_and_never_drop(selection):
    rng = np.random.default_rng(0)
    params = {"w": jnp.zeros(4000)}
    tx = jss.topk_sync(k=40, selection=selection, tau=5)
    state = tx.init(params)
    step = jax.jit(tx.update)
    counts = []
    for i in range(12):
        g = {"w": jnp.asarray(rng.standard_normal(4000).astype(np.float32))}
        acc = np.asarray(state.residual) + np.asarray(g["w"])
        updates, state = step(g, state)
        u = np.asarray(updates["w"])
        counts.append(int(state.last_local_count))
        kept = u != 0
        # what was sent left the residual, what was not stayed in it: nothing lost
        np.testing.assert_allclose(np.asarray(state.residual)[~kept], acc[~kept], rtol=1e-6)
        assert not np.asarray(state.residual)[kept].any()
        assert np.count_nonzero(u) <= 80  # capacity_factor 2
    assert counts[0] == 40 if selection == "threshold_reuse" else True  # exact first step
    assert 10 <= np.median(counts) <= 80


def test_threshold_reuse_overflow_falls_back_to_exact():
    params = {"w": jnp.zeros(500)}
    tx = jss.topk_sync(k=10, selection="threshold_reuse", tau=100, capacity_factor=1.5)
    state = tx.init(params)._replace(threshold=jnp.float32(1e-9), count=jnp.int32(1))
    g = {"w": jnp.asarray(np.random.default_rng(1).standard_normal(500).astype(np.float32))}
    updates, state = jax.jit(tx.update)(g, state)
    assert int(state.last_local_count) == 10
    _, idx = topk_reference(np.asarray(g["w"]), 10)
    assert set(np.flatnonzero(np.asarray(updates["w"]))) == set(idx.tolist())


@pytest.mark.parametrize("make_tx", [lambda: jss.topk_sync(k=3),
                                     lambda: jss.oktopk_sync(k=3)], ids=["topk", "oktopk"])
def test_state_saved_with_a_tree_residual_still_loads_and_continues_exactly(make_tx):
    # Up to 0.1.0 the residual was a tree shaped like the parameters; such a
    # checkpoint must continue bit for bit (the flat layout is the tree order).
    params = {"b": jnp.zeros(3), "w": jnp.zeros((3, 3))}
    tx = make_tx()
    g1 = {"b": jnp.array([0.5, -4.0, 0.1]), "w": jnp.arange(9.0).reshape(3, 3) - 4.0}
    g2 = {"b": jnp.array([1.5, 0.2, -0.3]), "w": jnp.arange(9.0).reshape(3, 3) * 0.3}
    _, state = tx.update(g1, tx.init(params), params)
    assert state.residual.shape == (12,)
    old = state._replace(residual=jss.unflatten_residual(state.residual, params))
    assert old.residual["w"].shape == (3, 3)
    u_new, s_new = jax.jit(tx.update)(g2, state, params)
    u_old, s_old = jax.jit(tx.update)(g2, old, params)
    for a, b in zip(jax.tree_util.tree_leaves((u_new, s_new)), jax.tree_util.tree_leaves((u_old, s_old))):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert s_old.residual.shape == (12,)  # saved again in the flat layout
    wrong = state._replace(residual={"w": jnp.zeros((2, 2))})
    with pytest.raises(ValueError, match="gradient has 12 entries but the residual has 4"):
        tx.update(g2, wrong, params)


def test_unflatten_residual_rows_and_mismatch():
    params = {"b": jnp.zeros(2), "w": jnp.zeros((2, 3))}
    flat = jnp.arange(16.0).reshape(2, 8)  # two devices' rows
    tree = jss.unflatten_residual(flat, params)
    np.testing.assert_array_equal(np.asarray(tree["w"][1]), np.arange(10.0, 16.0).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(tree["b"][0]), [0.0, 1.0])
    with pytest.raises(ValueError, match="`residual` has 7 entries per row"):
        jss.unflatten_residual(jnp.zeros(7), params)


@pytest.mark.parametrize("make, dense_branches", [
    (lambda: jss.topk_sync(density=0.01, warmup=jss.density_ramp(0.01, steps_per_stage=2)), 0),
    (lambda: jss.topk_sync(density=0.01, warmup=[(2, 1.0), (2, 0.1)], flush_every=5), 2),
    (lambda: jss.adam_direction_sync(jss.topk_sync(
        density=0.01, warmup=jss.density_ramp(0.01, steps_per_stage=2)),
        momentum_masking="restart"), 0),
    (lambda: jss.oktopk_sync(density=0.01, warmup=[(2, 1.0), (2, 0.1)], flush_every=5), 2),
    (lambda: jss.adam_direction_sync(jss.topk_sync(
        density=0.01, warmup=jss.density_ramp(0.01, steps_per_stage=2),
        warmup_wire_dtype=jnp.bfloat16), momentum_masking="restart"), 0),
    (lambda: jss.topk_sync(density=0.01, warmup=[(2, 1.0), (2, 0.1)], flush_every=5,
                           warmup_wire_dtype=jnp.bfloat16), 2),
], ids=["topk_ramp", "topk_dense_flush", "adam_direction_ramp", "oktopk_dense_flush",
        "adam_direction_ramp_bf16_warmup", "topk_dense_flush_bf16_warmup"])
def test_warmup_phases_copy_no_n_entry_buffer(make, dense_branches):
    # The accumulate pass and the residual update run outside the phases' switch: an
    # in-place write inside a branch made XLA copy every N-entry buffer it wrote (4 a
    # step with the Adam-direction producer: its moments, age and the residual, in every
    # branch). What is left: a dense branch (a dense warm-up phase, the flush) sums the
    # accumulator in a buffer of its own, one copy run on its dense steps only.
    n = 5003
    params = {"w": jnp.zeros((n - 3,)), "b": jnp.zeros((3,))}
    assert n_entry_copies(make(), params, n=n) == dense_branches


def test_16bit_wires_keep_momentum_masking_as_in_float32():
    # momentum masking reads a zero residual as "sent": under masking a 16-bit wire's
    # rounding is dropped, not kept, so the sent entries' residual is exactly zero;
    # with gradients that do not depend on the parameters the Adam state (mu, nu,
    # age) and the residual are then the float32 run's bit for bit (only the updates
    # differ: 16-bit sums), for warmup_wire_dtype and for wire_dtype alike
    rng = np.random.default_rng(6)
    grads = [{"w": jnp.asarray(rng.standard_normal(200).astype(np.float32))} for _ in range(6)]

    def run(**kw):
        tx = jss.adam_direction_sync(jss.topk_sync(k=4, warmup=[(4, 0.1)], **kw),
                                     momentum_masking="restart")
        state = tx.init(grads[0])
        update = jax.jit(tx.update)
        outs = []
        for g in grads:
            u, state = update(g, state)
            outs.append(np.asarray(u["w"]))
        return state, outs

    base, u_base = run()
    age = np.asarray(base.moments()[1])  # the pending masks applied
    assert np.count_nonzero(age == 0) > 0  # masks fired
    for kw in ({"warmup_wire_dtype": jnp.bfloat16}, {"wire_dtype": jnp.bfloat16},
               {"wire_dtype": jnp.float16}):
        wired, u_wired = run(**kw)
        for field in ("mu", "nu", "age"):
            np.testing.assert_array_equal(np.asarray(getattr(wired, field)),
                                          np.asarray(getattr(base, field)), err_msg=str(kw))
        np.testing.assert_array_equal(np.asarray(wired.sync.residual),
                                      np.asarray(base.sync.residual), err_msg=str(kw))
        assert not np.array_equal(u_wired[1], u_base[1]), kw  # the sums were 16-bit
        np.testing.assert_allclose(u_wired[1], u_base[1], rtol=2**-7, atol=0)


@pytest.mark.parametrize("make", [lambda **kw: jss.topk_sync(k=6, **kw),
                                  lambda **kw: jss.oktopk_sync(k=6, **kw)],
                         ids=["topk_sync", "oktopk_sync"])
def test_a_source_that_reads_zero_as_sent_gets_no_wire_rounding(make):
    # the syncs' contract with AccumulatorSource.exact_sent (adam_direction_sync's
    # momentum masking sets it): a 16-bit wire's rounding of the sent values is kept
    # in the residual (v - round(v), error feedback), except for such a source, whose
    # sent entries' residual is exactly zero; the entries not sent are the same
    from jax_sparse_sync.transforms.accumulator_source import gradient_source

    g = {"w": jnp.asarray(np.random.default_rng(7).standard_normal(300).astype(np.float32))}

    def residual_after(exact_sent, **kw):
        tx = make(**kw)
        source = gradient_source(jnp.float32)._replace(exact_sent=exact_sent)
        _, state, _ = jax.jit(lambda grads, st: tx.update_from(source, grads, st))(
            g, tx.init(g))
        return np.asarray(state.residual)

    def scatter_adds(exact_sent, **kw):
        tx = make(wire_dtype=jnp.bfloat16, **kw)
        source = gradient_source(jnp.float32)._replace(exact_sent=exact_sent)
        return str(jax.make_jaxpr(lambda grads, st: tx.update_from(source, grads, st))(
            g, tx.init(g))).count("scatter-add")

    # the rounding is added into the residual by one scatter-add, only where it is
    # kept: under exact_sent no step scatter-adds (zeros) into the residual, with
    # or without the warm-up's switch
    for kw in ({}, {"warmup": [(2, 0.1)]}):
        assert scatter_adds(False, **kw) == 1, kw
        assert scatter_adds(True, **kw) == 0, kw

    f32 = residual_after(False)
    sent = f32 == 0
    assert 1 <= np.count_nonzero(sent) <= 12
    kept = residual_after(False, wire_dtype=jnp.bfloat16)
    assert np.all(kept[sent] != 0)  # the rounding of each sent value kept
    np.testing.assert_array_equal(kept[~sent], f32[~sent])
    np.testing.assert_array_equal(residual_after(True, wire_dtype=jnp.bfloat16), f32)


def test_oktopk_sync_errors_name_oktopk_sync():
    """A k out of range names the transform the user called (it used to say topk_sync)."""
    tx = jss.oktopk_sync(k=10)
    with pytest.raises(ValueError, match=r"^jax_sparse_sync\.oktopk_sync: `k` must be in \[1, 4\]"):
        tx.init({"w": jnp.zeros(4)})
