"""Property-based tests (Hypothesis) of the public ops against tests/reference.py.

Random sizes (0 included), the three input dtypes, k from 0 to N (and outside,
which must raise a ValueError naming the argument), magnitude ties, signed
zeros, NaN and +-Inf placed anywhere, duplicate and out-of-range indices, and
both NaN policies of the sparse allreduce (a world of one rank here; the
multi-rank runs are in tests/mpi). Comparisons are bitwise (NaN payloads
included where the op copies values rather than computing them).

Bounded so the file runs in well under a minute on a loaded 2-core machine:
``max_examples`` per test (``JSS_HYPOTHESIS_EXAMPLES`` overrides it, for longer
local runs) and no per-example deadline (each new shape compiles, which takes
as long as the machine's load makes it). Under CI (``CI=true``) the examples
are derandomized, so a run is reproducible. Every failure Hypothesis found is
kept as an ``@example`` of the test that found it.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reference import (block_scan_reference, bucket_topk_reference, kth_magnitude_reference,
                       residual_update_reference, scatter_add_reference,
                       sparse_allreduce_reference, threshold_select_reference, topk_reference)

import jax_sparse_sync as jss
from jax_sparse_sync.bindings.block_scan import block_scan

EXAMPLES = int(os.environ.get("JSS_HYPOTHESIS_EXAMPLES", "25"))
BOUNDED = settings(max_examples=EXAMPLES, deadline=None, database=None,
                   derandomize=os.environ.get("CI", "") == "true",
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.0, np.nan, -np.nan, np.inf, -np.inf, 1e-40, 65504.0,
            3.0e38]

element = st.one_of(
    st.sampled_from(SPECIALS),                               # ties, signed zeros, NaN, Inf
    st.floats(-1e4, 1e4, allow_nan=False, width=32),         # ordinary values
    st.floats(allow_nan=False, allow_infinity=False, width=32),  # the whole float32 range
)


#: Sizes drawn from a fixed set: every new shape (and static k) compiles, which
#: dominates the run time; these cover empty, tiny, non-powers of two and several
#: buckets/blocks.
SIZES = (0, 1, 2, 3, 7, 16, 37, 64, 100)


def sizes(min_size=0, max_size=100):
    return st.sampled_from([n for n in SIZES if min_size <= n <= max_size])


def counts(n):
    """k in [0, n], mostly the edges (0, 1, n - 1, n) and the middle: few distinct values."""
    return st.sampled_from(sorted({0, min(1, n), max(n - 1, 0), n // 2, n}))


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Subnormals -> zero of the same sign: what XLA's CPU threads (flush-to-zero and
    denormals-are-zero set) make of them in arithmetic, the kernels' included."""
    tiny = ml_dtypes.finfo(x.dtype).tiny if x.dtype == ml_dtypes.bfloat16 else np.finfo(x.dtype).tiny
    x32 = x.astype(np.float32)
    zero = np.copysign(np.float32(0), x32)
    return np.where(np.abs(x32) < np.float32(tiny), zero, x32).astype(x.dtype)


@st.composite
def arrays(draw, min_size=0, max_size=100, finite=False, subnormals=True):
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    n = draw(sizes(min_size, max_size))
    elems = element.filter(np.isfinite) if finite else element
    values = draw(st.lists(elems, min_size=n, max_size=n))
    with np.errstate(over="ignore"):
        x = np.asarray(values, np.float32).astype(DTYPES[dtype])  # out of range -> +-inf
    if finite:
        x = np.where(np.isfinite(x.astype(np.float32)), x, 0).astype(DTYPES[dtype])
    return x if subnormals else flush_subnormals(x)


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 1: np.uint8}[a.dtype.itemsize])


def same_values(got, want, nan_payload=True):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if nan_payload:
        np.testing.assert_array_equal(bits(got), bits(want))
    else:
        g, w = got.astype(np.float32), want.astype(np.float32)
        assert np.array_equal(np.isnan(g), np.isnan(w)), (got, want)
        keep = ~np.isnan(g)
        np.testing.assert_array_equal(bits(got)[keep], bits(want)[keep])


# ---- selection ------------------------------------------------------------------


@BOUNDED
@given(x=arrays(), data=st.data())
def test_topk_matches_the_reference(x, data):
    k = data.draw(st.one_of(counts(x.size), st.sampled_from([-1, x.size + 1])), label="k")
    if not 0 <= k <= x.size:
        with pytest.raises(ValueError, match=r"`k` must be in \[0, "):
            jss.topk(jnp.asarray(x), k)
        return
    values, indices = jss.topk(jnp.asarray(x), k)
    want_values, want_indices = topk_reference(x, k)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    same_values(values, want_values)


