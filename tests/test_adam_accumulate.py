"""The fused Adam-direction + accumulator pass (``jss_adam_accumulate``) against the
unfused composition it replaces (the Adam pass, the direction cut into leaves, the
sync's accumulate / accumulate_topk), bit for bit, and adam_direction_sync's flat
entry into topk_sync / oktopk_sync against the unfused transform, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.bindings import adam as adam_kernels
from jax_sparse_sync.bindings.selection import topk
from jax_sparse_sync.transforms import adam_accumulate as fused
from jax_sparse_sync.transforms import adam_pass, flat
from jax_sparse_sync.transforms.accumulator_source import FlatSyncTransformation

from adam_cases import B1, B2, EPS, grads_tree_and_flat, state  # noqa: F401
from compiled_step import on_cpu


def grads_tree(n, seed):
    return grads_tree_and_flat(n, seed)[0]


def unfused(grads, mu, nu, age, residual, count, *, masking, decay, k, last_kth, noise=None,
            scale=None):
    # what adam_direction_sync(topk_sync) did before the fusion: the direction written,
    # cut into the gradient's leaves, then the sync's accumulator (and top-k)
    masks = None if masking == "off" else residual
    if noise is None:
        mu, nu, age, direction = adam_pass.adam_direction_pass(
            grads, mu, nu, age, masks, count, b1=B1, b2=B2, eps=EPS, masking=masking,
            scale=scale)
    else:
        mu, nu, noise, age, direction = adam_pass.mean_moment_pass(
            grads, mu, nu, noise, age, masks, count, b1=B1, b2=B2, eps=EPS, masking=masking,
            scale=scale, nranks=4, warmup=10)
    leaves = flat.split_like(direction, grads)
    if k is None:
        return mu, nu, age, noise, flat.accumulate(residual, leaves, jnp.float32, decay)
    acc, values, indices, _ = flat.accumulate_topk(residual, leaves, k, decay=decay,
                                                   last_kth=last_kth)
    return mu, nu, age, noise, acc, values, indices


def fused_pass(grads, mu, nu, age, residual, count, *, masking, decay, k, last_kth, noise=None,
               scale=None):
    out = fused.adam_accumulate(grads, mu, nu, age, residual, count, b1=B1, b2=B2, eps=EPS,
                                masking=masking, scale=scale, decay=decay, k=k,
                                last_kth=last_kth, noise=noise, nranks=4, warmup=10)
    mu, nu, age, noise, acc, values, indices, _ = out
    return (mu, nu, age, noise, acc) if k is None else (mu, nu, age, noise, acc, values, indices)


def assert_bitwise(ours, theirs, names):
    for name, a, b in zip(names, jax.tree_util.tree_leaves(ours),
                          jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_array_equal(np.atleast_1d(np.asarray(a)).view(np.uint8),
                                      np.atleast_1d(np.asarray(b)).view(np.uint8),
                                      err_msg=name)


NAMES = ("mu", "nu", "age", "noise", "acc", "values", "indices")


@pytest.mark.parametrize("masking", ["restart", "zero", "off"])
@pytest.mark.parametrize("n", [1000, 600_001])  # one thread; several chunks
@pytest.mark.parametrize("decay", [None, 0.9])
@pytest.mark.parametrize("k", [None, 50])
def test_fused_pass_is_the_unfused_composition_bit_for_bit(masking, n, decay, k, monkeypatch):
    monkeypatch.setenv("JSS_NUM_THREADS", "3")
    mu, nu, age, residual = state(n, 1)
    grads = grads_tree(n, 2)
    kw = dict(masking=masking, decay=decay, k=k, last_kth=None)
    ours = jax.jit(lambda *a: fused_pass(*a, **kw))(grads, mu, nu, age, residual, 5)
    theirs = jax.jit(lambda *a: unfused(*a, **kw))(grads, mu, nu, age, residual, 5)
    assert len(jax.tree_util.tree_leaves(ours)) == len(jax.tree_util.tree_leaves(theirs))
    assert_bitwise(ours, theirs, [x for x in NAMES if x != "noise"])
    if masking != "off":  # the stored age is negative exactly where the residual held something
        np.testing.assert_array_equal(np.asarray(ours[2]) < 0, residual != 0)


@pytest.mark.parametrize("hint", ["right", "far_low", "high", "nan"])
def test_fused_topk_follows_every_hint_case(hint, monkeypatch):
    monkeypatch.setenv("JSS_NUM_THREADS", "2")
    n, k = 300_000, 300
    mu, nu, age, residual = state(n, 3)
    grads = grads_tree(n, 4)
    acc = np.asarray(unfused(grads, mu, nu, age, residual, 7, masking="restart", decay=None,
                             k=None, last_kth=None)[4])
    kth = np.sort(np.abs(acc))[-k]
    last_kth = {"right": kth, "far_low": kth * 0.01, "high": kth * 2.0, "nan": np.nan}[hint]
    kw = dict(masking="restart", decay=None, k=k, last_kth=jnp.float32(last_kth))
    out = jax.jit(lambda *a: fused.adam_accumulate(
        *a, b1=B1, b2=B2, eps=EPS, masking="restart", k=k,
        last_kth=jnp.float32(last_kth)))(grads, mu, nu, age, residual, 7)
    theirs = jax.jit(lambda *a: unfused(*a, **kw))(grads, mu, nu, age, residual, 7)
    assert_bitwise(out[4:7], theirs[4:7], ("acc", "values", "indices"))
    values, indices = topk(jnp.asarray(acc), k)
    np.testing.assert_array_equal(np.asarray(out[6]), np.asarray(indices))
    if jax.default_backend() == "cpu":  # the kernel's list (the GPU's twin has none)
        assert int(out[7]) == (1 if hint == "right" else 0)  # used only then


@pytest.mark.parametrize("count", [1, 2, 3, 12])
def test_fused_mean_moment_pass_is_the_unfused_bit_for_bit(count, monkeypatch):
    monkeypatch.setenv("JSS_NUM_THREADS", "2")
    n = 20_000
    mu, nu, age, residual = state(n, 5)
    rng = np.random.default_rng(6)
    noise = tuple(jnp.asarray(np.abs(rng.standard_normal(n)).astype(np.float32) * s)
                  for s in (0.01, 1.0, 1.0))
    grads = grads_tree(n, 7)
    kw = dict(masking="restart", decay=None, k=20, last_kth=None, scale=jnp.float32(0.3))
    ours = jax.jit(lambda *a, noise: fused_pass(*a, noise=noise, **kw))(
        grads, mu, nu, age, residual, count, noise=noise)
    theirs = jax.jit(lambda *a, noise: unfused(*a, noise=noise, **kw))(
        grads, mu, nu, age, residual, count, noise=noise)
    assert_bitwise(ours, theirs, ("mu", "nu", "age", "diff_sq", "last", "before_last", "acc",
                                  "values", "indices"))


def test_the_jnp_twin_agrees_with_the_kernel():
    # the GPU path (XLA's fusion): the same arithmetic, an FMA apart at most
    n, k = 5000, 40
    mu, nu, age, residual = state(n, 8)
    grads = grads_tree(n, 9)
    leaves = [jnp.ravel(x) for x in jax.tree_util.tree_leaves(grads)]
    scalars = jnp.asarray([1 - B2 ** 4, 1 - B1 ** 4, 1.0, 0.0, 0.0, 0.0, 1.0, 0.95, 0.0, 1.0,
                           1.0], jnp.float32)
    kw = dict(b1=B1, b2=B2, eps=EPS, masking="restart", mask=True, has_noise=False,
              has_decay=True, k=k, cap=16 * k)
    with on_cpu():
        ours = jax.jit(lambda *a: adam_kernels.adam_accumulate_kernel(*a, **kw))(
            leaves, mu, nu, age, None, residual, scalars)
    twin = jax.jit(lambda *a: fused._jnp_twin(*a, **kw))(leaves, mu, nu, age, None, residual,
                                                        scalars)
    for name, a, b in zip(("mu", "nu", "age", "acc", "values"),
                          (ours[0], ours[1], ours[2], ours[4], ours[5]),
                          (twin[0], twin[1], twin[2], twin[4], twin[5])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=1e-7,
                                   err_msg=name)
    np.testing.assert_array_equal(np.asarray(ours[6]), np.asarray(twin[6]))


def test_sparse_syncs_take_a_flat_source_and_still_chain():
    for sync in (jss.topk_sync(density=0.1), jss.oktopk_sync(density=0.1)):
        assert isinstance(sync, FlatSyncTransformation)
        assert isinstance(sync, optax.GradientTransformation)
        assert sync.update_from is not None
        init, update = sync  # unpacks as (init, update), as optax.chain does
    # a residual that is not float32 takes the gradient only
    assert jss.topk_sync(density=0.1, residual_dtype=jnp.bfloat16).update_from is None


def _params():
    rng = np.random.default_rng(0)
    return {"a": jnp.asarray(rng.standard_normal((30, 20)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(7), jnp.float32),
            "c": jnp.zeros((0,), jnp.float32),
            "d": jnp.asarray(rng.standard_normal((4, 5, 6)), jnp.float32)}


def _train(tx, steps=8):
    params = _params()
    state = tx.init(params)

    @jax.jit
    def step(params, state, t):
        def loss(p):
            x = jnp.sin(jnp.arange(7, dtype=jnp.float32) + t)
            return (jnp.sum(p["a"] ** 2 * x[0]) + jnp.sum(jnp.cos(p["b"] * x))
                    + jnp.sum(p["d"] ** 3) * 0.01)
        updates, state = tx.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state
    for t in range(steps):
        params, state = step(params, state, jnp.float32(t))
    return params, state


def _unfused(sync):
    # the same sync without its flat entry: adam_direction_sync hands it leaves
    return optax.GradientTransformation(sync.init, sync.update)


SYNCS = {
    "topk": lambda: jss.topk_sync(density=0.02),
    "topk_ramp_flush_decay": lambda: jss.topk_sync(
        density=0.02, warmup=[(2, 1.0), (3, 0.1)], flush_every=5, residual_decay=0.95),
    "topk_threshold_reuse": lambda: jss.topk_sync(density=0.02, selection="threshold_reuse"),
    "oktopk": lambda: jss.oktopk_sync(density=0.05),
    "oktopk_ramp": lambda: jss.oktopk_sync(density=0.05, warmup=[(3, 0.25)]),
}


OPTIONS = {"plain": dict(), "zero_lr": dict(momentum_masking="zero", learning_rate=0.1),
           "mean": dict(second_moment="mean", nranks=4, second_moment_warmup=5)}
CASES = [(name, "plain") for name in SYNCS] + [
    ("topk_ramp_flush_decay", "zero_lr"), ("topk_ramp_flush_decay", "mean"),
    ("oktopk", "mean")]


def _chain(sync, options):
    return optax.chain(jss.adam_direction_sync(sync, eps=1e-3, **OPTIONS[options]),
                       optax.sgd(0.05))


@pytest.mark.parametrize("name,options", CASES)
def test_adam_direction_sync_fused_equals_unfused(name, options):
    ours, ours_state = _train(_chain(SYNCS[name](), options))
    theirs, theirs_state = _train(_chain(_unfused(SYNCS[name]()), options))
    assert_bitwise(ours, theirs, list(ours))
    assert_bitwise(ours_state, theirs_state,
                   [str(p) for p, _ in jax.tree_util.tree_leaves_with_path(ours_state)])
    assert float(jnp.max(jnp.abs(ours_state[0].sync.residual))) > 0  # something was held


def test_the_fused_kernel_replaces_the_adam_pass_and_the_accumulator():
    params = _params()
    grads = jax.tree_util.tree_map(jnp.ones_like, params)

    def hlo(sync):
        tx = _chain(sync, "plain")
        with on_cpu():  # the kernel is CPU-only: elsewhere the twin is lowered
            return jax.jit(tx.update).lower(grads, tx.init(params), params).as_text()
    ours, theirs = hlo(jss.topk_sync(density=0.02)), hlo(_unfused(jss.topk_sync(density=0.02)))
    assert "jss_adam_accumulate" in ours
    assert "jss_adam_direction" not in ours and "jss_accumulate_topk" not in ours
    assert "jss_adam_accumulate" not in theirs
    assert "jss_adam_direction" in theirs and "jss_accumulate_topk" in theirs


def test_bf16_gradient_keeps_the_unfused_path():
    # the unfused path rounds the direction to the gradient's dtype; the flat entry
    # (float32 throughout) is taken for float32 gradients only, so results do not change
    params = {"w": jnp.ones((64,), jnp.bfloat16)}
    tx = jss.adam_direction_sync(jss.topk_sync(k=4))
    g = {"w": jnp.linspace(-1, 1, 64).astype(jnp.bfloat16)}
    ours, _ = tx.update(g, tx.init(params), params)
    tx2 = jss.adam_direction_sync(_unfused(jss.topk_sync(k=4)))
    theirs, _ = tx2.update(g, tx2.init(params), params)
    assert_bitwise(ours, theirs, ["w"])


@pytest.mark.parametrize("placed", ["range", "scattered"])
@pytest.mark.parametrize("noise", [False, True], ids=["plain", "mean_moment"])
def test_a_part_of_the_whole_state_is_the_call_on_its_entries(noise, placed):
    # grouped_topk_sync's in-place path (AccumulatorSource.produce_at): the call with
    # `at` reads and writes only the part's entries of the whole buffers (one range, or
    # each leaf at its own place, out of order: the kernel's `gathered` path), the same
    # bits as the call on those entries cut out and concatenated; the rest stays as
    # given; indices relative to the part's leaf order
    n, m, k = 9000, 5000, 30
    mu, nu, age, residual = state(n, 10)
    rng = np.random.default_rng(11)
    buffers = tuple(jnp.asarray(np.abs(rng.standard_normal(n)).astype(np.float32) * s)
                    for s in (0.01, 1.0, 1.0)) if noise else None
    grads = grads_tree(m, 12)  # leaves of 1, 0, 6, 1659 and 3334 entries
    sizes = [int(x.size) for x in jax.tree_util.tree_leaves(grads)]
    at = 2500 if placed == "range" else [n - 1, 5, 5, 6000, 100]
    starts = [at + lo for lo in np.cumsum([0] + sizes[:-1])] if placed == "range" else at
    take = np.concatenate([np.arange(s, s + z) for s, z in zip(starts, sizes)])
    kw = dict(b1=B1, b2=B2, eps=EPS, masking="restart", decay=0.9, k=k, last_kth=None,
              nranks=4 if noise else None, warmup=10)
    count = jnp.int32(5)
    whole = jax.jit(lambda *a, noise: fused.adam_accumulate(*a, noise=noise, at=at, **kw))(
        grads, mu, nu, age, residual, count, noise=buffers)
    part = jax.jit(lambda *a, noise: fused.adam_accumulate(*a, noise=noise, **kw))(
        grads, mu[take], nu[take], age[take], residual[take], count,
        noise=None if buffers is None else tuple(x[take] for x in buffers))
    names = ("mu", "nu", "age") + (("diff_sq", "last", "before_last") if noise else ()) + (
        "acc",)
    given = (mu, nu, age) + (tuple(buffers) if noise else ()) + (residual,)
    for name, w, p, g in zip(names, jax.tree_util.tree_leaves(whole[:5]),
                             jax.tree_util.tree_leaves(part[:5]), given):
        w, g = np.asarray(w), np.asarray(g)
        np.testing.assert_array_equal(w[take].view(np.uint32) if w.itemsize == 4 else w[take],
                                      np.asarray(p).view(np.uint32) if w.itemsize == 4
                                      else np.asarray(p), err_msg=name)
        np.testing.assert_array_equal(np.delete(w, take), np.delete(g, take), err_msg=name)
    for a, b in zip(whole[5:7], part[5:7]):  # values, indices (relative to the part)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the jax.numpy twin (GPU) takes the part the same way
    leaves = [jnp.ravel(x) for x in jax.tree_util.tree_leaves(grads)]
    scalars = jnp.asarray([1 - B2 ** 5, 1 - B1 ** 5, 1.0, 0.0, 0.0, 0.0, 1.0, 0.9, 0.0, 1.0,
                           1.0], jnp.float32)
    consts = dict(b1=B1, b2=B2, eps=EPS, masking="restart", mask=True, has_noise=False,
                  has_decay=True, k=k, cap=16 * k, starts=tuple(int(x) for x in starts))
    with on_cpu():
        ours = jax.jit(lambda *a: adam_kernels.adam_accumulate_kernel(*a, **consts))(
            leaves, mu, nu, age, None, residual, scalars)
    twin = jax.jit(lambda *a: fused._jnp_twin(*a, **consts))(
        leaves, mu, nu, age, None, residual, scalars)
    for name, i in (("mu", 0), ("nu", 1), ("age", 2), ("acc", 4), ("values", 5)):
        np.testing.assert_allclose(np.asarray(ours[i]), np.asarray(twin[i]), rtol=2e-6,
                                   atol=1e-7, err_msg=name)
    np.testing.assert_array_equal(np.asarray(ours[6]), np.asarray(twin[6]))
    with pytest.raises(ValueError, match=r"adam_accumulate: the range at 4001 of 5000 entries "
                                         r"does not fit the state's 9000"):
        fused.adam_accumulate(grads, mu, nu, age, residual, count, noise=buffers, at=4001,
                              **kw)
