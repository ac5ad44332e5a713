"""The block-sparse (OmniReduce-style) allreduce over a mesh axis (``comm=jss.axis(name)``).

The same algorithm and bits as the MPI handler (ffi/collectives/block_allreduce.cc), with
JAX collectives inside ``shard_map`` / ``pmap``; :func:`jss.block_allreduce`
and :func:`jss.block_sync` call :func:`axis_block_allreduce` when given a mesh
axis. The vector is cut into B blocks of ``block_size`` entries
(:func:`jax_sparse_sync.bindings.block_scan.block_scan`, the same FFI kernel, finds the nonzero ones); device
q owns blocks ``[q B / P, (q+1) B / P)``, at most ``ceil(B / P)`` of them.

==================  ====================================================================
step                collectives
==================  ====================================================================
argument check      ``all_gather`` of the header (size, block size, flags, and each
                    device's largest count of nonzero blocks in one owner's range)
phase 1             ``all_to_all``: to each owner a bitmap of its range (int32 words)
                    and this device's nonzero blocks of it, at the smallest capacity of
                    a halving ladder that holds the largest such count anywhere; the
                    top of the ladder is the whole range, dense (no bitmap). Owners add
                    the blocks in rank order.
phase 2             ``all_gather`` of the owners' counts of nonzero result blocks, then
                    of their bitmaps and nonzero result blocks (ladder as above; dense
                    ranges at the top)
==================  ====================================================================

Nothing is dropped (the ladder tops at the whole range) and at most twice the
nonzero blocks' bytes travel, plus the bitmap. Lossless, bit for bit: owners
add ``((0 + x_0) + x_1) + ...`` over every rank, as the MPI handler does (an
absent block adds zeros, which changes no sum that starts at +0), so the
result equals the MPI transport's and the rank-order dense sum (up to the
sign of zeros), on every device. Stats follow :mod:`jax_sparse_sync.mesh.sparse_allreduce`
(the static shapes that travel; a short last block travels padded to
``block_size``); ``result_nnz`` counts the nonzero result blocks;
``switched_to_dense`` is 1 when a phase sent whole ranges (the ladder's top;
the MPI handler always reports 0).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext
from jax_sparse_sync.mesh.checks import checked_headers
from jax_sparse_sync.mesh.comm import AxisComm
from jax_sparse_sync.mesh.common import (F_NONFINITE, HEADER_BYTES, Counters, log2_ceil,
                                         uniform_max, vary)
from jax_sparse_sync.mesh.ladder import capacity_ladder, ladder_index
from jax_sparse_sync.base.arguments import NAN_POLICIES
from jax_sparse_sync.bindings.block_scan import block_scan

__all__ = ["axis_block_allreduce"]


def _pack_bits(mask):
    """bool [..., m] -> int32 [..., ceil(m / 32)] bitmap words (bit j of word w: entry 32w + j)."""
    m = mask.shape[-1]
    words = -(-m // 32)
    pad = jnp.zeros(mask.shape[:-1] + (words * 32 - m,), bool)
    bits = jnp.concatenate([mask, pad], axis=-1).reshape(mask.shape[:-1] + (words, 32))
    shifted = bits.astype(jnp.uint32) << jnp.arange(32, dtype=jnp.uint32)
    return jax.lax.bitcast_convert_type(shifted.sum(-1, dtype=jnp.uint32), jnp.int32)


def _unpack_bits(words, m):
    """Inverse of :func:`_pack_bits`."""
    u = jax.lax.bitcast_convert_type(words, jnp.uint32)
    bits = (u[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return bits.reshape(words.shape[:-1] + (-1,))[..., :m].astype(bool)


def _compact(blocks, mask, width):
    """[R, m, b] blocks, [R, m] mask -> the masked blocks packed first: [R, width, b]."""
    r, m = mask.shape
    slot = jnp.where(mask, jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, width)
    src = jnp.zeros((r, width), jnp.int32).at[jnp.arange(r)[:, None], slot].set(
        jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), (r, m)), mode="drop", unique_indices=True)
    filled = jnp.arange(width)[None, :] < mask.sum(1, keepdims=True)
    picked = jnp.take_along_axis(blocks, src[:, :, None], axis=1)
    return jnp.where(filled[:, :, None], picked, 0.0)


def _expand(words, packed, m):
    """Bitmap words [R, W] and packed blocks [R, width, b] -> dense [R, m, b] (absent: 0)."""
    bits = _unpack_bits(words, m)
    slot = jnp.clip(jnp.cumsum(bits.astype(jnp.int32), axis=1) - 1, 0, packed.shape[1] - 1)
    got = jnp.take_along_axis(packed, slot[:, :, None], axis=1)
    return jnp.where(bits[:, :, None], got, 0.0)


def _ladder_exchange(blocks, mask, need, bmax, collective, name):
    """Sends ``blocks`` [R, bmax, b] (``mask`` [R, bmax]: nonzero and in range) through
    ``collective`` at the ladder step that holds ``need`` blocks; returns what arrived,
    expanded to dense [R', bmax, b], the ladder and the chosen index."""
    ladder = capacity_ladder(bmax, 1)

    def sparse(width):
        words = _pack_bits(mask)
        packed = _compact(blocks, mask, width)
        got_w = collective(words)
        got_b = collective(packed)
        return _expand(got_w, got_b, bmax)

    def dense():
        return collective(jnp.where(mask[:, :, None], blocks, 0.0))

    branches = [functools.partial(sparse, w) for w in ladder[:-1]] + [dense]
    index = ladder_index(need, ladder)
    return jax.lax.switch(index, branches), ladder, index


def axis_block_allreduce(x, *, block_size: int, comm: AxisComm, nan_policy: str = "propagate",
                         op: str = "block_allreduce"):
    """The block-sparse sum of the float32 vector ``x`` over ``comm``'s mesh axis:
    ``(sum f32[x.size], stats vector)``; arguments checked by :func:`jss.block_allreduce`,
    which calls this for ``comm=jss.axis(...)``.

    Example:
      >>> import jax, jax.numpy as jnp, jax_sparse_sync as jss
      >>> from jax.sharding import PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
      >>> f = jax.jit(jax.shard_map(lambda x: jss.block_allreduce(x, block_size=2,
      ...                                                         comm=jss.axis("data")),
      ...                           mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
      >>> f(jnp.array([0., 0., 3., 0.])).tolist()
      [0.0, 0.0, 3.0, 0.0]
    """
    name, b = comm.name, int(block_size)
    p = comm.size(op)
    x = jnp.asarray(x, jnp.float32).reshape(-1)
    n = x.shape[0]
    nb = -(-n // b)
    bmax = -(-nb // p)
    first = np.asarray([nb * q // p for q in range(p + 1)])
    rank = jax.lax.axis_index(name)

    nonzero = block_scan(x, b)  # [nb]
    # [P owners, bmax] views of the block ids each owner holds
    ids = first[:-1, None] + np.arange(bmax)[None, :]
    in_range = np.arange(bmax)[None, :] < np.diff(first)[:, None]
    safe_ids = np.minimum(ids, max(nb - 1, 0))
    blocks = jnp.pad(x, (0, nb * b - n)).reshape(nb, b)[safe_ids]  # [P, bmax, b]
    mask = nonzero[safe_ids] & in_range
    per_owner = mask.sum(1).astype(jnp.int32)

    nonfinite = ~jnp.all(jnp.isfinite(x)) if NAN_POLICIES[nan_policy] == 0 else jnp.asarray(False)
    headers, zero = checked_headers(name, flags=jnp.where(nonfinite, F_NONFINITE, 0), size=n,
                                    word=_ext.ALGORITHM_IDS["block"], param=b,
                                    slots=(per_owner.max(), per_owner.sum()), op=op)
    ctr = Counters()
    lg = log2_ceil(p)
    ctr.collective(HEADER_BYTES * (p - 1), lg)
    blocks = vary(blocks + zero.astype(jnp.float32), name)

    # Phase 1: each owner receives its range from every device, adds in rank order.
    def to_owners(a):
        return jax.lax.all_to_all(a, name, 0, 0)

    got, ladder, index = _ladder_exchange(blocks, mask, headers[:, 6].max(), bmax, to_owners, name)
    words = -(-bmax // 32)
    ctr.collective(ctr.table([(p - 1) * 4 * (words + w * b) for w in ladder[:-1]]
                             + [(p - 1) * 4 * bmax * b], index), p - 1)

    def add(s, acc):
        return acc + got[s]

    acc = jax.lax.fori_loop(0, p, add, vary(jnp.zeros((bmax, b), jnp.float32), name))

    # Phase 2: the owners' nonzero result blocks to everyone.
    result_mask = block_scan(acc.reshape(-1), b)[None, :] & jnp.asarray(in_range)[rank][None, :]
    count = result_mask.sum().astype(jnp.int32)
    need = uniform_max(count, name)
    ctr.collective(4 * (p - 1), lg)

    def gather(a):
        return jax.lax.all_gather(a[0], name, to="invarying")

    rows, ladder2, index2 = _ladder_exchange(acc[None], result_mask, need, bmax, gather, name)
    ctr.collective(ctr.table([(p - 1) * 4 * (words + w * b) for w in ladder2[:-1]]
                             + [(p - 1) * 4 * bmax * b], index2), lg)
    # [P, bmax, b] owner ranges -> the vector (static gather: block j is owner q's j - first[q])
    owner = np.searchsorted(first, np.arange(nb), side="right") - 1
    out = rows[owner, np.arange(nb) - first[owner]].reshape(-1)[:n]
    dt = ctr.dt
    went_dense = (index == len(ladder) - 1) | (index2 == len(ladder2) - 1)
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages,
                       jnp.sum(block_scan(out, b)).astype(dt), went_dense.astype(dt),
                       ctr.value(_ext.ALGORITHM_IDS["block"])])
    return out, stats
