"""The fused Adam-direction pass (CPU FFI kernel) against its jax.numpy twin and
against masking applied right after the sync, on every masking mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse_sync.bindings import adam as adam_kernels
from jax_sparse_sync.transforms import adam_pass

from adam_cases import B1, B2, EPS, state  # noqa: F401
from adam_cases import grads_tree_and_flat as grads_tree


def run(fn, grads, mu, nu, age, residual, count, masking, scale=None):
    @jax.jit
    def f(mu, nu, age, residual):
        return fn(grads, mu, nu, age, None if residual is None else residual, jnp.int32(count),
                  b1=B1, b2=B2, eps=EPS, masking=masking, scale=scale)
    return [np.asarray(x) for x in f(mu, nu, age, residual)]


def jnp_twin(grads, mu, nu, age, residual, count, scale=None, **kw):
    leaves = [jnp.ravel(x) for x in jax.tree_util.tree_leaves(grads)]
    t = jnp.float32(count)
    if kw["masking"] == "off":
        residual = None
    return adam_kernels.adam_direction_twin(leaves, mu, nu, age, residual,
                                            1.0 - jnp.float32(B2) ** t, 1.0 - jnp.float32(B1) ** t,
                                            jnp.float32(1.0 if scale is None else scale), **kw)


@pytest.mark.parametrize("masking", ["restart", "zero", "off"])
@pytest.mark.parametrize("n", [1000, 600_001])  # one thread; two chunks (> 2 * 256K)
@pytest.mark.parametrize("with_residual", [True, False])
def test_kernel_matches_the_jnp_pass(masking, n, with_residual, monkeypatch):
    monkeypatch.setenv("JSS_NUM_THREADS", "3")
    mu, nu, age, residual = state(n, 1)
    if not with_residual:
        residual = None
        age = np.abs(age)
    grads, _ = grads_tree(n, 2)
    ours = run(adam_pass.adam_direction_pass, grads, mu, nu, age, residual, 5, masking)
    twin = run(jnp_twin, grads, mu, nu, age, residual, 5, masking)
    for name, a, b in zip(("mu", "nu", "age", "direction"), ours, twin):
        # XLA may fuse b1 * mu + (1 - b1) * g into an FMA: an ulp of the larger term
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7, err_msg=name)
    # the stored age is negative exactly where the residual held something
    if residual is not None and masking != "off":
        np.testing.assert_array_equal(ours[2] < 0, residual != 0)
    else:
        assert (ours[2] >= 1).all()


@pytest.mark.parametrize("fn", [adam_pass.adam_direction_pass, jnp_twin])
def test_scale_multiplies_the_direction_only(fn):
    # a learning rate before the sync: the direction times it, bit for bit; the state
    # is that of the unscaled step
    n, rate = 70_001, 3e-4
    mu, nu, age, residual = state(n, 5)
    grads, _ = grads_tree(n, 6)
    plain = run(fn, grads, mu, nu, age, residual, 9, "restart")
    scaled = run(fn, grads, mu, nu, age, residual, 9, "restart", scale=jnp.float32(rate))
    for a, b in zip(plain[:3], scaled[:3]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(scaled[3], np.float32(rate) * plain[3])


def test_lazy_masking_is_masking_right_after_the_sync():
    # a NumPy step with the mask applied eagerly at the end of the previous step
    n = 5000
    mu, nu, age, residual = state(n, 3)
    grads, g = grads_tree(n, 4)
    sent = (age < 0) & (residual == 0)
    m = np.where(sent, 0, mu)
    # int16 ages saturate at 32767
    a = (np.minimum(np.where(sent, 0, np.abs(age.astype(np.int32))), 32766) + 1).astype(np.float32)
    m = np.float32(B1) * m + np.float32(1 - B1) * g
    v = np.float32(B2) * nu + np.float32(1 - B2) * g * g
    t = 7
    d = (m / (1 - np.float32(B1) ** a)) / (np.sqrt(v / (1 - np.float32(B2) ** t)) + EPS)
    ours = run(adam_pass.adam_direction_pass, grads, mu, nu, age, residual, t, "restart")
    np.testing.assert_allclose(ours[0], m, rtol=1e-6)
    np.testing.assert_allclose(ours[1], v, rtol=1e-6)
    np.testing.assert_array_equal(np.abs(ours[2]), a)
    np.testing.assert_allclose(ours[3], d, rtol=1e-5)


def test_bias1_table_reaches_one():
    for b1 in (0.0, 0.5, 0.9, 0.99):
        table = np.asarray(adam_pass.bias1_table(b1))
        assert table[-1] == 1.0 and (table <= 1).all()  # past it the kernel uses 1.0
        assert table[0] == 1 - np.float32(b1)  # float32 arithmetic, as in the step


def noise_state(n, seed):
    """mean_moment_pass's noise state (diff_sq >= 0, last, before_last) of n random entries."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(x) for x in (np.abs(rng.standard_normal(n)).astype(np.float32),
                                          rng.standard_normal(n).astype(np.float32),
                                          rng.standard_normal(n).astype(np.float32)))


