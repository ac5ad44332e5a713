"""oktopk_sync across ranks: equals NumPy Ok-Topk SGD, replicas identical,
reused thresholds and fallbacks, exact continuation after a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks
from reference import oktopk_sgd_reference
from test_topk_sync_mpi import SIZE, flatten, grad_numpy, init_params, targets, train

import jax_sparse_sync as jss

P, RANK = WORLD.Get_size(), WORLD.Get_rank()


def test_exact_policy_matches_numpy_oktopk_sgd():
    k, lr, steps = 9, 0.1, 15
    tx = optax.chain(jss.oktopk_sync(k=k, selection="exact", tau=1, tau_prime=4), optax.sgd(lr))
    params, state = train(tx, steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    ref, ref_res = oktopk_sgd_reference(init_params(), [grad_numpy(r) for r in range(P)], k, lr, steps)
    np.testing.assert_allclose(flat, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state[0].residual), ref_res[RANK], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("selection", ["exact", "threshold_reuse", "gaussian"])
def test_threshold_policies_keep_replicas_identical_and_converge(selection):
    # error feedback applies an entry's accumulated gradient at once, so keep
    # lr * (steps between selections) * curvature below 2
    tx = optax.chain(jss.oktopk_sync(density=0.1, selection=selection, tau=4, tau_prime=8),
                     optax.sgd(0.05))
    params, state = train(tx, 40)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    assert_same_on_all_ranks(np.asarray(state[0].global_threshold), "global threshold")
    assert_same_on_all_ranks(np.asarray(state[0].boundaries), "boundaries")
    optimum = np.mean([targets(r) for r in range(P)], axis=0)
    assert np.linalg.norm(flat - optimum) < 0.5 * np.linalg.norm(init_params() - optimum)
    # a reused threshold may select anything from 0 to the capacity; never more
    k = round(0.1 * SIZE)
    assert 0 <= int(state[0].last_local_count) <= (k if selection == "exact" else 2 * k)


def test_overflow_falls_back_to_exact_topk():
    # a reused threshold far too low: every entry qualifies, more than the capacity
    params = {"w": jnp.zeros(200)}
    tx = jss.oktopk_sync(k=10, selection="threshold_reuse", tau=1000, capacity_factor=1.5)
    state = tx.init(params)
    state = state._replace(local_threshold=jnp.float32(1e-9), count=jnp.int32(1))
    g = {"w": jnp.asarray(np.random.default_rng(RANK).standard_normal(200).astype(np.float32))}
    updates, new = jax.jit(tx.update)(g, state)
    assert int(new.last_local_count) == 10  # the exact path ran: k entries, none dropped
    assert np.count_nonzero(np.asarray(updates["w"])) <= 10 * P


def test_checkpoint_restore_continues_exactly():
    tx = optax.chain(jss.oktopk_sync(k=7, tau=3, tau_prime=5), optax.sgd(0.1))
    straight, _ = train(tx, 12)
    params, state = train(tx, 5)
    saved = jax.tree_util.tree_map(np.asarray, (params, state))
    restored = jax.tree_util.tree_map(jnp.asarray, saved)
    resumed, _ = train(tx, 7, params=restored[0], state=restored[1], start=5)
    np.testing.assert_array_equal(flatten(resumed), flatten(straight))


def test_bad_arguments():
    for kwargs, match in [({"k": 2, "selection": "bucket"}, "`selection` must be one of"),
                          ({"k": 2, "tau": 0}, "`tau` must be a positive int"),
                          ({"k": 2, "capacity_factor": 0.5}, "`capacity_factor` must be >= 1"),
                          ({}, "pass `density=`")]:
        with pytest.raises(ValueError, match=match):
            jss.oktopk_sync(**kwargs)
