"""``chunked_topk_sync``'s wire format: the chunked top-k, its quantizer and the byte payload.

One rank's payload, for N entries cut into ``C = ceil(N / chunk)`` chunks of
``k`` slots each (:class:`~jax_sparse_sync.transforms.chunked_topk_config.ChunkedLayout`),
is three byte blocks, one after the other:

1. **offsets**: each slot's position within its chunk, uint16 (uint32 for
   chunks past 65535 entries), little-endian, chunk after chunk, ascending
   within a chunk. An empty slot holds the all-ones offset (never a position:
   decoders drop every offset >= chunk): the padding of a last chunk shorter
   than k, and a kept entry whose value is zero (a chunk with fewer than k
   nonzeros), which would otherwise decode as the lowest level;
2. **values**: with ``value_bits`` b in {2, 4, 8}, one b-bit code per slot,
   ``8 / b`` codes a byte, the first in the low bits; with ``value_dtype``, the
   values themselves (bfloat16 or float32, little-endian);
3. **scales** (quantized only): one float32 per chunk.

The quantizer (deterministic, so every rank decodes the same bits): a chunk's
scale ``s`` is the largest magnitude among its kept values; a code is a sign
bit (the top bit: 1 for a negative value, or -0.0) and ``b - 1`` bits of
magnitude level ``q``, the level nearest ``|v| L / s`` among ``1..L`` (``L =
2^(b-1)``; round half to even, then clamped to [1, L]); it decodes to
``+-q (s / L)``: at 2 bits ``{+-s/2, +-s}``, at 8 bits 128 levels up to
``s``. A chunk whose kept values are all zero has ``s = 0`` (all its slots are
empty). A NaN among the kept values makes
its chunk's scale, so every value it decodes, NaN (``nan_policy="raise"``
raises first). SparseLoCo (arXiv 2508.15706) also sends a sign and a
magnitude level per kept value with a scale per chunk; this quantizer is the
library's own statement of that scheme, not a copy of its code.

Decoding is a pure function of a payload's bytes, used alike for this rank's
own payload (the values the residual keeps out: what was sent) and for every
rank's payload after the allgather.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.transforms.chunked_topk_config import ChunkedLayout

__all__ = ["quantize", "dequantize", "pack_codes", "unpack_codes", "encode", "decode",
           "decode_sum"]


def quantize(values: jax.Array, lay: ChunkedLayout) -> tuple[jax.Array, jax.Array]:
    """``(codes uint8 (slots,), scales float32 (chunks,))`` of the kept ``values``."""
    v = values.astype(jnp.float32).reshape(lay.chunks, lay.k)
    levels = 2 ** (lay.value_bits - 1)
    scales = jnp.max(jnp.abs(v), axis=1)
    # |v| L / s: the 0 of an all-zero chunk, and level 1 for it (decoded as 0 * ...)
    per_level = jnp.where(scales > 0, levels / scales, 0.0)[:, None]
    q = jnp.clip(jnp.round(jnp.abs(v) * per_level), 1, levels) - 1
    q = jnp.where(jnp.isnan(q), 0, q).astype(jnp.uint8)  # a NaN chunk: its scale says so
    sign = jnp.signbit(v).astype(jnp.uint8) << (lay.value_bits - 1)
    return (sign | q).reshape(-1), scales


def dequantize(codes: jax.Array, scales: jax.Array, lay: ChunkedLayout) -> jax.Array:
    """The float32 values ``codes`` (uint8 (slots,)) and ``scales`` (chunks,) stand for."""
    levels = 2 ** (lay.value_bits - 1)
    c = codes.reshape(lay.chunks, lay.k)
    q = (c & (levels - 1)).astype(jnp.float32) + 1.0
    magnitude = q * (scales / levels)[:, None]  # s / L exact: L is a power of two
    return jnp.where((c >> (lay.value_bits - 1)) != 0, -magnitude, magnitude).reshape(-1)


def pack_codes(codes: jax.Array, bits: int) -> jax.Array:
    """``bits``-bit codes (uint8 (m,)) packed ``8 / bits`` a byte, the first in the low
    bits: ``ceil(m bits / 8)`` bytes."""
    per = 8 // bits
    m = codes.shape[0]
    padded = jnp.pad(codes, (0, -m % per)).reshape(-1, per)
    shifts = jnp.arange(per, dtype=jnp.uint8) * bits
    # the codes' bits are disjoint: their sum is their bitwise or
    return jnp.sum((padded << shifts).astype(jnp.uint32), axis=1).astype(jnp.uint8)


def unpack_codes(packed: jax.Array, m: int, bits: int) -> jax.Array:
    """The inverse of :func:`pack_codes`: ``m`` codes, uint8."""
    per = 8 // bits
    shifts = jnp.arange(per, dtype=jnp.uint8) * bits
    return ((packed[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:m].astype(jnp.uint8)


def _bytes_of(x: jax.Array) -> jax.Array:
    """The little-endian bytes of a vector of 2- or 4-byte words, as uint8."""
    return jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _words_of(b: jax.Array, dtype) -> jax.Array:
    """The inverse of :func:`_bytes_of`."""
    return jax.lax.bitcast_convert_type(b.reshape(-1, jnp.dtype(dtype).itemsize), dtype)


def encode(values: jax.Array, indices: jax.Array, lay: ChunkedLayout):
    """This rank's payload from its chunked top-k (``jss.bucket_topk(acc, k, chunk)``'s
    ``(values, indices)``, -1 in a short last chunk's padding slots).

    Returns:
      ``(payload uint8 (lay.payload_bytes,), codes, scales)``: ``codes``/``scales``
      are the quantized values (``None`` with ``value_dtype``: the payload's value
      bytes are then the values rounded to it).
    """
    base = jnp.repeat(jnp.arange(lay.chunks, dtype=jnp.int32) * lay.chunk, lay.k,
                      total_repeat_length=lay.slots)
    empty = (indices < 0) | (values == 0)
    offsets = jnp.where(empty, jnp.iinfo(lay.offset_dtype).max, indices - base)
    parts = [_bytes_of(offsets.astype(lay.offset_dtype))]
    codes = scales = None
    if lay.value_bits:
        codes, scales = quantize(values, lay)
        parts += [pack_codes(codes, lay.value_bits), _bytes_of(scales)]
    else:
        parts.append(_bytes_of(values.astype(lay.value_dtype)))
    payload = jnp.concatenate(parts)
    assert payload.shape == (lay.payload_bytes,), (payload.shape, lay.payload_bytes)
    return payload, codes, scales


def decode(payload: jax.Array, lay: ChunkedLayout) -> tuple[jax.Array, jax.Array]:
    """``(indices int32 (slots,), values float32 (slots,))`` of one rank's payload; an
    empty slot (an offset >= chunk, or a position at or past N) has index N and value 0
    (a scatter with ``mode="drop"`` skips it)."""
    ob, vb = lay.offset_bytes, lay.value_bytes
    offsets = _words_of(payload[:ob], lay.offset_dtype).astype(jnp.int32)
    base = jnp.repeat(jnp.arange(lay.chunks, dtype=jnp.int32) * lay.chunk, lay.k,
                      total_repeat_length=lay.slots)
    if lay.value_bits:
        codes = unpack_codes(payload[ob:ob + vb], lay.slots, lay.value_bits)
        values = dequantize(codes, _words_of(payload[ob + vb:], jnp.float32), lay)
    else:
        values = _words_of(payload[ob:ob + vb], lay.value_dtype).astype(jnp.float32)
    indices = base + offsets
    sent = (offsets < lay.chunk) & (indices < lay.size)
    return jnp.where(sent, indices, lay.size), jnp.where(sent, values, 0.0)


def decode_sum(gathered: jax.Array, lay: ChunkedLayout) -> tuple[jax.Array, jax.Array]:
    """The sum over ranks of the decoded payloads (``gathered`` uint8 (P, B)), added in
    rank order into zeros: ``((0 + v_0) + v_1) + ...`` at each index, the same bits on
    every rank (one rank's indices are distinct, so no two of its adds meet); and its
    count of nonzeros (int32), followed through the adds (O(P k), no pass over N)."""

    def add_rank(r, carry):
        out, nonzeros = carry
        indices, values = decode(gathered[r], lay)
        before = out.at[indices].get(mode="fill", fill_value=0.0)
        after = before + values
        sent = indices < lay.size
        nonzeros += jnp.sum(sent & (after != 0), dtype=jnp.int32) \
            - jnp.sum(sent & (before != 0), dtype=jnp.int32)
        return out.at[indices].set(after, mode="drop"), nonzeros

    return jax.lax.fori_loop(0, gathered.shape[0], add_rank,
                             (jnp.zeros((lay.size,), jnp.float32), jnp.zeros((), jnp.int32)))