def mean_twin(grads, mu, nu, noise, age, residual, count, *, nranks, scale=None, **kw):
    # mean_moment_pass with the jax.numpy arithmetic forced (the CPU runs the kernel)
    real = jax.lax.platform_dependent
    try:
        jax.lax.platform_dependent = lambda *a, default, **kernels: default(*a)
        return adam_pass.mean_moment_pass(grads, mu, nu, noise, age, residual, count,
                                          nranks=nranks, scale=scale, **kw)
    finally:
        jax.lax.platform_dependent = real


# every masking before the second difference exists (2), at its first step (3), after
# (9); and across the thread chunks (> 2 * 256K entries)
@pytest.mark.parametrize("masking,n,count", [
    *((m, 1000, c) for m in ("restart", "zero", "off") for c in (2, 3, 9)),
    ("restart", 600_001, 9)])
def test_mean_moment_kernel_matches_the_jnp_pass(masking, n, count, monkeypatch):
    monkeypatch.setenv("JSS_NUM_THREADS", "3")
    mu, nu, age, residual = state(n, 11)
    noise = noise_state(n, 12)
    grads, g = grads_tree(n, 13)
    outs = []
    for fn in (adam_pass.mean_moment_pass, mean_twin):
        f = jax.jit(lambda mu, nu, noise, age, residual, fn=fn: fn(
            grads, mu, nu, noise, age, residual, jnp.int32(count), b1=B1, b2=B2, eps=EPS,
            masking=masking, scale=jnp.float32(0.5), nranks=8))
        mu2, nu2, noise2, age2, d = f(mu, nu, noise, age, residual)
        outs.append([np.asarray(x) for x in (mu2, nu2, *noise2, age2, d)])
    names = ("mu", "nu", "diff_sq", "last", "before_last", "age", "direction")
    for name, a, b in zip(names, *outs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=name)
    np.testing.assert_array_equal(outs[0][3], g)  # the gradient, kept for the next step
    np.testing.assert_array_equal(outs[0][4], np.asarray(noise[1]))  # and the last one
    if count <= 2:  # no second difference yet: the estimate is unchanged, no correction
        np.testing.assert_array_equal(outs[0][2], np.asarray(noise[0]))


@pytest.mark.parametrize("fn", [adam_pass.mean_moment_pass, mean_twin])
def test_mean_moment_warmup_ramps_the_correction_in(fn):
    # W = 3 at step 3: the full correction (as without a warm-up); W huge: none yet, the
    # rank's own Adam direction; W = 6 at step 3: in between
    n = 5000
    mu, nu, age, residual = state(n, 21)
    noise = noise_state(n, 22)
    grads, _ = grads_tree(n, 23)

    def direction(warmup):
        return np.asarray(jax.jit(lambda: fn(
            grads, mu, nu, noise, age, residual, jnp.int32(3), b1=B1, b2=B2, eps=EPS,
            masking="restart", nranks=8, warmup=warmup))()[4])
    full, none, half = direction(0), direction(10**9), direction(6)
    np.testing.assert_array_equal(direction(3), full)
    plain = run(adam_pass.adam_direction_pass, grads, mu, nu, age, residual, 3, "restart")[3]
    np.testing.assert_allclose(none, plain, rtol=1e-5, atol=1e-7)
    moved = np.abs(full) > np.abs(plain) * 1.01  # where the correction enlarges the step
    assert moved.mean() > 0.2
    assert (np.abs(half[moved]) > np.abs(plain[moved])).all()
    assert (np.abs(half[moved]) < np.abs(full[moved])).all()


