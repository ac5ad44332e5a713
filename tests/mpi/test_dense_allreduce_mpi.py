"""dense_allreduce / dense_sync: one MPI_Allreduce of the flat buffer, in place.

The sum against the rank-order NumPy sum (float tolerance: MPI picks its own
reduction order), the same bytes on every rank, exact byte counts, the
argument check (sizes, NaN policy) on every rank, the output written over a
donated input, and no index array or scatter left in dense_sync's step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import WORLD, assert_same_on_all_ranks, raises_mpi_error
from reference import rank_order_sum

import jax_sparse_sync as jss
from jax_sparse_sync.planning import cost_model

P, RANK = WORLD.Get_size(), WORLD.Get_rank()


def run(x, **kw):
    out, stats = jax.jit(lambda v: jss.dense_allreduce(v, return_stats=True, **kw))(x)
    return np.asarray(out), stats.as_dict()


def wide_range(n, seed):
    """Values over six decades, so a different reduction order on some rank would show."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)


@pytest.mark.parametrize("n", [1, 7, 1000, 65_539, 1 << 20])
def test_sum_matches_numpy_and_is_the_same_bytes_on_every_rank(n):
    x = wide_range(n, 100 * n + RANK)
    out, stats = run(x)
    everything = WORLD.allgather(x)
    ref = rank_order_sum(everything)
    np.testing.assert_allclose(out, ref, rtol=1e-5,
                               atol=1e-6 * float(np.abs(np.stack(everything)).sum(0).max()))
    assert_same_on_all_ranks(out)
    vol = cost_model.wire_volume("dense", nranks=P, size=n, k=n)
    assert stats["bytes_sent"] == stats["bytes_received"] == vol.bytes_min == vol.bytes_max
    assert stats["messages"] == vol.messages
    assert stats["result_nnz"] == n and stats["algorithm"] == "dense"


def test_same_bytes_as_the_sparse_dense_algorithm():
    # the old route (an index for every entry) and the new one send the same bytes
    x = wide_range(4096, RANK)
    _, new = run(x)
    _, old = jax.jit(lambda v: jss.sparse_allreduce(v, jnp.arange(v.size, dtype=jnp.int32),
                                                    size=v.size, algorithm="dense",
                                                    return_stats=True))(x)
    assert new["bytes_sent"] == int(old.bytes_sent) and new["messages"] == int(old.messages)


def test_half_precision_input_is_summed_in_float32():
    x = wide_range(500, RANK).astype(jnp.bfloat16)
    out = jss.dense_allreduce(jnp.asarray(x))
    assert out.dtype == jnp.bfloat16 and out.shape == (500,)
    ref = rank_order_sum([np.asarray(v, np.float32) for v in WORLD.allgather(x)])
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2 ** -7, atol=1e-3)
    assert_same_on_all_ranks(np.asarray(out, np.float32))


def test_shape_is_kept():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + RANK
    out = np.asarray(jss.dense_allreduce(jnp.asarray(x)))
    np.testing.assert_array_equal(out, sum(np.arange(12, dtype=np.float32).reshape(3, 4) + r
                                           for r in range(P)))


def test_output_is_written_over_a_donated_input():
    x = jnp.asarray(wide_range(1 << 16, RANK))
    before = x.unsafe_buffer_pointer()
    out = jax.jit(jss.dense_allreduce, donate_argnums=0)(x)
    assert out.unsafe_buffer_pointer() == before
    assert x.is_deleted()


def test_dense_sync_step_has_no_index_array_and_no_scatter():
    params = {"w": jnp.zeros((300, 7)), "b": jnp.zeros(11)}
    tx = jss.dense_sync()
    text = jax.jit(tx.update).lower(params, tx.init(params)).as_text()
    assert "jss_dense_allreduce" in text
    for absent in ("jss_sparse_allreduce", "iota", "scatter"):
        assert absent not in text, absent


def test_dense_sync_is_the_mean_of_the_ranks_gradients():
    grads = {"w": wide_range(300, RANK).reshape(30, 10), "b": wide_range(5, 7 + RANK)}
    tx = jss.dense_sync()
    upd, state = jax.jit(tx.update, donate_argnums=(0, 1))(
        jax.tree_util.tree_map(jnp.asarray, grads), tx.init(grads))
    for name in grads:
        everything = WORLD.allgather(grads[name])
        np.testing.assert_allclose(np.asarray(upd[name]), rank_order_sum(everything) / P,
                                   rtol=1e-5, atol=1e-3)
        assert_same_on_all_ranks(np.asarray(upd[name]))
    vol = cost_model.wire_volume("dense", nranks=P, size=305, k=305)
    assert int(jss.SyncStats.from_vector(state.last_stats).bytes_sent) == vol.bytes_max


