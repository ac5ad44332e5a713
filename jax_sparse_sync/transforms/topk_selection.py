"""topk_sync's selections: how each rank chooses its entries and how the ranks exchange them.

A selection is one :class:`Selection` entry of :data:`SELECTION_TABLE`: the local
choice it starts from (a selection policy of
:mod:`~jax_sparse_sync.transforms.selection_policy`, SparCML's bucketed top-k, or
none when the exchange chooses) and its exchange (``(acc, values, indices,
ExchangeArguments) -> (summed, indices, stats)``). A new selection is one entry.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jax_sparse_sync.ops.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.transforms.cyclic_selection import cyclic_exchange
from jax_sparse_sync.transforms.selection_policy import SELECTION_POLICIES
from jax_sparse_sync.transforms.union_selection import union_exchange

__all__ = ["ExchangeArguments", "Selection", "SELECTION_TABLE", "SELECTIONS", "sparse_exchange"]


class ExchangeArguments(NamedTuple):
    """What every exchange is called with besides the accumulator and the local choice."""

    size: int
    k: int            # entries kept (per bucket for selection="bucket")
    step: jax.Array   # the step count (int32): the QSGD seed, cyclic's leader
    comm: object
    algorithm: str
    nan_policy: str
    quantize_bits: int
    qsgd_bucket: int
    wire_dtype: object = None
    index_encoding: str = "int32"


def sparse_exchange(acc, values, indices, args: ExchangeArguments):
    """The local choice summed over the ranks by ``algorithm``'s sparse allreduce."""
    del acc
    summed, stats = sparse_allreduce(
        values.astype(jnp.float32), indices, size=args.size, algorithm=args.algorithm,
        comm=args.comm, nan_policy=args.nan_policy, quantize_bits=args.quantize_bits,
        qsgd_bucket=args.qsgd_bucket, seed=args.step, wire_dtype=args.wire_dtype,
        index_encoding=args.index_encoding, return_stats="vector")
    return summed, indices, stats


def cyclic_selection_exchange(acc, values, indices, args: ExchangeArguments):
    """ScaleCom: rank ``step mod P`` chooses the indices (it selects; no local choice)."""
    del values, indices
    return cyclic_exchange(acc.astype(jnp.float32), args.k, args.step, comm=args.comm,
                           nan_policy=args.nan_policy)


def union_selection_exchange(acc, values, indices, args: ExchangeArguments):
    """Every rank's accumulator summed on the union of the ranks' local choices."""
    del values
    return union_exchange(acc.astype(jnp.float32), indices, comm=args.comm,
                          algorithm=args.algorithm, nan_policy=args.nan_policy)


class Selection(NamedTuple):
    """One ``selection=`` of topk_sync: how each rank chooses, how the ranks exchange.

    Attributes:
      local: the local choice it starts from (a selection policy, or ``"bucket"``);
        ``None`` when the exchange chooses (its ``values`` and ``indices`` are None).
      exchange: ``(acc, values, indices, ExchangeArguments) -> (summed, indices,
        stats)``: the sum over ranks as a dense (size,) float32 vector, the
        indices to zero in the residual (-1: none), the stats vector.
      quantizable: the values travel through the sparse allreduce (so
        ``quantize_bits`` applies).
      mesh_axis: runs on a mesh axis (``comm=jss.axis(name)``) as well as MPI.
    """

    local: str | None
    exchange: Callable
    quantizable: bool = True
    mesh_axis: bool = True


#: topk_sync's selections: the shared policies, SparCML's bucketed top-k,
#: ScaleCom's cyclic local top-k (indices chosen by one rank a step) and the union
#: of every rank's top-k summed over all ranks. A new selection is one entry.
SELECTION_TABLE = {
    **{policy: Selection(policy, sparse_exchange) for policy in SELECTION_POLICIES},
    "bucket": Selection("bucket", sparse_exchange),
    "cyclic": Selection(None, cyclic_selection_exchange, quantizable=False, mesh_axis=False),
    "union": Selection("exact", union_selection_exchange, quantizable=False),
}
SELECTIONS = tuple(SELECTION_TABLE)
