"""grouped_topk_sync: per-group top-k and non-blocking allreduces give the
NumPy reference (each group keeps its share of k), replicas stay bitwise
identical, one all-leaves group equals the ungrouped update bit for bit, and
bad plans fail with a clear error. The deprecated topk_sync(grouping=...) warns
and is the same transform."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks

import jax_sparse_sync as jss

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
SHAPES = {"a": (6, 7), "b": (13,), "c": (2, 3, 4), "d": (50,)}
NAMES = sorted(SHAPES)  # tree order
SIZES = [int(np.prod(SHAPES[n])) for n in NAMES]
N = sum(SIZES)


def grads_of(rank, step):
    rng = np.random.default_rng(1000 * step + rank)
    return {n: rng.standard_normal(SHAPES[n]).astype(np.float32) for n in NAMES}


def params():
    return {n: jnp.zeros(SHAPES[n], jnp.float32) for n in NAMES}


def run(tx, steps=4):
    state = tx.init(params())
    update = jax.jit(tx.update)
    outs = []
    for step in range(steps):
        upd, state = update(grads_of(RANK, step), state)
        outs.append({n: np.asarray(upd[n]) for n in NAMES})
    return outs, state


def reference(groups, density, steps=4):
    """NumPy: every rank accumulates, keeps the top k_g of each group, sums, / P."""
    offs = np.concatenate([[0], np.cumsum(SIZES)])
    k_total = max(1, round(density * N))
    residual = np.zeros((P, N), np.float32)
    outs = []
    for step in range(steps):
        summed = np.zeros(N, np.float32)
        for r in range(P):
            g = grads_of(r, step)
            flat = np.concatenate([g[n].ravel() for n in NAMES])
            acc = residual[r] + flat
            for ids, _ in groups:
                pos = np.concatenate([np.arange(offs[i], offs[i + 1]) for i in ids])
                kg = min(len(pos), max(1, round(k_total * len(pos) / N)))
                keep = pos[np.argsort(-np.abs(acc[pos]), kind="stable")[:kg]]
                summed[keep] += acc[keep]
                acc[keep] = 0
            residual[r] = acc
        outs.append(summed / P)
    return outs, residual[RANK]


GROUPS = [((3,), "normal"), ((2, 1), "simultaneous"), ((0,), "normal")]


@pytest.mark.parametrize("groups", [GROUPS, [((3, 2, 1, 0), "normal")],
                                    [((i,), "simultaneous") for i in (3, 2, 1, 0)],
                                    # leaves 3 and 0 together: not one slice of the residual
                                    # (the per-leaf fallback and tree-order reassembly)
                                    [((3, 0), "normal"), ((2, 1), "simultaneous")]])
def test_grouped_matches_reference_and_replicas_agree(groups):
    outs, state = run(optax.chain(jss.grouped_topk_sync(groups, density=0.1,
                                                        algorithm="allgather")))
    want, want_residual = reference(groups, 0.1)
    for got, ref in zip(outs, want):
        flat = np.concatenate([got[n].ravel() for n in NAMES])
        np.testing.assert_allclose(flat, ref, rtol=1e-5, atol=1e-6)
        assert_same_on_all_ranks(flat)
    np.testing.assert_allclose(np.asarray(state[0].residual), want_residual, rtol=1e-5, atol=1e-6)
    stats = jss.SyncStats.from_vector(state[0].last_stats)
    assert int(stats.messages) > 0 or P == 1


@pytest.mark.parametrize("groups", [GROUPS, [((3, 0), "normal"), ((2, 1), "simultaneous")]])
def test_density_one_with_the_dense_algorithm_is_a_grouped_dense_sync(groups):
    # every entry kept (no selection runs): the mean of the ranks' gradients each step,
    # nothing left in the residual, and the same as the exact top-k path would give
    outs, state = run(jss.grouped_topk_sync(groups, density=1.0, algorithm="dense"))
    want, want_residual = reference(groups, 1.0)
    for step, (got, ref) in enumerate(zip(outs, want)):
        flat = np.concatenate([got[n].ravel() for n in NAMES])
        mean = np.mean([np.concatenate([grads_of(r, step)[n].ravel() for n in NAMES])
                        for r in range(P)], axis=0)
        np.testing.assert_allclose(flat, mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(flat, ref, rtol=1e-5, atol=1e-6)
        assert_same_on_all_ranks(flat)
    np.testing.assert_array_equal(np.asarray(state.residual), np.zeros(N, np.float32))
    assert not want_residual.any()
    if P > 1:  # the dense allreduce's bytes, not a sparse stream's
        stats = jss.SyncStats.from_vector(state.last_stats)
        assert int(stats.bytes_sent) >= 2 * (P - 1) * N * 4 // P


def test_one_group_in_tree_order_is_the_ungrouped_update_bitwise():
    one = [((0, 1, 2, 3), "normal")]
    a, sa = run(jss.grouped_topk_sync(one, density=0.05, algorithm="allgather"))
    b, sb = run(jss.topk_sync(density=0.05, algorithm="allgather"))
    for x, y in zip(a, b):
        for n in NAMES:
            np.testing.assert_array_equal(x[n], y[n])
    np.testing.assert_array_equal(np.asarray(sa.residual), np.asarray(sb.residual))


def test_a_plan_from_the_planner_runs():
    prof = jss.planning.BackwardProfile(names=tuple(NAMES), entries=tuple(SIZES),
                               dense_bytes=tuple(4 * s for s in SIZES),
                               ready_s=(4e-3, 3e-3, 2e-3, 1e-3), compute_s=5e-3, order=(3, 2, 1, 0))
    for method in jss.planning.GROUPINGS:
        plan = jss.planning.plan_grouping(method, prof, nranks=P, density=0.1)
        assert sorted(i for g in plan.leaf_groups() for i in g) == [0, 1, 2, 3]
        outs, _ = run(jss.grouped_topk_sync(plan, density=0.1), steps=2)
        assert_same_on_all_ranks(np.concatenate([outs[-1][n].ravel() for n in NAMES]))


def test_auto_grouping_gives_every_rank_the_same_plan_and_it_runs():
    import os
    import tempfile

    from jax_sparse_sync.planning.auto_grouping import auto_grouping

    def loss(p, x):
        return sum(jnp.sum(jnp.tanh(p[n] * x) ** 2) for n in NAMES)

    folder = WORLD.bcast(tempfile.mkdtemp() if RANK == 0 else None)
    path = os.path.join(folder, "grouping.json")
    ab = jss.planning.cost_model.AlphaBeta(alpha=50e-6, beta=8e-9, gamma=1.5)
    plan = auto_grouping(loss, params(), jnp.float32(0.5), density=0.1, comm=WORLD, path=path,
                         repeats=2, cost_params=ab)
    assert len(set(WORLD.allgather(repr(plan.to_json())))) == 1
    assert os.path.exists(path)  # rank 0 wrote it before anyone returned
    again = auto_grouping(None, params(), jnp.float32(0.5), density=0.1, comm=WORLD, path=path,
                          cost_params=ab)  # the saved profile: loss_fn never called
    assert again == plan
    outs, _ = run(jss.grouped_topk_sync(plan, density=0.1, algorithm="allgather"), steps=2)
    want, _ = reference([(g.leaves, g.kind) for g in plan.groups], 0.1, steps=2)
    for got, ref in zip(outs, want):
        flat = np.concatenate([got[n].ravel() for n in NAMES])
        np.testing.assert_allclose(flat, ref, rtol=1e-5, atol=1e-6)
        assert_same_on_all_ranks(flat)


def test_simultaneous_groups_keep_the_plans_max_concurrent():
    from jax_sparse_sync.model import grouping as gp
    from jax_sparse_sync.planning.plan_grouping import layer_times
    prof = jss.planning.BackwardProfile(names=tuple(NAMES), entries=tuple(SIZES),
                               dense_bytes=tuple(4 * s for s in SIZES),
                               ready_s=(4e-3, 3e-3, 2e-3, 1e-3), compute_s=5e-3, order=(3, 2, 1, 0))
    groups = [((i,), "simultaneous") for i in (3, 2, 1, 0)]
    plan = gp.simulate(layer_times(prof), groups, gp.Link(a=1e-4, b=1e-9, max_concurrent=2),
                       lambda n: 8.0 * n)
    assert plan.max_concurrent == 2
    jss.planning.nonblocking_timeline()  # clear
    outs, _ = run(jss.grouped_topk_sync(plan, density=0.1, algorithm="allgather"), steps=2)
    want, _ = reference(groups, 0.1, steps=2)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(np.concatenate([got[n].ravel() for n in NAMES]), ref,
                                   rtol=1e-5, atol=1e-6)
    recs = jss.planning.nonblocking_timeline()
    assert len(recs) == 8  # 4 groups, 2 steps
    for j in range(2, 8):  # at most 2 on the wire: group j after group j - 2 ended
        assert recs[j].wire_begin >= recs[j - 2].wire_end, (j, recs)


def test_bad_plans_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match="exactly once"):
        jss.grouped_topk_sync([((0, 1), "normal")], density=0.1).update(
            grads_of(0, 0), jss.topk_sync(density=0.1).init(params()))
    with pytest.raises(ValueError, match="kind"):
        jss.grouped_topk_sync([((0, 1, 2, 3), "fused")], density=0.1).update(
            grads_of(0, 0), jss.topk_sync(density=0.1).init(params()))
    for not_a_plan in ("asc", None):
        with pytest.raises(ValueError, match="plan_grouping"):
            jss.grouped_topk_sync(not_a_plan, density=0.1)
    with pytest.raises(ValueError, match="pass `density=`"):
        jss.grouped_topk_sync(GROUPS)
    with pytest.raises(ValueError, match="MPI communicators"):
        jss.grouped_topk_sync(GROUPS, density=0.1, comm=jss.axis("data"))
    with pytest.raises(ValueError, match="selection='exact'"), pytest.warns(DeprecationWarning):
        jss.topk_sync(density=0.1, grouping=GROUPS, selection="threshold_reuse")


def test_deprecated_topk_sync_grouping_warns_and_is_grouped_topk_sync():
    with pytest.warns(DeprecationWarning, match=r"use jss\.grouped_topk_sync"):
        old = jss.topk_sync(density=0.1, algorithm="allgather", grouping=GROUPS)
    a, sa = run(old, steps=2)
    b, sb = run(jss.grouped_topk_sync(GROUPS, density=0.1, algorithm="allgather"), steps=2)
    for x, y in zip(a, b):
        for n in NAMES:
            np.testing.assert_array_equal(x[n], y[n])
    np.testing.assert_array_equal(np.asarray(sa.residual), np.asarray(sb.residual))


def test_groups_out_of_tree_order_use_the_fused_selection():
    # A planner's group boundary often falls between a layer's bias and kernel, or
    # tree order sorts "Dense_10" before "Dense_2": such groups are not consecutive in
    # tree order. They must still get the fused accumulate-and-select kernel, one
    # call per group and no separate top-k (the general path took 14x the
    # consecutive group's time on a 7.9M MLP)
    tx = jss.grouped_topk_sync([((3, 0), "normal"), ((2, 1), "simultaneous")], density=0.1)
    state = tx.init(params())
    hlo = jax.jit(tx.update).lower(grads_of(RANK, 0), state).compile().as_text()
    assert hlo.count('custom_call_target="jss_accumulate_topk"') == 2
    assert 'custom_call_target="jss_topk"' not in hlo
