"""The device-resident exchange's protocol through the CPU seam, on every rank.

Run by tests/test_device_protocol.py (and test_multirank.py's seam job) under
``mpiexec`` with ``JSS_TEST_DEVICE_PROTOCOL=compare``: the CPU handler then runs each
sparse allreduce through the device protocol (ffi/collectives/device_exchange.h,
its host stand-ins) and then through the CPU path, and fails the call unless the
two outputs and statistics are equal bit for bit. The cases are the ones where a
device sum could round differently: signed zeros, sums that cancel, the same index
on several ranks, NaN under nan_policy="propagate", 16-bit and encoded wires,
padding in the middle (the bucketed selection's layout), unsorted duplicates (the
host's fallback), an empty rank; and the errors, whose messages must be the CPU
path's. Each result is also checked against the NumPy reference and across ranks.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from reference import bits_differ, sparse_allreduce_reference

import jax_sparse_sync as jss

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
N = 512
ALGORITHMS = ["allgather", "recursive_doubling", "split_allgather", "hash_partition"]

# On a GPU (tests/test_cuda_module.py, JAX_PLATFORMS=cuda,cpu) the same cases run the
# CUDA handler's device protocol, and each call is repeated on CPU arrays (the CPU
# handler, the CPU path): the two results and statistics must be equal bit for bit.
ON_GPU = jax.default_backend() == "gpu"
pytestmark = pytest.mark.skipif(
    not ON_GPU and os.environ.get("JSS_TEST_DEVICE_PROTOCOL") != "compare",
    reason="runs under JSS_TEST_DEVICE_PROTOCOL=compare, or on a GPU")


def contribution(case: str, rank: int):
    """(values, indices) of one rank: every case with capacity 24."""
    rng = np.random.default_rng(50 + rank)
    idx = np.sort(rng.choice(N, 24, replace=False)).astype(np.int32)
    values = rng.standard_normal(24).astype(np.float32)
    if case == "signed_zeros":  # -0.0 everywhere on odd ranks, +-0 mixed on even ones
        idx = np.arange(24, dtype=np.int32) * 3
        values = np.where(np.arange(24) % 2 == 0, -0.0, 0.0).astype(np.float32)
        if rank % 2:
            values[:] = -0.0
        values[::5] = np.float32(rank + 1) * (-1) ** rank
    elif case == "cancelling":  # rank r holds (-1)^r v: sums of 0 (P even), -0 partials
        idx = np.arange(24, dtype=np.int32) * 2
        values = np.linspace(-3, 3, 24).astype(np.float32) * (-1.0) ** rank
    elif case == "shared":  # the same indices everywhere, values of every magnitude
        idx = np.arange(24, dtype=np.int32) * 7
        values = (rng.standard_normal(24) * 10.0 ** rng.integers(-20, 20, 24)).astype(np.float32)
    elif case == "padding_inside":  # bucket_topk's layout: padding between kept entries
        idx[3::4] = -1
        values[3::4] = 0.0
    elif case == "unsorted_duplicates":
        idx = rng.integers(0, 40, 24).astype(np.int32)
        idx[::7] = -1
    elif case == "subnormals":  # flushed to zero by the CPU handlers (XLA's FTZ / DAZ)
        idx = np.arange(24, dtype=np.int32) * 5
        values = (values * np.float32(1e-39)).astype(np.float32)
        values[::3] = np.float32(1.5e-38) * (-1) ** rank  # normal, sums subnormal
    elif case == "empty_on_last" and rank == P - 1:
        idx[:] = -1
        values[:] = 0.0
    return values, idx


@functools.lru_cache(maxsize=None)
def compiled(algorithm, *options):
    """One program per algorithm and options, shared by the cases (one compile each)."""
    kw = dict(options)
    return jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=N, algorithm=algorithm,
                                                     return_stats=True, **kw))


def run(values, indices, algorithm, **kw):
    fn = compiled(algorithm, *sorted(kw.items()))
    out, stats = fn(values, indices)
    out, stats = np.asarray(out), stats.as_dict()
    if ON_GPU:  # the CPU handler on the same call: the CPU path, bit for bit
        cpu = jax.devices("cpu")[0]
        want, want_stats = fn(jax.device_put(values, cpu), jax.device_put(indices, cpu))
        want = np.asarray(want)
        differ = bits_differ(out, want)  # bit for bit, except a NaN's payload
        assert differ.size == 0, (f"GPU and CPU differ at {differ[:8]}: {out[differ[:8]]} "
                                  f"against {want[differ[:8]]}")
        assert stats == want_stats.as_dict()
    return out, stats


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", ["random", "signed_zeros", "cancelling", "shared",
                                  "padding_inside", "unsorted_duplicates", "subnormals",
                                  "empty_on_last"])
def test_equals_the_cpu_path(algorithm, case):
    values, indices = contribution(case, RANK)
    out, stats = run(values, indices, algorithm)  # the handler compares bit for bit
    ref = sparse_allreduce_reference(WORLD.allgather((values, indices)), N)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-38)  # subnormals: flushed
    assert_same_on_all_ranks(out)
    # nonzeros as the handlers count them: under XLA's DAZ a subnormal compares equal to
    # 0 (a value passed through without an addition, as at one rank, stays subnormal)
    assert stats["result_nnz"] == int(np.count_nonzero(np.abs(out) >= np.finfo(np.float32).tiny))
    if case == "signed_zeros" and algorithm == "allgather":
        # the sums are formed on the device as the CPU path's: (0 + v0) + v1 ..., so a
        # zero is +0 (the merging algorithms keep a lone -0 entry, on both paths)
        assert not np.signbit(out[out == 0]).any()


@pytest.mark.parametrize("algorithm", ["allgather", "recursive_doubling"])
def test_nan_propagates(algorithm):
    values, indices = contribution("shared", RANK)
    values[4] = np.nan if RANK == 0 else np.inf
    out, _ = run(values, indices, algorithm, nan_policy="propagate")
    assert np.isnan(out[indices[4]]) or P == 1
    assert_same_on_all_ranks(out)


@pytest.mark.parametrize("algorithm", ["allgather", "recursive_doubling"])
@pytest.mark.parametrize("wire", [dict(wire_dtype=jnp.bfloat16), dict(wire_dtype=jnp.float16),
                                  dict(index_encoding="auto")])
@pytest.mark.parametrize("case", ["random", "unsorted_duplicates"])
def test_wire_formats(algorithm, wire, case):
    values, indices = contribution(case, RANK)
    out, _ = run(values, indices, algorithm, **wire)
    contributions = WORLD.allgather((values, indices))
    ref = sparse_allreduce_reference(contributions, N)
    # each value and partial sum rounded to the wire (bfloat16: 2^-8) at most P + 1 times
    magnitudes = sparse_allreduce_reference([(np.abs(v), i) for v, i in contributions], N)
    assert np.all(np.abs(out - ref) <= (P + 1) * 2.0**-8 * magnitudes)
    assert_same_on_all_ranks(out)


@pytest.mark.parametrize("algorithm", ["allgather", "hash_partition"])
def test_errors_are_the_cpu_paths(algorithm):
    values, indices = contribution("random", RANK)
    if RANK == P - 1:
        indices[5] = N + 3
    with raises_mpi_error(rf"`indices` out of range on rank {P - 1}: indices\[5\] = {N + 3}"):
        run(values, indices, algorithm)
    values, indices = contribution("random", RANK)
    if RANK == 0:
        values[2] = np.inf
    with raises_mpi_error(r"non-finite \(NaN or Inf\) entries in `values` on rank\(s\) 0"):
        run(values, indices, algorithm)


@pytest.mark.skipif(ON_GPU, reason="the CPU seam's comparison")
def test_a_flipped_bit_fails_the_comparison():
    # the comparison runs: one bit of the device protocol's output flipped is caught
    values, indices = contribution("random", RANK)
    os.environ["JSS_TEST_DEVICE_PROTOCOL_FLIP"] = "1"
    try:
        with raises_mpi_error(r"JSS_TEST_DEVICE_PROTOCOL=compare\): out\[0\] has bits \d+, "
                              r"the CPU path's \d+"):
            run(values, indices, "allgather")
    finally:
        del os.environ["JSS_TEST_DEVICE_PROTOCOL_FLIP"]
    out, _ = run(values, indices, "allgather")
    assert_same_on_all_ranks(out)
