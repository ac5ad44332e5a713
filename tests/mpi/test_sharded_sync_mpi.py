"""sharded_sync across ranks: bit for bit the single-process reference of P ranks
(tests/sharded_reference.py: owner regions, AdamW on each, the change's three
compressions), replicas identical, the bytes of both exchanges exact against the
model, the state 1/P per rank, and an exact continuation after a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks
from quadratic_problem import SIZE, QuadraticProblem, assert_resumes_exactly, flatten
from sharded_reference import sharded_sync_reference, slot_of

import jax_sparse_sync as jss
from jax_sparse_sync.model import sharded as model

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
PROBLEM = QuadraticProblem(target_seed=70, init_seed=1)
K, STEPS = 9, 8
INNER = optax.adamw(0.05, weight_decay=0.1)


def train(tx, steps, params=None, state=None, start=0):
    return PROBLEM.train(tx, steps, RANK, params, state, start)


def reference(change, change_k=0, steps=STEPS, max_grad_norm=None):
    return sharded_sync_reference(PROBLEM.init_params(), [PROBLEM.grad_numpy(r) for r in range(P)],
                                  k=K, steps=steps, inner=INNER, change=change, change_k=change_k,
                                  max_grad_norm=max_grad_norm)


def bits(x):
    return np.ascontiguousarray(np.asarray(x, np.float32)).view(np.int32)


def tx_change_k(change):
    """The change's entries an owner sends with "topk" (k, at most its ceil(N / P))."""
    return min(K, slot_of(SIZE, P)) if change == "topk" else 0


# max_grad_norm 2: the quadratic's mean gradient starts near norm 10, so the first steps clip
@pytest.mark.parametrize("change,max_grad_norm", [("topk", None), ("lazy", None),
                                                  ("dense", None), ("topk", 2.0)])
def test_equals_the_reference_of_p_ranks_bit_for_bit_with_the_models_bytes(change, max_grad_norm):
    tx = jss.sharded_sync(INNER, k=K, change=change, max_grad_norm=max_grad_norm)
    params, state = train(tx, STEPS)
    ref = reference(change, tx_change_k(change), max_grad_norm=max_grad_norm)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    np.testing.assert_array_equal(bits(flat), bits(ref.params))
    np.testing.assert_array_equal(bits(state.residual), bits(ref.residuals[RANK]))
    for ours, theirs in zip(jax.tree_util.tree_leaves(state.inner),
                            jax.tree_util.tree_leaves(ref.inner[RANK])):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    np.testing.assert_array_equal(bits(state.change_residual), bits(ref.change_residuals[RANK]))
    assert int(state.count) == STEPS
    assert not np.array_equal(flat, PROBLEM.init_params())  # it trained
    # the last step's bytes and messages, both exchanges, exactly the model's
    stats = jss.SyncStats.from_vector(state.last_stats)
    reduce = jss.SyncStats.from_vector(state.reduce_stats)
    sent = ref.reduce_sent[RANK]
    reduce_bytes = model.region_reduce_bytes(nranks=P, rank=RANK, sent_entries=sent) + (
        model.clip_bytes(nranks=P) if max_grad_norm else 0)
    assert int(reduce.bytes_sent) == reduce_bytes
    assert int(stats.bytes_sent) == reduce_bytes + model.change_bytes(
        change, nranks=P, size=SIZE, rank=RANK, entries=ref.change_sent[RANK])
    assert int(reduce.messages) == model.region_reduce_messages(nranks=P, rank=RANK,
                                                                sent_entries=sent) + (
        model.change_messages("dense", nranks=P) if max_grad_norm else 0)
    assert int(stats.messages) == int(reduce.messages) + model.change_messages(change, nranks=P)
    assert WORLD.allreduce(int(stats.bytes_received)) == WORLD.allreduce(int(stats.bytes_sent))
    assert int(reduce.result_nnz) == ref.reduce_union  # the entries the owners summed
    assert stats.algorithm_name == ("dsar_split_allgather" if change == "dense"
                                    else "split_allgather")
    assert reduce.algorithm_name == "region_reduce"


def test_the_state_per_rank_is_one_region_of_the_replicated_one():
    tx = jss.sharded_sync(optax.adam(1e-3), density=0.1, change="topk")
    state = tx.init({"w": jnp.zeros(SIZE)})
    mu, nu = state.inner[0].mu, state.inner[0].nu
    assert mu.shape == nu.shape == state.change_residual.shape == (slot_of(SIZE, P),)
    assert state.residual.shape == (SIZE,) and state.world.shape == (P,)
    replicated = optax.adam(1e-3).init(jnp.zeros(SIZE))
    assert replicated[0].mu.shape == (SIZE,)


def test_auto_picks_the_models_change_and_runs_it():
    tx = jss.sharded_sync(INNER, density=0.1)
    _, state = train(tx, 2)
    k = round(0.1 * SIZE)
    chosen = model.choose_change(nranks=P, size=SIZE, k=k, change_k=min(k, slot_of(SIZE, P)))
    assert state.change_residual.shape == ((slot_of(SIZE, P),) if chosen == "topk" else (0,))
    assert_same_on_all_ranks(np.asarray(state.last_stats)[[5]], "the change's algorithm")


def test_resumes_exactly_from_a_checkpoint():
    assert_resumes_exactly(train, jss.sharded_sync(INNER, k=K, change="topk"), steps=6, at=3)


def test_a_state_of_another_world_size_names_reshard_state():
    tx = jss.sharded_sync(INNER, k=K, change="topk")
    params = {"w": jnp.zeros(SIZE)}
    wrong = tx.init(params)._replace(world=jnp.zeros((P + 1,), jnp.int32))
    with pytest.raises(ValueError, match=f"written by {P + 1} ranks.*reshard_state"):
        tx.update({"w": jnp.ones(SIZE)}, wrong, params)