@pytest.mark.parametrize("where", ["first", "last"])
def test_nan_raises_on_every_rank_naming_the_rank(where):
    x = np.ones(64, np.float32)
    culprit = 0 if where == "first" else P - 1
    if RANK == culprit:
        x[5] = np.inf
    with raises_mpi_error(rf"dense_allreduce: non-finite \(NaN or Inf\) entries in `values` on "
                          rf"rank\(s\) {culprit}\."):
        run(x, nan_policy="raise")
    out, _ = run(x, nan_policy="propagate")  # the default: summed like any value
    assert np.isinf(out[5]) and out[0] == P


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_size_mismatch_raises_on_every_rank():
    x = np.ones(100 if RANK == 0 else 101, np.float32)
    with raises_mpi_error(r"dense_allreduce: `size` differs across ranks: rank 0 passed "
                          r"size=100 but rank 1"):
        run(x)
    out, _ = run(np.ones(3, np.float32))  # the communicator is still usable
    np.testing.assert_array_equal(out, np.full(3, P, np.float32))


def test_bad_arguments_are_python_errors():
    with pytest.raises(TypeError, match="dense_allreduce: `x` has dtype int32"):
        jss.dense_allreduce(jnp.arange(4))
    with pytest.raises(ValueError, match="dense_allreduce: `nan_policy`"):
        jss.dense_allreduce(jnp.ones(4), nan_policy="ignore")


def test_empty_vector():
    out, stats = run(np.zeros(0, np.float32))
    assert out.shape == (0,) and stats["result_nnz"] == 0


def test_dense_phases_of_the_sparse_syncs_use_it():
    params = {"w": jnp.zeros(200)}
    for tx in (jss.topk_sync(k=4, warmup=[(1, 1.0)]), jss.topk_sync(k=4, flush_every=3),
               jss.oktopk_sync(k=4, warmup=[(1, 1.0)])):
        text = jax.jit(tx.update).lower(params, tx.init(params)).as_text()
        assert "jss_dense_allreduce" in text


# ---- the 16-bit wire ------------------------------------------------------------------

def wire_reference(everything, dtype):
    """The wire's arithmetic in NumPy: each input rounded to ``dtype``, summed in float32 in
    rank order, the sum rounded to ``dtype`` once."""
    rounded = [np.asarray(jnp.asarray(v).astype(dtype).astype(jnp.float32)) for v in everything]
    total = rank_order_sum(rounded)
    return np.asarray(jnp.asarray(total).astype(dtype).astype(jnp.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("n", [1, 1001, 4096])
def test_16bit_wire_is_the_rounded_float32_sum_with_half_the_bytes(dtype, n):
    x = np.random.default_rng(10 * n + RANK).standard_normal(n).astype(np.float32)
    out, stats = run(x, wire_dtype=dtype)
    everything = WORLD.allgather(x)
    np.testing.assert_array_equal(out, wire_reference(everything, dtype))  # bit for bit
    assert_same_on_all_ranks(out)
    exact = rank_order_sum(everything)
    eps = float(jnp.finfo(dtype).eps)
    bound = eps * (np.abs(np.stack(everything)).sum(0) + np.abs(exact))  # two roundings
    assert (np.abs(out - exact) <= bound + 1e-30).all()
    _, f32 = run(x)
    block = -(-n // P)
    vol = cost_model.wire_volume("dense", nranks=P, size=n, k=n)
    header = vol.bytes_max - 2 * (P - 1) * n * 4 // P
    assert stats["bytes_sent"] == header + 2 * (P - 1) * block * 2
    if n % P == 0 and P > 1:  # the payload halved exactly
        assert stats["bytes_sent"] - header == (f32["bytes_sent"] - header) // 2


def test_dense_sync_on_a_bfloat16_wire_is_within_bfloat16_rounding():
    grads = {"w": wide_range(600, RANK)}
    tx = jss.dense_sync(wire_dtype=jnp.bfloat16)
    upd, state = jax.jit(tx.update)(jax.tree_util.tree_map(jnp.asarray, grads), tx.init(grads))
    everything = WORLD.allgather(grads["w"])
    # the division by P is XLA's (by P = 3 it may multiply by the reciprocal: 1 ulp)
    np.testing.assert_allclose(np.asarray(upd["w"]), wire_reference(everything, jnp.bfloat16) / P,
                               rtol=2e-7, atol=0)
    exact = rank_order_sum(everything) / P
    bound = 2 ** -7 * (np.abs(np.stack(everything)).sum(0) / P + np.abs(exact))
    assert (np.abs(np.asarray(upd["w"]) - exact) <= bound).all()
    sent = int(jss.SyncStats.from_vector(state.last_stats).bytes_sent)
    _, dense_state = jax.jit(jss.dense_sync().update)(
        jax.tree_util.tree_map(jnp.asarray, grads), jss.dense_sync().init(grads))
    assert sent < int(jss.SyncStats.from_vector(dense_state.last_stats).bytes_sent) or P == 1


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_wire_dtype_mismatch_raises_on_every_rank():
    dtype = jnp.bfloat16 if RANK == 0 else None
    with raises_mpi_error(r"`wire_dtype \(0: float32, 1: bfloat16, 2: float16\)` differs across "
                          r"ranks: rank 0 passed"):
        run(np.ones(10, np.float32), wire_dtype=dtype)


def test_bad_wire_dtype_is_a_python_error():
    with pytest.raises(ValueError, match="dense_allreduce: `wire_dtype` must be None"):
        jss.dense_allreduce(jnp.ones(4), wire_dtype=jnp.int8)
    with pytest.raises(ValueError, match="dense_sync: `wire_dtype` must be None"):
        jss.dense_sync(wire_dtype="float64")
