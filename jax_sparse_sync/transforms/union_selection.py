"""``topk_sync(selection="union")``: every rank chooses, the union is summed by all.

With every rank choosing its own top-k (``selection="exact"``) the ranks'
choices barely overlap once the accumulators hold mostly noise. Almost every
coordinate then moves by one rank's
accumulation divided by P; the other ranks' share of it stays in their
residuals and arrives later, stale. ScaleCom's cyclic top-k
(``selection="cyclic"``) shares one rank's indices instead, but then only k
coordinates move a step.

The union exchange keeps both: each rank picks its own exact top-k, the ranks
learn the union U of the P choices (a sparse allreduce of the k indices with
the value 1: it counts how many ranks chose each coordinate), and then every
rank sends its whole accumulator at U in a dense allreduce of ``P k`` floats
(U in index order, padded with zeros). Every coordinate of U gets the mean of
all P ranks' accumulations and every residual is zeroed there: up to P k
coordinates move a step, each as dense data parallelism would move it.

On the wire: the first phase is the sparse allreduce of ``algorithm``
(``allgather``: P k (index, value) pairs received), the second a dense
allreduce of ``min(N, P k)`` floats: about twice the bytes of
``selection="exact"`` at the same k, and two latencies; locally one more
pass over N (the counts compacted) and a gather of P k entries.

Moving every rank's accumulation at once applies each coordinate's held-back
steps in one burst (about P times the burst of one rank's share), which a
model may not take well: an option, not a default. Measurements:
benchmarks/README.md, "Convergence".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.ops import transport
from jax_sparse_sync.bindings.selection import threshold_select
from jax_sparse_sync.ops.sparse_allreduce import sparse_allreduce
from jax_sparse_sync.stats import add_traffic
from jax_sparse_sync.transforms.cyclic_selection import dense_sum

__all__ = ["union_exchange", "union_capacity"]


def union_capacity(size: int, k: int, nranks: int) -> int:
    """Slots of the second phase: the union of P choices of k holds at most P k."""
    return min(size, nranks * k)


def union_exchange(acc: jax.Array, indices: jax.Array, *, comm, algorithm: str,
                   nan_policy: str):
    """The sum over ranks of every rank's ``acc`` on the union of the ranks' ``indices``.

    Args:
      acc: this rank's accumulator (N,) float32.
      indices: this rank's chosen entries (k,) int32 (its top-k), unique;
        index -1 marks a padding slot.
      comm: an MPI communicator or a mesh axis.
      algorithm: the sparse allreduce that shares the indices.
      nan_policy: of the values' dense allreduce (it carries every rank's
        chosen entries, so a non-finite chosen value is caught there).

    Returns:
      ``(summed (N,) float32, zero off the union; union (P k,) int32 in index
      order, -1 padded, the same on every rank; stats vector: the first
      phase's, with the second phase's bytes and messages added)``.
    """
    n, k = acc.shape[0], indices.shape[0]
    capacity = union_capacity(n, k, transport.comm_size_in_trace(comm))
    ones = jnp.where(indices >= 0, 1.0, 0.0).astype(jnp.float32)
    counts, index_stats = sparse_allreduce(ones, indices, size=n, algorithm=algorithm, comm=comm,
                                           nan_policy="propagate", return_stats="vector")
    # counts are small integers, exact and identical on every rank: so is the union
    # (in index order, -1 padded; at most P k entries, so it never overflows)
    _, union, _ = threshold_select(counts, -1.0, capacity=capacity)
    valid = union >= 0
    mine = jnp.where(valid, acc[jnp.where(valid, union, 0)], 0.0)
    values, value_stats = dense_sum(mine, comm, nan_policy)
    summed = jnp.zeros((n,), jnp.float32).at[jnp.where(valid, union, n)].set(
        values, mode="drop", unique_indices=True)
    return summed, union, add_traffic(index_stats, value_stats)
