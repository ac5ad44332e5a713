"""block_allreduce / block_sync: lossless (bitwise the rank-order dense sum),
exact byte counts, only nonzero blocks travel."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from reference import block_allreduce_bytes_sent, rank_order_sum

import jax_sparse_sync as jss

P, RANK = WORLD.Get_size(), WORLD.Get_rank()


def sparse_rows(n_rows, width, touched, seed):
    """An embedding-table gradient: a few rows touched."""
    rng = np.random.default_rng(seed)
    g = np.zeros((n_rows, width), np.float32)
    g[rng.choice(n_rows, touched, replace=False)] = rng.standard_normal((touched, width))
    return g.reshape(-1)


def run(x, block_size, **kw):
    out, stats = jax.jit(lambda v: jss.block_allreduce(v, block_size=block_size, return_stats=True,
                                                       **kw))(x)
    return np.asarray(out), stats.as_dict()


@pytest.mark.parametrize("case", ["rows", "empty", "dense", "ragged", "tiny_blocks", "one_block"])
def test_lossless_and_exact_bytes(case):
    block = {"tiny_blocks": 1, "one_block": 10_000}.get(case, 64)
    if case == "rows":
        x = sparse_rows(500, 64, 12, RANK)
    elif case == "empty":
        x = np.zeros(3000, np.float32)
    elif case == "dense":
        x = np.random.default_rng(RANK).standard_normal(3000).astype(np.float32)
    elif case == "ragged":  # size not a multiple of the block; last block short
        x = sparse_rows(100, 7, 9, RANK)
    else:
        x = sparse_rows(60, 5, 4, RANK)
    out, stats = run(x, block)
    everything = WORLD.allgather(x)
    np.testing.assert_array_equal(out, rank_order_sum(everything))  # bit for bit
    assert_same_on_all_ranks(out)
    assert stats["bytes_sent"] == block_allreduce_bytes_sent(everything, RANK, block)
    assert stats["algorithm"] == "block"


def test_sparse_gradient_sends_far_less_than_dense():
    x = sparse_rows(2000, 64, 16, RANK)
    _, block = run(x, 64)
    _, dense = jax.jit(lambda v: jss.sparse_allreduce(
        v, jnp.arange(v.size, dtype=jnp.int32), size=v.size, algorithm="dense",
        return_stats=True))(x)
    if P > 1:
        assert block["bytes_sent"] * 10 < int(dense.bytes_sent)


def test_block_sync_trains_like_dense():
    # an embedding bag: each rank's batch touches a few rows; same updates as dense
    params = {"emb": jnp.zeros((300, 16)), "w": jnp.ones((16, 3))}
    tx_block = optax.chain(jss.block_sync(block_size=16), optax.sgd(0.1))
    tx_dense = optax.chain(jss.dense_sync(), optax.sgd(0.1))

    def loss(p, ids, y):
        h = p["emb"][ids].mean(axis=1)
        return jnp.mean((h @ p["w"] - y) ** 2)

    def train(tx):
        prm, st = params, tx.init(params)
        step = jax.jit(lambda prm, st, ids, y: (lambda g: tx.update(g, st, prm))(
            jax.grad(loss)(prm, ids, y)))
        for i in range(5):
            rng = np.random.default_rng(100 * i + RANK)
            ids, y = rng.integers(0, 300, (8, 4)), rng.standard_normal((8, 3)).astype(np.float32)
            upd, st = step(prm, st, ids, y)
            prm = optax.apply_updates(prm, upd)
        return prm, st

    p_block, st = train(tx_block)
    p_dense, _ = train(tx_dense)
    for name in params:
        np.testing.assert_allclose(np.asarray(p_block[name]), np.asarray(p_dense[name]),
                                   rtol=1e-6, atol=1e-7)
        assert_same_on_all_ranks(np.asarray(p_block[name]))
    assert int(jss.SyncStats.from_vector(st[0].last_stats).result_nnz) <= 300 + 3


def test_bad_arguments_and_nan_policy():
    with pytest.raises(ValueError, match="`block_size` must be a positive int"):
        jss.block_allreduce(jnp.ones(4), block_size=0)
    with pytest.raises(TypeError, match="`x` has dtype int32"):
        jss.block_allreduce(jnp.arange(4), block_size=2)
    with pytest.raises(ValueError, match="use jss.block_allreduce"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4, algorithm="block")
    x = np.zeros(8, np.float32)
    if RANK == 0:
        x[3] = np.nan
    with raises_mpi_error(r"non-finite .* rank\(s\) 0"):
        run(x, 4, nan_policy="raise")
    out, _ = run(x, 4)  # propagate: NaN reaches the sum
    assert np.isnan(out[3])


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_block_size_mismatch_across_ranks():
    with raises_mpi_error(r"`block_size` differs across ranks: rank 0 passed block_size=4"):
        run(np.ones(16, np.float32), 4 if RANK == 0 else 8)
