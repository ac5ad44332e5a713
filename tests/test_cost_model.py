"""The cost model: volumes, bounds and the choice of algorithm."""

import pytest

from jax_sparse_sync import cost_model as cm


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_recursive_doubling_bounds_are_ordered(p):
    for rank in range(p):
        v = cm.wire_volume("recursive_doubling", nranks=p, size=10_000, k=100, rank=rank)
        assert v.bytes_min <= v.bytes_max


def test_dense_and_allgather_formulas():
    v = cm.wire_volume("dense", nranks=4, size=1000, k=10)
    assert v.bytes_max == 56 * 3 + 2 * 3 * 1000 * 4 // 4
    v = cm.wire_volume("allgather", nranks=4, size=1000, k=10)
    assert v.bytes_max == 56 * 3 + 3 * 10 * 8


def test_choice_follows_density():
    # very sparse: a sparse algorithm; dense input: the dense allreduce
    assert cm.choose_algorithm(nranks=8, size=16_000_000, k=16_000) != "dense"
    assert cm.choose_algorithm(nranks=8, size=1_000_000, k=1_000_000) == "dense"


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="unknown algorithm"):
        cm.wire_volume("ring", nranks=2, size=10, k=1)
