"""topk_sync across ranks: equals NumPy error-feedback Top-k SGD, replicas stay
bitwise identical, and residual state survives a checkpoint round trip."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from quadratic_problem import SIZE, QuadraticProblem, assert_resumes_exactly, flatten, unflatten
from reference import (bucket_topk_reference, ef_cyclic_topk_sgd_reference, ef_topk_sgd_reference,
                       ef_union_topk_sgd_reference, round_to_wire_reference)

import jax_sparse_sync as jss

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
PROBLEM = QuadraticProblem(target_seed=50, init_seed=0)
targets, grad_numpy, init_params = PROBLEM.targets, PROBLEM.grad_numpy, PROBLEM.init_params


def train(tx, steps, params=None, state=None, start=0):
    return PROBLEM.train(tx, steps, RANK, params, state, start)


def assert_matches_reference(params, state, ref_params, ref_residuals):
    """Replicas bitwise identical; the parameters and this rank's residual those of the
    NumPy reference. Returns the flat parameters."""
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")  # replicas bitwise identical
    np.testing.assert_allclose(flat, ref_params, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state[0].residual), ref_residuals[RANK], rtol=2e-5,
                               atol=2e-5)
    return flat


@pytest.mark.parametrize("algorithm", ["allgather", "recursive_doubling", "split_allgather",
                                       "dsar_split_allgather", "dense", "hash_partition", "auto"])
def test_twenty_steps_match_numpy_ef_topk_sgd(algorithm):
    k, lr, steps = 9, 0.1, 20
    tx = optax.chain(jss.topk_sync(k=k, algorithm=algorithm), optax.sgd(lr))
    params, state = train(tx, steps)
    assert_matches_reference(params, state, *ef_topk_sgd_reference(
        init_params(), [grad_numpy(r) for r in range(P)], k, lr, steps))
    assert int(state[0].count) == steps


def test_residual_decay_matches_numpy_leaky_ef_and_one_is_plain_ef():
    k, lr, steps = 9, 0.1, 12
    leaky = optax.chain(jss.topk_sync(k=k, residual_decay=0.8), optax.sgd(lr))
    params, state = train(leaky, steps)
    fns = [grad_numpy(r) for r in range(P)]
    ref_params, ref_residuals = ef_topk_sgd_reference(init_params(), fns, k, lr, steps,
                                                      decay=0.8)
    assert_matches_reference(params, state, ref_params, ref_residuals)
    plain_params, _ = ef_topk_sgd_reference(init_params(), fns, k, lr, steps)
    assert np.abs(ref_params - plain_params).max() > 1e-3  # the decay changed the run
    # 1.0 is plain error feedback, bit for bit
    one, _ = train(optax.chain(jss.topk_sync(k=k, residual_decay=1.0), optax.sgd(lr)), 3)
    default, _ = train(optax.chain(jss.topk_sync(k=k), optax.sgd(lr)), 3)
    assert flatten(one).tobytes() == flatten(default).tobytes()


def test_residual_decay_schedule_matches_numpy():
    k, lr, steps = 9, 0.1, 8
    schedule = optax.linear_schedule(0.5, 1.0, 6)  # a leak that fades out
    params, state = train(optax.chain(jss.topk_sync(k=k, residual_decay=schedule),
                                      optax.sgd(lr)), steps)
    ref_params, ref_residuals = ef_topk_sgd_reference(
        init_params(), [grad_numpy(r) for r in range(P)], k, lr, steps,
        decay=lambda step: float(schedule(step)))
    np.testing.assert_allclose(flatten(params), ref_params, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state[0].residual), ref_residuals[RANK], rtol=2e-5,
                               atol=2e-5)


def test_residual_decay_bad_values():
    with pytest.raises(ValueError, match="at step 0 it gives"):
        jss.topk_sync(k=2, residual_decay=lambda count: 1.5)
    for bad in (0.0, 1.5, -0.1, "0.9"):
        with pytest.raises(ValueError, match="residual_decay"):
            jss.topk_sync(k=2, residual_decay=bad)
    with pytest.raises(ValueError, match="residual_decay"), pytest.warns(DeprecationWarning):
        jss.topk_sync(k=2, residual_decay=0.9, grouping=[((0,), "normal")])


def test_cyclic_selection_matches_numpy_reference():
    # ScaleCom's cyclic local top-k: rank (step mod P) picks the indices, all send
    k, lr, steps = 9, 0.1, 2 * P + 3  # every rank leads at least twice
    tx = optax.chain(jss.topk_sync(k=k, selection="cyclic"), optax.sgd(lr))
    params, state = train(tx, steps)
    assert_matches_reference(params, state, *ef_cyclic_topk_sgd_reference(
        init_params(), [grad_numpy(r) for r in range(P)], k, lr, steps))
    # every rank zeroed the same k entries this step, and 3k floats went on the wire
    # (the leader's k indices as 2k float halves, then the k values: two dense allreduces)
    stats = jss.SyncStats.from_vector(state[0].last_stats)
    assert stats.result_nnz == k and stats.messages >= 2 or P == 1
    def dense_bytes(m):
        _, st = jss.sparse_allreduce(jnp.ones(m), jnp.arange(m, dtype=jnp.int32), size=m,
                                     algorithm="dense", return_stats=True)
        return int(st.bytes_sent)
    assert int(stats.bytes_sent) == dense_bytes(2 * k) + dense_bytes(k), stats


def test_cyclic_selection_with_a_ramp_and_under_adam_direction_sync():
    # the warm-up phases pick their own k; the masking sees the shared residual layout
    steps, phases = 8, [(2, 1.0), (3, 0.25)]
    tx = optax.chain(jss.adam_direction_sync(jss.topk_sync(k=5, selection="cyclic",
                                                           warmup=phases), eps=0.1),
                     optax.sgd(0.05))
    params, state = train(tx, steps)
    assert_same_on_all_ranks(flatten(params), "parameters")
    residual = np.asarray(state[0].sync.residual)
    assert np.count_nonzero(residual == 0) >= 5  # this step's shared indices


def test_union_selection_matches_numpy_reference():
    # every rank's top-k chosen, every rank's accumulator summed on the union
    k, lr, steps = 9, 0.1, 6
    tx = optax.chain(jss.topk_sync(k=k, selection="union", algorithm="allgather"),
                     optax.sgd(lr))
    params, state = train(tx, steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    ref_params, ref_residuals, union = ef_union_topk_sgd_reference(
        init_params(), [grad_numpy(r) for r in range(P)], k, lr, steps)
    np.testing.assert_allclose(flat, ref_params, rtol=2e-5, atol=2e-5)
    residual = np.asarray(state[0].residual)
    np.testing.assert_allclose(residual, ref_residuals[RANK], rtol=2e-5, atol=2e-5)
    assert np.all(residual[union] == 0)
    # the ranks' choices overlap only partly here, so more than k entries moved;
    # on the wire: the indices' sparse allreduce, then P k floats densely
    stats = jss.SyncStats.from_vector(state[0].last_stats)
    assert int(stats.result_nnz) == union.size
    assert P == 1 or k < union.size <= P * k
    _, index_stats = jss.sparse_allreduce(jnp.ones(k), jnp.arange(k, dtype=jnp.int32) * P + RANK,
                                          size=SIZE, algorithm="allgather", return_stats=True)
    _, value_stats = jss.sparse_allreduce(jnp.ones(P * k), jnp.arange(P * k, dtype=jnp.int32),
                                          size=P * k, algorithm="dense", return_stats=True)
    assert int(stats.bytes_sent) == int(index_stats.bytes_sent) + int(value_stats.bytes_sent)


def test_union_selection_raises_on_a_nan_any_rank_chose():
    params = unflatten(init_params())
    tx = jss.topk_sync(k=3, selection="union")
    state = tx.init(params)
    grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    if RANK == P - 1:
        grads["b"] = grads["b"].at[4].set(jnp.nan)
    with raises_mpi_error("NaN|non-finite|nan"):
        jax.block_until_ready(jax.jit(tx.update)(grads, state))


def test_union_selection_under_adam_direction_sync_with_a_ramp():
    steps, phases = 7, [(2, 1.0), (2, 0.25)]
    tx = optax.chain(jss.adam_direction_sync(jss.topk_sync(k=4, selection="union",
                                                           warmup=phases),
                                             momentum_masking="restart", eps=0.1),
                     optax.sgd(0.05))
    params, state = train(tx, steps)
    assert_same_on_all_ranks(flatten(params), "parameters")
    assert np.count_nonzero(np.asarray(state[0].sync.residual) == 0) >= 4


def test_cyclic_selection_bad_arguments():
    with pytest.raises(ValueError, match="quantize_bits"):
        jss.topk_sync(k=2, selection="cyclic", quantize_bits=4)
    with pytest.raises(ValueError, match="quantize_bits"):
        jss.topk_sync(k=2, selection="union", quantize_bits=4)
    with pytest.raises(ValueError, match="MPI communicators"):
        jss.topk_sync(k=2, selection="cyclic", comm=jss.axis("data"))


@pytest.mark.parametrize("algorithm", ["allgather", "split_allgather"])
def test_bucket_selection_matches_numpy(algorithm):
    kpb, bucket, lr, steps = 2, 16, 0.1, 10
    tx = optax.chain(jss.topk_sync(k=kpb, selection="bucket", bucket=bucket, algorithm=algorithm),
                     optax.sgd(lr))
    params, _ = train(tx, steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    ref, _ = ef_topk_sgd_reference(init_params(), [grad_numpy(r) for r in range(P)], None, lr,
                                   steps, select=lambda acc: bucket_topk_reference(acc, kpb, bucket))
    np.testing.assert_allclose(flat, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("selection", ["threshold_reuse", "gaussian"])
def test_threshold_policies_keep_replicas_identical(selection):
    tx = optax.chain(jss.topk_sync(density=0.1, selection=selection, tau=4,
                                   algorithm="split_allgather"), optax.sgd(0.05))
    params, state = train(tx, 16)
    assert_same_on_all_ranks(flatten(params), "parameters")
    optimum = np.mean([targets(r) for r in range(P)], axis=0)
    assert np.linalg.norm(flatten(params) - optimum) < np.linalg.norm(init_params() - optimum)


def test_quantized_dsar_training_stays_identical_and_converges():
    tx = optax.chain(jss.topk_sync(density=0.2, algorithm="dsar_split_allgather", quantize_bits=4),
                     optax.sgd(0.2))
    params, state = train(tx, 20)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    # the optimum of the summed quadratic losses is the mean target
    optimum = np.mean([targets(r) for r in range(P)], axis=0)
    start = np.linalg.norm(init_params() - optimum)
    assert np.linalg.norm(flat - optimum) < 0.5 * start


def test_density_sets_k_and_stats_are_logged():
    tx = jss.topk_sync(density=0.05, algorithm="allgather")
    params, state = train(tx, 2)
    k = round(0.05 * SIZE)
    stats = jss.SyncStats.from_vector(state.last_stats).as_dict()
    expect = jss.planning.cost_model.wire_volume("allgather", nranks=P, size=SIZE, k=k, rank=RANK)
    assert stats["bytes_sent"] == expect.bytes_max
    assert 0 < stats["result_nnz"] <= min(SIZE, P * k)


def test_checkpoint_restore_continues_exactly():
    tx = optax.chain(jss.topk_sync(k=5, algorithm="recursive_doubling"), optax.sgd(0.05, momentum=0.9))
    saved = assert_resumes_exactly(train, tx, 10, at=4)
    # a checkpoint is the state's arrays; the residual is per rank and travels with it
    assert np.any(np.asarray(saved[1][0].residual) != 0)


@pytest.mark.parametrize("algorithm", ["allgather", "auto"])
def test_warmup_phases_match_numpy(algorithm):
    # dense for 2 steps, k = 25% of N for 3, then k = 9 (the reference: top-k with k = N is dense)
    warmup, lr, steps = [(2, 1.0), (3, 0.25)], 0.1, 10
    k_phase = round(0.25 * SIZE)
    tx = optax.chain(jss.topk_sync(k=9, algorithm=algorithm, warmup=warmup), optax.sgd(lr))
    params, state = train(tx, steps)
    assert_matches_reference(params, state, *ef_topk_sgd_reference(
        init_params(), [grad_numpy(r) for r in range(P)],
        lambda step: SIZE if step < 2 else (k_phase if step < 5 else 9), lr, steps))
    assert int(state[0].last_local_count) == 9


@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_warmup_on_a_16bit_wire_matches_numpy(wire):
    # warmup_wire_dtype: dense for 2 steps and 25 % for 3 on the 16-bit wire, then k = 9
    # in float32; the sent entries' residual is zero (the rounding is not kept)
    from jax_sparse_sync.planning import cost_model

    warmup, lr, steps = [(2, 1.0), (3, 0.25)], 0.1, 10
    k_phase = round(0.25 * SIZE)
    tx = optax.chain(jss.topk_sync(k=9, algorithm="allgather", warmup=warmup,
                                   warmup_wire_dtype=getattr(jnp, wire)), optax.sgd(lr))
    grad_fns = [grad_numpy(r) for r in range(P)]
    k_at = lambda step: SIZE if step < 2 else (k_phase if step < 5 else 9)  # noqa: E731
    wire_at = lambda step: wire if step < 5 else None  # noqa: E731
    for stop in (2, 4, steps):  # after the dense phase, inside the 25 % one, at the end
        params, state = train(tx, stop)
        flat = assert_matches_reference(params, state, *ef_topk_sgd_reference(
            init_params(), grad_fns, k_at, lr, stop, wire_at=wire_at, keep_wire_rounding=False))
        stats = jss.SyncStats.from_vector(state[0].last_stats).as_dict()
        if stop == 2:  # the dense step on the 16-bit wire: the residual empty
            assert not np.any(np.asarray(state[0].residual))
            assert stats["bytes_sent"] == cost_model.wire_volume(
                "dense", nranks=P, size=SIZE, k=SIZE, wire_dtype=1).bytes_max
        if stop == 4:  # 25 %: 6-byte entries (int32 index, 16-bit value)
            assert stats["bytes_sent"] == (cost_model.HEADER_BYTES + 6 * k_phase) * (P - 1)
        if stop == steps:  # the own density: float32 again, 8-byte entries
            assert stats["bytes_sent"] == (cost_model.HEADER_BYTES + 8 * 9) * (P - 1)
    # the same run with the float32 warm-up differs (the wire changed what was summed)
    plain = optax.chain(jss.topk_sync(k=9, algorithm="allgather", warmup=warmup), optax.sgd(lr))
    assert not np.array_equal(flatten(train(plain, steps)[0]), flat)
    # the reference's rounding is the library's (ml_dtypes / jnp, nearest even)
    x = np.asarray(init_params())
    assert np.array_equal(round_to_wire_reference(x, wire),
                          np.asarray(jnp.asarray(x).astype(getattr(jnp, wire)).astype(jnp.float32)))


@pytest.mark.parametrize("selection", ["exact", "threshold_reuse"])
def test_flush_every_matches_numpy_with_dense_steps(selection):
    # every 3rd step (2, 5, 8) is dense, after a warm-up phase: the reference's k = N
    lr, steps, k = 0.1, 9, 7
    tx = optax.chain(jss.topk_sync(k=k, algorithm="allgather", selection=selection, tau=2,
                                   warmup=[(1, 0.25)], flush_every=3), optax.sgd(lr))
    params, state = train(tx, steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    # the last step flushed: nothing is held back
    assert not np.any(np.asarray(state[0].residual))
    assert int(state[0].last_local_count) == SIZE
    if selection == "exact":
        ref_params, _ = ef_topk_sgd_reference(
            init_params(), [grad_numpy(r) for r in range(P)],
            lambda step: SIZE if step % 3 == 2 else (round(0.25 * SIZE) if step < 1 else k),
            lr, steps)
        np.testing.assert_allclose(flat, ref_params, rtol=2e-5, atol=2e-5)
    # a step that does not flush keeps k entries
    _, state = train(tx, 1, params=params, state=state, start=steps)
    assert int(state[0].last_local_count) <= 2 * k


def test_flush_every_bad_values_and_grouping():
    for bad in (0, -2, 2.5, True, "3"):
        with pytest.raises(ValueError, match="flush_every"):
            jss.topk_sync(k=2, flush_every=bad)
    with pytest.raises(ValueError, match="flush_every.*grouping"), pytest.warns(DeprecationWarning):
        jss.topk_sync(k=2, flush_every=5, grouping=[((0,), "normal")])


def test_warmup_dense_phase_sends_dense_bytes_and_empties_the_residual():
    tx = optax.chain(jss.topk_sync(k=3, algorithm="allgather", warmup=[(1, 1.0)]), optax.sgd(0.1))
    params, state = train(tx, 1)
    stats = jss.SyncStats.from_vector(state[0].last_stats).as_dict()
    dense = jss.SyncStats.from_vector(train(optax.chain(jss.dense_sync(), optax.sgd(0.1)), 1)[1][0]
                                      .last_stats).as_dict()
    assert stats["bytes_sent"] == dense["bytes_sent"]
    assert stats["bytes_sent"] > 0 or P == 1  # one rank sends nothing
    assert int(state[0].last_local_count) == SIZE
    assert not np.any(np.asarray(state[0].residual))
    # the dense warm-up step is dense_sync's step (same update)
    dense_params, _ = train(optax.chain(jss.dense_sync(), optax.sgd(0.1)), 1)
    np.testing.assert_allclose(flatten(params), flatten(dense_params), rtol=1e-6, atol=1e-6)
    # the next step is sparse again
    _, state = train(tx, 1, params=params, state=state, start=1)
    assert int(state[0].last_local_count) == 3


def test_warmup_checkpoint_restore_continues_exactly_across_phases():
    tx = optax.chain(jss.topk_sync(k=5, algorithm="recursive_doubling",
                                   warmup=jss.density_ramp(5 / SIZE, steps_per_stage=2,
                                                           dense_steps=1)),
                     optax.sgd(0.05, momentum=0.9))
    assert_resumes_exactly(train, tx, 8, at=2)  # stopped inside the ramp


def test_mixed_dtypes_keep_leaf_dtypes_and_float32_residual():
    params = {"w": jnp.ones((8, 4), jnp.bfloat16), "b": jnp.zeros(4, jnp.float16),
              "s": jnp.ones((), jnp.float32)}
    tx = jss.topk_sync(density=0.1)
    state = tx.init(params)
    grads = jax.tree_util.tree_map(
        lambda p: (jnp.arange(p.size, dtype=jnp.float32).reshape(p.shape) * (RANK + 1)).astype(p.dtype),
        params)
    updates, state = jax.jit(tx.update)(grads, state)
    for name in params:
        assert updates[name].dtype == params[name].dtype
        assert state.residual.dtype == jnp.float32 and state.residual.shape == (8 * 4 + 4 + 1,)
    # the 4 largest entries of w (its last 4) are kept, averaged over ranks
    mean_scale = sum(r + 1 for r in range(P)) / P
    np.testing.assert_allclose(np.asarray(updates["w"], np.float32).reshape(-1)[-4:],
                               np.arange(28, 32) * mean_scale, rtol=1e-2)
    assert_same_on_all_ranks(np.asarray(updates["w"]).view(np.uint16))


def test_nan_gradient_raises_on_every_rank_and_keeps_state():
    params = {"w": jnp.ones(10)}
    tx = jss.topk_sync(k=3, algorithm="allgather")
    state = tx.init(params)
    grads = {"w": jnp.arange(10.0)}
    if RANK == P - 1:
        grads = {"w": grads["w"].at[4].set(jnp.nan)}
    with raises_mpi_error(rf"non-finite .* on rank\(s\) {P - 1}"):
        jax.block_until_ready(jax.jit(tx.update)(grads, state))
    # the previous state is untouched (functional update), and the next step works
    updates, state = jax.jit(tx.update)({"w": jnp.arange(10.0)}, state)
    np.testing.assert_allclose(np.asarray(updates["w"])[-3:], [7.0, 8.0, 9.0])