@pytest.mark.parametrize("masking", ["restart", "zero", "off"])
def test_mean_moment_with_one_rank_is_adam(masking):
    # P = 1: the mean gradient is the rank's own, so v = nu_hat and the direction,
    # moments and ages are the plain pass's (the noise buffer only grows)
    n = 1000
    mu, nu, age, residual = state(n, 3)
    grads, _ = grads_tree(n, 4)
    want = run(jnp_twin, grads, mu, nu, age, residual, 5, masking)
    got = adam_pass.mean_moment_pass(grads, mu, nu,
                                     (jnp.zeros(n), jnp.ones(n), jnp.full(n, 0.5)), age,
                                     residual, jnp.int32(5), b1=B1, b2=B2, eps=EPS,
                                     masking=masking, nranks=1)
    for w, g in zip(want, [got[0], got[1], got[3], got[4]]):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-7)
    diff_sq, last, before = (np.asarray(x) for x in got[2])
    np.testing.assert_array_equal(last, grads_tree(n, 4)[1])  # the gradient, kept for the next
    np.testing.assert_array_equal(before, np.ones(n))  # and the one before it
    # the second difference g - 2 * 1 + 0.5
    np.testing.assert_allclose(diff_sq, (1 - B2) * (last - 1.5) ** 2, rtol=1e-5, atol=1e-9)


def test_mean_moment_noise_estimate_ignores_linear_drift():
    # g_t = drift * t + noise (sigma = 1): the second difference's second moment / 6 is
    # sigma^2 whatever the drift; the first difference's / 2 would be 1 + drift^2 / 2
    n, steps, b2, drift = 20000, 60, 0.9, 1.0
    rng = np.random.default_rng(3)
    zero = jnp.zeros(n)
    mu = nu = age = zero
    noise = (zero, zero, zero)
    for t in range(1, steps + 1):
        g = drift * t + rng.standard_normal(n).astype(np.float32)
        mu, nu, noise, age, _ = adam_pass.mean_moment_pass(
            {"g": jnp.asarray(g)}, mu, nu, noise, age, None, jnp.int32(t), b1=B1, b2=b2,
            eps=EPS, masking="off", nranks=8)
    sigma2 = np.asarray(noise[0]) / (6.0 * (1.0 - b2 ** (steps - 2)))
    assert abs(float(np.mean(sigma2)) - 1.0) < 0.05, float(np.mean(sigma2))


def test_mean_moment_averages_to_dense_adams_direction():
    # P ranks, gradient = mean + noise (one rank's noise sigma), the noise dominating:
    # dense Adam on the mean gradient steps by ~sqrt(P) mean/sigma; averaging the ranks'
    # own Adam directions gives ~mean/sigma (sqrt(P) too small), the estimated mean
    # second moment gives dense Adam's again
    P, n, steps, b2 = 8, 4000, 400, 0.99
    rng = np.random.default_rng(0)
    mean = np.float32(0.05)

    def run_ranks(second_moment):
        g = mean + rng.standard_normal((steps, P, n)).astype(np.float32)

        def rank_step(g, mu, nu, noise, age, t):
            if second_moment == "mean":
                return adam_pass.mean_moment_pass({"g": g}, mu, nu, noise, age, None, t, b1=B1,
                                                  b2=b2, eps=EPS, masking="off", nranks=P)
            mu, nu, age, d = adam_kernels.adam_direction_twin(
                [g], mu, nu, age, None, 1.0 - jnp.float32(b2) ** t.astype(jnp.float32),
                1.0 - jnp.float32(B1) ** t.astype(jnp.float32), jnp.float32(1.0), b1=B1, b2=b2,
                eps=EPS, masking="off")
            return mu, nu, noise, age, d

        def step(carry, xs):  # every rank's pass (vmap), one step; scan: compiled once
            mu, nu, noise, age = carry
            g_t, t = xs
            mu, nu, noise, age, d = jax.vmap(rank_step, in_axes=(0, 0, 0, 0, 0, None))(
                g_t, mu, nu, noise, age, t)
            return (mu, nu, noise, age), d

        zero = jnp.zeros((P, n), jnp.float32)
        carry = (zero, zero, (zero, zero, zero), jnp.zeros((P, n), adam_pass.AGE_DTYPE))
        _, dirs = jax.jit(lambda c, g: jax.lax.scan(
            step, c, (g, jnp.arange(1, steps + 1, dtype=jnp.int32))))(carry, jnp.asarray(g))
        dense_mu = dense_nu = np.zeros(n, np.float32)
        for gm in g.mean(axis=1):
            dense_mu = B1 * dense_mu + (1 - B1) * gm
            dense_nu = b2 * dense_nu + (1 - b2) * gm * gm
        dense = (dense_mu / (1 - B1 ** steps)) / (np.sqrt(dense_nu / (1 - b2 ** steps)) + EPS)
        return float(np.asarray(dirs[-1]).mean()), float(np.mean(dense))

    got_rank, dense = run_ranks("rank")
    got_mean, dense2 = run_ranks("mean")
    assert 0.8 < got_mean / dense2 < 1.25, (got_mean, dense2)
    assert got_rank / dense < 0.55, (got_rank, dense)   # ~1/sqrt(8) = 0.35


