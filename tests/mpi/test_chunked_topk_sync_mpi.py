"""jss.chunked_topk_sync across ranks: each step's update is the NumPy reference's sum of
every rank's decoded payload over P, bit for bit; replicas and bytes; error feedback;
training on the quadratic problem; a checkpoint; the cross-rank errors."""

import chunked_topk_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from quadratic_problem import SIZE, QuadraticProblem, assert_resumes_exactly, flatten, unflatten

import jax_sparse_sync as jss
from jax_sparse_sync.planning import cost_model

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
PROBLEM = QuadraticProblem(target_seed=90, init_seed=3)


def train(tx, steps, params=None, state=None, start=0):
    return PROBLEM.train(tx, steps, RANK, params, state, start)


def grads_of(rank, step):
    """Rank `rank`'s update at `step` (every rank can compute every rank's)."""
    return np.random.default_rng(100 * rank + step).standard_normal(SIZE).astype(np.float32) \
        * np.float32(1 + step)


@pytest.mark.parametrize("chunk,k,values", [(16, 3, dict(value_bits=2)),
                                            (20, 6, dict(value_dtype=jnp.bfloat16))])
def test_updates_are_the_rank_order_sum_of_decoded_payloads_bit_for_bit(chunk, k, values):
    tx = jss.chunked_topk_sync(chunk=chunk, k_per_chunk=k, **values)
    update = jax.jit(tx.update)
    state = tx.init(unflatten(np.zeros(SIZE, np.float32)))
    residuals = [np.zeros(SIZE, np.float32)] * P
    sent = np.zeros(SIZE)
    bits, dtype = values.get("value_bits", 2), values.get("value_dtype")
    for step in range(3):
        updates, state = update(unflatten(grads_of(RANK, step)), state)
        want, residuals, sents = ref.step(residuals, [grads_of(r, step) for r in range(P)],
                                          chunk, k, bits, dtype)
        if P & (P - 1) == 0:  # the division by P exact: bit for bit
            assert flatten(updates).tobytes() == want.tobytes(), step
        else:  # XLA may divide by 3 as a product with 1/3: within an ulp
            np.testing.assert_allclose(flatten(updates), want, rtol=3e-7, atol=0)
        assert np.asarray(state.residual).tobytes() == residuals[RANK].tobytes(), step
        assert_same_on_all_ranks(flatten(updates), f"update of step {step}")
        sent += sents[RANK]
    # error feedback: what this rank sent plus what it keeps is what came in
    came_in = sum(grads_of(RANK, s).astype(np.float64) for s in range(3))
    np.testing.assert_allclose(sent + np.asarray(state.residual), came_in, rtol=1e-5, atol=1e-4)
    stats = jss.SyncStats.from_vector(state.last_stats)
    value_bytes = 2 if dtype is not None else 0
    expect = cost_model.chunked_topk_volume(nranks=P, size=SIZE, chunk=chunk, k_per_chunk=k,
                                            value_bits=0 if value_bytes else bits,
                                            value_bytes=value_bytes)
    assert int(stats.bytes_sent) == int(stats.bytes_received) == expect.bytes_max
    assert int(stats.messages) == expect.messages
    assert int(stats.result_nnz) == np.count_nonzero(want)
    assert stats.algorithm_name == "allgather"


def test_two_bit_training_converges_and_replicas_stay_identical():
    tx = optax.chain(jss.chunked_topk_sync(chunk=16, k_per_chunk=4), optax.sgd(0.05))
    start = PROBLEM.init_params()
    params, state = train(tx, 60)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    mean_target = np.mean([PROBLEM.targets(r) for r in range(P)], axis=0)
    # the mean of the ranks' quadratics (with their step-dependent scale) is minimised
    # at the mean target
    assert np.sum((flat - mean_target) ** 2) < 0.05 * np.sum((start - mean_target) ** 2)


def test_checkpoint_restore_continues_exactly():
    tx = optax.chain(jss.chunked_topk_sync(chunk=10, k_per_chunk=2, value_bits=4,
                                           residual_decay=0.9), optax.sgd(0.05))
    assert_resumes_exactly(train, tx, 6, at=3)


def test_nan_on_one_rank_raises_on_every_rank_naming_it():
    tx = jss.chunked_topk_sync(chunk=4, k_per_chunk=1)
    grads = np.ones(8, np.float32)
    if RANK == P - 1:
        grads[5] = np.nan
    with raises_mpi_error(rf"non-finite .* on rank\(s\) {P - 1}"):
        jax.block_until_ready(jax.jit(tx.update)({"w": jnp.asarray(grads)},
                                                 tx.init({"w": jnp.zeros(8)})))


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_a_format_that_differs_between_ranks_is_refused_at_init():
    tx = jss.chunked_topk_sync(chunk=8 + (RANK == 1), k_per_chunk=2)
    with pytest.raises(ValueError, match="differ in chunk: 8 on rank 0, 9 on rank 1"):
        tx.init({"w": jnp.zeros(20)})
