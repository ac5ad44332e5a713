"""``adam_direction_sync(sync, max_grad_norm=c)``: the gradient clipped by its global
norm inside the fused Adam pass (``jss_adam_accumulate``'s ``has_clip``), against
``optax.chain(optax.clip_by_global_norm(c), adam_direction_sync(sync))`` bit for bit:
the kernel alone, whole training runs (updates, mu, nu, age, residual, params) over
every sync with a flat entry point and over the unfused path, and the compiled step,
which no longer writes the clipped gradient (docs/topics/adam_direction.md)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.bindings import adam as adam_kernels
from jax_sparse_sync.transforms import adam_accumulate as fused
from jax_sparse_sync.transforms import adam_pass
from compiled_step import donated_step, on_cpu

from adam_cases import B1, B2, EPS, grads_tree_and_flat, state
from test_adam_accumulate import _params, _unfused, assert_bitwise

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import step_local_work  # noqa: E402

NAMES = ("mu", "nu", "age", "noise", "acc", "values", "indices")


def _pass(grads, mu, nu, age, residual, count, *, clip_by_kernel, max_norm, noise=None, k=40):
    kw = dict(b1=B1, b2=B2, eps=EPS, masking="restart", decay=0.9, k=k, last_kth=None,
              noise=noise, nranks=4, warmup=10)
    norm = adam_pass.global_norm(grads)
    if clip_by_kernel:
        out = fused.adam_accumulate(grads, mu, nu, age, residual, count,
                                    clip=(norm, max_norm), **kw)
    else:  # what chain(clip_by_global_norm, ...) hands the pass: optax's clipped tree
        clipped, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
        out = fused.adam_accumulate(clipped, mu, nu, age, residual, count, **kw)
    return out[:7]


@pytest.mark.parametrize("max_norm", [0.5, 1.0, 1e9], ids=["clips", "clips_by_1", "below"])
@pytest.mark.parametrize("noise", [False, True], ids=["plain", "mean_moment"])
def test_the_pass_clips_as_optax_bit_for_bit(max_norm, noise, monkeypatch):
    monkeypatch.setenv("JSS_NUM_THREADS", "3")
    n = 600_001  # several thread chunks; leaves across them
    mu, nu, age, residual = state(n, 21)
    grads = grads_tree_and_flat(n, 22)[0]
    rng = np.random.default_rng(23)
    buffers = tuple(jnp.asarray(np.abs(rng.standard_normal(n)).astype(np.float32) * s)
                    for s in (0.01, 1.0, 1.0)) if noise else None
    run = jax.jit(lambda *a, clip_by_kernel, noise: _pass(
        *a, clip_by_kernel=clip_by_kernel, max_norm=max_norm, noise=noise),
        static_argnames="clip_by_kernel")
    ours = run(grads, mu, nu, age, residual, 7, clip_by_kernel=True, noise=buffers)
    theirs = run(grads, mu, nu, age, residual, 7, clip_by_kernel=False, noise=buffers)
    assert_bitwise(ours, theirs, NAMES)
    unclipped = jax.jit(lambda *a: fused.adam_accumulate(
        *a, b1=B1, b2=B2, eps=EPS, masking="restart", decay=0.9, k=40, noise=buffers,
        nranks=4, warmup=10)[:7])(grads, mu, nu, age, residual, 7)
    # the clipping changed the step exactly where the norm (about 775) exceeds max_norm
    clipped = max_norm < float(adam_pass.global_norm(grads))
    assert clipped == (max_norm < 1e9)
    assert np.array_equal(np.asarray(ours[1]), np.asarray(unclipped[1])) != clipped  # nu


def test_the_jnp_twin_clips_as_the_kernel():
    # the GPU path (jax.numpy; XLA fuses it): the same clipping before the same pass
    n, k = 5000, 40
    mu, nu, age, residual = state(n, 24)
    leaves = [jnp.ravel(x) for x in jax.tree_util.tree_leaves(grads_tree_and_flat(n, 25)[0])]
    norm = float(adam_pass.global_norm(leaves))
    scalars = jnp.asarray([1 - B2 ** 4, 1 - B1 ** 4, 1.0, 0.0, 0.0, 0.0, 1.0, 0.95, 0.0, norm,
                           0.25], jnp.float32)
    kw = dict(b1=B1, b2=B2, eps=EPS, masking="restart", mask=True, has_noise=False,
              has_decay=True, k=k, cap=16 * k, has_clip=True)
    with on_cpu():
        ours = jax.jit(lambda *a: adam_kernels.adam_accumulate_kernel(*a, **kw))(
            leaves, mu, nu, age, None, residual, scalars)
    twin = jax.jit(lambda *a: fused._jnp_twin(*a, **kw))(leaves, mu, nu, age, None, residual,
                                                        scalars)
    unclipped = jax.jit(lambda *a: fused._jnp_twin(*a, **dict(kw, has_clip=False)))(
        leaves, mu, nu, age, None, residual, scalars)
    for i, name in ((0, "mu"), (1, "nu"), (2, "age"), (4, "acc"), (5, "values")):
        np.testing.assert_allclose(np.asarray(ours[i]), np.asarray(twin[i]), rtol=2e-6,
                                   atol=1e-7, err_msg=name)
    assert not np.allclose(np.asarray(twin[1]), np.asarray(unclipped[1]), rtol=1e-3)
    np.testing.assert_array_equal(np.asarray(ours[6]), np.asarray(twin[6]))


#: a gradient whose global norm crosses MAX_NORM from step to step (a's: about 49 (t % 3))
MAX_NORM = 30.0


def _train(tx, steps=9):
    params = _params()
    state = tx.init(params)

    def loss(p, t):
        x = jnp.sin(jnp.arange(7, dtype=jnp.float32) + t)
        return (jnp.sum(p["a"] ** 2) * (jnp.mod(t, 3.0) + 0.05) + jnp.sum(jnp.cos(p["b"] * x))
                + jnp.sum(p["d"] ** 3) * 0.01)

    @jax.jit
    def step(params, state, t):
        grads = jax.grad(loss)(params, t)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, optax.tree.norm(grads)
    norms = []
    for t in range(steps):
        params, state, norm = step(params, state, jnp.float32(t))
        norms.append(float(norm))
    return params, state, norms


SYNCS = {
    "topk": lambda: jss.topk_sync(density=0.05),
    "topk_ramp_flush_decay": lambda: jss.topk_sync(
        density=0.05, warmup=[(2, 1.0), (3, 0.1)], flush_every=5, residual_decay=0.95),
    "oktopk": lambda: jss.oktopk_sync(density=0.05),
    "grouped": lambda: jss.grouped_topk_sync(
        [((3,), "normal"), ((1, 2), "simultaneous"), ((0,), "normal")], density=0.05),
    "topk_unfused": lambda: _unfused(jss.topk_sync(density=0.05)),
}
OPTIONS = {"restart": dict(), "zero_lr": dict(momentum_masking="zero", learning_rate=0.1),
           "mean": dict(second_moment="mean", nranks=4, second_moment_warmup=3)}
CASES = [(name, "restart") for name in SYNCS] + [("topk_ramp_flush_decay", "zero_lr"),
                                                 ("topk", "mean"), ("grouped", "mean")]


@pytest.mark.parametrize("name,options", CASES)
def test_max_grad_norm_is_clip_by_global_norm_in_front_bit_for_bit(name, options):
    def tx(**clip):
        return optax.chain(jss.adam_direction_sync(SYNCS[name](), eps=1e-3, **clip,
                                                   **OPTIONS[options]),
                           optax.add_decayed_weights(0.01), optax.scale_by_learning_rate(0.05))
    ours = _train(tx(max_grad_norm=MAX_NORM))
    theirs = _train(optax.chain(optax.clip_by_global_norm(MAX_NORM), tx()))
    assert_bitwise(ours[0], theirs[0], ["params"] * 4)
    adam_ours, adam_theirs = ours[1][0], theirs[1][1][0]
    assert_bitwise(adam_ours, adam_theirs,
                   [str(p) for p, _ in jax.tree_util.tree_leaves_with_path(adam_ours)])
    norms = ours[2]
    assert min(norms) < MAX_NORM < max(norms)  # steps clipped and steps left as they were
    assert float(jnp.max(jnp.abs(adam_ours.sync.residual))) > 0  # something was held
    # and the clipping mattered: without it the parameters differ
    assert not np.array_equal(np.asarray(_train(tx())[0]["a"]), np.asarray(ours[0]["a"]))


def test_the_compiled_step_does_not_write_the_clipped_gradient():
    n = 300 * 200 + 2000 + 7

    def written(tx):
        # the CPU kernel's folding (on a GPU the twin's clip is one more XLA fusion)
        with on_cpu():
            params = {"a": jnp.zeros((300, 200)), "b": jnp.zeros((2000,)),
                      "c": jnp.zeros((7,))}
            step, args = donated_step(tx, params, grad_fill=0.5)
            text = step.lower(*args).compile().as_text()
            entry = step_local_work._entry_name(text)
            step(*args)  # and it runs
        return sum(e for comp, *_, e in step_local_work.written_buffers(text, min_entries=1)
                   if comp == entry)

    def tail(**clip):
        return (jss.adam_direction_sync(jss.topk_sync(density=0.01), momentum_masking="restart",
                                        **clip),
                optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(1e-3))
    folded = written(optax.chain(*tail(max_grad_norm=1.0)))
    chained = written(optax.chain(optax.clip_by_global_norm(1.0), *tail()))
    # the chain writes the clipped gradient (N floats) for the kernel to read; folded,
    # the kernel clips each entry as it reads it (the 7-entry leaf's clipping XLA
    # may fuse into another small fusion's output: not counted)
    assert chained - folded >= n - 7, (chained, folded)


@pytest.mark.parametrize("bad", [0.0, -1.0, True, "1.0", float("nan")])
def test_bad_max_grad_norm_names_itself(bad):
    with pytest.raises(ValueError, match="adam_direction_sync: `max_grad_norm` must be None"):
        jss.adam_direction_sync(jss.topk_sync(density=0.01), max_grad_norm=bad)