def test_ages_are_int16_and_saturate_at_max_age(monkeypatch):
    # the kernel and its twin keep a saturated age at MAX_AGE (its correction 1.0,
    # b1 = 0.9) and bring MAX_AGE - 1 to it; the sign still marks a held entry
    monkeypatch.setenv("JSS_NUM_THREADS", "2")
    n = 4000
    mu, nu, age, residual = state(n, 31)
    grads, _ = grads_tree(n, 32)
    for fn in (adam_pass.adam_direction_pass, jnp_twin):
        out = run(fn, grads, mu, nu, age, residual, 5, "restart")
        assert out[2].dtype == np.int16
        sent = (age < 0) & (residual == 0)
        high = ~sent & (np.abs(age.astype(np.int32)) >= 32766)
        assert high.sum() > 100
        assert (np.abs(out[2][high].astype(np.int32)) == adam_pass.MAX_AGE).all()
        np.testing.assert_array_equal(out[2][high] < 0, residual[high] != 0)


def test_restart_refuses_a_b1_whose_correction_outlives_int16_ages():
    import jax_sparse_sync as jss
    with pytest.raises(ValueError, match=r"`b1` = 0.9996 .*momentum_masking='zero'"):
        jss.adam_direction_sync(jss.topk_sync(k=1), b1=0.9996)
    jss.adam_direction_sync(jss.topk_sync(k=1), b1=0.9994)  # below MAX_RESTART_B1
    jss.adam_direction_sync(jss.topk_sync(k=1), b1=0.9996, momentum_masking="zero")
    # every b1 accepted has a table (float32, as the step computes it) that reaches 1.0
    # within MAX_AGE entries, so a saturated age reads what its true age would
    for b1 in (0.9, 0.999, 0.9994, adam_pass.MAX_RESTART_B1 * (1 - 1e-12)):
        table = np.asarray(adam_pass.bias1_table(b1))
        assert table[-1] == 1.0 and len(table) <= adam_pass.MAX_AGE, (b1, len(table))
    with pytest.raises(ValueError, match="too close to 1"):
        jss.adam_direction_sync(jss.topk_sync(k=1), b1=adam_pass.MAX_RESTART_B1)


def test_a_state_with_float32_ages_continues_as_the_int16_state():
    # a checkpoint from before the int16 ages: its float32 ages are converted at the
    # next step, which then equals the int16 state's step bit for bit
    import jax_sparse_sync as jss
    rng = np.random.default_rng(41)
    params = {"a": jnp.zeros((300,)), "b": jnp.zeros((7, 11))}
    tx = jss.adam_direction_sync(jss.topk_sync(k=20))
    state = tx.init(params)
    assert state.age.dtype == jnp.int16 and state.age.shape == (377,)
    step = jax.jit(tx.update)
    grads = [jax.tree_util.tree_map(lambda p: jnp.asarray(
        rng.standard_normal(p.shape).astype(np.float32)), params) for _ in range(4)]
    for g in grads[:3]:
        _, state = step(g, state)
    assert (np.asarray(state.age) < 0).any()  # held entries: negative ages
    legacy = state._replace(age=state.age.astype(jnp.float32))
    want, want_state = step(grads[3], state)
    got, got_state = step(grads[3], legacy)
    assert got_state.age.dtype == jnp.int16
    for a, b in zip(jax.tree_util.tree_leaves((want, want_state)),
                    jax.tree_util.tree_leaves((got, got_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
