"""jss.check_donation: the large sync-state buffers a jitted step does not donate."""

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.transforms import donation

N = 1 << 18  # a 1 MiB float32 residual: the smallest reported by default


def make(tx):
    params = {"w": jnp.zeros(N), "b": jnp.zeros(3)}

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step, params, tx.init(params)


@pytest.fixture(autouse=True)
def fresh_reports():
    donation._reported.clear()
    yield
    donation._reported.clear()


def test_donated_step_is_silent():
    step, params, state = make(optax.chain(jss.topk_sync(k=10), optax.sgd(0.1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jss.check_donation(jax.jit(step, donate_argnums=(0, 1)), params, state,
                                  params) == []
        # the state alone is what matters
        assert jss.check_donation(jax.jit(step, donate_argnums=(1,)), params, state,
                                  params) == []


def test_plain_jit_names_the_residual_and_warns_once():
    step, params, state = make(optax.chain(jss.topk_sync(k=10), optax.sgd(0.1)))
    plain = jax.jit(step)
    with pytest.warns(jss.NotDonatedWarning, match=r"TopkSyncState\.residual \(1\.0 MB\).*"
                                                  r"donate_argnums"):
        found = jss.check_donation(plain, params, state, params)
    assert found == ["TopkSyncState.residual (1.0 MB)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told once: the second check finds it but says nothing
        assert jss.check_donation(plain, params, state, params) == found


def test_adam_direction_moments_and_kwargs():
    tx = jss.adam_direction_sync(jss.topk_sync(k=10))
    step, params, state = make(tx)
    with pytest.warns(jss.NotDonatedWarning):
        found = jss.check_donation(jax.jit(step), params, state=state, grads=params)
    names = " ".join(found)
    assert "AdamDirectionSyncState.mu" in names and "AdamDirectionSyncState.nu" in names
    assert jss.check_donation(jax.jit(step, donate_argnames=("state",)), params, state=state,
                              grads=params) == []


def test_small_buffers_and_dense_sync_are_not_reported():
    step, params, state = make(optax.chain(jss.topk_sync(k=10), optax.sgd(0.1)))
    assert jss.check_donation(jax.jit(step), params, state, params, min_bytes=(N + 3) * 4 + 1) == []
    step, params, state = make(optax.chain(jss.dense_sync(), optax.sgd(0.1)))
    assert jss.check_donation(jax.jit(step), params, state, params) == []


def test_not_jitted_is_a_type_error():
    with pytest.raises(TypeError, match="check_donation: `step` must be a jitted function"):
        jss.check_donation(lambda x: x, 1)
