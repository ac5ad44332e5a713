"""The kernels inside the Optax transform: the "sampled" selection policy and
the in-place residual update of topk_sync (one rank)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.transforms.selection_policy import (SELECTION_POLICIES, nudge_threshold,
                                                         sample_stride)
from reference import residual_update_reference, sampled_threshold_reference, topk_reference


def test_sampled_policy_selects_about_k_and_never_drops():
    rng = np.random.default_rng(0)
    n, k = 200_000, 2000
    tx = jss.topk_sync(k=k, selection="sampled")
    state = tx.init({"w": jnp.zeros(n)})
    step = jax.jit(tx.update)
    assert sample_stride(k) == 7
    for _ in range(4):
        g = {"w": jnp.asarray(rng.standard_normal(n).astype(np.float32))}
        acc = np.asarray(state.residual) + np.asarray(g["w"])
        updates, state = step(g, state)
        u = np.asarray(updates["w"])
        # the threshold is the sampled k-th magnitude of the accumulator
        assert np.float32(state.threshold) == sampled_threshold_reference(acc, k, sample_stride(k))
        sent = np.abs(acc) >= np.float32(state.threshold)
        np.testing.assert_array_equal(u != 0, sent)  # exactly the entries above it
        np.testing.assert_array_equal(u[sent], acc[sent])
        np.testing.assert_array_equal(np.asarray(state.residual),
                                      np.where(sent, np.float32(0), acc))  # nothing lost
        assert int(state.last_local_count) == sent.sum()
        assert 0.75 * k <= sent.sum() <= 1.25 * k  # k_s = 286: about 6% spread


def test_sampled_policy_overflow_falls_back_to_exact():
    # all magnitudes equal: every entry passes the sampled threshold (overflow)
    n, k = 5000, 64
    tx = jss.topk_sync(k=k, selection="sampled", capacity_factor=1.5)
    state = tx.init({"w": jnp.zeros(n)})
    g = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32)
    updates, state = jax.jit(tx.update)({"w": jnp.asarray(g)}, state)
    assert int(state.last_local_count) == k
    _, idx = topk_reference(g, k)
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(updates["w"])), idx)


def test_sampled_is_a_shared_policy():
    assert "sampled" in SELECTION_POLICIES
    with pytest.raises(ValueError, match="`selection` must be one of"):
        jss.topk_sync(k=1, selection="sample")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("selection", ["exact", "bucket", "threshold_reuse"])
def test_topk_sync_residual_is_bitwise_the_reference(dtype, selection):
    rng = np.random.default_rng(3)
    n = 3000
    tx = jss.topk_sync(k=7, selection=selection, bucket=256, residual_dtype=dtype, tau=3)
    state = tx.init({"w": jnp.zeros(n, dtype)})
    step = jax.jit(tx.update)
    for _ in range(4):
        g = rng.standard_normal(n).astype(np.float32)
        acc = (np.asarray(state.residual) + np.asarray(jnp.asarray(g).astype(dtype)))
        updates, state = step({"w": jnp.asarray(g).astype(dtype)}, state)
        acc = np.asarray(jnp.asarray(acc).astype(dtype))
        sent = np.flatnonzero(np.asarray(updates["w"]).astype(np.float32))
        expect = residual_update_reference(acc, sent.astype(np.int32))
        np.testing.assert_array_equal(np.asarray(state.residual).view(np.uint8),
                                      expect.view(np.uint8))


def test_nudge_is_proportional_and_bounded():
    # inside [0.75 k, 1.25 k] the threshold stays; outside it moves by
    # (count / k) ** (1/32), at most 5% either way (count 0 counts as 0.5)
    t, k = np.float32(2.0), 1000
    nudged = lambda count: float(nudge_threshold(jnp.float32(t), jnp.int32(count), k))  # noqa: E731
    assert nudged(750) == nudged(1000) == nudged(1250) == t
    np.testing.assert_allclose(nudged(1300), t * 1.3 ** (1 / 32), rtol=1e-6)
    np.testing.assert_allclose(nudged(500), t * 0.5 ** (1 / 32), rtol=1e-6)
    np.testing.assert_allclose(nudged(10 * k), t * 1.05, rtol=1e-6)
    np.testing.assert_allclose(nudged(0), t / 1.05, rtol=1e-6)
    assert t < nudged(1300) < nudged(2000) < nudged(10 * k)


def _overflow_case(n, k, room_factor, seed, nan_at=None, ties=False):
    """An accumulator where ``room_factor * k`` entries clear the threshold 1.0."""
    rng = np.random.default_rng(seed)
    acc = rng.uniform(-0.9, 0.9, n).astype(np.float32)
    hot = rng.choice(n, int(room_factor * k), replace=False)
    acc[hot] = (np.float32(1.5) if ties else
                rng.uniform(1.0, 3.0, hot.size).astype(np.float32)) * rng.choice([-1, 1], hot.size)
    if nan_at is not None:
        acc[nan_at] = np.nan
    return acc


@pytest.mark.parametrize("room_factor,nan_at,ties", [
    (1.5, None, False),   # within the capacity: the threshold's own selection
    (3.0, None, False),   # overflow within the list: top-k of the list
    (3.0, 17, False),     # ... with a NaN (listed, and first in the top-k)
    (3.0, None, True),    # ... with every listed magnitude equal (ties: lower index)
    (9.0, None, False),   # beyond the list: the top-k of the whole accumulator
])
def test_threshold_overflow_takes_the_exact_topk_from_the_list(room_factor, nan_at, ties):
    from jax_sparse_sync.transforms import selection_policy as sp
    n, k = 40_000, 500
    capacity = 2 * k
    acc = jnp.asarray(_overflow_case(n, k, room_factor, 5, nan_at, ties))
    sel = jax.jit(lambda a: sp.select_local(a, k=k, policy="threshold_reuse",
                                            threshold=jnp.float32(1.0), step=jnp.int32(1),
                                            tau=32, capacity=capacity))(acc)
    qualified = int(room_factor * k) + (nan_at is not None)
    if qualified <= capacity:
        assert not bool(sel.exact) and int(sel.count) == qualified
        v, i, c = jss.threshold_select(acc, 1.0, capacity)
        np.testing.assert_array_equal(np.asarray(sel.indices), np.asarray(i))
        np.testing.assert_array_equal(np.asarray(sel.values), np.asarray(v))
        return
    # overflow: bit for bit the exact top-k (jss.topk on the whole accumulator)
    assert bool(sel.exact) and int(sel.count) == k
    v, i = jss.topk(acc, k)
    np.testing.assert_array_equal(np.asarray(sel.indices[:k]), np.asarray(i))
    np.testing.assert_array_equal(np.asarray(sel.values[:k]).view(np.uint32),
                                  np.asarray(v).view(np.uint32))
    assert (np.asarray(sel.indices[k:]) == -1).all() and (np.asarray(sel.values[k:]) == 0).all()
    assert float(sel.threshold) == float(jnp.min(jnp.abs(v))) or np.isnan(float(sel.threshold))
    if nan_at is not None:
        assert nan_at in np.asarray(sel.indices[:k])
    if ties:  # the k lowest listed indices
        listed = np.flatnonzero(np.abs(np.asarray(acc)) >= 1.0)
        np.testing.assert_array_equal(np.asarray(sel.indices[:k]), listed[:k])
    assert sp.OVERFLOW_LIST_FACTOR * k < 9.0 * k  # the last case is beyond the list
