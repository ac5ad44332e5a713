"""The phases of a :func:`jss.sharded_sync` step after the accumulator's top-k.

accumulate and select (the shared :mod:`~jax_sparse_sync.transforms.phases`) ->
**reduce** (:func:`reduce_phase`: the selected entries summed at their region's
owner) -> **clip** (:func:`clip_phase`, with ``max_grad_norm``) -> **inner** (:func:`inner_phase`: the owner's optimizer on its region,
with its shard of the state) -> **compress** (:func:`compress_phase`: which of
the region's change travels) -> **gather** (:func:`gather_phase`: every owner's
entries to every rank) -> settle (the sent gradient entries zeroed).

Rank q of P owns the fixed region ``[q N / P, (q + 1) N / P)`` of the flat
parameters (:class:`Region`); every region buffer is ``slot = ceil(N / P)``
entries, the slots past the region's end zero and never sent, so every rank
runs the same program and a mesh axis's shards have one shape.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jax_sparse_sync.bindings.selection import residual_update, threshold_select, topk
from jax_sparse_sync.ops import transport
from jax_sparse_sync.ops.region_reduce import region_bounds, region_reduce, region_slot
from jax_sparse_sync.ops.region_gather import region_gather
from jax_sparse_sync.base.leaf_layout import leaf_offsets
from jax_sparse_sync.transforms.flat import accumulate, ravel_leaves
from jax_sparse_sync.transforms.sharded_config import ShardedSyncConfig, region_leaf

__all__ = ["Region", "region_of", "region_params", "reduce_phase", "clip_phase", "inner_phase",
           "compress_phase", "gather_phase"]


class Region(NamedTuple):
    """This rank's region of the N flat entries."""

    nranks: int        # P
    size: int          # N
    slot: int          # ceil(N / P): every rank's region buffer
    lo: Any            # first entry: an int (MPI), an int32 traced on a mesh axis
    length: Any        # entries (slot, or fewer: the regions differ by at most one)
    rank: Any          # this rank: an int (MPI), traced on a mesh axis

    @property
    def valid(self) -> jax.Array:
        """Which of the ``slot`` buffer entries lie in the region."""
        return jnp.arange(self.slot, dtype=jnp.int32) < self.length


def region_of(comm, size: int, op: str = "sharded_sync") -> Region:
    """This rank's region of ``size`` entries on ``comm`` (MPI: its rank, so the bounds
    are Python ints; a mesh axis: the device's index along it, inside shard_map)."""
    p = transport.comm_size_in_trace(comm, op)
    bounds = region_bounds(size, p)
    if transport.is_mesh_axis(comm):
        rank, table = comm.rank(), jnp.asarray(bounds, jnp.int32)
        return Region(p, size, region_slot(size, p), table[rank], table[rank + 1] - table[rank],
                      rank)
    rank = comm.Get_rank()
    return Region(p, size, region_slot(size, p), bounds[rank], bounds[rank + 1] - bounds[rank],
                  rank)


def region_params(params, region: Region):
    """The region's parameters, float32 (``slot``,), zero past its end; None for None.

    With static bounds (MPI) only the leaves that overlap the region are read, N / P
    entries; on a mesh axis (the bounds traced) the raveled parameters are sliced."""
    if params is None:
        return None
    if isinstance(region.lo, int):
        lo, hi = region.lo, region.lo + int(region.length)
        leaves = jax.tree_util.tree_leaves(params)
        parts = [jnp.ravel(leaf)[max(a, lo) - a:min(b, hi) - a].astype(jnp.float32)
                 for leaf, a, b in zip(leaves, leaf_offsets(leaves), leaf_offsets(leaves)[1:])
                 if max(a, lo) < min(b, hi)]
        parts.append(jnp.zeros((region.slot - (hi - lo),), jnp.float32))
        return jnp.concatenate(parts)
    flat = ravel_leaves(params, jnp.float32)
    padded = jnp.pad(flat, (0, region.nranks * region.slot - region.size))
    return jax.lax.dynamic_slice(padded, (region.lo,), (region.slot,))


def reduce_phase(config: ShardedSyncConfig, values, indices, region: Region):
    """The selected entries summed at their owners: ``(mean gradient of the region
    (sum / P), the region's sum, stats vector)``."""
    summed, stats = region_reduce(values, indices, size=region.size, comm=config.shared.comm,
                                  nan_policy=config.shared.nan_policy)
    return summed / jnp.float32(region.nranks), summed, stats


