"""The transforms' MPI test problem: worker r's loss is a quadratic with its own minimiser.

Shared by tests/mpi/test_topk_sync_mpi.py and test_shared_support_sync_mpi.py: three leaves
of different shapes (so the flat layout is exercised), and a gradient whose scale changes
with the step (so a stale residual is not the fresh gradient).
"""

import jax.numpy as jnp
import numpy as np

SHAPES = {"a": (6, 7), "b": (13,), "c": (2, 3, 4)}
SIZE = sum(int(np.prod(s)) for s in SHAPES.values())


class QuadraticProblem:
    """Worker r's targets from seed ``target_seed + r``; the start from ``init_seed``."""

    def __init__(self, target_seed: int, init_seed: int):
        self.target_seed, self.init_seed = target_seed, init_seed

    def targets(self, rank):
        """Worker `rank`'s data: the minimiser of its quadratic loss."""
        return np.random.default_rng(self.target_seed + rank).standard_normal(SIZE).astype(
            np.float32)

    def grad_numpy(self, rank):
        t = self.targets(rank)
        return lambda params, step: (params - t) * np.float32(1 + step % 3)

    def init_params(self):
        return np.random.default_rng(self.init_seed).standard_normal(SIZE).astype(np.float32)


def unflatten(flat):
    out, o = {}, 0
    for name, shape in SHAPES.items():
        n = int(np.prod(shape))
        out[name] = jnp.asarray(flat[o:o + n].reshape(shape))
        o += n
    return out


def flatten(tree):
    return np.concatenate([np.asarray(tree[name]).reshape(-1) for name in SHAPES])
