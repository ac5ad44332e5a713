"""CPU selection and dense-update kernels against tests/reference.py.

Every kernel for float32, bfloat16 and float16; k = 0 and k = N; ties,
NaN/Inf, all-zero input; sizes around the 256K-per-thread chunking (and
primes); the multi-threaded path equal to the single-threaded one bit for
bit; in-place updates under a donated jit argument.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.bindings.block_scan import block_scan
from large_size import available_memory_bytes, check_planted_entries
from reference import (
    block_scan_reference, kth_magnitude_reference, residual_update_reference,
    bucket_topk_reference, sampled_threshold_reference, scatter_add_reference,
    threshold_select_reference, topk_reference, topk_reference_large)

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
CHUNK = 1 << 18  # elements per thread below which a kernel stays on one thread
SIZES = [CHUNK - 1, CHUNK + 1, 2 * CHUNK + 3, 1_000_003]


def bits(a):
    return np.asarray(a).reshape(-1).view(np.uint8)


def random_input(n, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def assert_topk_matches_reference(x, ks):
    """jss.topk(x, k) for each k in `ks`: the reference's indices and bit-identical values."""
    for k in ks:
        v, i = jss.topk(x, k)
        rv, ri = topk_reference(x, k)
        np.testing.assert_array_equal(np.asarray(i), ri)
        np.testing.assert_array_equal(bits(v), bits(rv))


@pytest.fixture(params=[1, 2, 3, 7], ids=lambda t: f"threads{t}")
def threads(request, monkeypatch):
    """JSS_NUM_THREADS=t: the kernels cut their input into t chunks (>= 4K each)."""
    monkeypatch.setenv("JSS_NUM_THREADS", str(request.param))
    return request.param


