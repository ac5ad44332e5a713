"""QSGD quantize/dequantize: unbiased, on its grid, reproducible, edge cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.bindings.block_scan import block_scan


def roundtrip(x, bits, bucket, seed):
    packed, scales = jss.qsgd_quantize(x, bits=bits, bucket=bucket, seed=seed)
    return np.asarray(jss.qsgd_dequantize(packed, scales, size=x.size, bits=bits, bucket=bucket))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_unbiased_statistically(bits):
    # E[Q(x)] = x: the mean of T independent quantizations converges to x with
    # standard error <= (scale / s) / (2 sqrt(T)); check every entry at 6 sigma.
    x = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    bucket, trials = 512, 300
    levels = 2 ** (bits - 1) - 1
    f = jax.jit(lambda s: jss.qsgd_dequantize(*jss.qsgd_quantize(x, bits=bits, bucket=bucket, seed=s),
                                              size=x.size, bits=bits, bucket=bucket))
    mean = np.mean([np.asarray(f(s)) for s in range(trials)], axis=0)
    scales = np.repeat([np.abs(x[i:i + bucket]).max() for i in range(0, x.size, bucket)], bucket)[:x.size]
    sigma = scales / levels / (2 * np.sqrt(trials))
    assert np.all(np.abs(mean - x) <= 6 * sigma + 1e-7)
    # and no systematic drift: the average signed error is tiny
    assert abs(np.mean(mean - x)) < 0.2 * np.mean(sigma)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_values_lie_on_the_grid_and_error_is_one_step(bits):
    x = np.random.default_rng(1).standard_normal(5000).astype(np.float32) * 3
    bucket = 1024
    q = roundtrip(x, bits, bucket, seed=7)
    levels = 2 ** (bits - 1) - 1
    for lo in range(0, x.size, bucket):
        scale = np.abs(x[lo:lo + bucket]).max()
        steps = q[lo:lo + bucket] / scale * levels
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
        assert np.all(np.abs(q[lo:lo + bucket] - x[lo:lo + bucket]) <= scale / levels * (1 + 1e-5))
        assert np.all(np.sign(q[lo:lo + bucket]) * np.sign(x[lo:lo + bucket]) >= 0)


def test_packed_sizes_and_reproducibility():
    x = np.random.default_rng(2).standard_normal(1001).astype(np.float32)
    packed, scales = jss.qsgd_quantize(x, bits=2, bucket=100, seed=3)
    assert packed.dtype == jnp.uint8 and packed.shape == (251,) and scales.shape == (11,)
    again, _ = jss.qsgd_quantize(x, bits=2, bucket=100, seed=3)
    other, _ = jss.qsgd_quantize(x, bits=2, bucket=100, seed=4)
    np.testing.assert_array_equal(np.asarray(packed), np.asarray(again))
    assert np.any(np.asarray(packed) != np.asarray(other))


def test_traced_seed_under_jit():
    x = jnp.linspace(-1, 1, 64)
    f = jax.jit(lambda s: jss.qsgd_quantize(x, bits=4, bucket=16, seed=s)[0])
    assert np.any(np.asarray(f(jnp.int32(1))) != np.asarray(f(jnp.int32(2))))


def test_zero_and_nonfinite_buckets():
    x = np.zeros(40, np.float32)
    x[25] = np.nan
    x[35] = 2.0
    q = roundtrip(x, 4, 10, seed=0)
    assert not q[:20].any()                       # all-zero buckets stay exactly zero
    assert np.all(np.isnan(q[20:30]))             # a NaN poisons its bucket, visibly
    assert np.isfinite(q[30:]).all() and q[35] == 2.0  # the max of a bucket is exact


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`bits` must be one of \(2, 4, 8\)"):
        jss.qsgd_quantize(jnp.ones(4), bits=3)
    with pytest.raises(ValueError, match="`bucket` must be a positive int"):
        jss.qsgd_quantize(jnp.ones(4), bucket=0)
    with pytest.raises(TypeError, match="`x` has dtype int32"):
        jss.qsgd_quantize(jnp.arange(4))
    packed, scales = jss.qsgd_quantize(jnp.ones(10), bits=4, bucket=4)
    with pytest.raises(ValueError, match="`packed` must be uint8 of shape"):
        jss.qsgd_dequantize(packed, scales, size=12, bits=4, bucket=4)
    with pytest.raises(ValueError, match="`quantize_bits` quantizes DSAR's dense phase"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4,
                             algorithm="allgather", quantize_bits=4)



@pytest.mark.parametrize("bits,scale", [(4, 1.5e-38), (8, 1e-37), (4, 1e-40), (8, 1e-39)])
def test_tiny_scale_codes_stay_in_range(bits, scale):
    # s / scale overflows to inf for a tiny scale (normal or subnormal); every
    # code must still be a level in [0, s] with the entry's sign (no inf * 0, no
    # out-of-range float-to-int conversion). QSGD computes with IEEE
    # subnormals although XLA's CPU threads flush them (as the GPU does).
    s = 2 ** (bits - 1) - 1
    x = np.array([1.0, -0.8, 0.0, 0.9, -1.0], np.float32) * np.float32(scale)  # all normal
    for seed in range(20):
        packed, scales = jss.qsgd_quantize(x, bits=bits, bucket=5, seed=seed)
        assert np.asarray(scales)[0] == np.float32(scale)
        per_byte = 8 // bits
        raw = np.asarray(packed).astype(np.uint32)
        codes = np.array([(raw[i // per_byte] >> ((i % per_byte) * bits)) & ((1 << bits) - 1)
                          for i in range(x.size)])
        level, negative = codes & ((1 << (bits - 1)) - 1), codes >> (bits - 1)
        assert list(level[[0, 2, 4]]) == [s, 0, s]
        assert list(negative) == [0, 1, 0, 0, 1]
        assert int(level[1]) in (int(0.8 * s), int(0.8 * s) + 1)
        assert int(level[3]) in (int(0.9 * s), int(0.9 * s) + 1)


@pytest.mark.parametrize("threads", ["1", "3"])
def test_subnormal_bucket_keeps_its_scale(threads, monkeypatch):
    # XLA's CPU threads run with denormals-are-zero: a bucket holding only
    # subnormals used to get scale 0 and dequantize to 0 on CPU while a GPU kept
    # them. Now its scale is its largest magnitude, on any thread count, and the
    # round trip is within one step of every entry.
    monkeypatch.setenv("JSS_NUM_THREADS", threads)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 1e-40).astype(np.float32)  # all subnormal
    x[1024:2048] *= 1e30  # two normal buckets in between
    bucket, bits = 512, 8
    packed, scales = jss.qsgd_quantize(x, bits=bits, bucket=bucket, seed=1)
    expect = np.abs(x).reshape(-1, bucket).max(axis=1)
    np.testing.assert_array_equal(np.asarray(scales), expect)
    out = np.asarray(jss.qsgd_dequantize(packed, scales, size=x.size, bits=bits, bucket=bucket))
    step = np.repeat(expect / (2 ** (bits - 1) - 1), bucket)
    assert np.all(np.abs(out.astype(np.float64) - x) <= step * 1.0001)
    sub = np.r_[out[:1024], out[2048:]]
    assert np.count_nonzero(sub) > 0.9 * sub.size  # the subnormal buckets are not flushed


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bucket", [1, 3, 5, 64, 1000])
def test_same_codes_for_any_thread_count(bits, bucket, monkeypatch):
    # The buckets are split over threads at byte-aligned boundaries (a multiple
    # of 4 buckets); odd buckets put codes of two buckets in one byte. With
    # JSS_NUM_THREADS the chunks go down to 4K entries, so 40K entries make
    # several, each boundary inside this data. NaN and a subnormal bucket too.
    rng = np.random.default_rng(bucket * 10 + bits)
    x = rng.standard_normal(40_003).astype(np.float32)
    x[rng.random(x.size) < 0.2] = 0
    x[17] = np.nan
    x[30_000:30_000 + 3 * bucket] = 1e-40
    out = {}
    for threads in ("1", "3", "7"):
        monkeypatch.setenv("JSS_NUM_THREADS", threads)
        packed, scales = jss.qsgd_quantize(x, bits=bits, bucket=bucket, seed=9)
        back = jss.qsgd_dequantize(packed, scales, size=x.size, bits=bits, bucket=bucket)
        mask = block_scan(x, bucket)
        out[threads] = [np.asarray(a).tobytes() for a in (packed, scales, back, mask)]
    assert out["3"] == out["1"] and out["7"] == out["1"]
