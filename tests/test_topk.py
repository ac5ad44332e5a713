"""jss.topk against the NumPy reference: dtypes, ties, extremes, bad input."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_sparse_sync as jss
from reference import bucket_topk_reference, magnitude_order, topk_reference


def _check_selection(x, k):
    v, i = jax.jit(jss.topk, static_argnums=1)(x, k)
    v, i = np.asarray(v), np.asarray(i)
    rv, ri = topk_reference(np.asarray(x), k)
    assert i.dtype == np.int32 and v.dtype == np.asarray(x).dtype
    assert v.shape == (k,) and i.shape == (k,)
    np.testing.assert_array_equal(i, ri)  # deterministic tie-break: same set, same order
    np.testing.assert_array_equal(v.view(np.uint8), rv.view(np.uint8))  # bitwise: sign kept


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("n,k", [(1, 1), (10, 3), (1000, 10), (4097, 41), (100_000, 1000)])
def test_topk_random(dtype, n, k):
    x = np.random.default_rng(n + k).standard_normal(n).astype(dtype)
    _check_selection(x, k)


@pytest.mark.parametrize("k", [0, 1, 7, 63, 64])
def test_topk_extremes_and_ties(k):
    # many equal magnitudes with both signs: the tie-break decides
    x = np.tile(np.array([1.0, -1.0, 0.5, -2.0], np.float32), 16)
    _check_selection(x, k)


def test_topk_k_equals_n_and_zero():
    x = np.random.default_rng(0).standard_normal(257).astype(np.float32)
    _check_selection(x, 257)
    v, i = jss.topk(x, 0)
    assert v.shape == (0,) and i.shape == (0,)


def test_topk_all_zero():
    v, i = jss.topk(jnp.zeros(100), 5)
    np.testing.assert_array_equal(np.asarray(i), np.arange(5))
    assert not np.any(np.asarray(v))


def test_topk_multidimensional_input_uses_ravel_order():
    x = np.random.default_rng(3).standard_normal((7, 11, 3)).astype(np.float32)
    v, i = jss.topk(x, 13)
    np.testing.assert_array_equal(np.asarray(v), x.reshape(-1)[np.asarray(i)])
    _check_selection(x, 13)


def test_topk_high_bits_collide_exercises_low_pass():
    # values with identical high 16 bits of the key differ only in low bits
    base = np.float32(1.5).view(np.uint32)
    x = (base + np.arange(5000, dtype=np.uint32) % 4000).view(np.float32)
    x = np.random.default_rng(1).permutation(x)
    _check_selection(x, 123)


def test_topk_nan_ranks_first():
    x = np.array([1.0, np.nan, -5.0, np.inf, 0.0], np.float32)
    v, i = jss.topk(x, 2)
    assert np.asarray(i).tolist() == [1, 3]  # NaN above inf above everything
    assert magnitude_order(x)[:2].tolist() == [1, 3]


def test_topk_subnormal_and_signed_zero():
    x = np.array([-0.0, 1e-45, -2e-45, 0.0, 1e-40], np.float32)
    _check_selection(x, 3)


@pytest.mark.parametrize("k", [-1, 11])
def test_topk_k_out_of_range(k):
    with pytest.raises(ValueError, match=r"`k` must be in \[0, 10\]"):
        jss.topk(jnp.ones(10), k)


def test_topk_rejects_integer_and_bool():
    with pytest.raises(TypeError, match=r"`x` has dtype int32 \(integer\).*astype"):
        jss.topk(jnp.arange(10), 2)
    with pytest.raises(TypeError, match="bool"):
        jss.topk(jnp.ones(10, bool), 2)


def test_topk_traced_k_is_rejected():
    with pytest.raises(TypeError, match="Python int"):
        jax.jit(lambda x, k: jss.topk(x, k))(jnp.ones(4), 2)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("n,k,bucket", [(1024, 4, 512), (1000, 8, 512), (100, 3, 7), (5, 2, 512),
                                        (64, 16, 16), (300, 0, 64)])
def test_bucket_topk_matches_reference(dtype, n, k, bucket):
    x = np.random.default_rng(n * k + bucket).standard_normal(n).astype(dtype)
    v, i = jax.jit(jss.bucket_topk, static_argnums=(1, 2))(x, k, bucket)
    rv, ri = bucket_topk_reference(x, k, bucket)
    np.testing.assert_array_equal(np.asarray(i), ri)
    np.testing.assert_array_equal(np.asarray(v).view(np.uint8), rv.view(np.uint8))


def test_bucket_topk_ties_go_to_lower_index():
    x = np.ones(12, np.float32)
    _, i = jss.bucket_topk(x, 2, bucket=4)
    assert np.asarray(i).tolist() == [0, 1, 4, 5, 8, 9]


def test_bucket_topk_bad_arguments():
    with pytest.raises(ValueError, match=r"`k_per_bucket` must be in \[0, 8\]"):
        jss.bucket_topk(jnp.ones(20), 9, bucket=8)
    with pytest.raises(ValueError, match="`bucket` must be a positive int"):
        jss.bucket_topk(jnp.ones(20), 1, bucket=0)
