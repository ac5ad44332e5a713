"""The compiled, donated training step of an Optax transform: what the tests that
count the buffers XLA copies or writes read (tests/test_topk_sync.py,
tests/test_grouped_phases.py, tests/test_step_local_work.py,
tests/test_shared_support_sync.py)."""

import jax
import jax.numpy as jnp
import optax


def on_cpu():
    """A context in which jitted calls run on the CPU whatever the default device: for the
    CPU-only fused kernels called directly and for the compiled CPU step's structure
    (under ``JAX_PLATFORMS=cuda,cpu`` the rest of a test runs on the GPU, where the
    kernels' jax.numpy twins are checked against these)."""
    return jax.default_device(jax.devices("cpu")[0])


def donated_step(tx, params, grad_fill: float = 1.0):
    """``(step, (params, state, grads))``: ``step`` is ``params, state <-
    apply(tx.update(grads, state, params))`` jitted with the parameters and the
    state donated, as a training loop runs it; ``grads`` every entry
    ``grad_fill``."""
    state = tx.init(params)

    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, grad_fill), params)
    return jax.jit(step, donate_argnums=(0, 1)), (params, state, grads)


def compiled_step_text(tx, params) -> str:
    """HLO text of :func:`donated_step`'s compiled step."""
    step, args = donated_step(tx, params)
    return step.lower(*args).compile().as_text()


def n_entry_copies(tx, params, n: int) -> int:
    """Copies of an N-entry float32 buffer (``f32[N]{0} copy(``) in :func:`donated_step`'s
    compiled CPU step of ``tx`` (XLA's GPU compiler made one for the density ramp on an
    H100, 2026-11-28: the CPU's count is the one the tests pin)."""
    with on_cpu():
        text = compiled_step_text(tx, params)
    return sum(f"f32[{n}]{{0}} copy(" in line for line in text.splitlines())
