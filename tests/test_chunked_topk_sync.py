"""jss.chunked_topk_sync at one rank: the compressor bit for bit against the NumPy
reference (tests/chunked_topk_reference.py), the payload's format and bytes, error
feedback's bookkeeping, convergence at 2 bits, and the argument errors. Across ranks:
tests/mpi/test_chunked_topk_sync_mpi.py; on a mesh axis: tests/axis/axis_chunked_topk_cases.py."""

import chunked_topk_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync.planning import cost_model
from jax_sparse_sync.transforms import chunked_topk_codec as codec
from jax_sparse_sync.transforms.chunked_topk_config import ChunkedLayout

SHAPES = {"a": (7, 9), "b": (40,), "c": (3, 5)}  # N = 118: chunks of 25 leave a short last one
N = sum(int(np.prod(s)) for s in SHAPES.values())


def grads_at(step, seed=0, scale=1.0):
    rng = np.random.default_rng(1000 * seed + step)
    return {k: jnp.asarray(rng.standard_normal(s) * scale, jnp.float32)
            for k, s in SHAPES.items()}


def flat(tree):
    return np.concatenate([np.asarray(x, np.float32).ravel()
                           for x in jax.tree_util.tree_leaves(tree)])


CASES = [dict(chunk=25, k=4, bits=2), dict(chunk=25, k=4, bits=4), dict(chunk=16, k=3, bits=8),
         dict(chunk=25, k=7, dtype=jnp.bfloat16),
         dict(chunk=50, k=20, dtype=jnp.float32)]  # 50: the last chunk (18) is shorter than k


def make(case, **kw):
    values = (dict(value_dtype=case["dtype"]) if "dtype" in case
              else dict(value_bits=case["bits"]))
    return jss.chunked_topk_sync(chunk=case["chunk"], k_per_chunk=case["k"], **values, **kw)


