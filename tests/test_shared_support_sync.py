"""shared_support_sync in one process: argument errors name the argument and the fix,
and the steps match the NumPy reference (tests/mpi has the multi-rank runs)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compiled_step import n_entry_copies
from reference import ef_shared_support_sgd_reference

import jax_sparse_sync as jss
from jax_sparse_sync.transforms import shared_support_sync as shared_support


@pytest.mark.parametrize("kwargs,error,match", [
    ({}, ValueError, r"shared_support_sync: pass `density=`"),
    ({"density": 0.1, "k": 3}, ValueError, "exactly one of `density` or `k`"),
    ({"density": 0.0}, ValueError, r"shared_support_sync: `density` must be in \(0, 1\]"),
    ({"density": 1.5}, ValueError, r"`density` must be in \(0, 1\]"),
    ({"k": 0}, ValueError, r"shared_support_sync: `k` must be in \[1, N\]"),
    ({"k": 2.0}, TypeError, "`k` must be an int"),
    ({"k": 2, "refresh_every": 0}, ValueError, "`refresh_every` must be an int >= 1"),
    ({"k": 2, "refresh_every": 2.5}, ValueError, "`refresh_every` must be an int >= 1"),
    ({"k": 2, "refresh_every": True}, ValueError, "`refresh_every` must be an int >= 1"),
    ({"k": 2, "nan_policy": "ignore"}, ValueError, "nan_policy"),
    ({"k": 2, "residual_dtype": jnp.int32}, TypeError, "`residual_dtype` must be a float"),
    ({"k": 2, "algorithm": "nope"}, ValueError, "nope"),
    ({"k": 2, "random_fraction": -0.1}, ValueError, r"`random_fraction` must be a number in \[0, 1\]"),
    ({"k": 2, "random_fraction": 1.5}, ValueError, r"`random_fraction` must be a number in \[0, 1\]"),
    ({"k": 2, "random_fraction": float("nan")}, ValueError, "`random_fraction` must be"),
    ({"k": 2, "random_fraction": True}, ValueError, "`random_fraction` must be"),
    ({"k": 2, "random_fraction": "0.5"}, ValueError, "`random_fraction` must be"),
    ({"k": 2, "random_fraction": 0.5, "refresh_every": 1}, ValueError,
     "refresh_every=1 has none.*refresh_every >= 2, or random_fraction=0"),
    ({"k": 2, "seed": 1.5}, TypeError, "`seed` must be an int"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        jss.shared_support_sync(**kwargs)


def test_k_above_the_parameter_count_and_integer_leaves_fail_at_init():
    with pytest.raises(ValueError, match=r"shared_support_sync: `k` must be in \[1, 4\]"):
        jss.shared_support_sync(k=5).init({"w": jnp.zeros(4)})
    with pytest.raises(TypeError, match=r"shared_support_sync: parameter leaf \['n'\]"):
        jss.shared_support_sync(k=1).init({"w": jnp.zeros(4), "n": jnp.zeros(2, jnp.int32)})


def test_a_state_for_another_k_is_refused():
    state = jss.shared_support_sync(k=2).init({"w": jnp.zeros(6)})
    with pytest.raises(ValueError, match="support holds"):
        jss.shared_support_sync(k=3).update({"w": jnp.ones(6)}, state)


def drawn_offsets(seed):
    """The draws of shared_support_sync(random_fraction=..., seed=seed) as the NumPy
    reference takes them: (step, m, r) -> offsets into the m coordinates off the support."""
    return lambda step, m, r: np.asarray(shared_support.random_offsets(seed, jnp.int32(step),
                                                                       m, r))


@pytest.mark.parametrize("random_fraction", [0.0, 0.5, 1.0])
def test_one_rank_matches_numpy(random_fraction, residual_dtype=jnp.float32):
    # one rank: the sum is this rank's own selection; the support is still chosen
    # on the refresh steps and used (with the draws) on the others
    rng = np.random.default_rng(3)
    size, k, lr, steps, refresh = 40, 4, 0.1, 9, 4
    target = rng.standard_normal(size).astype(np.float32)
    tx = optax.chain(jss.shared_support_sync(k=k, refresh_every=refresh,
                                             random_fraction=random_fraction, seed=5,
                                             residual_dtype=residual_dtype), optax.sgd(lr))
    w = jnp.zeros(size)
    state = tx.init(w)

    @jax.jit
    def step(w, state, i):
        updates, state = tx.update((w - target) * (1 + i % 3).astype(jnp.float32), state, w)
        return optax.apply_updates(w, updates), state

    for i in range(steps):
        w, state = step(w, state, jnp.int32(i))
    ref_w, ref_res, ref_support = ef_shared_support_sgd_reference(
        np.zeros(size, np.float32), [lambda p, s: (p - target) * np.float32(1 + s % 3)], k, lr,
        steps, refresh, random_fraction, drawn_offsets(5))
    np.testing.assert_allclose(np.asarray(w), ref_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state[0].residual), ref_res[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(state[0].support), ref_support)


def test_bfloat16_residual_sends_the_support_and_empties_it():
    # bfloat16 rounding may pick another support than a float32 reference would:
    # checked here by what a shared step must do whatever the support is
    tx = jss.shared_support_sync(k=3, refresh_every=2, residual_dtype=jnp.bfloat16)
    update = jax.jit(tx.update)
    grads = {"w": jnp.linspace(-1.0, 2.0, 20)}
    _, state = update(grads, tx.init(grads))
    support = np.asarray(state.support)
    np.testing.assert_array_equal(support, [17, 18, 19])  # the largest magnitudes
    acc = np.asarray(state.residual, np.float32) + np.asarray(grads["w"], np.float32)
    updates, state = update(grads, state)
    assert state.residual.dtype == jnp.bfloat16
    u = np.asarray(updates["w"])
    assert np.flatnonzero(u).tolist() == support.tolist()
    np.testing.assert_allclose(u[support], acc[support], rtol=1e-2)
    assert not np.asarray(state.residual, np.float32)[support].any()


def sparse_sums():
    """Sums a sparse allreduce can return (at most 3 k nonzeros): ties across the k-th
    magnitude, fewer than k nonzeros (then zeros by lowest index, -0.0 among them),
    NaN and inf, subnormals, all zero."""
    rng = np.random.default_rng(7)
    n, k = 50, 6
    cases = []
    for nnz in (0, 1, 3, 5, 6, 7, 12, 18):
        x = np.zeros(n, np.float32)
        at = rng.choice(n, nnz, replace=False)
        x[at] = rng.choice([-2.0, -1.0, 1.0, 2.0, 3.0], nnz)  # many ties
        cases.append(x)
    x = np.zeros(n, np.float32)
    x[[0, 2, 3]] = [-0.0, 1.0, -0.0]  # two -0.0 among the zeros, fewer than k nonzeros
    x[[40, 45]] = [np.float32(1e-45), -np.float32(1e-44)]  # subnormals are nonzeros
    cases.append(x)
    x = np.zeros(n, np.float32)
    x[[5, 9, 30, 31, 33, 44, 48]] = [np.nan, 1.0, np.inf, -1.0, 1.0, -np.inf, 1.0]
    cases.append(x)
    return n, k, cases


def test_support_of_sum_is_the_top_k_over_all_n_entries():
    # the refresh step's support from the sum's nonzeros is jss.topk(sum, k)'s choice
    n, k, cases = sparse_sums()
    support_of_sum = jax.jit(shared_support.support_of_sum, static_argnums=(1, 2))
    for x in cases:
        expect = np.asarray(jss.topk(jnp.asarray(x), k)[1])
        assert np.all(np.diff(expect) > 0)
        for nonzeros in (2 * k, 3 * k, n):  # n: the radix select over the whole sum
            got = np.asarray(support_of_sum(jnp.asarray(x), k, nonzeros))
            np.testing.assert_array_equal(got, expect, err_msg=str(x))
        # more nonzeros than the bound: selected from the whole sum, the same choice
        np.testing.assert_array_equal(np.asarray(support_of_sum(jnp.asarray(x), k, k)), expect)
    assert support_of_sum(jnp.ones(4), 0, 2).shape == (0,)


def test_the_refresh_step_keeps_the_hint_and_chooses_the_top_k_of_the_sum():
    # a sum with ties across the k-th magnitude and one with fewer than k nonzeros: the
    # support after the refresh step is jss.topk(sum, k)'s
    n, k, cases = sparse_sums()
    tx = jss.shared_support_sync(k=k, refresh_every=3)
    update = jax.jit(tx.update)
    for x in cases:
        # (XLA's CPU runtime flushes subnormal sums to zero: compared in the test above)
        if not np.isfinite(x).all() or (np.abs(x[x != 0]) < np.finfo(np.float32).tiny).any():
            continue
        _, state = update({"w": jnp.asarray(x)}, tx.init({"w": jnp.zeros(n)}))
        sent = np.zeros(n, np.float32)  # one rank: the sum is its own top-k
        top = np.asarray(jss.topk(jnp.asarray(x), k)[1])
        sent[top] = x[top]
        np.testing.assert_array_equal(np.asarray(state.support),
                                      np.asarray(jss.topk(jnp.asarray(sent), k)[1]))
        # the hint: this step's k-th magnitude, as topk_sync keeps it; a shared step
        # (no selection) keeps it for the next refresh
        assert float(state.threshold) == np.sort(np.abs(x))[-k]
        _, after = update({"w": jnp.asarray(x)}, state)
        assert float(after.threshold) == float(state.threshold)


def test_random_offsets_one_per_stratum_shared_by_seed_and_step():
    m, r = 1000, 7
    bounds = np.arange(r + 1) * m // r
    draws = {}
    for seed in (0, 1):
        for step in range(20):
            o = np.asarray(jax.jit(shared_support.random_offsets, static_argnums=(0, 2, 3))(
                seed, jnp.int32(step), m, r))
            assert o.dtype == np.int32 and o.shape == (r,)
            assert np.all((bounds[:-1] <= o) & (o < bounds[1:]))  # one in each stratum
            draws[seed, step] = o.tobytes()
    assert len(set(draws.values())) == len(draws)  # every (seed, step) draws anew
    # the same draw for the same (seed, step), traced or not
    again = np.asarray(shared_support.random_offsets(1, jnp.int32(3), m, r)).tobytes()
    assert again == draws[1, 3]
    # every offset can come up: r = m
    assert np.asarray(shared_support.random_offsets(0, jnp.int32(0), 5, 5)).tolist() == \
        [0, 1, 2, 3, 4]


def test_nth_outside_is_setdiff():
    rng = np.random.default_rng(11)
    for n, s in [(30, 0), (30, 5), (30, 29), (200, 40)]:
        support = np.sort(rng.choice(n, s, replace=False)).astype(np.int32)
        off = np.setdiff1d(np.arange(n), support)
        u = np.arange(off.size, dtype=np.int32)
        got = np.asarray(shared_support.nth_outside(jnp.asarray(support), jnp.asarray(u)))
        np.testing.assert_array_equal(got, off)


def test_random_fraction_moves_the_support_on_shared_steps():
    # the update of a shared step lands on the support and on round(f k) other
    # coordinates, which change from step to step; the support itself holds k - round(f k)
    n, k = 64, 8
    tx = jss.shared_support_sync(k=k, refresh_every=8, random_fraction=0.25, seed=3)
    update = jax.jit(tx.update)
    grads = {"w": jnp.linspace(1.0, 2.0, n)}
    _, state = update(grads, tx.init(grads))
    support = np.asarray(state.support)
    assert support.tolist() == list(range(n - 6, n))  # the 6 largest of the sum
    landed = []
    for _ in range(4):
        u, state = update(grads, state)
        at = set(np.flatnonzero(np.asarray(u["w"])).tolist())
        assert len(at) == k and set(support.tolist()) <= at
        landed.append(at - set(support.tolist()))
    assert len({tuple(sorted(x)) for x in landed}) == 4
    assert np.asarray(state.support).tolist() == support.tolist()


@pytest.mark.parametrize("kwargs", [{}, {"random_fraction": 0.25},
                                    {"refresh_every": 1}],
                         ids=["fixed_support", "random_fraction", "every_step_refreshes"])
def test_the_donated_step_copies_no_n_entry_buffer(kwargs):
    # Every step accumulates in place outside the cond that picks the exchange, and the
    # refresh branch only reads the accumulator (its local top-k from a list): the
    # accumulate pass inside a cond (the fused accumulate-and-select on refresh steps,
    # the plain one on shared steps) made XLA copy the residual once a step
    n = 5003
    params = {"w": jnp.zeros((n - 3,)), "b": jnp.zeros((3,))}
    tx = jss.shared_support_sync(density=0.01, **{"refresh_every": 2, **kwargs})
    assert n_entry_copies(tx, params, n=n) == 0
