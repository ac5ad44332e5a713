"""Adam-direction test inputs shared by test_adam_direction_pass.py and
test_adam_accumulate.py: a state with every kind of slot, a gradient tree
with an empty leaf and leaves across the kernels' thread chunks."""
import jax.numpy as jnp
import numpy as np

B1, B2, EPS = 0.9, 0.999, 1e-8


def state(n, seed):
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal(n).astype(np.float32) * 0.1
    nu = np.abs(rng.standard_normal(n)).astype(np.float32) * 0.01
    age = rng.integers(1, 300, n).astype(np.int16)  # past the 1 - b1**a table (166) too
    age[rng.random(n) < 0.05] = 32767  # saturated (MAX_AGE): stays there
    age[rng.random(n) < 0.02] = 32766  # the last step to saturation
    age[rng.random(n) < 0.4] *= -1  # held before the last sync
    residual = rng.standard_normal(n).astype(np.float32)
    residual[rng.random(n) < 0.5] = 0.0  # sent by it
    return mu, nu, age, residual


def grads_tree_and_flat(n, seed):
    """The gradient as a tree of leaves and as the flat vector they cut."""
    g = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    cut = [0, 1, 1, 7, n // 3, n]  # an empty leaf and leaves across the thread chunks
    return {f"l{j}": jnp.asarray(g[lo:hi]) for j, (lo, hi) in enumerate(zip(cut, cut[1:]))}, g
