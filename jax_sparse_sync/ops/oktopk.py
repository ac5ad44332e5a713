"""``oktopk_allreduce``: Ok-Topk's O(k) sparse allreduce (Li and Hoefler, PPoPP'22).

Result = Top-k( sum over ranks of each rank's local top-k ): the local
vectors are summed region by region (each rank owns one index region), and
each owner keeps the entries of its region above the global threshold (with
a reused threshold, ``region_counts`` bounds how many: its exact top ones when
the threshold picks too few or too many); the kept entries are gathered to
every rank. The payload stays within
[2k (P-1)/P, 6k (P-1)/P] words instead of TopkA's 2k (P-1). A call that computes the
exact global threshold also allreduces 896 int64 histogram counts
(cost_model.THRESHOLD_HISTOGRAM_BINS), a fixed 3584 (P-1)/P words whatever k
is: at small k that can exceed the bound, which then holds amortized over the
tau steps that reuse the threshold.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.ops import transport
from jax_sparse_sync.base.arguments import OKTOPK_PARTITIONS, check_nan_policy, wire_dtype_id
from jax_sparse_sync.stats import SyncStats

__all__ = ["OktopkResult", "oktopk_allreduce", "even_boundaries", "check_partition"]


class OktopkResult(NamedTuple):
    """What :func:`oktopk_allreduce` returns (see there)."""

    sum: jax.Array          # dense float32 (size,): the global top-k of the sum
    contributed: jax.Array  # bool (cap,): this rank's input slot is in the global top-k
    boundaries: jax.Array   # int32 (P + 1,): the region boundaries used
    threshold: jax.Array    # float32 (): the global threshold used
    stats: SyncStats


def even_boundaries(size: int, nranks: int) -> jax.Array:
    """Region boundaries ``[q * size // P for q in 0..P]``."""
    return jnp.asarray([size * q // nranks for q in range(nranks + 1)], jnp.int32)


def check_partition(partition, op: str) -> None:
    """ValueError unless ``partition`` names one of ``OKTOPK_PARTITIONS``."""
    if not isinstance(partition, str) or partition not in OKTOPK_PARTITIONS:
        raise ValueError(f"jax_sparse_sync.{op}: `partition` must be one of {OKTOPK_PARTITIONS} "
                         "(\"regions\": contiguous index regions, Ok-Topk's; \"hash\": ZEN's "
                         f"hash owners); got {partition!r}")


def _pair(x):
    try:
        lo, hi = x
    except (TypeError, ValueError):
        return None, None
    return lo, hi


def oktopk_allreduce(values: jax.Array, indices: jax.Array, *, size: int, k: int,
                     boundaries: jax.Array | None = None,
                     global_threshold: float | jax.Array = 0.0,
                     recompute_boundaries: bool | jax.Array = True,
                     recompute_threshold: bool | jax.Array = True,
                     comm=None, nan_policy: str = "raise",
                     region_counts: tuple[int, int] | None = None,
                     wire_dtype=None, partition: str = "regions") -> OktopkResult:
    """Ok-Topk sparse allreduce of each rank's local top-k entries.

    Args:
      values, indices: this rank's local selection (fixed-capacity COO, index
        -1 for padding), e.g. from :func:`jss.topk` or :func:`jss.threshold_select`.
      size: dense dimension N (equal on all ranks).
      k: the global k: how many entries of the sum to keep (equal on all ranks).
      boundaries: int32 (P + 1,) region boundaries to reuse; ignored when
        ``recompute_boundaries``. Default: an even split.
      global_threshold: magnitude threshold to reuse; ignored when
        ``recompute_threshold``.
      recompute_boundaries: recompute balanced regions from the ranks' index
        distributions (one allreduce of P-1 integers). May be traced.
      recompute_threshold: compute the exact global k-th magnitude (a
        distributed radix select, four small allreduces). May be traced.
      comm: mpi4py communicator (default: the library's clone of COMM_WORLD),
        or ``jss.axis(name)`` inside shard_map/pmap: JAX collectives over that
        mesh axis, each device a rank, same results bit for bit (see
        :mod:`jax_sparse_sync.mesh.oktopk`).
      nan_policy: ``"raise"`` or ``"propagate"``, as in :func:`sparse_allreduce`.
      region_counts: ``(lo, hi)`` ints, 0 <= lo <= hi: with a reused threshold
        (``recompute_threshold`` false), each owner keeps at least ``min(lo,
        nonzero entries of its reduced region)`` and at most ``hi`` entries: its
        region's exact top ones by magnitude (ties: the lower index) when the
        threshold picks fewer or more (the owner holds the whole region sum, so
        this costs nothing on the wire). ``None``: the threshold alone.
        ``oktopk_sync`` passes about ``(k / 2P, 2k / P)`` (see its
        ``region_band``).
      wire_dtype: ``None`` (float32 values), ``jnp.bfloat16`` or ``jnp.float16``:
        every value travels as 2 bytes (an entry 6 instead of 8; counts, the
        boundaries and the threshold histograms are unchanged). Each rank rounds
        its entries to the wire dtype (nearest even) before they travel and keeps
        the rounded ones for its own region; owners sum in float32, select on
        those sums, and round the selected sums before they are gathered, so every
        rank gets the same bits and ``sum`` holds wire-dtype values. ``contributed``
        is computed as for float32; what rounding takes from a rank's own values
        is the caller's to keep (``oktopk_sync`` keeps it in the residual). The
        same on both transports.
      partition: who owns (reduces and selects) an index. ``"regions"`` (the
        paper's): contiguous index regions, from ``boundaries`` or recomputed from
        the ranks' indices. ``"hash"``: ZEN's hash owner (murmur3's finalizer of
        the index mod P, as ``algorithm="hash_partition"``): data-independent, so
        every owner's share stays close to 1/P on a concentrated support
        (embedding rows) where regions would need rebalancing; ``boundaries`` and
        ``recompute_boundaries`` are then unused (returned as given). Each owner
        sums the ranks' entries in rank order 0, 1, ..., P-1 (the hash partition's
        bits), then the same threshold and keep rule apply (``region_counts``
        limits each hash owner), and the owners' selections are merged by index.
        With an exact threshold the result is ``"regions"``' up to the order of
        the additions (bit for bit at P = 2; a region's owner adds its own slice
        first). See docs/topics/wire_formats.md, "Ok-Topk with hash owners".

    Returns:
      An :class:`OktopkResult`. With an exact threshold, every entry whose
      magnitude equals the k-th largest is kept, so ties can add a few entries.
      ``stats.switched_to_dense`` reports whether the balancing step ran.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> r = jss.oktopk_allreduce(jnp.array([3., -1., 2.]), jnp.array([0, 5, 7], jnp.int32),
      ...                          size=8, k=2)
      >>> r.sum.tolist(), r.contributed.tolist()
      ([3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0], [True, False, True])
    """
    values, indices = jnp.asarray(values), jnp.asarray(indices)
    if values.ndim != 1 or values.shape != indices.shape:
        raise ValueError("jax_sparse_sync.oktopk_allreduce: `values` and `indices` must be 1-D "
                         f"and of the same length; got {values.shape} and {indices.shape}")
    if not jnp.issubdtype(values.dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.oktopk_allreduce: `values` has dtype {values.dtype}; "
                        "pass floats")
    if indices.dtype != jnp.int32:
        raise TypeError(f"jax_sparse_sync.oktopk_allreduce: `indices` has dtype {indices.dtype}; "
                        "pass int32")
    size = int(size)
    if not 0 < size < 2**31:
        raise ValueError(f"jax_sparse_sync.oktopk_allreduce: `size` must be in [1, 2**31); got {size}")
    if not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= size:
        raise ValueError(f"jax_sparse_sync.oktopk_allreduce: `k` must be an int in [1, {size}]; "
                         f"got {k!r}")
    check_nan_policy(nan_policy, "oktopk_allreduce")
    check_partition(partition, "oktopk_allreduce")
    wire_dtype_id(wire_dtype, "oktopk_allreduce")  # ValueError naming the argument
    if region_counts is not None:
        lo, hi = (int(c) if isinstance(c, (int, np.integer)) and not isinstance(c, bool)
                  else None for c in _pair(region_counts))
        if lo is None or hi is None or not 0 <= lo <= hi:
            raise ValueError("jax_sparse_sync.oktopk_allreduce: `region_counts` must be None or "
                             f"a pair of ints (lo, hi) with 0 <= lo <= hi; got {region_counts!r}")
        region_counts = (lo, hi)
    comm = transport.resolve_comm(comm)
    nranks = transport.comm_size_in_trace(comm, "oktopk_allreduce")
    if boundaries is None:
        boundaries = even_boundaries(size, nranks)
    boundaries = jnp.asarray(boundaries, jnp.int32)
    if boundaries.shape != (nranks + 1,):
        raise ValueError(f"jax_sparse_sync.oktopk_allreduce: `boundaries` must have shape "
                         f"({nranks + 1},) (P + 1); got {boundaries.shape}")
    run = transport.implementation("oktopk_allreduce", comm)
    out, contributed, bounds, threshold, stats = run(
        values, indices, size=size, k=int(k), boundaries=boundaries, threshold=global_threshold,
        recompute_boundaries=recompute_boundaries, recompute_threshold=recompute_threshold,
        comm=comm, nan_policy=nan_policy, region_counts=region_counts, wire_dtype=wire_dtype,
        partition=partition)
    return OktopkResult(out, contributed, bounds, threshold, SyncStats.from_vector(stats))
