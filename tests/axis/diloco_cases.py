"""jss.diloco inside shard_map on a mesh axis (host CPU devices), run by
test_axis_transport.py: DiLoCo over dense_sync and error-fed topk_sync with
``comm=jss.axis("data")`` against the NumPy reference, every device's parameters the
same bits after every outer step, and a checkpoint between two outer steps resumed
bit for bit.

Each device is one worker: its parameters, state and data are one row of arrays
sharded over the "data" axis (the working parameters differ between the outer steps).
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

if "xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts "
                "(run through tests/test_axis_transport.py)", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from diloco_reference import (diloco_reference, fragment_schedule,  # noqa: E402
                              topk_sync_reference)
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sparse_sync as jss  # noqa: E402

DIM, LR, EVERY, K = 48, 0.1, 3, 5


def targets(p):
    return np.random.default_rng(11).standard_normal((p, DIM)).astype(np.float32)


def start():
    return np.random.default_rng(12).standard_normal(DIM).astype(np.float32)


@functools.cache
def trainer(p, tx, check_vma):
    """``train(steps, w=None, state=None, begin=0, each=None) -> (w, state)``: the rows of
    ``w`` (P, DIM) and of the state are the devices' own; ``each(t, w, state)`` on host
    copies after step t (1-based)."""
    mesh = jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])
    rows = NamedSharding(mesh, P("data"))

    def expand(tree):
        return jax.tree_util.tree_map(lambda x: x[None], tree)

    def step(w, state, t, i):
        w, state = w[0], jax.tree_util.tree_map(lambda x: x[0], state)
        grads = leaves((w - t[0]) * (1 + i % 3).astype(jnp.float32))
        updates, state = tx.update(grads, state, leaves(w))
        return joined(jss.diloco_apply_updates(leaves(w), updates, state))[None], expand(state)

    init = jax.jit(jax.shard_map(lambda w: expand(tx.init(leaves(w[0]))), mesh=mesh,
                                 in_specs=P("data"), out_specs=P("data"), check_vma=check_vma))
    step = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("data"), P("data"), P("data"), P()),
                                 out_specs=(P("data"), P("data")), check_vma=check_vma),
                   donate_argnums=(0, 1))

    def train(steps, w=None, state=None, begin=0, each=None):
        w = jax.device_put(np.tile(start(), (p, 1)) if w is None else w, rows)
        state = init(w) if state is None else state
        t = jax.device_put(targets(p), rows)
        for i in range(begin, begin + steps):
            w, state = step(w, state, t, jnp.int32(i))
            if each is not None:
                each(i + 1, *jax.tree_util.tree_map(np.asarray, (w, state)))
        return w, state

    return train


@pytest.mark.parametrize("p,sync,fragments,check_vma", [(4, "dense", 1, True),
                                                        (3, "topk", 1, False),
                                                        (4, "topk", 2, True)])
def test_matches_numpy_and_devices_agree_after_every_outer_step(p, sync, fragments, check_vma):
    comm = jss.axis("data")
    made = (jss.dense_sync(comm=comm) if sync == "dense"
            else jss.topk_sync(k=K, algorithm="allgather", comm=comm))
    tx = jss.diloco(optax.sgd(LR), every=EVERY, sync=made, fragments=fragments)
    steps, seen = 2 * EVERY + 1, {}
    turn = fragment_schedule(EVERY, fragments)

    def check(t, w, state):
        seen[t] = w, state.anchor
        anchor = anchor_rows(state.anchor)
        assert all(row.tobytes() == anchor[0].tobytes() for row in anchor), t
        if turn(t) is not None:  # the merged fragment: every device holds the anchor's bits
            ids = groups(fragments)[turn(t)]
            assert all(row[ids].tobytes() == anchor[0][ids].tobytes() for row in w), t

    trainer(p, tx, check_vma)(steps, each=check)
    fns = [lambda x, s, tt=tt: (x - tt) * np.float32(1 + s % 3) for tt in targets(p)]
    _, _, _, history = diloco_reference(start(), fns, steps=steps, every=EVERY, inner_lr=LR,
                                        groups=groups(fragments),
                                        sync=None if sync == "dense" else topk_sync_reference(K))
    for t in range(1, steps + 1):
        np.testing.assert_allclose(seen[t][0], np.stack(history[t][0]), rtol=1e-5, atol=1e-6,
                                   err_msg=f"step {t}")
        np.testing.assert_allclose(anchor_rows(seen[t][1])[0], history[t][1], rtol=1e-5,
                                   atol=1e-6)


def leaves(w):
    """The flat parameters as two leaves (so that two fragments are one leaf each)."""
    return {"a": w[..., :DIM // 2], "b": w[..., DIM // 2:]}


def joined(tree):
    return jnp.concatenate([tree["a"], tree["b"]], axis=-1)


def groups(fragments):
    return [np.arange(DIM)] if fragments == 1 else [np.arange(DIM // 2),
                                                    np.arange(DIM // 2, DIM)]


def anchor_rows(anchor):
    """Each device's anchor as one flat row."""
    return np.concatenate([anchor["a"], anchor["b"]], axis=-1)


def test_checkpoint_between_outer_steps_resumes_bit_for_bit():
    p = 4
    tx = jss.diloco(optax.adam(0.05), every=EVERY,
                    sync=jss.topk_sync(k=K, algorithm="allgather", comm=jss.axis("data")))
    train = trainer(p, tx, True)
    straight, _ = train(2 * EVERY + 2)
    w, state = train(EVERY + 1)
    saved = jax.tree_util.tree_map(np.asarray, (w, state))  # what a checkpoint holds
    mesh_rows = NamedSharding(jax.make_mesh((p,), ("data",), devices=jax.devices()[:p]),
                              P("data"))
    restored = jax.tree_util.tree_map(lambda x: jax.device_put(x, mesh_rows), saved)
    resumed, _ = train(EVERY + 1, *restored, begin=EVERY + 1)
    assert np.asarray(resumed).tobytes() == np.asarray(straight).tobytes()
