"""The transforms' MPI test problem: worker r's loss is a quadratic with its own minimiser.

Shared by tests/mpi/test_topk_sync_mpi.py and test_shared_support_sync_mpi.py: three leaves
of different shapes (so the flat layout is exercised), and a gradient whose scale changes
with the step (so a stale residual is not the fresh gradient); the training loop on it, and
a run stopped, checkpointed and resumed (test_oktopk_sync_mpi.py's too).
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
from conftest import assert_same_on_all_ranks

SHAPES = {"a": (6, 7), "b": (13,), "c": (2, 3, 4)}
SIZE = sum(int(np.prod(s)) for s in SHAPES.values())


class QuadraticProblem:
    """Worker r's targets from seed ``target_seed + r``; the start from ``init_seed``."""

    #: the jitted steps of the last few transforms (see :meth:`step`)
    CACHED_STEPS = 8

    def __init__(self, target_seed: int, init_seed: int):
        self.target_seed, self.init_seed = target_seed, init_seed
        self._steps = collections.OrderedDict()

    def targets(self, rank):
        """Worker `rank`'s data: the minimiser of its quadratic loss."""
        return np.random.default_rng(self.target_seed + rank).standard_normal(SIZE).astype(
            np.float32)

    def grad_numpy(self, rank):
        t = self.targets(rank)
        return lambda params, step: (params - t) * np.float32(1 + step % 3)

    def init_params(self):
        return np.random.default_rng(self.init_seed).standard_normal(SIZE).astype(np.float32)

    def step(self, tx, rank):
        """The jitted training step of `tx` on worker `rank`'s loss.

        One per transform object: a test that trains the same `tx` to several lengths,
        or stops, checkpoints and resumes it, traces and compiles its step once, as one
        longer run would (the step is a pure function of its arguments).
        """
        key = (id(tx), rank)
        if key in self._steps and self._steps[key][0] is tx:
            self._steps.move_to_end(key)
            return self._steps[key][1]
        # the targets are an argument, not constants of the program: every rank then
        # compiles the same program, which the persistent cache and the compile-once lock
        # of tests/conftest.py compile once for the job instead of once a rank (P = 3,
        # test_topk_sync_mpi.py: 81 programs named jit_step compiled, 27 with this)
        t = unflatten(self.targets(rank))

        @jax.jit
        def jitted_step(params, state, i, targets):
            return _step(tx, params, state, i, targets)

        def step(params, state, i):
            return jitted_step(params, state, i, t)

        self._steps[key] = (tx, step)  # holding tx keeps its id from being reused
        while len(self._steps) > self.CACHED_STEPS:
            self._steps.popitem(last=False)
        return step

    def train(self, tx, steps, rank, params=None, state=None, start=0):
        """Steps start .. start + steps - 1 of `tx` on worker `rank`'s loss, from `params`
        and `state` (the start and tx.init's where None): (params, state)."""
        params = unflatten(self.init_params()) if params is None else params
        state = tx.init(params) if state is None else state
        step = self.step(tx, rank)
        for i in range(start, start + steps):
            params, state = step(params, state, jnp.int32(i))
        return params, state


def _step(tx, params, state, i, targets):
    """One step of `tx` on the loss whose minimiser is `targets` (a tree like params)."""
    scale = (1 + i % 3).astype(jnp.float32)
    grads = jax.tree_util.tree_map(lambda p, tt: (p - tt) * scale, params, targets)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def train_across_a_checkpoint(train, tx, steps, at):
    """`steps` steps of `train(tx, ...)` straight, and again stopped after `at`, saved as a
    checkpoint (the parameters' and the state's arrays as NumPy) and resumed from it:
    (straight params, resumed params, the checkpoint (params, state))."""
    straight, _ = train(tx, steps)
    params, state = train(tx, at)
    saved = jax.tree_util.tree_map(np.asarray, (params, state))
    restored = jax.tree_util.tree_map(jnp.asarray, saved)
    resumed, _ = train(tx, steps - at, params=restored[0], state=restored[1], start=at)
    return straight, resumed, saved


def assert_resumes_exactly(train, tx, steps, at):
    """train_across_a_checkpoint: the resumed parameters are the straight run's, bit for bit,
    and the same on every rank. Returns the checkpoint."""
    straight, resumed, saved = train_across_a_checkpoint(train, tx, steps, at)
    np.testing.assert_array_equal(flatten(resumed), flatten(straight))
    assert_same_on_all_ranks(flatten(resumed))
    return saved


def unflatten(flat):
    out, o = {}, 0
    for name, shape in SHAPES.items():
        n = int(np.prod(shape))
        out[name] = jnp.asarray(flat[o:o + n].reshape(shape))
        o += n
    return out


def flatten(tree):
    return np.concatenate([np.asarray(tree[name]).reshape(-1) for name in SHAPES])
