"""shared_support_sync across ranks: equals the NumPy reference (refresh steps are
error-feedback Top-k, the others a dense sum of k values on the shared support),
replicas and supports stay bitwise identical, the wire carries k floats."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from quadratic_problem import SIZE, QuadraticProblem, assert_resumes_exactly, flatten, unflatten
from reference import ef_shared_support_sgd_reference, ef_topk_sgd_reference

import jax_sparse_sync as jss
from jax_sparse_sync.transforms import shared_support_sync as shared_support

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
PROBLEM = QuadraticProblem(target_seed=70, init_seed=1)
grad_numpy, init_params = PROBLEM.grad_numpy, PROBLEM.init_params


def train(tx, steps, params=None, state=None, start=0):
    return PROBLEM.train(tx, steps, RANK, params, state, start)


@pytest.mark.parametrize("refresh_every,algorithm,random_fraction", [
    (3, "allgather", 0.0), (4, "auto", 0.0), (5, "recursive_doubling", 0.0),
    (3, "allgather", 1 / 3), (4, "auto", 1.0)])
def test_steps_match_numpy_and_replicas_stay_identical(refresh_every, algorithm,
                                                       random_fraction):
    k, lr, steps = 9, 0.1, 11
    tx = optax.chain(jss.shared_support_sync(k=k, refresh_every=refresh_every,
                                             random_fraction=random_fraction, seed=4,
                                             algorithm=algorithm), optax.sgd(lr))
    params, state = train(tx, steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    assert_same_on_all_ranks(np.asarray(state[0].support), "support")
    ref_params, ref_residuals, ref_support = ef_shared_support_sgd_reference(
        init_params(), [grad_numpy(r) for r in range(P)], k, lr, steps, refresh_every,
        random_fraction, lambda step, m, r: np.asarray(shared_support.random_offsets(
            4, jnp.int32(step), m, r)))
    np.testing.assert_allclose(flat, ref_params, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state[0].residual), ref_residuals[RANK], rtol=2e-5,
                               atol=2e-5)
    np.testing.assert_array_equal(np.asarray(state[0].support), ref_support)
    assert int(state[0].count) == steps
    # not plain error-feedback Top-k: the shared steps changed the run
    topk_params, _ = ef_topk_sgd_reference(init_params(), [grad_numpy(r) for r in range(P)],
                                           k, lr, steps)
    assert np.abs(ref_params - topk_params).max() > 1e-3


def test_refresh_every_one_is_topk_sync_bit_for_bit():
    shared, s_state = train(optax.chain(jss.shared_support_sync(k=7, refresh_every=1,
                                                                algorithm="allgather"),
                                        optax.sgd(0.1)), 5)
    plain, t_state = train(optax.chain(jss.topk_sync(k=7, algorithm="allgather"),
                                       optax.sgd(0.1)), 5)
    assert flatten(shared).tobytes() == flatten(plain).tobytes()
    assert np.asarray(s_state[0].residual).tobytes() == np.asarray(t_state[0].residual).tobytes()


def test_a_shared_step_sends_one_dense_allreduce_of_k_floats():
    k = 12
    tx = jss.shared_support_sync(k=k, refresh_every=4, algorithm="allgather")
    _, state = train(tx, 2)  # step 0 refreshes, step 1 is a shared step
    stats = jss.SyncStats.from_vector(state.last_stats).as_dict()
    _, dense = jss.dense_allreduce(jnp.zeros(k), return_stats=True)
    assert stats == dense.as_dict()  # the counts of jss.dense_allreduce on k floats
    assert stats["result_nnz"] == k
    _, refresh = train(tx, 1)  # a refresh step: the allgather's bytes
    expect = jss.planning.cost_model.wire_volume("allgather", nranks=P, size=SIZE, k=k, rank=RANK)
    refresh_stats = jss.SyncStats.from_vector(refresh.last_stats).as_dict()
    assert refresh_stats["bytes_sent"] == expect.bytes_max
    if P > 1:
        assert stats["bytes_received"] < refresh_stats["bytes_received"]


@pytest.mark.parametrize("random_fraction", [0.0, 0.4])
def test_checkpoint_restore_continues_exactly(random_fraction):
    # (the draws are keyed by the step count in the state: the same after a restore)
    tx = optax.chain(jss.shared_support_sync(k=5, refresh_every=3,
                                             random_fraction=random_fraction),
                     optax.sgd(0.05, momentum=0.9))
    assert_resumes_exactly(train, tx, 9, at=4)


def test_nan_on_the_support_raises_on_every_rank_and_keeps_state():
    params = {"w": jnp.ones(10)}
    tx = jss.shared_support_sync(k=3, refresh_every=2, algorithm="allgather")
    update = jax.jit(tx.update)
    _, state = update({"w": jnp.arange(10.0)}, tx.init(params))  # support {7, 8, 9}
    np.testing.assert_array_equal(np.asarray(state.support), [7, 8, 9])
    grads = {"w": jnp.zeros(10)}
    if RANK == P - 1:
        grads = {"w": grads["w"].at[8].set(jnp.nan)}
    with raises_mpi_error(rf"non-finite .* on rank\(s\) {P - 1}"):
        jax.block_until_ready(update(grads, state))
    updates, state = update({"w": jnp.ones(10)}, state)  # the state before is intact
    np.testing.assert_allclose(np.asarray(updates["w"]), [0.0] * 7 + [1.0] * 3)


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_a_seed_that_differs_between_ranks_is_refused_at_init():
    # seed=rank would draw different coordinates on each rank and sum unrelated values
    params = unflatten(init_params())
    tx = jss.shared_support_sync(density=0.25, random_fraction=0.5, seed=RANK)
    with pytest.raises(ValueError, match="`seed` must be the same on every rank"):
        tx.init(params)
    jss.shared_support_sync(density=0.25, random_fraction=0.5, seed=7).init(params)  # agreed
    jss.shared_support_sync(density=0.25, seed=RANK).init(params)  # no draws: not checked
