"""jss.diloco across ranks: DiLoCo with dense_sync, a bfloat16 wire and error-fed
topk_sync against NumPy, and SparseLoCo's chunked_topk_sync; every replica holds the
same parameters, bit for bit, after every outer step; bytes move on outer steps only; a
checkpoint between two outer steps resumes exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks
from diloco_reference import (diloco_reference, fragment_schedule, leaf_groups,
                              topk_sync_reference)
from quadratic_problem import SHAPES, QuadraticProblem, flatten, unflatten

import jax_sparse_sync as jss
from jax_sparse_sync.planning import cost_model
from jax_sparse_sync.transforms.diloco_config import balanced_groups

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
PROBLEM = QuadraticProblem(target_seed=70, init_seed=1)
SIZES = [int(np.prod(s)) for s in SHAPES.values()]
LR = 0.1


def snapped_entries(snapped):
    """The flat entries of the leaves marked in ``DiLoCoState.snapped``."""
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    return np.concatenate([np.arange(offsets[i], offsets[i + 1])
                           for i in np.flatnonzero(snapped)])


def trainer(tx):
    """``train(steps, params=None, state=None, start=0, each=None)``: this rank's steps
    on its own quadratic, the updates applied with jss.diloco_apply_updates;
    ``each(t, params, state)`` after step t (1-based), on NumPy copies."""
    t = unflatten(PROBLEM.targets(RANK))

    # the targets an argument, not constants: one program for every rank (compiled once
    # for the job through the persistent cache, as tests/mpi/quadratic_problem.py's step)
    @jax.jit
    def jitted_step(params, state, i, targets):
        scale = (1 + i % 3).astype(jnp.float32)
        grads = jax.tree_util.tree_map(lambda p, tt: (p - tt) * scale, params, targets)
        updates, state = tx.update(grads, state, params)
        return jss.diloco_apply_updates(params, updates, state), state

    def step(params, state, i):
        return jitted_step(params, state, i, t)

    def train(steps, params=None, state=None, start=0, each=None):
        params = unflatten(PROBLEM.init_params()) if params is None else params
        state = tx.init(params) if state is None else state
        for i in range(start, start + steps):
            params, state = step(params, state, jnp.int32(i))
            if each is not None:
                each(i + 1, *jax.tree_util.tree_map(np.asarray, (params, state)))
        return params, state

    return train


# one fragment with error-fed Top-k runs in tests/test_diloco.py and on a mesh axis
@pytest.mark.parametrize("sync,fragments,delay", [("dense", 1, 0), ("dense", 2, 1),
                                                  ("topk", 2, 0)])
def test_matches_numpy_and_replicas_are_identical_after_every_outer_step(sync, fragments,
                                                                          delay):
    every, k, steps = 4, 7, 9
    made = jss.dense_sync() if sync == "dense" else jss.topk_sync(k=k)
    tx = jss.diloco(optax.sgd(LR), every=every, sync=made, fragments=fragments, delay=delay)
    groups = leaf_groups(SIZES, balanced_groups(SIZES, fragments))
    seen, outer, turn = {}, [], fragment_schedule(every, fragments)

    def check(t, params, state):
        seen[t] = flatten(params), flatten(state.anchor)
        assert_same_on_all_ranks(seen[t][1], f"anchor after step {t}")
        if state.snapped.any():  # a merged fragment: every replica holds the anchor's bits
            merged = snapped_entries(state.snapped)
            assert_same_on_all_ranks(seen[t][0][merged], f"merged parameters, step {t}")
            assert seen[t][0][merged].tobytes() == seen[t][1][merged].tobytes()
            outer.append(t)
        if P > 1:  # bytes on the steps with an outer step, none on the others
            sent = jss.SyncStats.from_vector(state.last_stats).bytes_sent
            assert (sent > 0) == (turn(t) is not None), (t, sent)

    trainer(tx)(steps, each=check)
    ref_sync = None if sync == "dense" else topk_sync_reference(k)
    _, _, states, history = diloco_reference(
        PROBLEM.init_params(), [PROBLEM.grad_numpy(r) for r in range(P)], steps=steps,
        every=every, inner_lr=LR, groups=groups, sync=ref_sync, delay=delay)
    for t in range(1, steps + 1):
        np.testing.assert_allclose(seen[t][0], history[t][0][RANK], rtol=2e-5, atol=2e-5,
                                   err_msg=f"step {t}")
        np.testing.assert_allclose(seen[t][1], history[t][1], rtol=2e-5, atol=2e-5)
    assert len(outer) == steps * fragments // every


def test_bytes_only_on_outer_steps_and_bf16_wire_keeps_replicas_identical():
    every, steps = 3, 7
    tx = jss.diloco(optax.adam(0.05), every=every,
                    sync=jss.dense_sync(wire_dtype=jnp.bfloat16))
    sent = {}

    def check(t, params, state):
        sent[t] = int(jss.SyncStats.from_vector(jss.last_stats(state)).bytes_sent)
        if t % every == 0:
            assert_same_on_all_ranks(flatten(params), f"parameters after step {t}")
            assert flatten(params).tobytes() == flatten(state.anchor).tobytes()

    trainer(tx)(steps, each=check)
    inner = [sent[t] for t in sent if t % every]
    assert inner == [0] * len(inner), sent
    if P > 1:  # one bfloat16 allreduce of every entry on each outer step
        assert sent[3] == sent[6] > 0, sent


def test_checkpoint_between_outer_steps_resumes_exactly():
    tx = jss.diloco(optax.adamw(0.05), every=4, sync=jss.topk_sync(k=5), fragments=2, delay=1)
    train = trainer(tx)
    straight, _ = train(11)
    params, state = train(6)
    saved = jax.tree_util.tree_map(np.asarray, (params, state))
    restored = jax.tree_util.tree_map(jnp.asarray, saved)
    resumed, state = train(5, params=restored[0], state=restored[1], start=6)
    assert flatten(resumed).tobytes() == flatten(straight).tobytes()
    assert int(state.count) == 11
    assert_same_on_all_ranks(flatten(state.anchor), "anchor")


def test_sparseloco_chunked_topk_outer_step():
    # 2-bit chunked Top-k with error feedback in place of the outer momentum: each outer
    # step sends the exact payload of the cost model, the anchor moves by the synced
    # mean (the same on every rank), the replicas land on it
    every, chunk, k = 3, 16, 3
    tx = jss.diloco(optax.adam(0.05), optax.sgd(1.0), every=every,
                    sync=jss.chunked_topk_sync(chunk=chunk, k_per_chunk=k, value_bits=2))
    size = sum(SIZES)
    volume = cost_model.chunked_topk_volume(nranks=P, size=size, chunk=chunk, k_per_chunk=k)
    last = {"anchor": PROBLEM.init_params()}

    def check(t, params, state):
        sent = int(jss.SyncStats.from_vector(state.last_stats).bytes_sent)
        anchor = flatten(state.anchor)
        if t % every:
            assert sent == 0 and anchor.tobytes() == last["anchor"].tobytes(), t
            return
        assert sent == (volume.bytes("max") if P > 1 else sent), (t, sent)
        moved = anchor != last["anchor"]
        assert 0 < moved.sum() <= P * k * -(-size // chunk), t  # at most the kept entries
        assert_same_on_all_ranks(flatten(params), f"parameters after step {t}")
        assert flatten(params).tobytes() == anchor.tobytes()
        last["anchor"] = anchor

    trainer(tx)(2 * every, each=check)
