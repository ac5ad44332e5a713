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