def reference_step(case, residual, grads, decay=1.0):
    update, residuals, sents = ref.step([residual], [flat(grads)], case["chunk"], case["k"],
                                        case.get("bits", 2), case.get("dtype"), decay)
    return update, residuals[0], sents[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_steps_equal_the_numpy_compressor_bit_for_bit(case):
    tx = make(case)
    state = tx.init(grads_at(0))
    update_fn = jax.jit(tx.update)
    residual = np.zeros(N, np.float32)
    for step in range(4):
        grads = grads_at(step, scale=1 + step)
        updates, state = update_fn(grads, state)
        want, residual, _ = reference_step(case, residual, grads)
        assert flat(updates).tobytes() == want.tobytes(), step
        assert np.asarray(state.residual).tobytes() == residual.tobytes(), step
        assert int(jss.SyncStats.from_vector(state.last_stats).result_nnz) == \
            np.count_nonzero(want)
        assert jax.tree_util.tree_structure(updates) == jax.tree_util.tree_structure(grads)
    assert int(state.count) == 4


def test_residual_decay_is_applied_before_the_update_is_added():
    case = dict(chunk=25, k=4, bits=2)
    tx = make(case, residual_decay=0.5)
    state, update_fn = tx.init(grads_at(0)), jax.jit(tx.update)
    residual = np.zeros(N, np.float32)
    for step in range(3):
        updates, state = update_fn(grads_at(step), state)
        want, residual, _ = reference_step(case, residual, grads_at(step), decay=0.5)
        np.testing.assert_array_equal(flat(updates), want)
        np.testing.assert_allclose(np.asarray(state.residual), residual, rtol=1e-6, atol=1e-7)


def test_error_feedback_keeps_what_was_not_sent_quantization_error_included():
    # at one rank the update is what was sent: sent over the steps + the residual = the inputs
    tx = jax.jit(jss.chunked_topk_sync(chunk=20, k_per_chunk=2, value_bits=2).update)
    state = jss.chunked_topk_sync(chunk=20, k_per_chunk=2).init(grads_at(0))
    sent, came_in = np.zeros(N), np.zeros(N)
    for step in range(12):
        updates, state = tx(grads_at(step), state)
        sent += flat(updates)
        came_in += flat(grads_at(step))
    np.testing.assert_allclose(sent + np.asarray(state.residual), came_in, rtol=1e-5, atol=1e-4)
    # 2-bit values: what was sent is not the accumulator at the kept entries
    assert np.abs(np.asarray(state.residual)).max() > 0


def test_payload_format_offsets_codes_and_scales():
    lay = ChunkedLayout(size=10, chunk=4, k=2, chunks=3, value_bits=2, value_dtype=None)
    acc = jnp.array([1., -4., 2., 0., 0.5, 3., 0., -1.5, 7., 0.], jnp.float32)
    values, indices = jss.bucket_topk(acc, 2, 4)
    payload, codes, scales = jax.jit(codec.encode, static_argnums=2)(values, indices, lay)
    assert payload.shape == (lay.payload_bytes,) == (6 * 2 + 2 + 3 * 4,)
    offsets = np.frombuffer(np.asarray(payload[:12]).tobytes(), "<u2")
    # chunk 0 keeps 1 and 2 (|-4|, |2|); chunk 1 keeps 5 and 7; chunk 2 (8, 9) keeps both,
    # and 9's value is 0: an empty slot (the all-ones offset)
    assert offsets.tolist() == [1, 2, 1, 3, 0, 0xFFFF]
    np.testing.assert_array_equal(np.frombuffer(np.asarray(payload[14:]).tobytes(), "<f4"),
                                  [4., 3., 7.])
    # 2 bits: sign (high bit), level - 1 (low bit); |v| L / s: 2, 1 | 2, 1 | 2, 0 -> level 1
    assert np.asarray(codes).tolist() == [0b11, 0b00, 0b01, 0b10, 0b01, 0b00]
    packed = np.asarray(payload[12:14]).tolist()
    assert packed == [0b11 | 0b00 << 2 | 0b01 << 4 | 0b10 << 6, 0b01 | 0b00 << 2]
    indices_back, decoded = jax.jit(codec.decode, static_argnums=1)(payload, lay)
    assert np.asarray(indices_back).tolist() == [1, 2, 5, 7, 8, 10]  # empty: index N
    assert np.asarray(decoded).tolist() == [-4., 2., 3., -1.5, 7., 0.]


def test_short_last_chunk_pads_slots_that_no_decoder_reads():
    lay = ChunkedLayout(size=9, chunk=8, k=3, chunks=2, value_bits=4, value_dtype=None)
    acc = jnp.arange(1, 10, dtype=jnp.float32)
    payload, _, _ = jax.jit(codec.encode, static_argnums=2)(*jss.bucket_topk(acc, 3, 8), lay)
    total, nonzeros = jax.jit(codec.decode_sum, static_argnums=1)(payload[None], lay)
    # the last chunk holds one entry (9.0) and two padding slots, decoded past N: dropped
    assert np.count_nonzero(np.asarray(total)) == 4 == int(nonzeros)
    assert float(total[8]) == 9.0


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_codes_pack_and_unpack(bits):
    codes = jnp.asarray(np.random.default_rng(bits).integers(0, 2 ** bits, 13), jnp.uint8)
    packed = jax.jit(codec.pack_codes, static_argnums=1)(codes, bits)
    assert packed.shape == ((13 * bits + 7) // 8,)
    np.testing.assert_array_equal(
        jax.jit(codec.unpack_codes, static_argnums=(1, 2))(packed, 13, bits), codes)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bytes_are_the_payload_and_the_cost_models_count(case):
    tx = make(case)
    _, state = jax.jit(tx.update)(grads_at(0), tx.init(grads_at(0)))
    stats = jss.SyncStats.from_vector(state.last_stats)
    # one rank: the header check only (nothing travels), the algorithm an allgather
    assert int(stats.bytes_sent) == 0 and stats.algorithm_name == "allgather"
    value_bytes = {jnp.bfloat16: 2, jnp.float32: 4}.get(case.get("dtype"), 0)
    want = ref.payload_bytes(N, case["chunk"], case["k"], case.get("bits", 2), value_bytes)
    got = cost_model.chunked_topk_payload_bytes(
        size=N, chunk=case["chunk"], k_per_chunk=case["k"],
        value_bits=0 if value_bytes else case["bits"], value_bytes=value_bytes)
    assert got == want
    for p in (2, 3, 8):
        v = cost_model.chunked_topk_volume(nranks=p, size=N, chunk=case["chunk"],
                                           k_per_chunk=case["k"],
                                           value_bits=0 if value_bytes else case["bits"],
                                           value_bytes=value_bytes)
        assert v.bytes_max == cost_model.HEADER_BYTES * (p - 1) + (p - 1) * want


def test_sparseloco_setting_is_about_a_hundredth_of_float32():
    b = cost_model.chunked_topk_payload_bytes(size=4096 * 100, chunk=4096, k_per_chunk=64)
    assert b == 148 * 100 and 4 * 4096 * 100 / b > 100


def test_two_bits_with_error_feedback_still_converge():
    rng = np.random.default_rng(3)
    target = jnp.asarray(rng.standard_normal(2000), jnp.float32)
    # each entry is sent about every 1 / density steps, with that many steps' gradient:
    # error-fed sparse SGD on a quadratic needs lr / density below 2
    tx = optax.chain(jss.chunked_topk_sync(chunk=256, density=0.03, value_bits=2),
                     optax.sgd(0.05))
    params = jnp.zeros(2000, jnp.float32)
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        updates, state = tx.update(params - target, state, params)
        return optax.apply_updates(params, updates), state

    loss0 = float(jnp.sum((params - target) ** 2))
    for _ in range(100):
        params, state = step(params, state)
    assert float(jnp.sum((params - target) ** 2)) < 0.01 * loss0


def test_nan_raises_under_raise_and_propagates_its_chunk_otherwise():
    grads = {"w": jnp.array([1., jnp.nan, 2., 3., 4., 5.], jnp.float32)}
    tx = jss.chunked_topk_sync(chunk=3, k_per_chunk=1)
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(jax.jit(tx.update)(grads, tx.init(grads)))
    tx = jss.chunked_topk_sync(chunk=3, k_per_chunk=1, nan_policy="propagate")
    updates, _ = jax.jit(tx.update)(grads, tx.init(grads))
    u = np.asarray(updates["w"])
    assert np.isnan(u[1]) and u[5] == 5.0 and np.count_nonzero(np.isnan(u)) == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(chunk=0, k_per_chunk=1), "`chunk` must be an int >= 1"),
    (dict(chunk=2.5, k_per_chunk=1), "`chunk` must be an int >= 1"),
    (dict(chunk=8, k_per_chunk=9), r"`k_per_chunk` must be in \[1, chunk=8\]"),
    (dict(chunk=8, k_per_chunk=0), r"`k_per_chunk` must be in \[1, chunk=8\]"),
    (dict(chunk=8), "pass exactly one of `k_per_chunk`"),
    (dict(chunk=8, k_per_chunk=2, density=0.1), "pass exactly one of `k_per_chunk`"),
    (dict(chunk=8, density=1.5), r"`density` must be in \(0, 1\]"),
    (dict(k_per_chunk=2, value_bits=3), r"`value_bits` must be one of \(2, 4, 8\)"),
    (dict(k_per_chunk=2, value_bits=True), r"`value_bits` must be one of \(2, 4, 8\)"),
    (dict(k_per_chunk=2, value_dtype=jnp.float16), "`value_dtype` must be jnp.bfloat16"),
    (dict(k_per_chunk=2, value_dtype=jnp.int8), "`value_dtype` must be jnp.bfloat16"),
    (dict(k_per_chunk=2, value_bits=2, value_dtype=jnp.float32), "not both"),
    (dict(k_per_chunk=2, residual_decay=0.0), "`residual_decay`"),
    (dict(k_per_chunk=2, nan_policy="ignore"), "nan_policy"),
])
def test_bad_arguments_raise_at_construction_naming_them(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match) as err:
        jss.chunked_topk_sync(**kwargs)
    assert "chunked_topk_sync" in str(err.value)


def test_non_float_leaves_are_named():
    tx = jss.chunked_topk_sync(k_per_chunk=1)
    with pytest.raises(TypeError, match=r"chunked_topk_sync: parameter leaf \['n'\]"):
        tx.init({"w": jnp.zeros(3), "n": jnp.zeros(2, jnp.int32)})
    state = tx.init({"w": jnp.zeros(3)})
    with pytest.raises(TypeError, match=r"gradient leaf \['w'\] has dtype int32"):
        tx.update({"w": jnp.zeros(3, jnp.int32)}, state)


def test_a_state_for_other_parameters_is_named():
    tx = jss.chunked_topk_sync(k_per_chunk=1)
    state = tx.init({"w": jnp.zeros(5)})
    with pytest.raises(ValueError, match="gradient has 6 entries but the residual has 5"):
        tx.update({"w": jnp.zeros(6)}, state)
