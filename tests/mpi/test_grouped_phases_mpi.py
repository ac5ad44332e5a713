"""grouped_topk_sync with the configurations that converge: adam_direction_sync in front
(momentum masking, each group's Adam pass on its own), warm-up ramps (dense and sparse
phases) and flushes, the phase applied to every group. Each against the NumPy reference
with per-group top-k (tests/reference.py), replicas bitwise identical, and a one-group
plan bit for bit the ungrouped adam_direction_sync(topk_sync(...))."""

import jax
import numpy as np
import optax
import pytest
from conftest import assert_same_on_all_ranks
from quadratic_problem import SHAPES
from reference import ef_adam_direction_reference, ef_topk_sgd_reference, grouped_topk_selection
from test_topk_sync_mpi import P, RANK, SIZE, flatten, grad_numpy, init_params, train

import jax_sparse_sync as jss

SIZES = [int(np.prod(s)) for s in SHAPES.values()]  # tree order: a (42), b (13), c (24)
LR = 0.05
EPS = 0.1  # keeps Adam's first directions (all about +-1) apart, as test_adam_direction_sync_mpi
#: backward order: c first; and a plan whose group is not one slice of the flat layout
GROUPS = [((2,), "normal"), ((0, 1), "simultaneous")]
SPLIT = [((0, 2), "normal"), ((1,), "simultaneous")]


def adam_sgd(sync, masking="restart"):
    return optax.chain(jss.adam_direction_sync(sync, momentum_masking=masking, eps=EPS),
                       optax.sgd(LR))


def check_moments(state, moments, steps):
    mu, age = moments[RANK]
    ours_mu, ours_age = state[0].moments()
    np.testing.assert_allclose(np.asarray(ours_mu), mu, rtol=2e-4, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ours_age), age)
    return np.count_nonzero(age < steps)  # entries whose momentum was masked


@pytest.mark.parametrize("groups", [GROUPS, SPLIT], ids=["slices", "split"])
@pytest.mark.parametrize("masking", ["restart", "zero"])
def test_adam_direction_grouped_matches_reference(groups, masking):
    k, steps = 8, 12
    params, state = train(adam_sgd(jss.grouped_topk_sync(groups, k=k, algorithm="allgather"),
                                   masking), steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    select = grouped_topk_selection(SIZES, [ids for ids, _ in groups], lambda step: k)
    ref, moments = ef_adam_direction_reference(
        init_params(), [grad_numpy(r) for r in range(P)], k, LR, steps, eps=EPS,
        masking=masking, select_at=select)
    np.testing.assert_allclose(flat, ref, rtol=2e-4, atol=2e-5)
    masked = check_moments(state, moments, steps)
    assert masked > 0  # entries were sent after being held back: the masking ran
    # per-group top-k is another selection than the global one: the reference tells
    glob, _ = ef_adam_direction_reference(init_params(), [grad_numpy(r) for r in range(P)], k,
                                          LR, steps, eps=EPS, masking=masking)
    assert np.max(np.abs(glob - ref)) > 1e-4
    assert int(state[0].sync.last_local_count) == 8  # 24 -> 2.4 -> 2, 55 -> 5.6 -> 6


# a dense phase, a sparse phase, then k; a flush every 4th step (steps 3 and 7)
WARMUP, FLUSH, K, STEPS = [(2, 1.0), (2, 0.25)], 4, 6, 8


def k_at(step):
    if step < 2 or step % FLUSH == FLUSH - 1:
        return SIZE  # dense
    return round(0.25 * SIZE) if step < 4 else K


@pytest.mark.parametrize("groups", [GROUPS, SPLIT], ids=["slices", "split"])
def test_grouped_warmup_and_flush_match_reference(groups):
    tx = optax.chain(jss.grouped_topk_sync(groups, k=K, algorithm="allgather", warmup=WARMUP,
                                           flush_every=FLUSH), optax.sgd(0.1))
    params, state = train(tx, STEPS - 1)  # ends on a sparse step
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    select = grouped_topk_selection(SIZES, [ids for ids, _ in groups], k_at)
    ref, residuals = ef_topk_sgd_reference(init_params(), [grad_numpy(r) for r in range(P)],
                                           None, 0.1, STEPS - 1, select_at=select)
    np.testing.assert_allclose(flat, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state[0].residual), residuals[RANK], rtol=2e-5,
                               atol=2e-5)
    assert np.any(np.asarray(state[0].residual))
    assert int(state[0].last_local_count) == 6  # 24 -> 1.8 -> 2, 55 -> 4.2 -> 4
    params, state = train(tx, 1, params=params, state=state, start=STEPS - 1)  # flushes
    assert not np.any(np.asarray(state[0].residual))
    assert int(state[0].last_local_count) == SIZE
    assert_same_on_all_ranks(flatten(params), "parameters")


