"""The error-feedback accumulator's CPU kernels (``jss_accumulate`` and
``jss_accumulate_topk``) against their XLA twins, bit for bit: every hint
(none, right, a little low, far too low, too high, NaN), ties at the k-th
magnitude, NaN entries, several thread counts, and inside ``topk_sync``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.transforms import flat
from jax_sparse_sync.transforms.selection_policy import hinted_topk


def grads_tree(n, seed, dtype=np.float32):
    g = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    cut = [0, 1, 1, 7, n // 3, n]  # an empty leaf and leaves across the thread chunks
    return {f"l{j}": jnp.asarray(g[lo:hi]).astype(dtype) for j, (lo, hi) in enumerate(zip(cut, cut[1:]))}


def xla_accumulate(residual, grads, decay=None):
    leaves = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(grads) if x.size]
    factor = jnp.reshape(jnp.float32(1.0 if decay is None else decay), (1,))
    return flat._accumulate_xla(residual, factor, leaves, has_decay=decay is not None)


def as_np(*xs):
    return [np.asarray(x) for x in xs]


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("decay", [None, 0.93])
@pytest.mark.parametrize("leaf_dtype", [np.float32, jnp.bfloat16])
def test_accumulate_kernel_equals_xla(monkeypatch, threads, decay, leaf_dtype):
    monkeypatch.setenv("JSS_NUM_THREADS", threads)
    n = 50_003
    grads = grads_tree(n, 0, leaf_dtype)
    residual = jnp.asarray(np.random.default_rng(1).standard_normal(n).astype(np.float32))
    got = jax.jit(lambda r, g: flat.accumulate(r, g, jnp.float32, decay))(residual, grads)
    want = jax.jit(lambda r, g: xla_accumulate(r, g, decay))(residual, grads)
    if decay is None:
        np.testing.assert_array_equal(*as_np(got, want))
    else:  # XLA may join the product and the sum in a fused multiply-add
        np.testing.assert_allclose(*as_np(got, want), rtol=0, atol=1e-6)
    # NumPy's float32 arithmetic (one rounding for the product, one for the sum), bit for bit
    g = np.concatenate([np.ravel(np.asarray(x, np.float32)) for x in jax.tree_util.tree_leaves(grads)])
    r = np.asarray(residual)
    np.testing.assert_array_equal(np.asarray(got), (r if decay is None else r * np.float32(decay)) + g)


def kth_of(residual, grads, k):
    values, _ = jss.topk(xla_accumulate(residual, grads), k)
    return float(np.min(np.abs(np.asarray(values))))


@pytest.mark.parametrize("threads", ["1", "4"])
@pytest.mark.parametrize("k", [1, 37, 500, 4000])
def test_accumulate_topk_equals_topk_of_accumulate_for_every_hint(monkeypatch, threads, k):
    # and hinted_topk, the same list on an accumulator formed beforehand
    # (shared_support_sync's refresh branch): jss.topk's choice for every hint
    monkeypatch.setenv("JSS_NUM_THREADS", threads)
    n = 40_000
    grads = grads_tree(n, 2)
    residual = jnp.asarray(np.random.default_rng(3).standard_normal(n).astype(np.float32) * 2)
    want_acc = xla_accumulate(residual, grads)
    want_v, want_i = jss.topk(want_acc, k)
    kth = kth_of(residual, grads, k)
    magnitudes = np.abs(np.asarray(want_acc))
    cap = min(n, flat.HINT_CAPACITY * k)
    used_any = False
    for last_kth in (None, kth, kth * 1.1, kth * 0.01, kth * 2.0, float("nan"), 0.0, float("inf")):
        fn = jax.jit(lambda r, g: flat.accumulate_topk(r, g, k, last_kth=last_kth))
        acc, v, i, used = fn(residual, grads)
        np.testing.assert_array_equal(*as_np(acc, want_acc))
        np.testing.assert_array_equal(*as_np(v, want_v))
        np.testing.assert_array_equal(*as_np(i, want_i))
        # the list is used exactly when it holds between k and cap entries
        hint = np.float32(0.0 if last_kth is None else last_kth) * np.float32(flat.HINT_FACTOR)
        listed = int(np.sum(magnitudes >= hint)) if 0 < hint < np.inf else -1
        assert int(used) == int(k <= listed <= cap), (last_kth, listed)
        used_any |= bool(used)
        if last_kth is not None:  # (a 0 hint lists every nonzero there: the same choice)
            v, i = jax.jit(lambda a: hinted_topk(a, k, last_kth))(want_acc)
            np.testing.assert_array_equal(*as_np(v, want_v))
            np.testing.assert_array_equal(*as_np(i, want_i))
    assert used_any or k == 1  # (k = 1: the largest few are too close together for 8 slots)


@pytest.mark.parametrize("threads", ["1", "4"])
@pytest.mark.parametrize("decay", [None, 0.9])
@pytest.mark.parametrize("placed", ["range", "scattered"])
def test_a_part_of_the_residual_is_the_call_on_its_entries(monkeypatch, threads, decay, placed):
    # grouped_topk_sync's in-place path (gradient_source's produce_at): the call with
    # `at` reads and writes only the part's entries of the whole residual (one range,
    # or each leaf at its own place, out of order), the same bits as the call on those
    # entries cut out and concatenated; the rest stays as given; indices relative to
    # the part's order. With every hint case of the part (none, right, far too low)
    # and the XLA twin.
    monkeypatch.setenv("JSS_NUM_THREADS", threads)
    n, k = 30_000, 123
    grads = grads_tree(12_345, 21)  # leaves of 1, 0, 6, 4108 and 8230 entries
    sizes = [int(x.size) for x in jax.tree_util.tree_leaves(grads)]
    if placed == "range":
        at = 7_001
        starts = [at + lo for lo in np.cumsum([0] + sizes[:-1])]
    else:  # the big leaves swapped and apart, the first at the end of the buffer
        at = [n - 1, 5, 5, 20_000, 1_000]
        starts = at
    take = np.concatenate([np.arange(s, s + z) for s, z in zip(starts, sizes)])
    residual = jnp.asarray(np.random.default_rng(22).standard_normal(n).astype(np.float32))
    part_residual = residual[take]
    kth = kth_of(part_residual, grads, k)
    for last_kth in (None, kth, kth * 0.01):
        kw = dict(decay=decay, last_kth=last_kth)
        whole = jax.jit(lambda r, g: flat.accumulate_topk(r, g, k, at=at, **kw))(residual, grads)
        part = jax.jit(lambda r, g: flat.accumulate_topk(r, g, k, **kw))(part_residual, grads)
        acc = np.asarray(whole[0])
        np.testing.assert_array_equal(acc[take].view(np.uint32),
                                      np.asarray(part[0]).view(np.uint32))
        np.testing.assert_array_equal(np.delete(acc, take), np.delete(np.asarray(residual), take))
        for a, b in zip(whole[1:], part[1:]):  # values, indices (the part's order), hint used
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the XLA twin (GPU) takes the part the same way
    leaves = [jnp.ravel(x) for x in jax.tree_util.tree_leaves(grads) if x.size]
    factor, hint = jnp.ones((1,), jnp.float32), jnp.zeros((1,), jnp.float32)
    kept = tuple(s for s, z in zip(starts, sizes) if z)
    twin = jax.jit(lambda r, f, h, l: flat._accumulate_topk_xla(
        r, f, h, l, has_decay=False, k=k, cap=16 * k, starts=kept))(residual, factor, hint, leaves)
    ours = jax.jit(lambda r, g: flat.accumulate_topk(r, g, k, at=at))(residual, grads)
    for a, b in zip(twin[:3], ours[:3]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_part_that_does_not_fit_names_the_leaf():
    residual = jnp.zeros((30_000,), jnp.float32)
    grads = grads_tree(12_345, 21)
    with pytest.raises(ValueError, match=r"accumulate_topk: the range at 20000 of 12345 entries "
                                         r"does not fit the residual's 30000"):
        flat.accumulate_topk(residual, grads, 5, at=20_000)
    with pytest.raises(ValueError, match=r"accumulate_topk: leaf 4 at 25000 of 8230 entries "
                                         r"does not fit the residual's 30000"):
        flat.accumulate_topk(residual, grads, 5, at=[0, 5, 5, 10_000, 25_000])
    with pytest.raises(ValueError, match=r"accumulate_topk: `at` has 2 starts for 5 gradient "
                                         r"leaves \(one per leaf\)"):
        flat.accumulate_topk(residual, grads, 5, at=[0, 5])


def test_hinted_topk_ties_nan_and_negative_zero_follow_topk():
    n = 30_000
    g = np.zeros(n, np.float32)
    g[::7] = 1.0   # 4286 ties at the top magnitude: the lowest indices win
    g[::7 * 13] = -1.0
    g[12345] = np.nan  # NaN ranks first
    g[1::11] = -0.0
    for k, last_kth in ((100, 1.0), (1000, 1.0), (5000, 1.0), (5000, 0.0), (3, float("nan"))):
        # 4287 listed: more than 16 k, the list's top k, fewer than k (zeros, -0.0 among
        # them, chosen by jss.topk); a NaN hint lists the NaN alone
        v, i = jax.jit(lambda a: hinted_topk(a, k, last_kth))(jnp.asarray(g))
        want_v, want_i = jss.topk(jnp.asarray(g), k)
        np.testing.assert_array_equal(*as_np(i, want_i))
        assert np.asarray(v).tobytes() == np.asarray(want_v).tobytes()  # -0.0 and NaN bits
        assert 12345 in np.asarray(i)


def test_accumulate_topk_ties_and_nan_follow_topk():
    n, k = 30_000, 100
    g = np.zeros(n, np.float32)
    g[::7] = 1.0   # 4286 ties at the top magnitude: the lowest indices win
    g[::7 * 13] = -1.0
    g[12345] = np.nan  # NaN ranks first
    grads = {"a": jnp.asarray(g[:1000]), "b": jnp.asarray(g[1000:])}
    residual = jnp.zeros(n, jnp.float32)
    want_v, want_i = jss.topk(xla_accumulate(residual, grads), k)
    acc, v, i, used = jax.jit(lambda r, gg: flat.accumulate_topk(r, gg, k, last_kth=1.0))(
        residual, grads)
    np.testing.assert_array_equal(*as_np(i, want_i))
    np.testing.assert_array_equal(*as_np(v, want_v))  # (NaN == NaN under assert_array_equal)
    assert 12345 in np.asarray(i)
    assert int(used) == 0  # 4286 listed > 16 k: the whole accumulator was selected from
    _, _, i2, used2 = jax.jit(lambda r, gg: flat.accumulate_topk(r, gg, 1000, last_kth=1.0))(
        residual, grads)
    np.testing.assert_array_equal(np.asarray(i2), np.asarray(jss.topk(xla_accumulate(residual, grads), 1000)[1]))
    assert int(used2) == 1


def test_accumulate_topk_with_decay_and_donation():
    n, k = 20_000, 20
    grads = grads_tree(n, 4)
    residual = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    want = xla_accumulate(jnp.asarray(residual), grads, 0.5)  # (exact: 0.5 r needs no rounding)
    want_v, want_i = jss.topk(want, k)
    fn = jax.jit(lambda r, g: flat.accumulate_topk(r, g, k, decay=0.5, last_kth=jnp.float32(1.0)),
                 donate_argnums=0)
    acc, v, i, _ = fn(jnp.asarray(residual), grads)
    for got, exp in ((acc, want), (v, want_v), (i, want_i)):
        np.testing.assert_array_equal(*as_np(got, exp))


def test_topk_sync_selects_from_the_hint_list_and_matches_the_unfused_path():
    """Ten steps of topk_sync (its fused kernel, the hint taken from the state)
    against the same steps written with the XLA accumulator and jss.topk."""
    n, k = 30_000, 30
    rng = np.random.default_rng(6)
    params = {"w": jnp.zeros((100, 290)), "b": jnp.zeros(1000)}
    tx = jss.topk_sync(k=k)
    state = tx.init(params)
    update = jax.jit(tx.update)
    residual = jnp.zeros(n, jnp.float32)
    kth = None
    used = []
    for _ in range(10):
        grads = {"w": jnp.asarray(rng.standard_normal((100, 290)), jnp.float32),
                 "b": jnp.asarray(rng.standard_normal(1000), jnp.float32)}
        if kth is not None:
            used.append(int(flat.accumulate_topk(residual, grads, k, last_kth=kth)[3]))
        updates, state = update(grads, state)
        acc = xla_accumulate(residual, grads)
        values, indices = jss.topk(acc, k)
        residual = acc.at[indices].set(0.0)
        kth = jnp.min(jnp.abs(values))
        np.testing.assert_array_equal(*as_np(state.residual, residual))
        np.testing.assert_array_equal(*as_np(state.threshold, kth))
        dense = np.zeros(n, np.float32)
        dense[np.asarray(indices)] = np.asarray(values)
        np.testing.assert_array_equal(np.asarray(updates["b"]), dense[:1000])  # "b" sorts first
    assert sum(used) >= 5, used  # the state's k-th magnitude is a usable hint on most steps


def test_topk_sync_float64_residual_keeps_the_unfused_path():
    jax.config.update("jax_enable_x64", True)
    try:
        params = {"w": jnp.zeros(64, jnp.float32)}
        tx = jss.topk_sync(k=3, residual_dtype=jnp.float64)
        g = {"w": jnp.arange(64, dtype=jnp.float32) - 30.0}
        updates, state = jax.jit(tx.update)(g, tx.init(params))
        assert state.residual.dtype == jnp.float64
        assert np.flatnonzero(np.asarray(updates["w"])).tolist() == [61, 62, 63]
    finally:
        jax.config.update("jax_enable_x64", False)
