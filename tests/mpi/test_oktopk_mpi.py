"""oktopk_allreduce against the NumPy reference: the global top-k of the sum,
the contribution mask entry by entry, the balancing path, reuse of state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from reference import hash_owner_reference, oktopk_reference
from test_sparse_allreduce_mpi import make_pattern

import jax_sparse_sync as jss
from jax_sparse_sync.model import cost_model as cm

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
N = 4096


def run(values, indices, k, **kw):
    fn = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=N, k=k, **kw))
    return jax.tree_util.tree_map(np.asarray, fn(values, indices))


def check_against_reference(values, indices, k, result, threshold=None):
    contributions = WORLD.allgather((values, indices))
    ref, ref_thr, masks = oktopk_reference(contributions, N, k, threshold)
    np.testing.assert_allclose(result.sum, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(result.contributed, masks[RANK])  # entry by entry
    assert int(result.stats.result_nnz) == np.count_nonzero(ref)
    assert_same_on_all_ranks(result.sum)
    return ref_thr


@pytest.mark.parametrize("pattern", ["random", "same", "disjoint", "padding", "duplicates_unsorted"])
@pytest.mark.parametrize("k", [1, 30, 200])
def test_exact_matches_reference(pattern, k):
    values, indices = make_pattern(pattern, N, 60, RANK, P)
    result = run(values, indices, k)
    ref_thr = check_against_reference(values, indices, k, result)
    assert float(result.threshold) == pytest.approx(ref_thr, rel=1e-6)
    assert result.boundaries[0] == 0 and result.boundaries[-1] == N
    assert np.all(np.diff(result.boundaries) >= 0)
    assert_same_on_all_ranks(result.boundaries)


def test_skewed_input_takes_the_balancing_path():
    # every rank's entries sit in region 0 of an even split: one owner selects all
    rng = np.random.default_rng(RANK)
    indices = rng.choice(N // (2 * P), 50, replace=False).astype(np.int32)
    values = rng.standard_normal(50).astype(np.float32)
    result = run(values, indices, 50, recompute_boundaries=False)
    check_against_reference(values, indices, 50, result)
    # largest share > 4x the mean happens once P > 4
    assert int(result.stats.switched_to_dense) == int(P > 4)


def test_skewed_input_on_a_16bit_wire_balances_the_same_and_agrees_on_every_rank():
    # the balancing step's point-to-point pieces and the allgatherv as 16-bit messages:
    # the same selection as float32 on the rounded inputs, the sums rounded once more
    rng = np.random.default_rng(RANK)
    indices = rng.choice(N // (2 * P), 50, replace=False).astype(np.int32)
    values = rng.standard_normal(50).astype(np.float32)
    result = run(values, indices, 50, recompute_boundaries=False, wire_dtype=jnp.bfloat16)
    rounded = np.asarray(jnp.asarray(values).astype(jnp.bfloat16).astype(jnp.float32))
    ref, _, masks = oktopk_reference(WORLD.allgather((rounded, indices)), N, 50)
    np.testing.assert_array_equal(result.sum != 0, ref != 0)
    np.testing.assert_allclose(result.sum, ref, rtol=2.0**-8 + 1e-6, atol=0)
    np.testing.assert_array_equal(result.contributed, masks[RANK])
    assert_same_on_all_ranks(result.sum)
    assert int(result.stats.switched_to_dense) == int(P > 4)
    plain = run(rounded, indices, 50, recompute_boundaries=False)
    assert int(result.stats.bytes_sent) < int(plain.stats.bytes_sent) or P == 1


def test_empty_and_dense_inputs():
    empty = run(np.zeros(4, np.float32), -np.ones(4, np.int32), 10)
    assert not empty.sum.any() and not empty.contributed.any()
    values = np.random.default_rng(RANK).standard_normal(N).astype(np.float32)
    dense = run(values, np.arange(N, dtype=np.int32), N // 3)
    check_against_reference(values, np.arange(N, dtype=np.int32), N // 3, dense)


def test_reused_threshold_and_boundaries():
    values, indices = make_pattern("random", N, 80, RANK, P)
    first = run(values, indices, 40)
    # a second call reusing the state: the same regions, a given threshold
    reused = run(values, indices, 40, boundaries=first.boundaries,
                 global_threshold=float(first.threshold) * 1.1,
                 recompute_boundaries=False, recompute_threshold=False)
    check_against_reference(values, indices, 40, reused, threshold=float(first.threshold) * 1.1)
    np.testing.assert_array_equal(reused.boundaries, first.boundaries)
    assert np.count_nonzero(reused.sum) <= np.count_nonzero(first.sum)


def tied_pattern(count=80):
    """Integer values on overlapping indices: sums with many equal magnitudes."""
    rng = np.random.default_rng(2000 + RANK)
    indices = rng.choice(N // 4, count, replace=False).astype(np.int32)
    return (rng.integers(1, 3, count) * rng.choice([-1, 1], count)).astype(np.float32), indices


def assert_matches_reference(result, contributions, threshold, **reference_kw):
    """The allreduce's sum, this rank's contributed mask and the result count equal
    ``oktopk_reference``'s (k = 40), and the sum is the same on every rank."""
    ref, _, masks = oktopk_reference(contributions, N, 40, threshold, **reference_kw)
    np.testing.assert_allclose(result.sum, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(result.contributed, masks[RANK])
    assert int(result.stats.result_nnz) == np.count_nonzero(ref)
    assert_same_on_all_ranks(result.sum)


@pytest.mark.parametrize("pattern", ["random", "same", "padding", "ties"])
@pytest.mark.parametrize("threshold,region_counts", [
    (0.0, (0, 5)),     # everything qualifies: each owner keeps its top 5
    (0.3, (2, 9)),     # some regions over 9, some under: capped where over
    (1e9, (7, 12)),    # nothing qualifies: each owner keeps its top 7
    (2.5, (4, 4)),     # exactly 4 per region (ties at the cut: the lower index)
    (1.5, (0, 10**9)),  # limits that never bind: the threshold alone
])
def test_region_counts_match_reference(pattern, threshold, region_counts):
    values, indices = tied_pattern() if pattern == "ties" else make_pattern(pattern, N, 60, RANK, P)
    bounds = np.array([0] + [N * q // (2 * P) + q for q in range(1, P)] + [N], np.int32)
    result = run(values, indices, 40, boundaries=bounds, global_threshold=threshold,
                 recompute_boundaries=False, recompute_threshold=False,
                 region_counts=region_counts)
    contributions = WORLD.allgather((values, indices))
    assert_matches_reference(result, contributions, threshold, boundaries=bounds,
                             region_counts=region_counts)
    lo, hi = region_counts
    kept = np.flatnonzero(result.sum)
    for a, b in zip(bounds[:-1], bounds[1:]):
        got = np.count_nonzero((kept >= a) & (kept < b))
        assert got <= hi
        if threshold > 1e8:
            nonzero = np.count_nonzero(ref_sum_nonzero(contributions)[a:b])
            assert got == min(lo, nonzero)
    # without limits: every entry at or above the threshold
    plain, _, _ = oktopk_reference(contributions, N, 40, threshold)
    if region_counts == (0, 10**9):
        np.testing.assert_allclose(result.sum, plain, rtol=1e-5, atol=1e-6)


def ref_sum_nonzero(contributions):
    total = np.zeros(N, np.float64)
    for v, i in contributions:
        np.add.at(total, i[i >= 0], v[i >= 0])
    return total != 0


def test_region_counts_apply_to_reused_thresholds_only():
    values, indices = make_pattern("random", N, 60, RANK, P)
    result = run(values, indices, 40, region_counts=(0, 1))  # exact threshold: the top 40
    check_against_reference(values, indices, 40, result)


def test_receive_volume_meets_the_lower_bound():
    k = 64
    values, indices = make_pattern("random", N, k, RANK, P)
    result = run(values, indices, k)
    stats = result.stats.as_dict()
    received = WORLD.allgather(stats["bytes_received"])
    total = int(result.stats.result_nnz)
    # each rank must receive the entries it did not select itself: on average
    # at least 8 * T (P - 1) / P bytes (Ok-Topk's 2k (P-1)/P words, T ~ k)
    assert np.mean(received) >= 8 * total * (P - 1) / P


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`k` must be an int in \[1, 4096\]"):
        jss.oktopk_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N, k=0)
    with pytest.raises(ValueError, match=r"`boundaries` must have shape"):
        jss.oktopk_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N, k=1,
                             boundaries=jnp.zeros(P + 2, jnp.int32))
    with raises_mpi_error("`boundaries` must start at 0"):
        jax.block_until_ready(jss.oktopk_allreduce(
            jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N, k=1,
            boundaries=jnp.full(P + 1, 5, jnp.int32), recompute_boundaries=False).sum)
    for bad in [(3, 2), (-1, 2), (1.5, 2), 4, "ab", (1, 2, 3), (True, 2)]:
        with pytest.raises(ValueError, match="`region_counts` must be None or a pair"):
            jss.oktopk_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N, k=1,
                                 region_counts=bad)
    with pytest.raises(ValueError, match="use jss.oktopk_allreduce"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N, algorithm="oktopk")


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_k_mismatch_across_ranks():
    with raises_mpi_error(r"`k` differs across ranks: rank 0 passed k=3 but rank 1"):
        jax.block_until_ready(jss.oktopk_allreduce(
            np.ones(2, np.float32), np.arange(2, dtype=np.int32), size=N, k=3 + (RANK > 0)).sum)


