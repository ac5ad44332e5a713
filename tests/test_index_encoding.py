"""jax_sparse_sync.ops.index_encoding: exact sizes, the smallest picked, round trips."""

import numpy as np
import pytest

from jax_sparse_sync.ops.index_encoding import KINDS, choose, decode, encode, encoded_sizes


def support(n, density, seed, kind="uniform"):
    rng = np.random.default_rng(seed)
    m = max(1, int(n * density))
    if kind == "uniform":
        return np.sort(rng.choice(n, m, replace=False))
    if kind == "block":  # a contiguous run
        start = int(rng.integers(0, n - m + 1))
        return np.arange(start, start + m)
    # clustered: a few dense runs and a few far outliers
    runs = [np.arange(s, s + m // 4) for s in rng.choice(n - m // 4, 3, replace=False)]
    return np.unique(np.concatenate(runs + [rng.choice(n, m // 4 + 1, replace=False)]))


CASES = [(n, d, kind) for n in (1000, 1 << 16) for d in (1e-3, 1e-2, 0.1, 0.5, 1.0)
         for kind in ("uniform", "block", "clustered")]


@pytest.mark.parametrize("n,density,kind", CASES)
def test_round_trip_and_exact_sizes_of_every_encoding(n, density, kind):
    idx = support(n, density, seed=int(n * density) + len(kind), kind=kind)
    sizes = encoded_sizes(idx)
    for name, kid in KINDS.items():
        buf = encode(idx, name)
        assert buf.dtype == np.uint8 and len(buf) == sizes[name], (name, len(buf), sizes)
        assert buf[0] == kid
        np.testing.assert_array_equal(decode(buf), idx)
    best = encode(idx)
    assert len(best) == min(sizes.values()) and buf.dtype == np.uint8
    assert best[0] == KINDS[choose(idx)]
    np.testing.assert_array_equal(decode(best), idx)


def test_each_encoding_wins_where_it_should():
    n = 1 << 20
    sparse = support(n, 1e-4, 1)      # few, far apart: ~20-bit gaps, but list is 32 bits
    assert choose(sparse) == "delta"
    assert choose(support(n, 0.5, 2)) == "bitmap"    # half of the positions, random gaps
    assert choose(np.arange(0, n, 2)) == "delta"     # every other one: 1-bit gaps
    assert choose(np.asarray([5])) == "list"        # one index: 9 bytes
    assert choose(np.arange(100, 5000)) == "delta"  # adjacent: 0-bit gaps


def test_one_percent_of_16m_needs_far_fewer_index_bytes_than_int32():
    n = 1 << 24
    idx = support(n, 0.01, 3)
    sizes = encoded_sizes(idx)
    assert sizes["list"] == 5 + 4 * len(idx)
    assert sizes["list"] / min(sizes.values()) >= 1.6, sizes
    np.testing.assert_array_equal(decode(encode(idx)), idx)


def test_empty_and_hand_computed_sizes():
    assert encoded_sizes([]) == {"list": 5, "delta": 5, "bitmap": 5}
    assert decode(encode([])).size == 0
    # gaps 2, 2 -> stored 1, 1 in 1 bit each: 5 + 1 + 4 + 1
    assert encoded_sizes([10, 12, 14]) == {"list": 17, "delta": 11, "bitmap": 10}
    assert list(encode([10, 12, 14], "bitmap")) == [2, 3, 0, 0, 0, 10, 0, 0, 0, 0b10101]


@pytest.mark.parametrize("bad,err", [([3, 3], ValueError), ([5, 2], ValueError),
                                     ([-1, 2], ValueError), ([1.5], TypeError),
                                     ([[1, 2]], TypeError)])
def test_bad_indices_are_named(bad, err):
    with pytest.raises(err, match="indices"):
        encoded_sizes(np.asarray(bad))


def test_bad_kind_and_bad_message_are_named():
    with pytest.raises(ValueError, match="kind"):
        encode([1, 2], "huffman")
    with pytest.raises(ValueError, match="not a message"):
        decode(np.asarray([9, 0, 0, 0, 0], np.uint8))


# ---- the C++ wire codec (ffi/collectives/wire_codec.h) agrees with this module, byte for byte ----------
from jax_sparse_sync import _ext  # noqa: E402

AUTO, AUTO_BF16, INT32_BF16 = 16, 17, 1  # wire words: index encoding << 4 | value dtype


def cpp_pack(idx, vals, wire):
    return np.frombuffer(_ext.cpu_module.wire_pack_entries(
        np.asarray(idx, np.int32).tobytes(), np.asarray(vals, np.float32).tobytes(), wire),
        np.uint8)


def cpp_unpack(message, n, wire):
    i, v = _ext.cpu_module.wire_unpack_entries(np.asarray(message, np.uint8).tobytes(), n, wire)
    return np.frombuffer(i, np.int32), np.frombuffer(v, np.float32)


@pytest.mark.parametrize("n,density,kind", CASES + [(1 << 24, 1e-4, "uniform"),
                                                    (1 << 24, 1e-2, "uniform")])
def test_cpp_message_is_the_python_encoding_then_the_values(n, density, kind):
    idx = support(n, density, seed=int(n * density) + len(kind), kind=kind)
    vals = np.random.default_rng(len(idx)).standard_normal(len(idx)).astype(np.float32)
    message = cpp_pack(idx, vals, AUTO)
    head = encode(idx)
    assert message[:len(head)].tobytes() == head.tobytes()
    assert message[len(head):].tobytes() == vals.tobytes()  # float32 values, little-endian
    back_idx, back_vals = cpp_unpack(message, n, AUTO)
    np.testing.assert_array_equal(back_idx, idx)
    np.testing.assert_array_equal(back_vals, vals)
    # 16-bit values: 2 bytes each after the same encoding, rounded to nearest even
    message16 = cpp_pack(idx, vals, AUTO_BF16)
    assert message16[:len(head)].tobytes() == head.tobytes()
    assert len(message16) == len(head) + 2 * len(idx)
    import ml_dtypes
    _, v16 = cpp_unpack(message16, n, AUTO_BF16)
    np.testing.assert_array_equal(v16, vals.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_cpp_empty_and_int32_messages():
    assert cpp_pack([], [], AUTO).tobytes() == encode(np.zeros(0, np.int64)).tobytes()
    idx, vals = np.array([3, 9], np.int32), np.array([1.5, -2.0], np.float32)
    msg = cpp_pack(idx, vals, INT32_BF16)  # int32 indices, then bfloat16 values: 6 bytes each
    assert len(msg) == 12 and msg[:8].tobytes() == idx.tobytes()
    plain = cpp_pack(idx, vals, 0)  # (index, value) pairs, 8 bytes each
    assert len(plain) == 16 and cpp_unpack(plain, 10, 0)[0].tolist() == [3, 9]


@pytest.mark.parametrize("corrupt,match", [
    (lambda m: np.concatenate([[7], m[1:]]), "unknown index encoding kind 7"),
    (lambda m: m[:3], "shorter than its 5-byte header"),
    (lambda m: m[:-1], "does not hold"),
    (lambda m: np.concatenate([m[:1], np.frombuffer(np.uint32(10**6).tobytes(), np.uint8), m[5:]]),
     "claims 1000000 distinct indices"),
])
def test_cpp_decoder_rejects_a_corrupted_message(corrupt, match):
    idx = np.arange(0, 1000, 3)  # delta-coded
    message = cpp_pack(idx, np.ones(len(idx), np.float32), AUTO)
    assert message[0] == KINDS["delta"]
    with pytest.raises(ValueError, match=match):
        cpp_unpack(corrupt(message), 1000, AUTO)


@pytest.mark.parametrize("kind", ["list", "delta", "bitmap"])
def test_cpp_decoder_rejects_an_index_outside_the_dimension(kind):
    idx = np.arange(500, 1000, 2) if kind != "list" else np.array([5, 990])
    message = np.concatenate([encode(idx, kind), np.zeros(4 * len(idx), np.uint8)])
    cpp_unpack(message, 1000, AUTO)  # fits a dimension of 1000
    with pytest.raises(ValueError, match=r"outside \[0, 950\)"):
        cpp_unpack(message, 950, AUTO)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 17, 64, 65])
@pytest.mark.parametrize("kind", ["delta", "bitmap"])
def test_cpp_decoder_reads_every_stream_length_and_gap_width(kind, m):
    # the C++ decoder reads its bit streams a 64-bit word at a time: streams of
    # every length around a word's end, and gaps up to 30 bits wide (delta)
    rng = np.random.default_rng(m)
    n = 1 << 31 if kind == "delta" else 2000
    gaps = (rng.integers(0, 1 << 30, m) if kind == "delta" else rng.integers(0, 40, m))
    idx = np.cumsum(gaps + 1) - 1
    idx = idx[idx < n][:m]
    vals = np.arange(len(idx), dtype=np.float32)
    message = np.concatenate([encode(idx, kind), np.frombuffer(vals.tobytes(), np.uint8)])
    assert message[0] == KINDS[kind]
    back_idx, back_vals = cpp_unpack(message, n, AUTO)
    np.testing.assert_array_equal(back_idx, idx)
    np.testing.assert_array_equal(back_vals, vals)
    if len(idx) > 1 and kind == "delta":
        assert int(np.diff(idx).max()) > 1 << 20  # wide gaps were drawn
    # and the C++ encoder writes the same bytes where it picks this kind
    if choose(idx) == kind:
        assert cpp_pack(idx, vals, AUTO)[:len(message) - 4 * len(idx)].tobytes() == \
            encode(idx, kind).tobytes()
