"""sharded_sync on a mesh axis (jss.axis), on 4 host CPU devices: run by tests/test_sharded_sync.py.

JAX fixes the number of host devices when it starts, so this module runs in a
subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set
before JAX is imported; elsewhere it skips itself. Checked: the single-process
reference of P ranks (tests/sharded_reference.py) bit for bit at P = 3 (the top-k
change), every device's parameters identical; and on a 2 x 2 mesh, the
sync over "data" inside a shard_map whose parameters are sharded over "model"
(FSDP-style: each device holds half of them), the dense change and the reduced
gradient clipped by its global norm: each model shard equals the reference of that
half at P = 2 (to float32 rounding, see there), and the state is sharded over both axes.
"""

from __future__ import annotations

import os
import sys

import pytest

if "xla_force_host_platform_device_count=4" not in os.environ.get("XLA_FLAGS", ""):
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts "
                "(run through tests/test_sharded_sync.py)", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from sharded_reference import sharded_sync_reference, slot_of  # noqa: E402

import jax_sparse_sync as jss  # noqa: E402

N, K, STEPS = 61, 7, 5
INNER = optax.adamw(0.05, weight_decay=0.1)


def targets(rank, n=N):
    return np.random.default_rng(80 + rank).standard_normal(n).astype(np.float32)


def start(n=N):
    return np.random.default_rng(2).standard_normal(n).astype(np.float32)


def grad_fn(t):
    return lambda w, step: (w - t) * np.float32(1 + step % 3)


def change_k(n, p):
    return min(K, slot_of(n, p))


def rows(tree):
    return jax.tree_util.tree_map(lambda x: x[None], tree)


def trainer(mesh, tx, data_axes, param_spec):
    """jit(shard_map) of ``STEPS`` steps: the parameters ``w`` under ``param_spec``, the
    state one row per device (sharded over ``data_axes``), device d's targets its row."""

    def init(w):
        return rows(tx.init({"w": w}))

    def step(w, state, t, i):
        state = jax.tree_util.tree_map(lambda x: x[0], state)
        scale = (1 + i % 3).astype(jnp.float32)
        updates, state = tx.update({"w": (w - t[0]) * scale}, state, {"w": w})
        return w + updates["w"], rows(state)

    state_spec = P(data_axes)
    init = jax.jit(jax.shard_map(init, mesh=mesh, in_specs=param_spec, out_specs=state_spec))
    step = jax.jit(jax.shard_map(step, mesh=mesh,
                                 in_specs=(param_spec, state_spec, P(data_axes), P()),
                                 out_specs=(param_spec, state_spec)))

    def train(w, t):
        w = jax.device_put(w, NamedSharding(mesh, param_spec))
        state = init(w)
        t = jax.device_put(t, NamedSharding(mesh, P(data_axes)))
        for s in range(STEPS):
            w, state = step(w, state, t, jnp.int32(s))
        return w, state
    return train


# The changes' own arithmetic (the lazy masks, the owner's top-k) is the transport's
# business of neither: tests/mpi/test_sharded_sync_mpi.py checks all three; here the
# sparse gather (topk, lazy's path) at P = 3 and the dense one on the 2 x 2 mesh.
def test_three_devices_equal_the_reference_bit_for_bit(change="topk"):
    p = 3
    mesh = jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])
    tx = jss.sharded_sync(INNER, k=K, change=change, comm=jss.axis("data"))
    ts = np.stack([targets(r) for r in range(p)])
    w, state = trainer(mesh, tx, "data", P())(start(), ts)
    ref = sharded_sync_reference(start(), [grad_fn(t) for t in ts], k=K, steps=STEPS,
                                 inner=INNER, change=change, change_k=change_k(N, p))
    copies = [np.asarray(s.data) for s in w.addressable_shards]
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)  # replicas identical
    assert copies[0].tobytes() == ref.params.tobytes()
    residual = np.asarray(state.residual)
    for r in range(p):
        assert residual[r].tobytes() == ref.residuals[r].tobytes()
        assert np.asarray(state.change_residual)[r].tobytes() == \
            ref.change_residuals[r].tobytes()
        for ours, theirs in zip(jax.tree_util.tree_leaves(state.inner),
                                jax.tree_util.tree_leaves(ref.inner[r])):
            assert np.asarray(ours)[r].tobytes() == np.asarray(theirs).tobytes()
    # the state per device: the region's ceil(N / P) entries per moment
    assert state.inner[0].mu.shape == (p, slot_of(N, p))
    assert jss.SyncStats.from_vector(np.asarray(state.reduce_stats)[0]).algorithm_name == "region_reduce"


def test_fsdp_parameters_over_model_and_the_sync_over_data(change="dense", max_grad_norm=2.0):
    # with the reduced gradient clipped by its global norm (over each model shard's sync):
    # XLA fuses the clip's scale into this program's inner step and may contract it
    # otherwise than the reference's (MPI's program: bit for bit, tests/mpi), so here to
    # float32 rounding
    data, model = 2, 2
    mesh = jax.make_mesh((data, model), ("data", "model"))
    tx = jss.sharded_sync(INNER, k=K, change=change, comm=jss.axis("data"),
                          max_grad_norm=max_grad_norm)
    n = 2 * N  # each model shard holds N entries
    ts = np.stack([targets(r, n) for r in range(data)])
    # the targets' rows over data; each device reads its own model half of its row
    train = trainer(mesh, tx, ("data", "model"), P("model"))
    tiled = np.stack([ts[d, m * N:(m + 1) * N] for d in range(data) for m in range(model)])
    w, state = train(start(n), tiled)
    copies = {}  # each model half's copies on the data axis: bitwise the same
    for shard in w.addressable_shards:
        copies.setdefault(shard.index[0].start, set()).add(np.asarray(shard.data).tobytes())
    assert len(copies) == model and all(len(c) == 1 for c in copies.values())
    w = np.asarray(w)
    for m in range(model):
        half = slice(m * N, (m + 1) * N)
        ref = sharded_sync_reference(start(n)[half], [grad_fn(ts[d, half]) for d in range(data)],
                                     k=K, steps=STEPS, inner=INNER, change=change,
                                     max_grad_norm=max_grad_norm)
        np.testing.assert_allclose(w[half], ref.params, rtol=1e-6, atol=1e-7)
    # state rows in (data, model) order: device (d, m) holds model half m's region d
    mu = np.asarray(state.inner[0].mu)
    assert mu.shape == (data * model, slot_of(N, data))
    shards = {s.index[0].start: s.data.shape for s in state.inner[0].mu.addressable_shards}
    assert len(shards) == data * model and all(shape == (1, slot_of(N, data))
                                               for shape in shards.values())
