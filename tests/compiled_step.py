"""The compiled, donated training step of an Optax transform, as text: what the tests
that count the buffers XLA copies read (tests/test_topk_sync.py,
tests/test_grouped_phases.py)."""

import jax
import jax.numpy as jnp
import optax


def compiled_step_text(tx, params) -> str:
    """HLO text of ``params, state <- apply(tx.update(ones, state, params))`` compiled
    with the parameters and the state donated, as a training loop runs it."""
    state = tx.init(params)

    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step, donate_argnums=(0, 1))
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    return step.lower(params, state, grads).compile().as_text()
