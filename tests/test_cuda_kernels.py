"""The CUDA kernels against the CPU kernels, bit for bit (GPU machines only).

Every selection and compression op runs on the same input on the GPU and on
the CPU backend and the outputs must be identical bit for bit (same selection,
same order, same tie-breaking, same padding, same QSGD codes for the same seed),
at sizes that span many CUDA tiles and blocks, for float32, bfloat16 and float16,
with ties, NaN, +-inf, -0 and subnormals. One test runs at N = 2^31 - 1 to
exercise the 64-bit offsets. The CPU kernels are checked against the NumPy
reference elsewhere (tests/test_topk.py, tests/test_kernels*.py).

Needs a GPU, the CUDA module (``JSS_CUDA=ON bash scripts/setup.sh``) and both
backends in one process::

    JAX_PLATFORMS=cuda,cpu .venv/bin/python -m pytest tests/test_cuda_kernels.py -q

Skipped anywhere else. tests/cuda_host/ checks the same kernel logic on the
host without a GPU.
"""

import jax
import ml_dtypes
import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync import _ext
from jax_sparse_sync.bindings.block_scan import block_scan
from large_size import check_planted_entries
from reference import topk_reference


def _devices(kind):
    try:
        return jax.devices(kind)
    except RuntimeError:
        return []


GPUS, CPUS = _devices("gpu"), _devices("cpu")
pytestmark = pytest.mark.skipif(
    not (GPUS and CPUS and _ext.cuda_available()),
    reason="needs a GPU and the CPU backend in one process (JAX_PLATFORMS=cuda,cpu) and the "
           "CUDA module (JSS_CUDA=ON bash scripts/setup.sh)")

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
SIZES = [1, 4097, 300_007]


def make_input(n, dtype, flavor, seed=0):
    """flavor 0: heavy ties and zeros; 1: normal; 2: NaN, +-inf, -0, subnormals;
    3: only subnormals (whole subnormal QSGD buckets)."""
    rng = np.random.default_rng(seed + 7919 * flavor + n)
    if flavor == 0:
        x = rng.integers(-6, 7, n).astype(np.float32) * 0.25
    elif flavor == 1:
        x = rng.standard_normal(n).astype(np.float32)
    elif flavor == 3:
        tiny = 1e-40 if dtype == np.float32 else (1e-39 if dtype == ml_dtypes.bfloat16 else 1e-6)
        return (rng.standard_normal(n) * tiny).astype(dtype)
    else:
        x = rng.standard_normal(n).astype(np.float32)
        pick = rng.integers(0, 100, n)
        x[pick < 2] = np.nan
        x[(pick >= 2) & (pick < 4)] = np.inf
        x[(pick >= 4) & (pick < 6)] = -np.inf
        x[(pick >= 6) & (pick < 10)] = -0.0
        x[(pick >= 10) & (pick < 14)] = np.float32(1e-41) if dtype == np.float32 else 1e-7
    return x.astype(dtype)


def on_both(fn, *args):
    """fn on the CPU and on the GPU (data placement picks the backend), as NumPy."""
    cpu = fn(*[jax.device_put(a, CPUS[0]) for a in args])
    gpu = fn(*[jax.device_put(a, GPUS[0]) for a in args])
    for c, g in zip(jax.tree.leaves(cpu), jax.tree.leaves(gpu)):
        assert c.devices() == {CPUS[0]} and g.devices() == {GPUS[0]}
    return jax.tree.map(np.asarray, cpu), jax.tree.map(np.asarray, gpu)


def assert_same_bits(cpu, gpu, what):
    for c, g in zip(jax.tree.leaves(cpu), jax.tree.leaves(gpu)):
        assert c.dtype == g.dtype and c.shape == g.shape, what
        mismatch = np.flatnonzero(c.reshape(-1).view(np.uint8) != g.reshape(-1).view(np.uint8))
        assert mismatch.size == 0, f"{what}: first differing byte {mismatch[:5]}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("flavor", [0, 1, 2])
