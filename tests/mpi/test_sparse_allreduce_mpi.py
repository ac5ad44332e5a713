"""sparse_allreduce on every rank against the NumPy reference.

Every algorithm, every overlap pattern, float32 and bfloat16; results are
checked against the reference, bitwise identity across ranks, and the byte
counts against the cost model.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from reference import (hash_owner_reference, hash_partition_bytes_sent,
                       sparse_allreduce_reference, split_allgather_bytes_sent)

import jax_sparse_sync as jss
from jax_sparse_sync.planning import cost_model

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
ALGORITHMS = ["dense", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather", "hash_partition"]
N = 4096


def make_pattern(pattern: str, n: int, k: int, rank: int, nranks: int):
    """(values, indices) of one rank for an overlap pattern."""
    rng = np.random.default_rng(1000 + rank)
    if pattern == "random":
        idx = rng.choice(n, k, replace=False)
    elif pattern == "same":  # every rank picks the same indices: full overlap
        idx = np.random.default_rng(7).choice(n, k, replace=False)
    elif pattern == "disjoint":  # no two ranks share an index (k capped at n / P)
        idx = np.arange(min(k, n // nranks)) * nranks + rank
    elif pattern == "k_equals_n":
        idx = np.arange(n)
    elif pattern == "all_zero":  # what top-k of an all-zero gradient gives
        return np.zeros(k, np.float32), np.arange(k, dtype=np.int32)
    elif pattern == "padding":  # half of the slots are padding (-1)
        idx = rng.choice(n, k, replace=False)
        idx[::2] = -1
    elif pattern == "duplicates_unsorted":
        idx = rng.integers(0, n // 8, k)
    elif pattern == "cancelling":  # the same indices, +v on even ranks and -v on odd ones:
        idx = np.arange(0, 2 * k, 2)  # sums of exactly 0 (P even) count as zero
        values = np.linspace(0.5, 2.0, k).astype(np.float32) * (-1.0 if rank % 2 else 1.0)
        return values.astype(np.float32), idx.astype(np.int32)
    elif pattern == "uneven":  # ranks contribute different numbers of entries
        idx = rng.choice(n, k * (rank + 1) // nranks + 1, replace=False)
    elif pattern == "concentrated":  # every rank's entries in the first N/8 (embedding rows)
        idx = rng.choice(n // 8, min(k, n // 8), replace=False)
    else:
        raise ValueError(pattern)
    values = rng.standard_normal(len(idx)).astype(np.float32)
    return values, idx.astype(np.int32)


def run(values, indices, size, algorithm, **kw):
    fn = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=size, algorithm=algorithm,
                                                   return_stats=True, **kw))
    out, stats = fn(values, indices)
    return np.asarray(out), stats.as_dict()


PATTERNS = ["random", "same", "disjoint", "k_equals_n", "all_zero", "padding",
            "duplicates_unsorted", "cancelling", "uneven"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_matches_reference_float32(algorithm, pattern):
    k = N if pattern == "k_equals_n" else min(64, N // P)
    values, indices = make_pattern(pattern, N, k, RANK, P)
    out, stats = run(values, indices, N, algorithm)
    ref = sparse_allreduce_reference(WORLD.allgather((values, indices)), N)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert_same_on_all_ranks(out)
    assert stats["result_nnz"] == int(np.count_nonzero(out))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pattern", ["random", "disjoint"])
def test_matches_reference_bfloat16(algorithm, pattern):
    values, indices = make_pattern(pattern, N, 32, RANK, P)
    values = values.astype(ml_dtypes.bfloat16)
    out, _ = run(values, indices, N, algorithm)
    assert out.dtype == ml_dtypes.bfloat16
    ref = sparse_allreduce_reference(WORLD.allgather((values.astype(np.float32), indices)), N)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2e-2, atol=2e-2)
    assert_same_on_all_ranks(out)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_empty_contribution(algorithm):
    # capacity 0 (e.g. a threshold above max |g|): nothing to send, nothing hangs
    values, indices = np.zeros(0, np.float32), np.zeros(0, np.int32)
    out, stats = run(values, indices, 100, algorithm)
    assert out.shape == (100,) and not out.any()
    assert stats["result_nnz"] == 0


@pytest.mark.parametrize("algorithm", ["dense", "allgather"])
def test_bytes_match_cost_model_exactly(algorithm):
    k = 50
    values, indices = make_pattern("random", N, k, RANK, P)
    _, stats = run(values, indices, N, algorithm)
    vol = cost_model.wire_volume(algorithm, nranks=P, size=N, k=k, rank=RANK)
    assert vol.bytes_min == vol.bytes_max == stats["bytes_sent"]
    assert stats["messages"] == vol.messages


@pytest.mark.parametrize("pattern,bound", [("same", "min"), ("disjoint", "max"), ("random", None)])
@pytest.mark.parametrize("k", [8, 600])
def test_recursive_doubling_bytes_within_model_bounds(pattern, bound, k):
    # k = 600 with P >= 4 pushes the disjoint union past N/2: the stream goes dense
    values, indices = make_pattern(pattern, N, k, RANK, P)
    k = len(indices)  # the disjoint pattern caps k at N / P
    out, stats = run(values, indices, N, "recursive_doubling")
    vol = cost_model.wire_volume("recursive_doubling", nranks=P, size=N, k=k, rank=RANK)
    assert vol.bytes_min <= stats["bytes_sent"] <= vol.bytes_max
    if bound == "min":
        assert stats["bytes_sent"] == vol.bytes_min
    elif bound == "max":
        assert stats["bytes_sent"] == vol.bytes_max
    # the stream turns dense iff the union of indices passes delta = N/2
    union = len(set(np.concatenate([i for _, i in WORLD.allgather((values, indices))]).tolist()))
    assert stats["switched_to_dense"] == int(union > N // 2), (union, stats)
    assert_same_on_all_ranks(stats["switched_to_dense"], "switched_to_dense")


@pytest.mark.parametrize("algorithm", ["split_allgather", "dsar_split_allgather"])
@pytest.mark.parametrize("pattern", ["random", "same", "disjoint", "padding", "uneven"])
@pytest.mark.parametrize("k", [8, 600])
def test_split_allgather_bytes_exact_and_within_model_bounds(algorithm, pattern, k):
    values, indices = make_pattern(pattern, N, k, RANK, P)
    out, stats = run(values, indices, N, algorithm)
    all_indices = [i for _, i in WORLD.allgather((values, indices))]
    expect = split_allgather_bytes_sent(all_indices, RANK, N, algorithm == "dsar_split_allgather")
    assert stats["bytes_sent"] == expect
    k_real = len(np.unique(indices[indices >= 0]))
    vol = cost_model.wire_volume(algorithm, nranks=P, size=N, k=k_real, rank=RANK)
    assert vol.bytes_min <= stats["bytes_sent"] <= vol.bytes_max
    assert stats["messages"] <= vol.messages
    # received bytes summed over ranks equal sent bytes summed over ranks
    assert sum(WORLD.allgather(stats["bytes_sent"])) == sum(WORLD.allgather(stats["bytes_received"]))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_dsar_qsgd_dense_phase(bits):
    k, bucket = 300, 256
    values, indices = make_pattern("random", N, k, RANK, P)
    fn = jax.jit(lambda v, i, s: jss.sparse_allreduce(
        v, i, size=N, algorithm="dsar_split_allgather", quantize_bits=bits, qsgd_bucket=bucket,
        seed=s, return_stats=True))
    out, stats = fn(values, indices, jnp.int32(5))
    out = np.asarray(out)
    assert_same_on_all_ranks(out)  # each range is quantized once, by its owner
    all_inputs = WORLD.allgather((values, indices))
    ref = sparse_allreduce_reference(all_inputs, N)
    # each entry is within one quantization step of its range's bucket maximum
    levels = 2 ** (bits - 1) - 1
    bounds = [N * q // P for q in range(P + 1)]
    for q in range(P):
        for lo in range(bounds[q], bounds[q + 1], bucket):
            hi = min(lo + bucket, bounds[q + 1])
            step = np.abs(ref[lo:hi]).max() / levels
            assert np.all(np.abs(out[lo:hi] - ref[lo:hi]) <= step * (1 + 1e-5) + 1e-6)
    expect = split_allgather_bytes_sent([i for _, i in all_inputs], RANK, N, True, bits, bucket)
    assert int(stats.bytes_sent) == expect
    vol = cost_model.wire_volume("dsar_split_allgather", nranks=P, size=N, k=k, rank=RANK,
                                 quantize_bits=bits, qsgd_bucket=bucket)
    assert vol.bytes_min <= int(stats.bytes_sent) <= vol.bytes_max
    # a new seed gives a different (but again identical across ranks) rounding
    out2 = np.asarray(fn(values, indices, jnp.int32(6))[0])
    assert_same_on_all_ranks(out2)
    assert P == 1 or np.any(out2 != out) or bits == 8


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_quantize_bits_mismatch_across_ranks():
    bits = 4 if RANK == 0 else 8
    with raises_mpi_error(r"rank 0 uses 'dsar_split_allgather \(quantize_bits=4\)'"):
        jax.block_until_ready(jss.sparse_allreduce(
            np.ones(2, np.float32), np.arange(2, dtype=np.int32), size=10,
            algorithm="dsar_split_allgather", quantize_bits=bits))


def test_auto_picks_the_same_algorithm_everywhere_and_is_correct():
    values, indices = make_pattern("random", N, 40, RANK, P)
    out, _ = run(values, indices, N, "auto")
    ref = sparse_allreduce_reference(WORLD.allgather((values, indices)), N)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_scan_keeps_collectives_in_order():
    # several allreduces inside one lax.scan: the ordered effect keeps them in order
    values, indices = make_pattern("random", N, 16, RANK, P)

    def body(carry, scale):
        out = jss.sparse_allreduce(values * scale, indices, size=N, algorithm="recursive_doubling")
        return carry + out, out.sum()

    total, _ = jax.jit(lambda: jax.lax.scan(body, jnp.zeros(N), jnp.arange(1.0, 4.0)))()
    ref = 6.0 * sparse_allreduce_reference(WORLD.allgather((values, indices)), N)
    np.testing.assert_allclose(np.asarray(total), ref, rtol=1e-5, atol=1e-5)


# ---- bad input: the same clear error on every rank, and no hang -----------------------------


def _expect_error_everywhere(match, values, indices, size, algorithm="allgather", **kw):
    with raises_mpi_error(match):
        run(values, indices, size, algorithm, **kw)
    # the communicator is still usable afterwards
    ok_v, ok_i = np.ones(2, np.float32), np.array([0, 1], np.int32)
    out, _ = run(ok_v, ok_i, 8, "recursive_doubling")
    assert out[0] == P


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_size_mismatch_across_ranks(algorithm):
    size = 100 if RANK == 0 else 101
    _expect_error_everywhere(r"`size` differs across ranks: rank 0 passed size=100 but rank 1",
                             np.ones(3, np.float32), np.arange(3, dtype=np.int32), size, algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_index_out_of_range_on_last_rank(algorithm):
    indices = np.array([0, 5, 1], np.int32)
    if RANK == P - 1:
        indices[1] = 100
    _expect_error_everywhere(rf"`indices` out of range on rank {P - 1}: indices\[1\] = 100",
                             np.ones(3, np.float32), indices, 100, algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nan_raises_on_every_rank(algorithm):
    values = np.ones(3, np.float32)
    if RANK == 0:
        values[2] = np.nan
    _expect_error_everywhere(r"non-finite \(NaN or Inf\) entries in `values` on rank\(s\) 0",
                             values, np.arange(3, dtype=np.int32), 10, algorithm)


def test_dense_input_keeps_the_nan_policy_and_stats():
    # indices = arange(size) (dense_sync's call) takes the dense shortcut of the
    # dense algorithm: the same result, statistics and NaN checks as a stream
    values = np.random.default_rng(RANK).standard_normal(64).astype(np.float32)
    values[::5] = 0.0
    indices = np.arange(64, dtype=np.int32)
    out, stats = run(values, indices, 64, "dense")
    np.testing.assert_allclose(out, sum(v for v, _ in WORLD.allgather((values, indices))),
                               rtol=1e-6, atol=1e-6)
    assert stats["result_nnz"] == int(np.count_nonzero(out))
    vol = cost_model.wire_volume("dense", nranks=P, size=64, k=64, rank=RANK)
    assert stats["bytes_sent"] == vol.bytes_min == vol.bytes_max
    if RANK == P - 1:
        values[7] = np.nan
    _expect_error_everywhere(rf"non-finite \(NaN or Inf\) entries in `values` on rank\(s\) {P - 1}",
                             values, indices, 64, "dense")
    out, _ = run(values, indices, 64, "dense", nan_policy="propagate")
    assert np.isnan(out[7])


def test_nan_propagate_policy():
    values = np.ones(3, np.float32)
    if RANK == 0:
        values[2] = np.nan
    out, _ = run(values, np.arange(3, dtype=np.int32), 10, "recursive_doubling",
                 nan_policy="propagate")
    assert np.isnan(out[2]) and out[0] == P


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_algorithm_mismatch_across_ranks():
    algorithm = "allgather" if RANK == 0 else "recursive_doubling"
    _expect_error_everywhere(r"`algorithm` differs across ranks \(rank 0 uses 'allgather', rank 1 uses 'recursive_doubling'\)", np.ones(2, np.float32),
                             np.arange(2, dtype=np.int32), 10, algorithm)


def test_trace_time_errors():
    with pytest.raises(TypeError, match=r"`indices` has dtype int64|`indices` has dtype"):
        jss.sparse_allreduce(jnp.ones(2), jnp.ones(2, jnp.float32), size=4)
    with pytest.raises(TypeError, match="`values` has dtype int32"):
        jss.sparse_allreduce(jnp.ones(2, jnp.int32), jnp.arange(2, dtype=jnp.int32), size=4)
    with pytest.raises(ValueError, match="same length"):
        jss.sparse_allreduce(jnp.ones(3), jnp.arange(2, dtype=jnp.int32), size=4)
    with pytest.raises(ValueError, match="unknown `algorithm` 'ring'"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4, algorithm="ring")
    with pytest.raises(ValueError, match="`nan_policy`"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4, nan_policy="x")


@pytest.mark.parametrize("pattern", ["random", "same", "disjoint", "padding", "uneven",
                                     "concentrated", "k_equals_n"])
@pytest.mark.parametrize("k", [8, 300])
def test_hash_partition_bytes_exact_and_within_model_bounds(pattern, k):
    values, indices = make_pattern(pattern, N, k, RANK, P)
    out, stats = run(values, indices, N, "hash_partition")
    everyone = WORLD.allgather((values, indices))
    np.testing.assert_allclose(out, sparse_allreduce_reference(everyone, N), rtol=1e-5, atol=1e-5)
    assert_same_on_all_ranks(out)
    all_indices = [i for _, i in everyone]
    assert stats["bytes_sent"] == hash_partition_bytes_sent(all_indices, RANK, N)
    assert stats["switched_to_dense"] == 0 and stats["algorithm"] == "hash_partition"
    k_real = len(np.unique(indices[indices >= 0]))
    vol = cost_model.wire_volume("hash_partition", nranks=P, size=N, k=k_real, rank=RANK)
    assert vol.bytes_min <= stats["bytes_sent"] <= vol.bytes_max
    assert stats["messages"] <= vol.messages


def test_hash_partition_balances_a_concentrated_support():
    # All entries in the first N/8: split-allgather's owner 0 merges all of them,
    # hash_partition's owners about 1/P each (the same support, every rank's count).
    values, indices = make_pattern("concentrated", N, 300, RANK, P)
    union = np.unique(np.concatenate([i for _, i in WORLD.allgather((values, indices))]))
    shares = np.bincount(hash_owner_reference(union, P), minlength=P)
    if P > 1:
        assert shares.max() <= 1.3 * shares.mean(), shares
    _, hashed = run(values, indices, N, "hash_partition")
    _, split = run(values, indices, N, "split_allgather")
    sent_hash = WORLD.allgather(hashed["bytes_sent"])
    sent_split = WORLD.allgather(split["bytes_sent"])
    if P > 2:  # the busiest rank sends less under the hash
        assert max(sent_hash) < max(sent_split), (sent_hash, sent_split)


@pytest.mark.parametrize("algorithm", ["allgather", "dense"])
def test_a_large_output_is_zeroed_then_summed(algorithm):
    # Past kernels/dense_fill.h's streaming threshold (2^20 floats) the dense result is
    # zeroed with streaming stores before the entries land (a size not a multiple of 4,
    # the first and last slot among the entries): allgather's sum is the rank-order sum
    # bit for bit, dense's MPI_Allreduce's (any order of the same operands).
    n = (1 << 20) + 5
    rng = np.random.default_rng(50 + RANK)
    inner = rng.choice(np.arange(1, n - 1), 300, replace=False)
    indices = np.sort(np.concatenate([[0, n - 1], inner])).astype(np.int32)
    values = rng.standard_normal(len(indices)).astype(np.float32)
    out, stats = run(values, indices, n, algorithm)
    expect = np.zeros(n, np.float32)
    for v, i in WORLD.allgather((values, indices)):
        expect[i] += v
    if algorithm == "allgather":
        np.testing.assert_array_equal(out.view(np.uint32), expect.view(np.uint32))
    else:
        np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-6)
    assert_same_on_all_ranks(out)
    assert stats["result_nnz"] == int(np.count_nonzero(expect))