# ---- partition="hash": the owners are hash owners (issue 35) -----------------------------

OWNERS = hash_owner_reference(np.arange(N), P)  # each index's hash owner


def same_bits(a, b):
    np.testing.assert_array_equal(np.asarray(a, np.float32).view(np.int32),
                                  np.asarray(b, np.float32).view(np.int32))


@pytest.mark.parametrize("pattern", ["random", "same", "disjoint", "padding",
                                     "duplicates_unsorted"])
@pytest.mark.parametrize("k", [1, 200])
def test_hash_owners_with_the_exact_threshold_equal_the_regions(pattern, k):
    values, indices = make_pattern(pattern, N, 60, RANK, P)
    regions = run(values, indices, k)
    hashed = run(values, indices, k, partition="hash")
    check_against_reference(values, indices, k, hashed)
    # the same selection; the same sums up to the order of the additions (hash owners
    # add ranks 0, 1, ..., P-1; a region's owner starts with its own slice)
    np.testing.assert_array_equal(hashed.sum != 0, regions.sum != 0)
    np.testing.assert_allclose(hashed.sum, regions.sum, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(hashed.contributed, regions.contributed)
    assert float(hashed.threshold) == pytest.approx(float(regions.threshold), rel=1e-6)
    if P == 2:  # two addends commute: bit for bit
        same_bits(hashed.sum, regions.sum)
        assert float(hashed.threshold) == float(regions.threshold)
    # and the kept sums are the hash partition's (the same owners, the same order) bit for bit
    full = np.asarray(jax.jit(lambda v, i: jss.sparse_allreduce(
        v, i, size=N, algorithm="hash_partition"))(values, indices))
    kept = hashed.sum != 0
    same_bits(hashed.sum[kept], full[kept])
    # the boundaries pass through unused (the default: an even split)
    np.testing.assert_array_equal(hashed.boundaries, [N * q // P for q in range(P + 1)])


@pytest.mark.parametrize("pattern", ["random", "ties"])
@pytest.mark.parametrize("threshold,region_counts", [
    (0.0, (0, 5)),      # everything qualifies: each hash owner keeps its top 5
    (0.3, (2, 9)),      # some owners over 9: capped there
    (1e9, (7, 12)),     # nothing qualifies: each owner keeps its top 7
    (2.5, (4, 4)),      # exactly 4 per owner (ties at the cut: the lower index)
    (1.5, None),        # the threshold alone
])
def test_hash_owners_with_a_reused_threshold_match_the_reference(pattern, threshold,
                                                                 region_counts):
    values, indices = tied_pattern() if pattern == "ties" else make_pattern(pattern, N, 60, RANK, P)
    # boundaries that would be rejected with regions: unused with hash owners
    result = run(values, indices, 40, boundaries=np.full(P + 1, 7, np.int32),
                 global_threshold=threshold, recompute_boundaries=False,
                 recompute_threshold=False, region_counts=region_counts, partition="hash")
    contributions = WORLD.allgather((values, indices))
    assert_matches_reference(result, contributions, threshold, region_counts=region_counts,
                             owners=OWNERS)
    assert_same_on_all_ranks(result.contributed.any(keepdims=True))
    np.testing.assert_array_equal(result.boundaries, np.full(P + 1, 7))
    if region_counts is not None:
        kept = np.flatnonzero(result.sum)
        per_owner = np.bincount(OWNERS[kept], minlength=P)
        assert per_owner.max() <= region_counts[1]


def embedding_rows_pattern(size, count=3000, rows=64, width=256):
    """Each rank's entries on popular rows (Zipf over rows), as an embedding's
    gradient: every rank's support within the first rows x width indices of size."""
    rng = np.random.default_rng(300 + RANK)
    weights = 1.0 / np.arange(1, rows + 1) ** 1.1
    row = rng.choice(rows, 2 * count, p=weights / weights.sum())
    flat = np.unique(row * width + rng.integers(0, width, row.size))
    flat = rng.permutation(flat)[:count]
    return rng.standard_normal(flat.size).astype(np.float32), flat.astype(np.int32)


@pytest.mark.skipif(P < 2, reason="shares need several owners")
def test_hash_owners_balance_a_skewed_support():
    size, k = 1 << 16, 2400
    values, indices = embedding_rows_pattern(size)  # all of it in [0, size / 4)

    def call(**kw):
        fn = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=size, k=k, **kw))
        return jax.tree_util.tree_map(np.asarray, fn(values, indices))

    regions = call(recompute_boundaries=False)  # the even split
    hashed = call(partition="hash")
    # exact thresholds: the same selection (sums up to the order of the additions)
    np.testing.assert_array_equal(hashed.sum != 0, regions.sum != 0)
    kept = np.flatnonzero(hashed.sum)
    assert kept.size >= k
    # each owner's share of the selection (what it gathers to every rank)
    hash_share = np.bincount(hash_owner_reference(kept, P), minlength=P)
    region_share = np.bincount(kept * P // size, minlength=P)
    mean = kept.size / P
    assert hash_share.max() <= 1.15 * mean, hash_share
    assert region_share.max() >= 1.5 * mean, region_share  # all of it in region 0
    # and what each owner received in phase 1: within 15 % of the mean too
    received = np.array(WORLD.allgather(int(hashed.stats.bytes_received)))
    assert received.max() <= 1.15 * received.mean(), received
    assert int(hashed.stats.switched_to_dense) == 0  # no balancing step needed


@pytest.mark.skipif(P < 2, reason="nothing travels at P = 1")
def test_hash_owners_bytes_sent_exactly():
    # the counters against the cost model's control bytes and the payload per owner:
    # header and slice sizes, phase 1 (8 bytes an entry to another owner), the
    # threshold histograms, the selection sizes, this owner's selection to P-1 ranks
    values, indices = make_pattern("random", N, 60, RANK, P)
    k = 50
    result = run(values, indices, k, partition="hash")
    mine = np.unique(indices[indices >= 0])
    phase1 = 8 * np.count_nonzero(OWNERS[mine] != RANK)
    kept = np.flatnonzero(result.sum)
    gathered = 8 * (P - 1) * np.count_nonzero(OWNERS[kept] == RANK)
    control = cm.oktopk_volume(nranks=P, k=0, recompute_boundaries=True,
                               recompute_threshold=True, partition="hash").bytes_min
    assert int(result.stats.bytes_sent) == control + phase1 + gathered
    # regions recomputing their boundaries send the boundary allreduce on top
    regions_control = cm.oktopk_volume(nranks=P, k=0).bytes_min
    assert regions_control - control == 2 * (P - 1) * (P - 1) * 8 // P


def test_bad_partition():
    for bad in ["Hash", "regions ", None, 1]:
        with pytest.raises(ValueError, match=r"`partition` must be one of \('regions', 'hash'\)"):
            jss.oktopk_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N, k=1,
                                 partition=bad)
