"""``jss.reshard_state``: a checkpoint of P ranks restored on Q.

The rule's arithmetic on hand-made states (exact where documented), its
errors, the clear error of a step on a state of another world size, and the
end-to-end job (tests/mpi/reshard_case.py: train at 4 ranks, restore at 2 and
at 8, continue) under ``mpiexec -n 8``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_multirank import run_under_mpiexec

import jax_sparse_sync as jss
from jax_sparse_sync.transforms.reshard import pairwise_rank_sum, share_weights

N = 37


def topk_state(rank, size, residual, count=5, threshold=0.5):
    return jss.TopkSyncState(
        count=np.int32(count), residual=np.asarray(residual, np.float32),
        threshold=np.float32(threshold), last_local_count=np.int32(3),
        last_stats=np.arange(7, dtype=np.int32), world=np.eye(size, dtype=np.int32)[rank])


def residuals(size, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    # magnitudes over many binades, so that sums round
    return [(rng.standard_normal(N) * 10.0 ** rng.integers(-3, 4, N)).astype(dtype)
            for _ in range(size)]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16])
@pytest.mark.parametrize("old_size,new_size", [(4, 1), (4, 2), (4, 4), (4, 8), (2, 8), (8, 2)])
def test_the_residual_mean_over_ranks_is_kept_bitwise_between_powers_of_two(old_size, new_size,
                                                                            dtype):
    dtype = np.dtype(dtype)
    # float16's range: smaller magnitudes, so that no sum overflows
    scale = np.float32(1e-2 if dtype == np.float16 else 1.0)
    old = [topk_state(r, old_size, x * scale)._replace(residual=(x * scale).astype(dtype))
           for r, x in enumerate(residuals(old_size))]
    new = jss.reshard_state(old, new_size)
    assert len(new) == new_size
    old_mean = pairwise_rank_sum([s.residual for s in old]) / np.asarray(old_size, dtype)
    new_mean = pairwise_rank_sum([s.residual for s in new]) / np.asarray(new_size, dtype)
    assert new_mean.dtype == dtype and new[0].residual.dtype == dtype
    assert new_mean.tobytes() == old_mean.tobytes()
    # and the exact sum, scaled by Q / P, to the rounding of the group sums
    exact = np.sum([s.residual.astype(np.float64) for s in old], 0) * new_size / old_size
    error = np.abs(np.sum([s.residual.astype(np.float64) for s in new], 0) - exact)
    magnitude = np.sum([np.abs(s.residual.astype(np.float64)) for s in old], 0)
    assert np.all(error <= 4 * float(jnp.finfo(dtype).eps) * magnitude)


def test_growing_copies_each_parent_and_shrinking_averages_each_group():
    old = [topk_state(r, 4, x, threshold=t) for r, (x, t) in
           enumerate(zip(residuals(4), [1.0, 2.0, 4.0, 8.0]))]
    grown = jss.reshard_state(old, 8)
    for j, s in enumerate(grown):
        parent = old[j // 2]
        assert s.residual.tobytes() == parent.residual.tobytes()
        assert s.threshold == parent.threshold
        assert s.count == 5 and s.last_local_count == 0 and not s.last_stats.any()
        assert s.world.tolist() == np.eye(8, dtype=int)[j].tolist()
    shrunk = jss.reshard_state(old, 2)
    for j, s in enumerate(shrunk):
        a, b = old[2 * j].residual, old[2 * j + 1].residual
        assert s.residual.tobytes() == ((a + b) * np.float32(0.5)).tobytes()
    assert [float(s.threshold) for s in shrunk] == [1.5, 6.0]
    # the same size: every rank keeps its own residual and threshold
    same = jss.reshard_state(old, 4)
    for s, o in zip(same, old):
        assert s.residual.tobytes() == o.residual.tobytes() and s.threshold == o.threshold


@pytest.mark.parametrize("old_size,new_size", [(4, 3), (4, 6), (3, 2), (3, 4), (5, 8)])
def test_other_sizes_keep_the_mean_to_rounding(old_size, new_size):
    for j in range(new_size):  # the weights of a new rank sum to 1
        assert sum(n for _, n in share_weights(old_size, new_size, j)) == old_size
    for i in range(old_size):  # an old rank's weights sum to Q / P
        total = sum(n for j in range(new_size) for r, n in share_weights(old_size, new_size, j)
                    if r == i)
        assert total == new_size  # sum over j of n / P == Q / P
    old = [topk_state(r, old_size, x) for r, x in enumerate(residuals(old_size, seed=3))]
    new = jss.reshard_state(old, new_size)
    # one rounding per new entry (float64 sums): within an ulp of the terms' magnitude
    error = np.abs(np.mean([s.residual.astype(np.float64) for s in new], 0)
                   - np.mean([s.residual.astype(np.float64) for s in old], 0))
    magnitude = np.mean([np.abs(s.residual.astype(np.float64)) for s in old], 0)
    assert np.all(error <= np.finfo(np.float32).eps * magnitude), (error / magnitude).max()


def test_every_sync_state_in_an_optimizer_tree_and_the_replicated_leaves():
    params = {"w": jnp.zeros((6,)), "b": jnp.zeros((2,))}
    txs = [jss.topk_sync(k=2), jss.oktopk_sync(k=2), jss.shared_support_sync(k=2),
           jss.adam_direction_sync(jss.topk_sync(k=2)), jss.dense_sync()]
    tx = optax.chain(*txs, optax.adam(1e-3))

    def state_of(rank):
        s = jax.tree_util.tree_map(np.asarray, tx.init(params))
        rng = np.random.default_rng(rank)
        top, ok, shared, adam, dense, opt = s
        top = top._replace(residual=rng.standard_normal(8).astype(np.float32),
                           world=np.eye(4, dtype=np.int32)[rank])
        ok = ok._replace(residual=rng.standard_normal(8).astype(np.float32),
                         boundaries=np.array([0, 2, 4, 6, 8], np.int32),
                         local_threshold=np.float32(rank), global_threshold=np.float32(7))
        shared = shared._replace(residual=rng.standard_normal(8).astype(np.float32),
                                 threshold=np.float32(2 * rank),
                                 world=np.eye(4, dtype=np.int32)[rank])
        adam = adam._replace(mu=np.full(8, rank, np.float32), nu=np.full(8, 2.0 * rank, np.float32),
                             age=np.full(8, 3 + rank, np.int16),
                             sync=adam.sync._replace(world=np.eye(4, dtype=np.int32)[rank]))
        return (top, ok, shared, adam, dense, opt)

    old = [state_of(r) for r in range(4)]
    new = jss.reshard_state(old, 2)
    top, ok, shared, adam, dense, opt = new[1]
    assert ok.boundaries.tolist() == [0, 4, 8]  # re-derived for 2 ranks
    assert float(ok.local_threshold) == 2.5 and float(ok.global_threshold) == 7.0
    assert adam.mu.tolist() == [2.5] * 8 and adam.nu.tolist() == [5.0] * 8
    # ranks 2 and 3's ages (5, 6) averaged and rounded, still int16
    assert adam.age.tolist() == [6] * 8 and adam.age.dtype == np.int16
    assert adam.sync.world.tolist() == [0, 1]
    assert shared.support.tolist() == old[0][2].support.tolist()
    assert float(shared.threshold) == 5.0  # the mean of ranks 2 and 3's (4 and 6)
    assert jax.tree_util.tree_structure(opt) == jax.tree_util.tree_structure(old[0][5])
    # a rank's own state only
    alone = jss.reshard_state(old, 2, rank=1)
    for a, b in zip(jax.tree_util.tree_leaves(alone), jax.tree_util.tree_leaves(new[1])):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # a leaf that is not a sync state's must be replicated
    bad = [s[:5] + (jax.tree_util.tree_map(lambda x: x + r, s[5]),) for r, s in enumerate(old)]
    with pytest.raises(ValueError, match=r"leaf \[5\]\[0\]\.count .*replicated.*differs "
                                         r"between old rank 0 and old rank 1"):
        jss.reshard_state(bad, 2)


def test_chunked_topk_sync_state_keeps_its_residual_mean_and_a_template_restores_it():
    params = {"w": jnp.zeros((N,))}
    tx = jss.chunked_topk_sync(chunk=8, k_per_chunk=2)
    base = jax.tree_util.tree_map(np.asarray, tx.init(params))
    old = [base._replace(count=np.int32(4), residual=x, world=np.eye(4, dtype=np.int32)[r],
                         last_stats=np.arange(6, dtype=base.last_stats.dtype))
           for r, x in enumerate(residuals(4))]
    new = jss.reshard_state(old, 2)
    for j, state in enumerate(new):
        assert isinstance(state, jss.ChunkedTopkSyncState) and int(state.count) == 4
        assert state.world.tolist() == np.eye(2, dtype=np.int32)[j].tolist()
        assert not np.asarray(state.last_stats).any()
    # P = 4 -> 2: each new rank the mean of its pair, the mean over ranks kept bitwise
    assert pairwise_rank_sum([s.residual for s in new]).tobytes() == \
        (pairwise_rank_sum([s.residual for s in old]) / np.float32(2)).tobytes()
    template = jss.checkpoint_template(tx.init(params), 4, rank=3)
    assert template.world.tolist() == [0, 0, 0, 1]


def test_bad_arguments_name_the_argument():
    old = [topk_state(r, 4, x) for r, x in enumerate(residuals(4))]
    with pytest.raises(ValueError, match="`states` is empty"):
        jss.reshard_state([], 2)
    with pytest.raises(ValueError, match="`new_size` must be a positive int"):
        jss.reshard_state(old, 0)
    with pytest.raises(ValueError, match=r"`rank` must be None or an int in \[0, new_size=2\)"):
        jss.reshard_state(old, 2, rank=2)
    with pytest.raises(ValueError, match="entry 1 of `states`.*not written by rank 1 of 4.*rank "
                                         "order"):
        jss.reshard_state([old[0], old[2], old[1], old[3]], 2)
    with pytest.raises(ValueError, match="entry 0 of `states`.*not written by rank 0 of 3"):
        jss.reshard_state(old[:3], 2)
    with pytest.raises(ValueError, match="`count` at .*differs between old rank 0 and old rank 3"):
        jss.reshard_state(old[:3] + [old[3]._replace(count=np.int32(6))], 2)


def test_a_step_on_a_state_of_another_world_size_names_reshard_state():
    # this process is a world of one rank; a state written by 4 ranks must not step
    params = {"w": jnp.zeros((8,))}
    for tx in (jss.topk_sync(k=2), jss.shared_support_sync(k=2),
               jss.grouped_topk_sync([((0,), "normal")], k=2),
               jss.adam_direction_sync(jss.topk_sync(k=2))):
        state = tx.init(params)
        sync = getattr(state, "sync", state)
        assert sync.world.tolist() == [1]  # one rank wrote it
        four = sync._replace(world=np.eye(4, dtype=np.int32)[2])
        bad = state._replace(sync=four) if sync is not state else four
        with pytest.raises(ValueError, match=r"written by 4 ranks but the communicator has 1.*"
                                             r"jax_sparse_sync\.reshard_state\(states_by_old_rank, "
                                             r"new_size=1\)"):
            jax.jit(tx.update)({"w": jnp.ones((8,))}, bad)
        # a state saved before `world` existed still steps
        old = state._replace(sync=sync._replace(world=None)) if sync is not state else \
            sync._replace(world=None)
        tx.update({"w": jnp.ones((8,))}, old)
    tx = jss.oktopk_sync(k=2)
    state = tx.init(params)._replace(boundaries=jnp.array([0, 2, 4, 6, 8], jnp.int32))
    with pytest.raises(ValueError, match="written by 4 ranks.*reshard_state"):
        tx.update({"w": jnp.ones((8,))}, state)


def test_restore_at_two_and_eight_ranks_from_four(tmp_path):
    # -m mpi4py: a rank that fails ends the job instead of leaving the others waiting
    proc = run_under_mpiexec(8, ["-m", "mpi4py", "tests/mpi/reshard_case.py", str(tmp_path)],
                             timeout=600)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "RESHARD OK" in proc.stdout, tail


def test_the_orbax_recipe(tmp_path):
    # docs/topics/reliability.md's recipe, in one process: the checkpoints of 4 ranks
    # saved with Orbax, restored into checkpoint_template's targets, resharded to this
    # world of one rank, and stepped
    ocp = pytest.importorskip("orbax.checkpoint", reason="Orbax is not installed")
    params = {"w": jnp.zeros((6,)), "b": jnp.zeros((2,))}
    tx = optax.chain(jss.topk_sync(k=2), jss.oktopk_sync(k=2), optax.adam(1e-3))
    ckpt = ocp.StandardCheckpointer()
    old = []
    for rank in range(4):  # what rank `rank` of 4 would have saved
        state = jss.checkpoint_template(tx.init(params), 4, rank=rank)
        top, ok, adam = state
        state = (top._replace(residual=np.full(8, rank, np.float32)),
                 ok._replace(residual=np.full(8, 2.0 * rank, np.float32)), adam)
        ckpt.save(tmp_path / f"rank{rank}", state)
        old.append(state)
    ckpt.wait_until_finished()
    template = jss.checkpoint_template(tx.init(params), 4)
    restored = [ckpt.restore(tmp_path / f"rank{r}", template) for r in range(4)]
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(old)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    with pytest.raises(ValueError, match="reshard_state"):  # not resharded
        tx.update({"w": jnp.ones((6,)), "b": jnp.ones((2,))}, restored[0])
    state = jss.reshard_state(restored, 1, rank=0)
    assert state[0].residual.tolist() == [1.5] * 8 and state[1].residual.tolist() == [3.0] * 8
    updates, state = jax.jit(tx.update)({"w": jnp.ones((6,)), "b": jnp.ones((2,))}, state)
    assert int(state[0].count) == 1
