"""jss.chunked_topk_sync on a mesh axis (comm=jss.axis("data")) in a shard_map-ped train
step, on 8 host CPU devices (run by tests/test_axis_transport.py): each step's update is
the NumPy reference's rank-order sum of every device's decoded payload over P, the
replicas are bitwise identical, the residuals are each device's reference residual, the
bytes are the cost model's count, and a NaN on one device raises on all."""

from __future__ import annotations

import functools
import os
import sys

import pytest

if "xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts "
                "(run through tests/test_axis_transport.py)", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import chunked_topk_reference as ref  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from common import device_copies, replicated_trainer  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sparse_sync as jss  # noqa: E402
from jax_sparse_sync.planning import cost_model  # noqa: E402

DIM, CHUNK, K, LR = 150, 32, 5, 0.05  # 5 chunks, the last one 22 entries


@functools.cache
def mesh_of(p: int):
    return jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])


def targets(p):
    return np.random.default_rng(11).standard_normal((p, DIM)).astype(np.float32)


def grad_fn(w, t, step):
    return (w - t) * (1 + step % 3).astype(jnp.float32)


def reference(p, steps, bits, dtype):
    """NumPy: the replicated parameters and each device's residual after `steps`."""
    t, w = targets(p), np.zeros(DIM, np.float32)
    residuals = [np.zeros(DIM, np.float32)] * p
    for s in range(steps):
        grads = [(w - t[r]) * np.float32(1 + s % 3) for r in range(p)]
        update, residuals, _ = ref.step(residuals, grads, CHUNK, K, bits, dtype)
        w = w + update * np.float32(-LR)
    return w, residuals


@pytest.mark.parametrize("p,values,check_vma", [(4, dict(value_bits=2), True),
                                                (3, dict(value_bits=8), False),
                                                (8, dict(value_dtype=jnp.bfloat16), True)])
def test_training_matches_numpy_and_replicas_stay_identical(p, values, check_vma):
    steps = 5
    sync = jss.chunked_topk_sync(chunk=CHUNK, k_per_chunk=K, comm=jss.axis("data"), **values)
    train = replicated_trainer(mesh_of(p), optax.chain(sync, optax.sgd(LR)), grad_fn,
                               targets(p), DIM, check_vma)
    w, state = train(steps)
    copies = device_copies(w)
    assert len(copies) == p and all(c.tobytes() == copies[0].tobytes() for c in copies)
    bits, dtype = values.get("value_bits", 2), values.get("value_dtype")
    ref_w, ref_res = reference(p, steps, bits, dtype)
    np.testing.assert_allclose(copies[0], ref_w, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].residual), np.stack(ref_res), rtol=2e-6,
                               atol=1e-6)
    stats = np.asarray(state[0].last_stats)  # one row per device
    value_bytes = 2 if dtype is not None else 0
    expect = cost_model.chunked_topk_volume(nranks=p, size=DIM, chunk=CHUNK, k_per_chunk=K,
                                            value_bits=0 if value_bytes else bits,
                                            value_bytes=value_bytes)
    assert (stats[:, 0] == expect.bytes_max).all() and (stats[:, 1] == expect.bytes_max).all()
    assert (stats[:, 2] == expect.messages).all()


def test_one_step_is_the_rank_order_sum_bit_for_bit():
    # P = 4: the division by P is exact, so the update is the reference's bit for bit
    p, mesh = 4, mesh_of(4)
    tx = jss.chunked_topk_sync(chunk=CHUNK, k_per_chunk=K, comm=jss.axis("data"))
    grads = np.random.default_rng(2).standard_normal((p, DIM)).astype(np.float32)

    def body(g):
        updates, state = tx.update({"w": g[0]}, tx.init({"w": g[0]}))
        return updates["w"][None], state.residual[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                              check_vma=False))
    updates, residuals = f(jax.device_put(grads, NamedSharding(mesh, P("data"))))
    want, ref_res, _ = ref.step([np.zeros(DIM, np.float32)] * p, list(grads), CHUNK, K)
    updates, residuals = np.asarray(updates), np.asarray(residuals)
    for r in range(p):
        assert updates[r].tobytes() == want.tobytes(), r
        assert residuals[r].tobytes() == ref_res[r].tobytes(), r


def test_nan_on_one_device_raises_on_every_device():
    p, mesh = 3, mesh_of(3)
    tx = jss.chunked_topk_sync(chunk=CHUNK, k_per_chunk=K, comm=jss.axis("data"))

    def body(g):
        return tx.update({"w": g[0]}, tx.init({"w": g[0]}))[0]["w"][None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                              check_vma=False))
    grads = np.ones((p, DIM), np.float32)
    grads[2, 7] = np.nan
    with pytest.raises(Exception, match=r"non-finite .*rank\(s\) 2"):
        jax.block_until_ready(f(jax.device_put(grads, NamedSharding(mesh, P("data")))))