def test_adam_direction_grouped_with_a_density_ramp_matches_reference():
    # the LM's configuration: Adam directions, momentum masking, DGC's ramp, grouped
    ramp = jss.density_ramp(0.1, steps_per_stage=2, dense_steps=1)  # 1.0, 0.25 then 0.1
    assert ramp == ((1, 1.0), (2, 0.25))
    steps = 8
    params, state = train(adam_sgd(jss.grouped_topk_sync(GROUPS, density=0.1,
                                                         algorithm="allgather", warmup=ramp)),
                          steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    k_of = {1.0: SIZE, 0.25: round(0.25 * SIZE), 0.1: round(0.1 * SIZE)}
    select = grouped_topk_selection(SIZES, [ids for ids, _ in GROUPS], lambda step: k_of[
        1.0 if step < 1 else 0.25 if step < 3 else 0.1])
    ref, moments = ef_adam_direction_reference(
        init_params(), [grad_numpy(r) for r in range(P)], None, LR, steps, eps=EPS,
        select_at=select)
    np.testing.assert_allclose(flat, ref, rtol=2e-4, atol=2e-5)
    assert check_moments(state, moments, steps) > 0


@pytest.mark.parametrize("warmup, flush_every", [
    (None, None), ([(2, 0.25)], None), ([(1, 1.0), (2, 0.25)], 4)],
    ids=["plain", "sparse_ramp", "dense_phase_and_flush"])
def test_one_group_adam_direction_is_the_ungrouped_step(warmup, flush_every):
    one = [((0, 1, 2), "normal")]
    a, sa = train(adam_sgd(jss.grouped_topk_sync(one, k=K, algorithm="allgather",
                                                 warmup=warmup, flush_every=flush_every)), 6)
    b, sb = train(adam_sgd(jss.topk_sync(k=K, algorithm="allgather", warmup=warmup,
                                         flush_every=flush_every)), 6)
    ours = [flatten(a)] + [np.asarray(x) for x in (sa[0].mu, sa[0].nu, sa[0].age,
                                                   sa[0].sync.residual, sa[0].sync.threshold)]
    theirs = [flatten(b)] + [np.asarray(x) for x in (sb[0].mu, sb[0].nu, sb[0].age,
                                                     sb[0].sync.residual, sb[0].sync.threshold)]
    # A dense step (a dense phase, a flush, or a ramp stage dense enough that the
    # sparse allreduce switches to its dense path) is an MPI_Allreduce in both, but
    # the grouped one runs on the non-blocking worker's own communicator, where
    # MPICH may sum P > 2 ranks in another order (every rank still gets the same
    # bits): 1 ulp apart there. At the own density (k = 6 of 79) the sums are
    # the sparse path's, in rank order: bit for bit.
    bitwise = warmup is None or P == 2
    for x, y in zip(ours, theirs):
        if bitwise:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert_same_on_all_ranks(ours[0], "parameters")


def test_a_planner_plan_under_adam_direction_sync_with_a_ramp():
    prof = jss.planning.BackwardProfile(
        names=tuple(SHAPES), entries=tuple(SIZES), dense_bytes=tuple(4 * s for s in SIZES),
        ready_s=(3e-3, 2e-3, 1e-3), compute_s=4e-3, order=(2, 1, 0))
    plan = jss.planning.plan_grouping("asc", prof, nranks=P, density=0.1)
    tx = adam_sgd(jss.grouped_topk_sync(plan, density=0.1, flush_every=3,
                                        warmup=jss.density_ramp(0.1, steps_per_stage=1)))
    params, state = train(tx, 4)
    assert_same_on_all_ranks(flatten(params), "parameters")
    assert np.all(np.isfinite(flatten(params)))
    assert int(state[0].count) == 4
