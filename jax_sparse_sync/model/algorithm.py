"""Which sparse allreduce algorithm a call runs: the name checked, ``"auto"`` resolved
by the cost model (the one place both transports and ``topk_sync`` ask)."""

from __future__ import annotations

from jax_sparse_sync import _ext
from jax_sparse_sync.model import cost_model

__all__ = ["resolve_algorithm"]


def resolve_algorithm(algorithm: str, *, nranks: int, size: int, k: int,
                      params: cost_model.AlphaBeta | None = None) -> str:
    """Checks ``algorithm`` and resolves ``"auto"`` with the cost model."""
    if algorithm == "auto":
        return cost_model.choose_algorithm(nranks=nranks, size=size, k=k, params=params)
    if algorithm == "oktopk":
        raise ValueError(
            "jax_sparse_sync: Ok-Topk returns Top-k(sum), not the sum: use jss.oktopk_allreduce "
            "or the jss.oktopk_sync transform instead of algorithm='oktopk'.")
    if algorithm == "block":
        raise ValueError(
            "jax_sparse_sync: the block-sparse allreduce takes a dense vector: use "
            "jss.block_allreduce or the jss.block_sync transform instead of algorithm='block'.")
    if algorithm == "region_reduce":
        raise ValueError(
            "jax_sparse_sync: region_reduce leaves each rank the sum of its own region only "
            "(jss.sharded_sync's first exchange), not the whole sum: use jss.sharded_sync "
            "instead of algorithm='region_reduce'.")
    if algorithm not in _ext.ALGORITHM_IDS:
        raise ValueError(
            f"jax_sparse_sync: unknown `algorithm` {algorithm!r}; choose one of "
            f"{sorted(set(_ext.ALGORITHM_IDS) - {'oktopk', 'block', 'region_reduce'})} or 'auto'."
        )
    return algorithm
