"""With the watchdog on (jss.mpi.set_timeout), every collective gives bitwise the
same result as with it off, on every rank; and its record file names the last
collective entered. (A stuck rank ending the job: tests/test_watchdog.py.)
"""

import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks

import jax_sparse_sync as jss

P, RANK = WORLD.Get_size(), WORLD.Get_rank()
N, K = 2048, 64


def inputs(seed):
    rng = np.random.default_rng(seed + 17 * RANK)
    idx = rng.choice(N, K, replace=False).astype(np.int32)
    idx[::7] = -1
    return rng.standard_normal(K).astype(np.float32), idx


def every_collective(seed):
    """Each library collective once (blocking, non-blocking, Ok-Topk, block), and a
    few topk_sync steps; the results as NumPy arrays."""
    values, indices = inputs(seed)
    out = {}
    for algorithm in ("dense", "allgather", "recursive_doubling", "split_allgather",
                      "dsar_split_allgather"):
        out[algorithm] = np.asarray(jss.sparse_allreduce(values, indices, size=N,
                                                         algorithm=algorithm))
    pending = [jss.sparse_allreduce_start(values * (i + 1), indices, size=N) for i in range(3)]
    for i, p in enumerate(pending):
        out[f"nonblocking{i}"] = np.asarray(jss.sparse_allreduce_done(p))
    result = jss.oktopk_allreduce(values, indices, size=N, k=K)
    out["oktopk"] = np.asarray(result.sum)
    dense = np.zeros(N, np.float32)
    dense[indices[indices >= 0]] = values[indices >= 0]
    out["block"] = np.asarray(jss.block_allreduce(jnp.asarray(dense), block_size=16))

    tx = optax.chain(jss.topk_sync(k=K), optax.sgd(0.1))
    params = jnp.zeros(N, jnp.float32)
    state = tx.init(params)

    @jax.jit
    def step(params, state, grad):
        updates, state = tx.update(grad, state, params)
        return optax.apply_updates(params, updates), state

    rng = np.random.default_rng(seed + RANK)
    for _ in range(3):
        params, state = step(params, state, jnp.asarray(rng.standard_normal(N), jnp.float32))
    out["topk_sync_params"] = np.asarray(params)
    return out


@pytest.fixture
def watchdog_restored():
    before = jss.mpi.get_timeout()
    yield
    jss.mpi.set_timeout(before)


def test_results_are_bitwise_the_same_with_the_watchdog_on(watchdog_restored):
    jss.mpi.set_timeout(None)
    off = every_collective(3)
    with jss.mpi.sync_timeout(120):
        on = every_collective(3)
    assert off.keys() == on.keys()
    for name in off:
        assert off[name].tobytes() == on[name].tobytes(), name
        assert_same_on_all_ranks(on[name], name)


def test_the_record_file_names_the_last_collective(watchdog_restored):
    from jax_sparse_sync.mpi.watchdog import watchdog_directory

    values, indices = inputs(5)
    path = os.path.join(watchdog_directory(), f"rank{WORLD.Get_rank()}.cpu")
    with jss.mpi.sync_timeout(60):  # the watcher rewrites the record every 0.5 s at most
        jax.block_until_ready(jss.block_allreduce(jnp.ones(N, jnp.float32), block_size=16))
        jax.block_until_ready(jss.sparse_allreduce(values, indices, size=N))
        for _ in range(100):  # until the watcher has written it (a stale one names block_allreduce)
            record = open(path).read()
            if re.search(r"\nlast sparse_allreduce \S+ \d+ done ", record):
                break
            time.sleep(0.05)
    assert re.search(r"\nlast sparse_allreduce \S+ \d+ done ", record), record
    WORLD.Barrier()
