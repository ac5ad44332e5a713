"""The sparse allreduce's wire formats on every rank: 16-bit values and encoded indices
(and Ok-Topk's 16-bit values, at the end).

``wire_dtype=bfloat16/float16``: the result is within the wire's rounding of the
float32 NumPy reference, bitwise identical on every rank, and the bytes are the
float32 run's with every value's 4 bytes replaced by 2 (exactly). ``index_encoding=
"auto"``: lossless, so the result equals the int32 run's bit for bit, and every
message's bytes are what :mod:`jax_sparse_sync.ops.index_encoding` says.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from reference import (hash_partition_bytes_sent, oktopk_reference, sparse_allreduce_reference,
                       split_allgather_bytes_sent)
from test_sparse_allreduce_mpi import ALGORITHMS, N, make_pattern

import jax_sparse_sync as jss
from jax_sparse_sync.ops.index_encoding import encoded_sizes
from jax_sparse_sync.planning import cost_model

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
WIRES = {"bfloat16": (jnp.bfloat16, 2.0**-8), "float16": (jnp.float16, 2.0**-11)}
PATTERNS = ["random", "same", "uneven", "concentrated"]


def run(values, indices, algorithm, **kw):
    fn = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=N, algorithm=algorithm,
                                                   return_stats=True, **kw))
    out, stats = fn(values, indices)
    return np.asarray(out), stats.as_dict()


def rounding_bound(contributions, eps):
    """|error| of a sum whose inputs and partial sums are each rounded at most
    ceil(log2 P) + 1 times, relative to the magnitudes summed."""
    mags = sparse_allreduce_reference([(np.abs(v), i) for v, i in contributions], N)
    return (int(np.ceil(np.log2(max(P, 2)))) + 2) * eps * mags


def encoded_message_bytes(value_bytes):
    return lambda idx: encoded_sizes(idx)[min(encoded_sizes(idx), key=lambda k: (
        encoded_sizes(idx)[k], ("list", "delta", "bitmap").index(k)))] + value_bytes * len(idx)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("wire", sorted(WIRES))
def test_16bit_values_within_rounding_and_identical_on_every_rank(algorithm, pattern, wire):
    dtype, eps = WIRES[wire]
    values, indices = make_pattern(pattern, N, min(64, N // P), RANK, P)
    out, stats = run(values, indices, algorithm, wire_dtype=dtype)
    contributions = WORLD.allgather((values, indices))
    ref = sparse_allreduce_reference(contributions, N)
    err = np.abs(out - ref)
    bound = rounding_bound(contributions, eps)
    assert np.all(err <= bound + 1e-30), (float(err.max()), float(bound[err.argmax()]))
    assert_same_on_all_ranks(out)
    assert stats["result_nnz"] == int(np.count_nonzero(out))
    # every value the result holds came through the wire: a rounding was applied
    # (allgather sums the rounded inputs in float32, the others round the sums)
    if algorithm != "allgather":
        np.testing.assert_array_equal(out, np.asarray(jnp.asarray(out).astype(dtype)
                                                      .astype(jnp.float32)))


@pytest.mark.parametrize("algorithm", ["allgather", "split_allgather", "dsar_split_allgather",
                                       "hash_partition"])
@pytest.mark.parametrize("pattern", ["random", "concentrated"])
def test_16bit_values_halve_the_value_bytes_exactly(algorithm, pattern):
    values, indices = make_pattern(pattern, N, min(64, N // P), RANK, P)
    _, stats = run(values, indices, algorithm, wire_dtype=jnp.bfloat16)
    all_indices = [i for _, i in WORLD.allgather((values, indices))]
    six = lambda idx: 6 * len(idx)  # noqa: E731  int32 index + 2-byte value
    if algorithm == "allgather":
        k = len(np.unique(indices[indices >= 0]))
        expect = cost_model.HEADER_BYTES * (P - 1) + 6 * k * (P - 1)
        vol = cost_model.wire_volume("allgather", nranks=P, size=N, k=k, wire_dtype=1)
        assert vol.bytes_min == vol.bytes_max == expect
    elif algorithm == "hash_partition":
        expect = hash_partition_bytes_sent(all_indices, RANK, N, message_bytes=six)
    else:
        expect = split_allgather_bytes_sent(all_indices, RANK, N,
                                            algorithm == "dsar_split_allgather",
                                            message_bytes=six, value_bytes=2)
    assert stats["bytes_sent"] == expect
    assert sum(WORLD.allgather(stats["bytes_sent"])) == \
        sum(WORLD.allgather(stats["bytes_received"]))


def test_dense_algorithm_on_a_16bit_wire_is_the_dense_allreduce():
    values, indices = make_pattern("random", N, 64, RANK, P)
    out, stats = run(values, indices, "dense", wire_dtype=jnp.bfloat16)
    dense = np.zeros(N, np.float32)
    dense[indices] = values
    expect = np.asarray(jss.dense_allreduce(jnp.asarray(dense), wire_dtype=jnp.bfloat16))
    assert out.tobytes() == expect.tobytes()
    vol = cost_model.wire_volume("dense", nranks=P, size=N, k=64, wire_dtype=1)
    assert stats["bytes_sent"] == vol.bytes_max


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pattern", ["random", "same", "k_equals_n", "duplicates_unsorted"])
def test_encoded_indices_give_the_int32_result_bit_for_bit(algorithm, pattern):
    k = N if pattern == "k_equals_n" else min(64, N // P)
    values, indices = make_pattern(pattern, N, k, RANK, P)
    plain, plain_stats = run(values, indices, algorithm)
    out, stats = run(values, indices, algorithm, index_encoding="auto")
    assert out.tobytes() == plain.tobytes()
    assert_same_on_all_ranks(out)
    if algorithm != "dense" and P > 1:
        vol = cost_model.wire_volume(algorithm, nranks=P, size=N, k=len(np.unique(
            indices[indices >= 0])), rank=RANK, index_encoding="auto")
        assert vol.bytes_min <= stats["bytes_sent"] <= vol.bytes_max + 8 * (P - 1)


@pytest.mark.parametrize("algorithm", ["allgather", "split_allgather", "hash_partition"])
@pytest.mark.parametrize("pattern", ["random", "concentrated"])
@pytest.mark.parametrize("wire", [None, jnp.bfloat16])
def test_encoded_bytes_are_the_python_encodings_bytes(algorithm, pattern, wire):
    # every message's length is index_encoding.encode's (the smallest of three) plus
    # the values: the C++ encoder and the Python one agree message by message
    values, indices = make_pattern(pattern, N, min(64, N // P), RANK, P)
    _, stats = run(values, indices, algorithm, index_encoding="auto", wire_dtype=wire)
    all_indices = [i for _, i in WORLD.allgather((values, indices))]
    message = encoded_message_bytes(4 if wire is None else 2)
    if algorithm == "allgather":
        mine = np.unique(indices[indices >= 0])
        expect = cost_model.HEADER_BYTES * (P - 1) + (8 + message(mine)) * (P - 1)
    elif algorithm == "hash_partition":
        expect = hash_partition_bytes_sent(all_indices, RANK, N, message_bytes=message)
    else:
        expect = split_allgather_bytes_sent(all_indices, RANK, N, False, message_bytes=message,
                                            value_bytes=4 if wire is None else 2)
    assert stats["bytes_sent"] == (expect if P > 1 else 0)


def test_16bit_wire_with_quantize_bits_is_a_python_error():
    with pytest.raises(ValueError, match="quantize_bits"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N,
                             algorithm="dsar_split_allgather", quantize_bits=4,
                             wire_dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="index_encoding"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N,
                             algorithm="allgather", index_encoding="gzip")
    with pytest.raises(ValueError, match="wire_dtype"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=N,
                             algorithm="allgather", wire_dtype=jnp.int8)


def test_wire_format_mismatch_raises_on_every_rank():
    values, indices = make_pattern("random", N, 16, RANK, P)
    if P == 1:
        pytest.skip("needs two ranks")
    wire = jnp.bfloat16 if RANK == P - 1 else None
    with raises_mpi_error("wire_dtype=bfloat16"):
        run(values, indices, "allgather", wire_dtype=wire)


def test_topk_sync_on_a_16bit_wire_keeps_the_rounding_in_the_residual():
    # one step: what each rank's sent values lost to rounding is in its residual, so
    # residual + sent (as received) == the accumulator, entry for entry
    rng = np.random.default_rng(5 + RANK)
    g = {"w": jnp.asarray(rng.standard_normal(N).astype(np.float32))}
    k = 32
    tx = jss.topk_sync(k=k, algorithm="allgather", wire_dtype=jnp.bfloat16)
    state = tx.init(g)
    updates, state = jax.jit(tx.update)(g, state)
    residual = np.asarray(state.residual)
    acc = np.asarray(g["w"])
    sent = np.argsort(-np.abs(acc), kind="stable")[:k]
    rounded = np.asarray(jnp.asarray(acc[sent]).astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(residual[sent], acc[sent] - rounded)
    rest = np.setdiff1d(np.arange(N), sent)
    np.testing.assert_array_equal(residual[rest], acc[rest])
    # the update: the mean of every rank's rounded values, summed in float32
    contributions = WORLD.allgather((rounded, sent.astype(np.int32)))
    ref = sparse_allreduce_reference(contributions, N) / P
    np.testing.assert_allclose(np.asarray(updates["w"]), ref, rtol=1e-6, atol=1e-7)
    assert_same_on_all_ranks(np.asarray(updates["w"]))
    stats = jss.SyncStats.from_vector(jss.last_stats(state)).as_dict()
    assert stats["bytes_sent"] == (cost_model.HEADER_BYTES + 6 * k) * (P - 1)


def test_grouped_topk_sync_with_encoded_indices_matches_topk_sync():
    rng = np.random.default_rng(11 + RANK)
    g = {"a": jnp.asarray(rng.standard_normal(300).astype(np.float32)),
         "b": jnp.asarray(rng.standard_normal(500).astype(np.float32))}
    plain = jss.topk_sync(k=40, algorithm="split_allgather")
    grouped = jss.grouped_topk_sync([((0, 1), "normal")], k=40, algorithm="split_allgather",
                                    index_encoding="auto", wire_dtype=jnp.bfloat16)
    wired = jss.topk_sync(k=40, algorithm="split_allgather", index_encoding="auto",
                          wire_dtype=jnp.bfloat16)
    u0, _ = jax.jit(plain.update)(g, plain.init(g))
    u1, s1 = jax.jit(grouped.update)(g, grouped.init(g))
    u2, s2 = jax.jit(wired.update)(g, wired.init(g))
    for key in g:
        assert np.asarray(u1[key]).tobytes() == np.asarray(u2[key]).tobytes()
        # the mean of P rounded values: within the wire's rounding of the largest magnitudes
        largest = max(WORLD.allgather(float(np.abs(np.asarray(g[key])).max())))
        np.testing.assert_allclose(np.asarray(u2[key]), np.asarray(u0[key]), rtol=0,
                                   atol=(np.ceil(np.log2(max(P, 2))) + 2) * 2.0**-8 * largest)
    np.testing.assert_array_equal(np.asarray(s1.residual), np.asarray(s2.residual))


# ---- Ok-Topk on a 16-bit wire ------------------------------------------------------------------
def rounded_to(values, dtype):
    return np.asarray(jnp.asarray(values, jnp.float32).astype(dtype).astype(jnp.float32))


def run_oktopk(values, indices, k, **kw):
    fn = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=N, k=k, **kw))
    return jax.tree_util.tree_map(np.asarray, fn(values, indices))


@pytest.mark.parametrize("pattern", ["random", "same", "concentrated", "padding"])
@pytest.mark.parametrize("wire", sorted(WIRES))
def test_oktopk_16bit_values_within_rounding_and_identical_on_every_rank(pattern, wire):
    dtype, eps = WIRES[wire]
    values, indices = make_pattern(pattern, N, min(64, N // P), RANK, P)
    k = 40
    r = run_oktopk(values, indices, k, wire_dtype=dtype)
    contributions = WORLD.allgather((values, indices))
    # the owners select on float32 sums of the rounded inputs: the reference's selection
    rounded = [(rounded_to(v, dtype), i) for v, i in contributions]
    ref, ref_thr, masks = oktopk_reference(rounded, N, k)
    np.testing.assert_array_equal(r.sum != 0, ref != 0)
    np.testing.assert_array_equal(r.contributed, masks[RANK])
    assert float(r.threshold) == pytest.approx(ref_thr, rel=1e-6)
    # each kept value is that float32 sum rounded once more to the wire dtype ...
    assert np.all(np.abs(r.sum - ref) <= eps * np.abs(ref) + 1e-6 * np.abs(ref))
    np.testing.assert_array_equal(r.sum, rounded_to(r.sum, dtype))
    # ... so within the wire's rounding of the float32 sum of the unrounded inputs
    exact = sparse_allreduce_reference(contributions, N)
    mags = sparse_allreduce_reference([(np.abs(v), i) for v, i in contributions], N)
    kept = ref != 0
    assert np.all(np.abs(r.sum - exact)[kept] <= 2 * eps * mags[kept] + 1e-6 * mags[kept])
    assert int(r.stats.result_nnz) == np.count_nonzero(ref)
    for x in (r.sum, r.boundaries, r.threshold):
        assert_same_on_all_ranks(x)


def test_oktopk_16bit_bytes_are_the_float32_runs_less_2_per_value_sent():
    # inputs already in bfloat16 and small integers: both runs sum and select the same
    # entries, so the bytes differ by exactly 2 per value on the wire: this rank's
    # entries in other owners' regions, and its kept entries gathered to P - 1 ranks
    rng = np.random.default_rng(40 + RANK)
    indices = rng.choice(N, 64, replace=False).astype(np.int32)
    values = rng.integers(-20, 21, 64).astype(np.float32)
    plain = run_oktopk(values, indices, 40)
    wired = run_oktopk(values, indices, 40, wire_dtype=jnp.bfloat16)
    np.testing.assert_array_equal(plain.sum, wired.sum)  # small integers: exact in bfloat16
    lo, hi = (int(b) for b in plain.boundaries[RANK:RANK + 2])
    mine = np.unique(indices)
    values_sent = np.count_nonzero((mine < lo) | (mine >= hi)) + \
        (P - 1) * np.count_nonzero(plain.sum[lo:hi])
    assert int(plain.stats.switched_to_dense) == 0  # no balancing step at P <= 4
    assert int(wired.stats.bytes_sent) == int(plain.stats.bytes_sent) - 2 * values_sent
    assert sum(WORLD.allgather(int(wired.stats.bytes_sent))) == \
        sum(WORLD.allgather(int(wired.stats.bytes_received)))


def test_oktopk_wire_dtype_mismatch_and_bad_value():
    values, indices = make_pattern("random", N, 16, RANK, P)
    with pytest.raises(ValueError, match="wire_dtype"):
        jss.oktopk_allreduce(values, indices, size=N, k=4, wire_dtype=jnp.int8)
    with pytest.raises(ValueError, match="wire_dtype"):
        jss.oktopk_sync(k=4, wire_dtype="float64")
    if P == 1:
        return
    with raises_mpi_error("wire_dtype=bfloat16"):
        run_oktopk(values, indices, 4, wire_dtype=jnp.bfloat16 if RANK == P - 1 else None)


def test_oktopk_sync_on_a_16bit_wire_keeps_the_rounding_in_the_residual():
    # one step, exact local selection: a kept entry's residual is what rounding took
    # from it; an entry that was sent but not kept keeps its whole accumulator
    rng = np.random.default_rng(9 + RANK)
    g = {"w": jnp.asarray(rng.standard_normal(N).astype(np.float32))}
    k = 32
    tx = jss.oktopk_sync(k=k, selection="exact", wire_dtype=jnp.bfloat16)
    updates, state = jax.jit(tx.update)(g, tx.init(g))
    acc = np.asarray(g["w"])
    sent = np.sort(np.argsort(-np.abs(acc), kind="stable")[:k]).astype(np.int32)
    rounded = rounded_to(acc[sent], jnp.bfloat16)
    ref, _, masks = oktopk_reference(WORLD.allgather((rounded, sent)), N, k)
    kept = sent[masks[RANK]]
    residual = np.asarray(state.residual)
    np.testing.assert_array_equal(residual[kept], acc[kept] - rounded[masks[RANK]])
    rest = np.setdiff1d(np.arange(N), kept)
    np.testing.assert_array_equal(residual[rest], acc[rest])
    np.testing.assert_allclose(np.asarray(updates["w"]), ref / P, rtol=2.0**-8, atol=1e-7)
    assert_same_on_all_ranks(np.asarray(updates["w"]))