@BOUNDED
@given(x=arrays(), data=st.data())
def test_bucket_topk_matches_the_reference(x, data):
    bucket = data.draw(st.sampled_from([1, 3, 8, 32]), label="bucket")
    k = data.draw(counts(bucket), label="k_per_bucket")
    values, indices = jss.bucket_topk(jnp.asarray(x), k, bucket=bucket)
    if x.size == 0 or k == 0:
        assert values.shape == (0,) and indices.shape == (0,)
        return
    want_values, want_indices = bucket_topk_reference(x, k, bucket)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    same_values(values, want_values)


thresholds = st.one_of(st.sampled_from([0.0, -0.0, -1.0, 1.0, 0.5, np.inf, -np.inf, np.nan]),
                       st.floats(-10, 10, allow_nan=False, width=32))


@BOUNDED
@given(x=arrays(), threshold=thresholds, data=st.data())
def test_threshold_select_matches_the_reference(x, threshold, data):
    capacity = data.draw(counts(x.size), label="capacity")
    values, indices, count = jss.threshold_select(jnp.asarray(x), threshold, capacity)
    want_values, want_indices, want_count = threshold_select_reference(x, threshold, capacity)
    assert int(count) == want_count
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    same_values(values, want_values)


@BOUNDED
@given(x=arrays(), data=st.data())
def test_kth_magnitude_matches_the_reference(x, data):
    stride = data.draw(st.sampled_from([1, 3]), label="stride")
    m = -(-x.size // stride)
    k = data.draw(counts(m), label="k")
    got = np.asarray(jss.kth_magnitude(jnp.asarray(x), k, stride=stride))
    want = kth_magnitude_reference(x, k, stride)
    same_values(got, np.asarray(want, np.float32), nan_payload=False)


# ---- dense updates: residual_update, scatter_add, block_scan ---------------------


@st.composite
def dense_and_indices(draw, subnormals=True):
    dense = draw(arrays(min_size=1, max_size=100, subnormals=subnormals))
    n = dense.size
    slots = draw(st.sampled_from([0, 1, 5, 40, 150]))
    # duplicates are likely (a small range), padding and out-of-range indices too
    idx = draw(st.lists(st.one_of(st.integers(-1, n - 1), st.integers(-1, min(n - 1, 3)),
                                  st.sampled_from([-2, n, n + 7, -2**31, 2**31 - 1])),
                        min_size=slots, max_size=slots))
    # most examples valid: out-of-range indices in about a fifth of them
    if draw(st.integers(0, 4)):
        idx = [i if -1 <= i < n else -1 for i in idx]
    return dense, np.asarray(idx, np.int32)


def first_bad(idx, n):
    bad = np.flatnonzero((idx < -1) | (idx >= n))
    return int(bad[0]) if bad.size else None


@BOUNDED
@given(case=dense_and_indices())
def test_residual_update_matches_the_reference(case):
    acc, idx = case
    bad = first_bad(idx, acc.size)
    if bad is not None:
        with pytest.raises(ValueError, match=rf"indices\[{bad}\] = {idx[bad]} is outside"):
            jss.residual_update(jnp.asarray(acc), jnp.asarray(idx))
        return
    got = jss.residual_update(jnp.asarray(acc), jnp.asarray(idx))
    same_values(got, residual_update_reference(acc, idx))


# Arithmetic runs under XLA's flush-to-zero (found by Hypothesis: a bfloat16
# subnormal plus 0 gave +0, as jnp's own add does on CPU): subnormal inputs
# are left out here; the selection ops above, which only compare and copy,
# get them.
@BOUNDED
@given(case=dense_and_indices(subnormals=False), data=st.data())
def test_scatter_add_matches_the_reference(case, data):
    dense, idx = case
    vals = data.draw(st.lists(element, min_size=idx.size, max_size=idx.size), label="values")
    with np.errstate(over="ignore"):
        vals = flush_subnormals(np.asarray(vals, np.float32).astype(dense.dtype))
    bad = first_bad(idx, dense.size)
    if bad is not None:
        with pytest.raises(ValueError, match=rf"indices\[{bad}\] = {idx[bad]} is outside"):
            jss.scatter_add(jnp.asarray(dense), jnp.asarray(vals), jnp.asarray(idx))
        return
    got = jss.scatter_add(jnp.asarray(dense), jnp.asarray(vals), jnp.asarray(idx))
    with np.errstate(over="ignore", invalid="ignore"):
        want = scatter_add_reference(dense, vals, idx)
    # a computed NaN's payload is the platform's (documented): compare NaN-ness there
    same_values(got, want, nan_payload=False)


@BOUNDED
@given(x=arrays(), block=st.sampled_from([1, 4, 16, 50]))
def test_block_scan_matches_the_reference(x, block):
    got = np.asarray(block_scan(jnp.asarray(x), block))
    np.testing.assert_array_equal(got, block_scan_reference(x, block))


# ---- QSGD ------------------------------------------------------------------------


@BOUNDED
@given(x=arrays(min_size=1), bits_=st.sampled_from([2, 4, 8]), bucket=st.sampled_from([1, 5, 64]),
       seed=st.integers(-2**31, 2**31 - 1))
# Found by Hypothesis: a subnormal scale. QSGD computes with IEEE subnormals,
# but the decode step scale / levels is then subnormal too and keeps few bits:
# the codes decode off the grid (1e-40 at 8 bits decodes to 1.00017e-40, above
# the bucket's largest magnitude), still within one step of x. Not changed in
# the kernels (CPU and CUDA decode alike and must stay bitwise equal); the grid
# check allows that absolute error (docs/topics/test_suite.md).
@example(x=np.array([9.18355e-41], ml_dtypes.bfloat16), bits_=8, bucket=1, seed=0)
@example(x=np.array([1e-40], np.float32), bits_=8, bucket=1, seed=0)
def test_qsgd_codes_lie_on_the_grid_within_one_step(x, bits_, bucket, seed):
    packed, scales = jss.qsgd_quantize(jnp.asarray(x), bits=bits_, bucket=bucket, seed=seed)
    q = np.asarray(jss.qsgd_dequantize(packed, scales, size=x.size, bits=bits_, bucket=bucket))
    scales = np.asarray(scales)
    levels = 2 ** (bits_ - 1) - 1
    x32 = x.astype(np.float32)
    for b, lo in enumerate(range(0, x.size, bucket)):
        part, got = x32[lo:lo + bucket], q[lo:lo + bucket]
        if not np.all(np.isfinite(part)):
            assert np.isnan(scales[b]), (part, scales[b])  # a non-finite bucket is flagged
            continue
        scale = np.abs(part).max()
        assert scales[b] == scale
        if scale == 0:
            assert np.all(got == 0)
            continue
        steps = got.astype(np.float64) / scale * levels
        tiny = 64 * float(np.finfo(np.float32).smallest_subnormal) / scale * levels
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-3 + tiny)
        assert np.all(np.abs(got.astype(np.float64) - part) <= scale / levels * (1 + 1e-5))
        assert np.all(np.sign(got) * np.sign(part) >= 0)


