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
from reference import bits_differ, topk_reference


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
    """Equal bit for bit, except a NaN's payload (``reference.bits_differ``: the first H200
    run of the accumulator passes' special values differed only there)."""
    for c, g in zip(jax.tree.leaves(cpu), jax.tree.leaves(gpu)):
        assert c.dtype == g.dtype and c.shape == g.shape, what
        differ = bits_differ(np.asarray(c), np.asarray(g))
        assert differ.size == 0, f"{what}: first differing entries {differ[:5]}"


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


# --- the accumulator and Adam-direction passes (kernels/fused_accumulate.cuh) ------
# Their CUDA twins must give the CPU handlers' bits: the accumulator, the Adam
# state, the top-k (set and order) and hint_used. Inputs have no subnormals: XLA's
# CPU threads flush them (FTZ/DAZ), the GPU keeps IEEE subnormals.

def normal_or_special(n, seed, special):
    """Normal values; with ``special`` also NaN, +-inf and -0 (no subnormals)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if special:
        pick = rng.integers(0, 200, n)
        x[pick == 0] = np.nan
        x[pick == 1] = np.inf
        x[pick == 2] = -np.inf
        x[(pick >= 3) & (pick < 8)] = -0.0
    return x


def leaves_of(flat, sizes):
    bounds = np.cumsum([0, *sizes])
    return [flat[lo:hi] for lo, hi in zip(bounds, bounds[1:])]


# leaves one after the other from 0; at 11 of a longer buffer; in another order
# than the buffer's (a group of grouped_topk_sync that is not one range); more
# leaves than one launch's table holds (kChunkLeaves = 64)
LAYOUTS = {"whole": ([1, 4097, 120_000, 75_900], None),
           "range": ([1, 4097, 120_000, 75_900], "at"),
           "scattered": ([1, 4097, 120_000, 75_900], "scattered"),
           "many_leaves": ([3001] * 70, None)}


def placed_starts(sizes, how, total):
    if how is None:
        return tuple(int(s) for s in np.cumsum([0, *sizes[:-1]]))
    if how == "at":
        return tuple(11 + int(s) for s in np.cumsum([0, *sizes[:-1]]))
    places, at = [], total
    for size in sizes:  # from the end backwards, a gap of 5 before each
        at -= size + 5
        places.append(at)
    return tuple(places)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("has_decay,special", [(False, False), (True, True)])
def test_accumulate_passes_match_cpu(layout, has_decay, special):
    from jax_sparse_sync.bindings.accumulate import accumulate_kernel, accumulate_topk_kernel
    sizes, how = LAYOUTS[layout]
    n = sum(sizes)
    total = n + (0 if how is None else 50 + 5 * len(sizes))
    starts = placed_starts(sizes, how, total)
    flat = leaves_of(normal_or_special(n, 1, special), sizes)
    residual = normal_or_special(total, 2, special) * np.float32(0.5)
    factor = np.asarray([0.9], np.float32)
    if how is None:
        cpu, gpu = on_both(lambda r, f, g: accumulate_kernel(r, f, g, has_decay=has_decay),
                           residual, factor, flat)
        assert_same_bits(cpu, gpu, "accumulate")
    # (k, hint, cap): at 1 %, every hint (none; one that holds; one above the k-th
    # magnitude: too few listed; one far below it: too many), a list of exactly k
    # slots; then k = 1, a large k and k = n with a hint that holds
    k1 = n // 100
    cases = [(k1, hint, 16 * k1) for hint in ("none", "holds", "too_high", "too_low")]
    cases += [(k1, "holds", k1), (1, "holds", 16), (n // 7, "holds", n), (n, "holds", n)]
    acc = np.asarray(accumulate_topk_kernel(
        *[jax.device_put(a, CPUS[0]) for a in (residual, factor, np.zeros(1, np.float32))],
        [jax.device_put(a, CPUS[0]) for a in flat], has_decay=has_decay, k=1, cap=1,
        starts=starts)[0])
    part = np.concatenate([acc[s:s + z] for s, z in zip(starts, sizes)])
    magnitudes = np.sort(np.abs(part[~np.isnan(part)]))[::-1]
    for k, hint_kind, cap in cases:
        kth = float(magnitudes[min(k, magnitudes.size) - 1])
        hint = {"none": 0.0, "holds": 0.95 * kth, "too_high": 1.5 * kth + 1.0,
                "too_low": 1e-6 * kth}[hint_kind]
        cpu, gpu = on_both(
            lambda r, f, h, g, k=k, cap=cap: accumulate_topk_kernel(
                r, f, h, g, has_decay=has_decay, k=k, cap=cap, starts=starts),
            residual, factor, np.asarray([hint], np.float32), flat)
        assert_same_bits(cpu, gpu, f"accumulate_topk {layout} k={k} cap={cap} hint={hint_kind}")
        if hint_kind == "holds" and cap == 16 * k1 and not special:
            assert int(gpu[3]) == 1, "the list's path ran"


def adam_operands(n, total, masking, has_noise, has_decay, clip_norm, hint, seed=3):
    from adam_cases import B1, B2, state
    mu, nu, age, residual = (np.resize(x, total) for x in state(n, seed))
    rng = np.random.default_rng(seed + 1)
    noise = tuple(np.abs(rng.standard_normal(total)).astype(np.float32) if i == 0 else
                  rng.standard_normal(total).astype(np.float32) for i in range(3))
    t = 5.0
    scalars = np.asarray([1 - B2 ** t, 1 - B1 ** t, 0.01, 0.3 if has_noise else 0.0,
                          1.0 if has_noise else 0.0, 0.5, 0.5, 0.9, hint,
                          clip_norm or 1.0, 1.0], np.float32)
    return mu, nu, age, noise if has_noise else None, residual, scalars


# every masking, every variant, each with and without the mean gradient's moment
@pytest.mark.parametrize("masking,has_noise,variant", [
    ("restart", False, "plain"), ("restart", True, "decay_clip"),
    ("zero", True, "no_clip_scattered"), ("zero", False, "decay_clip"),
    ("off", False, "no_clip_scattered"), ("off", True, "plain")])
def test_adam_passes_match_cpu(masking, has_noise, variant):
    from adam_cases import B1, B2, EPS
    from jax_sparse_sync.bindings import adam as adam_kernels
    sizes, how = LAYOUTS["scattered" if variant == "no_clip_scattered" else "whole"]
    n = sum(sizes)
    total = n + (0 if how is None else 50 + 5 * len(sizes))
    starts = placed_starts(sizes, how, total)
    flat = leaves_of(normal_or_special(n, 4, False), sizes)
    has_decay = variant != "plain"
    # a power-of-two norm: the clip divides as XLA does on each device (exactly on the
    # CPU, div.full.f32 on a GPU: kernels/float_bits.cuh div_as_xla), which agree where
    # the quotient is exact; test_adam_clip.py checks the GPU clip against optax there
    clip_norm = {"plain": None, "decay_clip": 4.0, "no_clip_scattered": 0.5}[variant]
    kw = dict(b1=B1, b2=B2, eps=EPS, masking=masking, mask=masking != "off",
              has_noise=has_noise, has_decay=has_decay, has_clip=clip_norm is not None,
              starts=starts)
    for k, hint in ((0, 0.0), (n // 100, 0.0), (n // 100, 1e-3), (n // 50, 10.0)):
        mu, nu, age, noise, residual, scalars = adam_operands(
            n, total, masking, has_noise, has_decay, clip_norm, hint)
        cpu, gpu = on_both(
            lambda *a, k=k: adam_kernels.adam_accumulate_kernel(
                *a, k=k, cap=min(n, 16 * max(k, 1)), **kw),
            flat, mu, nu, age, noise, residual, scalars)
        assert_same_bits(cpu, gpu, f"adam_accumulate k={k} hint={hint}")
    if how is None:  # the direction alone (adam_direction_sync in front of other syncs)
        mu, nu, age, noise, residual, scalars = adam_operands(n, total, masking, has_noise,
                                                              False, None, 0.0)
        direction_kw = dict(b1=B1, b2=B2, eps=EPS, masking=masking)
        if has_noise:
            cpu, gpu = on_both(lambda g, m, v, a, r, s, z: adam_kernels.mean_moment_kernel(
                g, m, v, a, r, s[0], s[1], s[2], z, tuple(s[3:7]), **direction_kw),
                flat, mu, nu, age, residual, scalars, noise)
        else:
            cpu, gpu = on_both(lambda g, m, v, a, r, s: adam_kernels.adam_direction_kernel(
                g, m, v, a, r if masking != "off" else None, s[0], s[1], s[2], **direction_kw),
                flat, mu, nu, age, residual, scalars)
        assert_same_bits(cpu, gpu, "adam_direction")


@pytest.mark.parametrize("adam", [False, True])
def test_sync_steps_run_the_cuda_kernels_and_match_cpu(adam):
    # topk_sync and adam_direction_sync(topk_sync) on GPU arrays lower to the fused
    # kernels (not XLA's twins), and three steps (the hint's list from the second on)
    # give the CPU's updates and state bit for bit
    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((300, 200)).astype(np.float32),
              "b": rng.standard_normal(300).astype(np.float32)}
    sync = jss.topk_sync(density=0.01)
    tx = jss.adam_direction_sync(sync) if adam else sync
    grads = [jax.tree.map(lambda p, s=s: np.random.default_rng(s).standard_normal(
        p.shape).astype(np.float32), params) for s in range(3)]

    def run(device):
        put = lambda t: jax.device_put(t, device)  # noqa: E731
        with jax.default_device(device):  # the state's zeros there too
            state = tx.init(put(params))
            update = jax.jit(tx.update)
            outs = []
            for g in grads:
                u, state = update(put(g), state, put(params))
                outs.append(u)
            text = update.lower(put(grads[0]), state, put(params)).as_text()
        return jax.tree.map(np.asarray, (outs, state)), text

    (cpu, _), (gpu, text) = run(CPUS[0]), run(GPUS[0])
    assert ("jss_adam_accumulate" if adam else "jss_accumulate_topk") in text
    assert_same_bits(cpu, gpu, "sync steps")
