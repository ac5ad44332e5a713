"""adam_direction_sync across ranks: equals the NumPy reference (Adam per rank, error-
feedback Top-k of the directions, DGC's momentum masking), replicas stay bitwise
identical, a dense phase masks nothing, and the state survives a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks
from reference import ef_adam_direction_reference
from test_topk_sync_mpi import P, RANK, SIZE, flatten, grad_numpy, init_params, train

import jax_sparse_sync as jss

LR = 0.05
#: Adam's first directions are all about +-1 with eps = 1e-8, so a top-k among them is
#: a tie broken by rounding; eps = 0.1 keeps their magnitudes apart.
EPS = 0.1


def sgd_after(sync, masking, eps=EPS):
    return optax.chain(jss.adam_direction_sync(sync, momentum_masking=masking, eps=eps),
                       optax.sgd(LR))


@pytest.mark.parametrize("masking", ["restart", "zero", "off"])
def test_matches_numpy_reference(masking):
    k, steps = 7, 15
    params, state = train(sgd_after(jss.topk_sync(k=k, algorithm="allgather"), masking), steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    ref, moments = ef_adam_direction_reference(init_params(), [grad_numpy(r) for r in range(P)],
                                               k, LR, steps, eps=EPS, masking=masking)
    np.testing.assert_allclose(flat, ref, rtol=2e-4, atol=2e-5)
    mu, age = moments[RANK]
    ours_mu, ours_age = state[0].moments()  # the lazily applied masks applied
    np.testing.assert_allclose(np.asarray(ours_mu), mu, rtol=2e-4, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ours_age), age)
    masked = np.count_nonzero(age < steps)
    if masking == "off":
        assert masked == 0
    elif masking == "restart":
        assert masked > 0  # some entries were sent after being held back
    assert int(state[0].count) == steps


def decaying_lr(step):
    return LR / (1.0 + 0.5 * step)


@pytest.mark.parametrize("masking", ["restart", "off"])
def test_learning_rate_before_the_sync_matches_reference(masking):
    # the residual holds lr-scaled directions: a held-back entry moves by the rates of
    # the steps that computed it (a decaying rate makes that differ from rate-after)
    k, steps = 7, 12
    tx = optax.chain(jss.adam_direction_sync(jss.topk_sync(k=k), momentum_masking=masking,
                                             eps=EPS, learning_rate=decaying_lr),
                     optax.scale(-1.0))
    params, state = train(tx, steps)
    flat = flatten(params)
    assert_same_on_all_ranks(flat, "parameters")
    grads = [grad_numpy(r) for r in range(P)]
    ref, _ = ef_adam_direction_reference(init_params(), grads, k, decaying_lr, steps, eps=EPS,
                                         masking=masking, lr_before_sync=True)
    np.testing.assert_allclose(flat, ref, rtol=2e-4, atol=2e-5)
    after, _ = ef_adam_direction_reference(init_params(), grads, k, decaying_lr, steps,
                                           eps=EPS, masking=masking)
    assert np.max(np.abs(ref - after)) > 1e-3  # the placement of the rate matters here


def test_learning_rate_before_a_dense_sync_equals_after():
    steps = 5
    before, _ = train(optax.chain(jss.adam_direction_sync(jss.dense_sync(), eps=EPS,
                                                          learning_rate=decaying_lr),
                                  optax.scale(-1.0)), steps)
    after, _ = train(optax.chain(jss.adam_direction_sync(jss.dense_sync(), eps=EPS),
                                 optax.scale_by_learning_rate(decaying_lr)), steps)
    np.testing.assert_allclose(flatten(before), flatten(after), rtol=1e-5, atol=1e-7)


def test_off_is_scale_by_adam_then_sync():
    steps = 10
    ours, _ = train(sgd_after(jss.topk_sync(k=5), "off"), steps)
    plain, _ = train(optax.chain(optax.scale_by_adam(eps=EPS), jss.topk_sync(k=5),
                                 optax.sgd(LR)), steps)
    np.testing.assert_allclose(flatten(ours), flatten(plain), rtol=1e-5, atol=1e-6)


def test_a_dense_warmup_phase_masks_nothing():
    # in a dense phase nothing is held back, so Adam runs as in the dense case
    steps = 6
    sync = jss.topk_sync(k=4, warmup=[(4, 1.0)])
    params, state = train(sgd_after(sync, "restart"), steps)
    ref, moments = ef_adam_direction_reference(
        init_params(), [grad_numpy(r) for r in range(P)],
        lambda step: SIZE if step < 4 else 4, LR, steps, eps=EPS)
    np.testing.assert_allclose(flatten(params), ref, rtol=2e-4, atol=2e-5)
    age = np.asarray(state[0].moments()[1])
    # never masked (6), or masked in sparse step 5 (1) or 6 (0): none in the dense steps
    assert set(age.tolist()) <= {0.0, 1.0, float(steps)}, age
    np.testing.assert_array_equal(age, moments[RANK][1])


def test_dense_sync_is_local_adam_averaged():
    steps = 5
    params, state = train(sgd_after(jss.dense_sync(), "restart"), steps)
    ref, _ = ef_adam_direction_reference(init_params(), [grad_numpy(r) for r in range(P)],
                                         SIZE, LR, steps, eps=EPS)
    np.testing.assert_allclose(flatten(params), ref, rtol=2e-4, atol=2e-5)
    assert float(jnp.min(state[0].age)) == steps  # no residual: nothing masked
    assert_same_on_all_ranks(flatten(params), "parameters")


def test_oktopk_replicas_identical_and_masked():
    params, state = train(sgd_after(jss.oktopk_sync(density=0.2), "restart"), 12)
    assert_same_on_all_ranks(flatten(params), "parameters")
    assert np.count_nonzero(np.asarray(state[0].moments()[1]) < 12) > 0
    assert jss.SyncStats.from_vector(state[0].last_stats).bytes_sent > 0 or P == 1


def test_checkpoint_round_trip_continues_exactly():
    tx = sgd_after(jss.topk_sync(k=6), "restart")
    straight, _ = train(tx, 10)
    params, state = train(tx, 6)
    saved = jax.tree_util.tree_map(np.asarray, (params, state))  # what a checkpoint holds
    restored = jax.tree_util.tree_map(jnp.asarray, saved)
    resumed, _ = train(tx, 4, params=restored[0], state=restored[1], start=6)
    np.testing.assert_array_equal(flatten(resumed), flatten(straight))


def test_bad_arguments_name_themselves():
    sync = jss.topk_sync(k=1)
    with pytest.raises(ValueError, match="momentum_masking"):
        jss.adam_direction_sync(sync, momentum_masking="dgc")
    with pytest.raises(ValueError, match="`b1`"):
        jss.adam_direction_sync(sync, b1=1.0)
    with pytest.raises(ValueError, match="`eps`"):
        jss.adam_direction_sync(sync, eps=0.0)
    with pytest.raises(ValueError, match="`learning_rate`"):
        jss.adam_direction_sync(sync, learning_rate=0.0)
    with pytest.raises(TypeError, match="`learning_rate`"):
        jss.adam_direction_sync(sync, learning_rate=[1e-3])
    tx = jss.adam_direction_sync(sync)
    state = tx.init({"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match="initialised for other parameters"):
        tx.update({"w": jnp.zeros(4)}, state)
    WORLD.Barrier()


def test_mean_second_moment_through_a_dense_sync_is_the_ranks_mean_direction():
    # second_moment="mean" with P read from the default communicator: the update is the
    # mean over ranks of each rank's direction, each computed with the mean-gradient
    # second moment estimate (recomputed here for every rank from its gradients)
    from jax_sparse_sync.transforms import adam_pass
    n, steps = 50, 5
    tx = jss.adam_direction_sync(jss.dense_sync(), second_moment="mean", eps=EPS)
    state = tx.init({"w": jnp.zeros(n)})
    assert [x.shape for x in state.noise] == [(n,), (n,), (n,)]
    update = jax.jit(tx.update)
    refs = [[jnp.zeros(n), jnp.zeros(n), (jnp.zeros(n),) * 3, jnp.zeros(n)]
            for _ in range(P)]  # mu, nu, noise, age per rank

    def grad(rank, t):
        return np.random.default_rng(100 * t + rank).standard_normal(n).astype(np.float32)
    for t in range(1, steps + 1):
        out, state = update({"w": jnp.asarray(grad(RANK, t))}, state)
        dirs = []
        for r in range(P):
            mu, nu, noise, age = refs[r]
            mu, nu, noise, age, d = adam_pass.mean_moment_pass(
                {"w": jnp.asarray(grad(r, t))}, mu, nu, noise, age, None, jnp.int32(t),
                b1=0.9, b2=0.999, eps=EPS, masking="restart", nranks=P)
            refs[r] = [mu, nu, noise, age]
            dirs.append(np.asarray(d))
        np.testing.assert_allclose(np.asarray(out["w"]), np.mean(dirs, axis=0), rtol=1e-5,
                                   atol=1e-6)
        assert_same_on_all_ranks(np.asarray(out["w"]), "update")
    for ours, ref in zip(state.noise, refs[RANK][2]):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-6)
    if P > 1:  # the estimate differs from the rank's own second moment
        plain = jss.adam_direction_sync(jss.dense_sync(), eps=EPS)
        s = plain.init({"w": jnp.zeros(n)})
        for t in range(1, steps + 1):
            plain_out, s = plain.update({"w": jnp.asarray(grad(RANK, t))}, s)
        assert np.max(np.abs(np.asarray(plain_out["w"]) - np.asarray(out["w"]))) > 1e-3


def test_second_moment_bad_arguments():
    with pytest.raises(ValueError, match="second_moment"):
        jss.adam_direction_sync(jss.dense_sync(), second_moment="global")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="nranks"):
            jss.adam_direction_sync(jss.dense_sync(), second_moment="mean", nranks=bad)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="second_moment_warmup"):
            jss.adam_direction_sync(jss.dense_sync(), second_moment="mean",
                                    second_moment_warmup=bad)
    with pytest.raises(ValueError, match="second_moment='mean'"):
        jss.adam_direction_sync(jss.dense_sync(), second_moment_warmup=10)
    # a state built without the noise buffer is refused with the fix
    plain = jss.adam_direction_sync(jss.dense_sync()).init({"w": jnp.zeros(3)})
    tx = jss.adam_direction_sync(jss.dense_sync(), second_moment="mean")
    with pytest.raises(ValueError, match="noise"):
        tx.update({"w": jnp.ones(3)}, plain)
    # a state of the earlier first-difference estimate (two buffers): the fix is named
    old = tx.init({"w": jnp.zeros(3)})
    old = old._replace(noise=old.noise[:2])
    with pytest.raises(ValueError, match=r"_replace\(noise=tx.init\(params\).noise\)"):
        tx.update({"w": jnp.ones(3)}, old)


def _leaves_only(sync):
    # the sync without its flat entry point: adam_direction_sync hands it the direction
    # as leaves (the path before the fused kernel, jss_adam_accumulate)
    return optax.GradientTransformation(sync.init, sync.update)


@pytest.mark.parametrize("make_sync", [
    lambda: jss.topk_sync(k=6, warmup=[(2, 1.0), (2, 0.5)], flush_every=7),
    lambda: jss.oktopk_sync(density=0.2)], ids=["topk_ramp_flush", "oktopk"])
def test_fused_pass_equals_the_unfused_bit_for_bit_on_every_rank(make_sync):
    steps = 10
    fused, fused_state = train(sgd_after(make_sync(), "restart"), steps)
    plain, plain_state = train(sgd_after(_leaves_only(make_sync()), "restart"), steps)
    assert_same_on_all_ranks(flatten(fused), "parameters")
    np.testing.assert_array_equal(flatten(fused), flatten(plain))
    for name in ("mu", "nu", "age"):
        np.testing.assert_array_equal(np.asarray(getattr(fused_state[0], name)),
                                      np.asarray(getattr(plain_state[0], name)), err_msg=name)
    np.testing.assert_array_equal(np.asarray(fused_state[0].sync.residual),
                                  np.asarray(plain_state[0].sync.residual))