def clip_phase(config: ShardedSyncConfig, grad, region: Region):
    """The reduced gradient clipped by its global norm, as ``optax.clip_by_global_norm``
    clips the replicated one (scaled by ``max_grad_norm / norm`` where the norm is
    larger): ``(grad, stats)``. Each owner's sum of squares of its region
    goes to every rank (one dense gather of P floats, ``region_gather``) and they are added
    in rank order, so every owner scales by the same norm."""
    # a dot product, not a fused reduction: XLA:CPU hands it to the same library routine
    # whatever the step fuses around it, so its bits do not depend on the step's fusions
    partial = jnp.dot(grad, grad, precision=jax.lax.Precision.HIGHEST)
    parts, stats = region_gather(partial[None], jnp.asarray(region.rank, jnp.int32)[None],
                                 size=region.nranks, dense=True, comm=config.shared.comm,
                                 nan_policy="propagate")
    total = parts[0]
    for q in range(1, region.nranks):
        total = total + parts[q]
    norm = jnp.sqrt(total)
    limit = jnp.float32(config.max_grad_norm)
    # one runtime scale (1 where the norm is within the limit): the same operations
    # whether it clips or not, so a reference can repeat them (tests/sharded_reference.py)
    return grad * jnp.where(norm < limit, jnp.float32(1.0), limit / norm), stats


def inner_phase(config: ShardedSyncConfig, grad, inner_state, params, region: Region,
                touched=None):
    """The owner's optimizer on its region: ``(update (slot,), new inner state)``, the
    update zero outside the region. ``touched`` (lazy): only the entries that
    received gradient move and update their state; the others keep theirs (the
    scalar leaves, a step count, advance every step)."""
    update, new_state = config.inner.update(grad, inner_state, params)
    keep = region.valid if touched is None else region.valid & touched
    update = jnp.where(keep, update.astype(jnp.float32), 0.0)
    if touched is not None:
        new_state = jax.tree_util.tree_map(
            lambda new, old: jnp.where(touched, new, old) if region_leaf(old, region.slot)
            else new, new_state, inner_state)
    return update, new_state


def compress_phase(change: str, update, change_residual, region: Region, *, change_k: int,
                   capacity: int, touched=None):
    """Which of the region's change travels: ``(values, global indices (-1 padding),
    new change residual)``.

    ``"topk"``: the top ``change_k`` of ``change_residual + update`` (the owner's own
    error feedback, DoubleSqueeze's second compression), the rest kept;
    ``"lazy"``: every entry that received gradient (``touched``), at most
    ``capacity``; ``"dense"``: the whole region."""
    offsets = jnp.arange(region.slot, dtype=jnp.int32)
    if change == "topk":
        # the FFI accumulate kernel on CPU (XLA's fusion elsewhere): XLA:CPU would fuse the
        # sum into the inner step's last product and contract the two (an FMA), so that the
        # change's bits would depend on what the step fuses (tests compare them bitwise)
        acc = accumulate(change_residual, [update], jnp.float32)
        values, local = topk(acc, change_k)
        sent = local < region.length
        return (jnp.where(sent, values, 0.0), jnp.where(sent, region.lo + local, -1),
                residual_update(acc, local))
    if change == "lazy":
        # the touched entries in index order by the selection kernel's compaction (one
        # pass; jnp.nonzero's prefix sum and scatter took XLA:CPU 14x as long at 1.6M)
        touched_here = jnp.where(touched & region.valid, jnp.float32(1.0), jnp.float32(0.0))
        _, local, _ = threshold_select(touched_here, -1.0, capacity)
        sent = local >= 0
        return (jnp.where(sent, update[jnp.maximum(local, 0)], 0.0),
                jnp.where(sent, region.lo + local, -1), change_residual)
    return (update, jnp.where(region.valid, region.lo + offsets, -1), change_residual)


def gather_phase(config: ShardedSyncConfig, change: str, values, indices, region: Region):
    """Every owner's sent entries to every rank: ``(the dense change (N,), stats)``
    (:func:`~jax_sparse_sync.ops.region_gather.region_gather`; ``"dense"``: every region
    gathered dense)."""
    return region_gather(values, indices, size=region.size, dense=change == "dense",
                         comm=config.shared.comm, nan_policy=config.shared.nan_policy)