def test_topk_matches_cpu(dtype, n, flavor):
    x = make_input(n, dtype, flavor)
    for k in sorted({0, 1, max(1, n // 100), n // 2, n - 1, n}):
        cpu, gpu = on_both(lambda a, k=k: jss.topk(a, k), x)
        assert_same_bits(cpu, gpu, f"topk n={n} k={k}")
    if flavor == 1:  # and the NumPy reference, once per size and dtype
        _, ref_indices = topk_reference(x, n // 2)
        _, gpu = on_both(lambda a: jss.topk(a, n // 2), x)
        np.testing.assert_array_equal(gpu[1], ref_indices)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("flavor", [0, 1])
def test_topk_candidate_buffer_and_its_overflow(dtype, flavor):
    # The filter pass buffers the entries sharing the k-th key's first digit
    # (room for n / 16). Heavy ties (flavor 0) at this size overflow it, so the
    # later passes read x again; normal data (flavor 1) stays in the buffer.
    n = 3_000_017
    x = make_input(n, dtype, flavor)
    for k in (n // 100, n // 3):
        cpu, gpu = on_both(lambda a, k=k: jss.topk(a, k), x)
        assert_same_bits(cpu, gpu, f"topk n={n} k={k} flavor={flavor}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flavor", [0, 2])
def test_kth_magnitude_matches_cpu(dtype, flavor):
    n = 300_007
    x = make_input(n, dtype, flavor)
    for stride in (1, 7, 1000):
        m = -(-n // stride)
        for k in (0, 1, m // 3, m):
            cpu, gpu = on_both(lambda a, k=k, s=stride: jss.kth_magnitude(a, k, stride=s), x)
            assert_same_bits(cpu, gpu, f"kth_magnitude stride={stride} k={k}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_threshold_select_matches_cpu(dtype, n):
    for flavor in (0, 2):
        x = make_input(n, dtype, flavor)
        for threshold in (-1.0, 0.0, 0.5, 1.0, float("inf")):
            for capacity in sorted({0, 1, n // 50 + 1, n}):
                cpu, gpu = on_both(
                    lambda a, t=threshold, c=capacity: jss.threshold_select(a, t, c), x)
                assert_same_bits(cpu, gpu, f"threshold_select t={threshold} capacity={capacity}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bucket,k_per_bucket", [(512, 2), (512, 16), (5, 5), (3000, 100), (1, 1)])
def test_bucket_topk_matches_cpu(dtype, bucket, k_per_bucket):
    for flavor in (0, 2):
        x = make_input(100_003, dtype, flavor)
        cpu, gpu = on_both(lambda a: jss.bucket_topk(a, k_per_bucket, bucket), x)
        assert_same_bits(cpu, gpu, f"bucket_topk bucket={bucket} k={k_per_bucket}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bucket", [7, 1024])
def test_qsgd_matches_cpu(dtype, bits, bucket):
    # flavor 3: both compute with IEEE subnormals (XLA's CPU threads flush them)
    for flavor in (1, 2, 3):
        x = make_input(50_001, dtype, flavor)
        for seed in (0, 12345):
            cpu, gpu = on_both(lambda a, s=seed: jss.qsgd_quantize(a, bits=bits, bucket=bucket,
                                                                   seed=s), x)
            assert_same_bits(cpu, gpu, f"qsgd_quantize bits={bits} bucket={bucket} seed={seed}")
            cpu_d, gpu_d = on_both(lambda p, s: jss.qsgd_dequantize(p, s, size=x.size, bits=bits,
                                                                     bucket=bucket), *cpu)
            assert_same_bits(cpu_d, gpu_d, "qsgd_dequantize")


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_scan_matches_cpu(dtype):
    x = make_input(100_003, dtype, 0)
    x[: 50_000] = 0  # whole zero blocks, -0 included
    x[10] = -0.0
    for block in (1, 33, 256, 4096):
        cpu, gpu = on_both(lambda a, b=block: block_scan(a, b), x)
        assert_same_bits(cpu, gpu, f"block_scan block={block}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_update_and_scatter_add_match_cpu(dtype):
    n, cap = 100_003, 20_000
    rng = np.random.default_rng(3)
    acc = make_input(n, dtype, 1)
    indices = rng.integers(-1, 2_000, cap).astype(np.int32)  # many duplicates, padding
    values = make_input(cap, dtype, 1, seed=5)
    cpu, gpu = on_both(jss.residual_update, acc, indices)
    assert_same_bits(cpu, gpu, "residual_update")
    cpu, gpu = on_both(jss.scatter_add, acc, values, indices)
    assert_same_bits(cpu, gpu, "scatter_add")
    # donated input: the update happens in place on the GPU
    dense = jax.device_put(acc, GPUS[0])
    step = jax.jit(jss.scatter_add, donate_argnums=0)
    out = np.asarray(step(dense, jax.device_put(values, GPUS[0]), jax.device_put(indices, GPUS[0])))
    assert_same_bits(cpu, out, "scatter_add donated")


def test_int64_offsets_at_the_largest_size():
    # 2^31 - 1 bfloat16 entries (4 GiB on the GPU): offsets past 2^31 bytes.
    check_planted_entries(2**31 - 1, GPUS[0])