# ----------------------------------------------------------------------------- top-k

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3])
def test_topk_matches_reference_around_chunk_boundaries(dtype, n, density):
    x = random_input(n, dtype, seed=n)
    k = max(1, int(n * density))
    v, i = jss.topk(x, k)
    ri = topk_reference_large(x, k)
    np.testing.assert_array_equal(np.asarray(i), ri)
    np.testing.assert_array_equal(bits(v), bits(x[ri]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_same_bits_for_any_thread_count(dtype, threads):
    # many ties (few distinct values) so the tie-break crosses chunk borders
    rng = np.random.default_rng(5)
    x = (rng.integers(-40, 40, 3 * CHUNK + 11) / 8).astype(dtype)
    assert_topk_matches_reference(x, (1, 1000, 65_537, x.size - 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spread", [0.0, 1e-3])
def test_topk_concentrated_magnitudes(dtype, spread, threads):
    # Adam's directions: every magnitude near 1 (exactly 1 at its first step), so most
    # entries share the k-th's top digit and the kernel takes its no-gather path
    rng = np.random.default_rng(8)
    n = 3 * CHUNK + 11
    x = (np.sign(rng.standard_normal(n)) * (1 + spread * rng.standard_normal(n))).astype(dtype)
    x[rng.choice(n, 50, replace=False)] = 4.0  # a few certain ones above the crowd
    assert_topk_matches_reference(x, (1, 50, 51, 1000, n // 3, n - 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_k_zero_and_n(dtype, threads):
    x = random_input(CHUNK + 1, dtype)
    v, i = jss.topk(x, x.size)
    np.testing.assert_array_equal(np.asarray(i), np.arange(x.size))
    np.testing.assert_array_equal(bits(v), bits(x))
    v, i = jss.topk(x, 0)
    assert v.shape == (0,) and i.shape == (0,) and v.dtype == x.dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_nan_inf_and_all_zero(dtype, threads):
    x = random_input(CHUNK + 7, dtype, seed=2)
    x[[5, CHUNK + 3]] = np.nan
    x[[7, 100_000]] = -np.inf
    x[9] = np.inf
    v, i = jss.topk(x, 4)
    assert np.asarray(i).tolist() == [5, 7, 9, CHUNK + 3]  # NaNs, then the lowest-index infs
    v, i = jss.topk(x, 5)
    assert np.asarray(i).tolist() == [5, 7, 9, 100_000, CHUNK + 3]
    rv, ri = topk_reference(x, 1000)
    v, i = jss.topk(x, 1000)
    np.testing.assert_array_equal(np.asarray(i), ri)
    np.testing.assert_array_equal(bits(v), bits(rv))
    z = np.zeros(CHUNK + 5, dtype)
    z[::3] = -0.0  # -0 and +0 tie: the lower indices win
    v, i = jss.topk(z, 100)
    np.testing.assert_array_equal(np.asarray(i), np.arange(100))
    np.testing.assert_array_equal(bits(v), bits(z[:100]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_exact_fill_of_the_top_digit(dtype):
    # 1000 entries of 3.0 and 500 of -100.0 over small noise: k = 1500 fills the
    # top-digit bucket of 3.0 exactly (early stop after the first histogram)
    x = (random_input(600_000, dtype, seed=3) * 1e-3).astype(dtype)
    rng = np.random.default_rng(4)
    at = rng.choice(x.size, 1500, replace=False)
    x[at[:1000]] = 3.0
    x[at[1000:]] = -100.0
    assert_topk_matches_reference(x, (500, 1500, 1499, 1501))


def test_topk_float32_lower_digits_decide():
    # keys equal in the top 11 and the middle 11 bits: only the last 9-bit digit differs
    base = np.float32(1.75).view(np.uint32)
    rng = np.random.default_rng(6)
    x = (base + rng.integers(0, 512, 300_000).astype(np.uint32)).view(np.float32)
    x[rng.choice(x.size, 1000, replace=False)] *= -1
    assert_topk_matches_reference(x, (1, 77, 3000, 299_999))


def test_topk_beyond_2_to_the_24():
    # int64 counters and offsets: an input above 2^24 entries, split over threads
    n = (1 << 24) + 3
    x = np.random.default_rng(7).standard_normal(n, dtype=np.float32)
    k = 16_777
    v, i = jax.jit(jss.topk, static_argnums=1)(x, k)
    ri = topk_reference_large(x, k)
    np.testing.assert_array_equal(np.asarray(i), ri)
    np.testing.assert_array_equal(np.asarray(v), x[ri])
    assert float(jss.kth_magnitude(x, k)) == np.abs(x[ri]).min()
    _, idx, count = jss.threshold_select(x, np.abs(x[ri]).min(), 2 * k)
    assert int(count) == k and np.array_equal(np.asarray(idx)[:k], ri)


def test_size_limit_is_checked_in_python():
    big = jax.ShapeDtypeStruct((2**31,), jnp.float32)  # never allocated: traced only
    for f in (lambda x: jss.topk(x, 1), lambda x: jss.threshold_select(x, 1.0, 1)):
        with pytest.raises(ValueError, match=r"2\*\*31 - 1"):
            jax.eval_shape(f, big)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bucket_topk_same_bits_for_any_thread_count(dtype, threads):
    x = (np.random.default_rng(8).integers(-20, 20, CHUNK + 1000) / 4).astype(dtype)  # ties
    # both paths of the kernel: insertion up to kSmallBucketK = 128 per bucket, nth_element
    # past it (and where a bucket keeps all its entries)
    for k, bucket in ((4, 512), (1, 512), (3, 1000), (64, 512), (128, 512), (129, 512),
                      (32, 40)):
        v, i = jss.bucket_topk(x, k, bucket)
        rv, ri = bucket_topk_reference(x, k, bucket)
        np.testing.assert_array_equal(np.asarray(i), ri)
        np.testing.assert_array_equal(bits(v), bits(rv))


# ----------------------------------------------------------------------------- threshold

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES[:3])
def test_threshold_select_matches_reference(dtype, n, threads):
    x = random_input(n, dtype, seed=n + 1)
    x[[3, n // 2]] = np.nan
    x[n - 1] = -np.inf
    for threshold, capacity in ((2.5, n // 50), (3.2, 5), (-1.0, n), (np.inf, 10), (0.0, 100)):
        v, i, c = jss.threshold_select(x, threshold, capacity)
        rv, ri, rc = threshold_select_reference(x, threshold, capacity)
        assert int(c) == rc  # also when it overflows: count > capacity is reported
        np.testing.assert_array_equal(np.asarray(i), ri)
        np.testing.assert_array_equal(bits(v), bits(rv))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_threshold_select_16bit_compares_exactly(dtype):
    # thresholds between two adjacent 16-bit values, and exactly on one
    x = np.array([1.0, 1.0078125, 1.00390625, 0.99609375, -1.0078125], dtype)
    for t in (1.0, 1.001, float(np.float32(x[1])), 1.0078126):
        v, i, c = jss.threshold_select(x, t, 5)
        rv, ri, rc = threshold_select_reference(x, t, 5)
        assert int(c) == rc
        np.testing.assert_array_equal(np.asarray(i), ri)


def test_threshold_select_all_zero_and_empty_capacity():
    v, i, c = jss.threshold_select(np.zeros(CHUNK + 1, np.float32), 0.0, 4)
    assert int(c) == 0 and np.asarray(i).tolist() == [-1] * 4
    v, i, c = jss.threshold_select(np.ones(10, np.float32), 0.5, 0)
    assert int(c) == 10 and v.shape == (0,)


# ----------------------------------------------------------------------------- k-th magnitude

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 100, CHUNK + 1, 1_000_003])
def test_kth_magnitude_matches_reference(dtype, n, threads):
    x = random_input(n, dtype, seed=n + 2)
    for k in sorted({1, max(1, n // 100), n}):
        got = np.float32(jss.kth_magnitude(x, k))
        np.testing.assert_array_equal(bits(got), bits(kth_magnitude_reference(x, k)))
    for stride in (3, 64):
        m = -(-n // stride)
        k = max(1, m // 10)
        got = np.float32(jss.kth_magnitude(x, k, stride=stride))
        assert got == kth_magnitude_reference(x, k, stride)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kth_magnitude_gathered_and_reread_paths(dtype, threads):
    # After the first digit, the entries sharing it are gathered when they are
    # few (<= n / 8: normal data) and read from x again otherwise (heavy ties).
    rng = np.random.default_rng(5)
    n = 1_000_003
    few = rng.standard_normal(n).astype(dtype)
    many = (rng.integers(-6, 7, n) * 0.25).astype(dtype)
    for x in (few, many):
        for k in (1, n // 100, n // 3, n - 1):
            got = np.float32(jss.kth_magnitude(x, k))
            np.testing.assert_array_equal(bits(got), bits(kth_magnitude_reference(x, k)))


def test_kth_magnitude_nan_inf_zero_and_k0():
    x = np.array([1.0, np.nan, -np.inf, 0.0, -2.0], np.float32)
    assert np.isnan(float(jss.kth_magnitude(x, 1)))
    assert float(jss.kth_magnitude(x, 2)) == np.inf
    assert float(jss.kth_magnitude(x, 3)) == 2.0
    assert float(jss.kth_magnitude(x, 5)) == 0.0
    assert float(jss.kth_magnitude(x, 0)) == np.inf
    assert float(jss.kth_magnitude(np.zeros(10, np.float16), 4)) == 0.0
    with pytest.raises(ValueError, match=r"`k` must be in \[0, 2\]"):
        jss.kth_magnitude(x, 3, stride=3)
    with pytest.raises(ValueError, match="`stride` must be >= 1"):
        jss.kth_magnitude(x, 1, stride=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_estimate_threshold_methods(dtype):
    n, k = 1_000_003, 10_000
    x = random_input(n, dtype, seed=9)
    exact = np.float32(jss.estimate_threshold(x, k))
    assert exact == kth_magnitude_reference(x, k)
    for stride in (1, 7, 64):
        sampled = np.float32(jss.estimate_threshold(x, k, "sampled", sample_stride=stride))
        assert sampled == sampled_threshold_reference(x, k, stride)
        # the estimator: about k entries pass, within a few 1/sqrt(k_s)
        kept = np.count_nonzero(np.abs(x.astype(np.float32)) >= sampled)
        assert abs(kept / k - 1) < 5 / np.sqrt(k / stride)
    a = x.astype(np.float64)
    from scipy.stats import norm
    expect = abs(a.mean()) + a.std() * norm.ppf(1 - k / (2 * n))
    np.testing.assert_allclose(float(jss.estimate_threshold(x, k, "gaussian")), expect, rtol=2e-3)
    with pytest.raises(ValueError, match="`method` must be one of"):
        jss.estimate_threshold(x, k, "median")
    assert float(jss.estimate_threshold(x, 0, "sampled")) == np.inf


# ----------------------------------------------------------------------------- residual update

@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_update_matches_reference(dtype):
    acc = random_input(10_001, dtype, seed=11)
    acc[17] = np.nan
    idx = np.random.default_rng(1).choice(acc.size, 600, replace=False).astype(np.int32)
    idx[::7] = -1
    idx[0] = 17
    got = jax.jit(jss.residual_update)(acc, idx)
    assert got.dtype == acc.dtype
    np.testing.assert_array_equal(bits(got), bits(residual_update_reference(acc, idx)))
    # bitwise what the XLA scatter gives
    xla = jnp.asarray(acc).at[jnp.where(idx < 0, acc.size, idx)].set(0, mode="drop")
    np.testing.assert_array_equal(bits(got), bits(xla))


def test_residual_update_is_in_place_under_donation():
    acc = jnp.arange(1.0, 1 + (1 << 20), dtype=jnp.float32)
    pointer = acc.unsafe_buffer_pointer()
    idx = jnp.array([0, 5, -1, (1 << 20) - 1], jnp.int32)
    f = jax.jit(jss.residual_update, donate_argnums=0)
    out = f(acc, idx)
    assert acc.is_deleted()  # the donated buffer was taken over ...
    assert out.unsafe_buffer_pointer() == pointer  # ... and written in place
    expect = np.arange(1.0, 1 + (1 << 20), dtype=np.float32)
    expect[[0, 5, (1 << 20) - 1]] = 0
    np.testing.assert_array_equal(np.asarray(out), expect)


def test_residual_update_bad_indices():
    acc = jnp.ones(10)
    with pytest.raises(ValueError, match=r"indices\[1\] = 10 is outside \[0, 10\)"):
        jss.residual_update(acc, jnp.array([0, 10], jnp.int32))
    with pytest.raises(ValueError, match=r"indices\[0\] = -2"):
        jss.residual_update(acc, jnp.array([-2], jnp.int32))
    traced = jax.jit(jss.residual_update)
    if jax.default_backend() == "gpu":  # documented: the GPU kernel skips it (no host round trip)
        out = np.asarray(traced(acc, jnp.array([0, 12], jnp.int32)))
        np.testing.assert_array_equal(out, [0.0] + [1.0] * 9)
    else:
        with pytest.raises(Exception, match=r"indices\[1\] = 12 is outside"):  # traced: the kernel
            jax.block_until_ready(traced(acc, jnp.array([0, 12], jnp.int32)))
    with pytest.raises(TypeError, match="1-D int32"):
        jss.residual_update(acc, jnp.array([0, 1]).astype(jnp.int16))
    with pytest.raises(ValueError, match="must be 1-D"):
        jss.residual_update(jnp.ones((2, 5)), jnp.array([0], jnp.int32))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        jss.residual_update(jnp.ones(3, jnp.int32), jnp.array([0], jnp.int32))


# ----------------------------------------------------------------------------- scatter-add

@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_add_matches_reference(dtype):
    rng = np.random.default_rng(12)
    dense = random_input(5000, dtype, seed=13)
    idx = rng.integers(-1, 5000, 3000).astype(np.int32)  # duplicates and padding
    idx[:50] = 42  # a long run of one index: float32 accumulation matters for 16 bits
    values = (rng.standard_normal(3000) * 0.01).astype(dtype)
    values[60] = np.nan
    got = np.asarray(jax.jit(jss.scatter_add)(dense, values, idx))
    want = scatter_add_reference(dense, values, idx)
    nan = np.isnan(want.astype(np.float32))
    assert nan.any() and np.array_equal(np.isnan(got.astype(np.float32)), nan)
    if jax.default_backend() == "gpu":  # documented: NaN payload bits are the platform's
        got, want = got[~nan], want[~nan]
    np.testing.assert_array_equal(bits(got), bits(want))


def test_scatter_add_float32_is_the_sequential_sum_and_in_place():
    dense = jnp.zeros(1 << 20, jnp.float32)
    pointer = dense.unsafe_buffer_pointer()
    idx = jnp.array([3, 3, 3, -1, 7], jnp.int32)
    vals = jnp.array([1e8, 1.0, -1e8, 5.0, 2.0], jnp.float32)
    out = jax.jit(jss.scatter_add, donate_argnums=0)(dense, vals, idx)
    assert dense.is_deleted() and out.unsafe_buffer_pointer() == pointer
    assert float(out[3]) == np.float32(np.float32(1e8) + np.float32(1.0)) - np.float32(1e8)
    assert float(out[7]) == 2.0 and float(jnp.sum(out)) == float(out[3]) + 2.0


def test_scatter_add_bad_arguments():
    with pytest.raises(TypeError, match="`values` must be float32"):
        jss.scatter_add(jnp.zeros(4), jnp.ones(2, jnp.bfloat16), jnp.array([0, 1], jnp.int32))
    with pytest.raises(ValueError, match=r"indices\[0\] = 4 is outside \[0, 4\)"):
        jss.scatter_add(jnp.zeros(4), jnp.ones(1), jnp.array([4], jnp.int32))


# ----------------------------------------------------------------------------- block scan, QSGD

@pytest.mark.parametrize("dtype", DTYPES)
def test_block_scan_16bit_and_float32(dtype):
    x = np.zeros(1000, dtype)
    x[5] = -0.0  # not a nonzero
    x[130] = ml_dtypes.finfo(dtype).smallest_subnormal
    x[400] = np.nan
    x[999] = -1
    got = block_scan(x, 64)
    np.testing.assert_array_equal(np.asarray(got), block_scan_reference(x, 64))
    assert np.asarray(got).sum() == 3


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_qsgd_16bit_input_equals_its_float32_cast(dtype):
    x = random_input(3001, dtype, seed=14)
    x[2000] = np.inf
    a = jss.qsgd_quantize(x, bits=4, bucket=512, seed=3)
    b = jss.qsgd_quantize(x.astype(np.float32), bits=4, bucket=512, seed=3)
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
    np.testing.assert_array_equal(bits(a[1]), bits(b[1]))


@pytest.mark.skipif(available_memory_bytes() < 8 << 30,
                    reason="needs 8 GiB of free memory (a 4 GiB input)")
def test_int64_offsets_at_the_largest_size():
    # N = 2^31 - 1 bfloat16 entries on the CPU: byte offsets past 2^31, int32
    # indices up to 2^31 - 2 (about 6 s and 4.4 GB here).
    check_planted_entries(2**31 - 1, jax.devices("cpu")[0])