# ---- the sparse allreduce (one rank) and its NaN policies --------------------------


@st.composite
def sparse_inputs(draw):
    size = draw(sizes(1))
    cap = draw(st.sampled_from([0, 1, 5, 40, 150]))
    idx = draw(st.lists(st.one_of(st.integers(-1, size - 1), st.integers(0, min(size - 1, 3)),
                                  st.sampled_from([-2, size, size + 3])),
                        min_size=cap, max_size=cap))
    if draw(st.integers(0, 4)):
        idx = [i if -1 <= i < size else -1 for i in idx]
    values = draw(st.lists(element, min_size=cap, max_size=cap))
    return size, flush_subnormals(np.asarray(values, np.float32)), np.asarray(idx, np.int32)


ALGORITHMS = ["dense", "allgather", "recursive_doubling", "split_allgather"]


@BOUNDED
@given(case=sparse_inputs(), algorithm=st.sampled_from(ALGORITHMS),
       nan_policy=st.sampled_from(["raise", "propagate"]))
def test_sparse_allreduce_matches_the_reference_under_both_nan_policies(case, algorithm,
                                                                        nan_policy):
    size, values, idx = case
    run = lambda: np.asarray(jss.sparse_allreduce(  # noqa: E731
        jnp.asarray(values), jnp.asarray(idx), size=size, algorithm=algorithm,
        nan_policy=nan_policy))
    bad = first_bad(idx, size)
    if bad is not None:
        with pytest.raises(Exception, match=rf"indices\[{bad}\] = {idx[bad]} is not in \[0, "
                                            rf"size={size}\)"):
            run()
        jss.mpi.reset_after_mpi_error()
        return
    nonfinite = np.any(~np.isfinite(values[idx >= 0]))
    if nonfinite and nan_policy == "raise":
        with pytest.raises(Exception, match="non-finite"):
            run()
        jss.mpi.reset_after_mpi_error()
        return
    with np.errstate(invalid="ignore", over="ignore"):
        want = sparse_allreduce_reference([(values, idx)], size)
        # one rank: the sum of each index's entries in slot order, in float32
        want32 = scatter_add_reference(np.zeros(size, np.float32), values, idx)
    got = run()
    assert np.array_equal(np.isnan(got), np.isnan(want32)), (got, want32)
    keep = ~np.isnan(got)
    np.testing.assert_allclose(got[keep], want32[keep], rtol=1e-6, atol=0)
    finite = np.isfinite(want) & keep
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-30)
