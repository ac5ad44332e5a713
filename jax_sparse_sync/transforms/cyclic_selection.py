"""``topk_sync(selection="cyclic")``: indices chosen by one rank, values summed by all.

With every rank choosing its own top-k, the ranks' choices barely overlap once
the accumulators hold mostly noise: almost every coordinate is updated by one rank's accumulation, divided by P, and the
averaging over ranks that makes a larger P worth having happens only slowly,
through the residuals. ScaleCom's cyclic local top-k (Chen et al., NeurIPS
2020) shares the indices instead: at step t rank ``t mod P`` (the leader)
picks its top-k, every rank sends its own accumulator at those k indices, and
each kept coordinate gets the mean of all P ranks' accumulations. The same
number of (rank, coordinate) accumulations leave the residuals per step (P k),
the noise in them averaged before it is applied rather than after.

On the wire: the leader's k indices (as two exact float32 halves in a dense
allreduce of 2k entries, the other ranks adding zeros) and a dense allreduce
of the k values: 3k floats per step, whatever P, where the allgather sends P k
(index, value) pairs. Two latencies instead of one.

Only k coordinates move a step, and the other ranks' accumulations there are
small, so it can learn slower than every rank choosing its own: an option, not
a default. Measurements: benchmarks/README.md, "Convergence".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.ops import transport
from jax_sparse_sync.bindings.selection import topk
from jax_sparse_sync.ops.dense_allreduce import dense_allreduce
from jax_sparse_sync.stats import add_traffic

__all__ = ["cyclic_exchange", "leader_of_step", "dense_sum"]


def leader_of_step(step, nranks: int):
    """The rank that chooses the indices at ``step`` (0-based): ``step mod P``."""
    return jnp.asarray(step, jnp.int32) % nranks


def dense_sum(x: jax.Array, comm, nan_policy: str):
    """``(sum over ranks of x, stats vector)``: the dense allreduce, the same bits on
    every rank."""
    return dense_allreduce(x, comm=comm, nan_policy=nan_policy, return_stats="vector")


def cyclic_exchange(acc: jax.Array, k: int, step, *, comm, nan_policy: str):
    """The sum over ranks of every rank's ``acc`` at the leader's top-k indices.

    Args:
      acc: this rank's accumulator (N,) float32.
      k: entries kept.
      step: the transform's step count (int32 scalar, equal on every rank).
      comm: an MPI communicator.
      nan_policy: of the values' allreduce.

    Returns:
      ``(summed (N,) float32, zero elsewhere; indices (k,) int32, the same on
      every rank; stats vector)``.
    """
    n = acc.shape[0]
    _, mine = topk(acc, k)
    is_leader = leader_of_step(step, transport.comm_size(comm)) == transport.comm_rank(comm)
    # Indices travel as float32 halves < 2**16 (exact), the other ranks adding +0.
    halves = jnp.concatenate([(mine >> 16).astype(jnp.float32),
                              (mine & 0xFFFF).astype(jnp.float32)])
    shared, index_stats = dense_sum(jnp.where(is_leader, halves, 0.0), comm, "propagate")
    indices = (shared[:k].astype(jnp.int32) << 16) | shared[k:].astype(jnp.int32)
    values, value_stats = dense_sum(acc[indices], comm, nan_policy)
    summed = jnp.zeros((n,), jnp.float32).at[indices].set(values, unique_indices=True)
    return summed, indices, add_traffic(value_stats, index_stats)
