"""Index encodings of a sparse message: a plain list, delta-coded bit-packed, or a bitmap.

A sparse allreduce message carries sorted, distinct indices. Depending on how
many there are and how far they spread, one of three encodings is smallest:

=========  ===========================================================  ==========================
kind       layout after the 5-byte header (kind byte, uint32 count m)   bytes
=========  ===========================================================  ==========================
list (0)   m little-endian int32                                        5 + 4 m
delta (1)  width byte b, int32 first index, then the m - 1 gaps          10 + ceil((m - 1) b / 8)
           ``idx[j] - idx[j-1] - 1`` in b bits each (LSB first),        (m >= 1; b = bit length
           b = bit length of the largest gap (0 when all are adjacent)  of the largest gap)
bitmap (2) int32 first index, then one bit per position of              9 + ceil((last - first
           [first, last] (LSB first)                                    + 1) / 8)   (m >= 1)
=========  ===========================================================  ==========================

An empty message is the header alone (5 bytes, kind 0). :func:`encode` picks the
smallest (ties: list, then delta, then bitmap) and writes its kind in the first
byte, so :func:`decode` needs nothing else. Pure NumPy, on the host: the
definition of the format. The MPI transport's C++ encoder (``ffi/collectives/wire_codec.h``)
writes the same bytes for ``jss.sparse_allreduce(..., index_encoding="auto")``
(tested message by message). Sizes and when each kind wins:
docs/topics/wire_formats.md.

Example:
  >>> import numpy as np
  >>> from jax_sparse_sync.ops.index_encoding import encode, decode, encoded_sizes
  >>> idx = np.arange(0, 1000, 3)
  >>> encoded_sizes(idx)
  {'list': 1341, 'delta': 94, 'bitmap': 134}
  >>> buf = encode(idx); int(buf[0]), len(buf)
  (1, 94)
  >>> bool((decode(buf) == idx).all())
  True
"""

from __future__ import annotations

import numpy as np

__all__ = ["KINDS", "HEADER_BYTES", "encoded_sizes", "choose", "encode", "decode"]

#: encoding name -> the id in a message's first byte
KINDS = {"list": 0, "delta": 1, "bitmap": 2}
HEADER_BYTES = 5  # kind byte + uint32 count


def _checked(indices) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise TypeError(f"index_encoding: `indices` must be a 1-D integer array; got "
                        f"{idx.dtype} of shape {idx.shape}")
    idx = idx.astype(np.int64)
    if idx.size and (idx[0] < 0 or idx[-1] >= 2**31 or np.any(np.diff(idx) <= 0)):
        raise ValueError("index_encoding: `indices` must be sorted, distinct and in [0, 2**31) "
                         "(np.unique(indices) gives that)")
    return idx


def _gap_width(idx: np.ndarray) -> int:
    if idx.size < 2:
        return 0
    return int(np.diff(idx).max() - 1).bit_length()


def encoded_sizes(indices) -> dict[str, int]:
    """Exact bytes of each encoding of these sorted distinct indices (header included)."""
    idx = _checked(indices)
    m = int(idx.size)
    if m == 0:
        return {"list": HEADER_BYTES, "delta": HEADER_BYTES, "bitmap": HEADER_BYTES}
    b = _gap_width(idx)
    span = int(idx[-1] - idx[0]) + 1
    return {"list": HEADER_BYTES + 4 * m,
            "delta": HEADER_BYTES + 5 + ((m - 1) * b + 7) // 8,
            "bitmap": HEADER_BYTES + 4 + (span + 7) // 8}


def choose(indices) -> str:
    """The smallest encoding's name (ties: list, delta, bitmap)."""
    sizes = encoded_sizes(indices)
    return min(KINDS, key=lambda k: (sizes[k], KINDS[k]))


def _pack_bits(values: np.ndarray, width: int) -> np.ndarray:
    if width == 0 or values.size == 0:
        return np.zeros(0, np.uint8)
    bits = ((values[:, None] >> np.arange(width, dtype=np.int64)[None, :]) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little")


def _unpack_bits(buf: np.ndarray, count: int, width: int) -> np.ndarray:
    if width == 0 or count == 0:
        return np.zeros(count, np.int64)
    bits = np.unpackbits(buf, count=count * width, bitorder="little").reshape(count, width)
    return (bits.astype(np.int64) << np.arange(width, dtype=np.int64)[None, :]).sum(axis=1)


def encode(indices, kind: str | None = None) -> np.ndarray:
    """The message (uint8 array) of these sorted distinct indices in ``kind``'s encoding,
    or the smallest one (``kind=None``); its length is ``encoded_sizes(indices)[kind]``."""
    idx = _checked(indices)
    kind = choose(idx) if kind is None else kind
    if kind not in KINDS:
        raise ValueError(f"index_encoding: `kind` must be one of {sorted(KINDS)} or None; "
                         f"got {kind!r}")
    m = int(idx.size)
    header = np.concatenate([np.asarray([KINDS[kind] if m else 0], np.uint8),
                             np.asarray([m], "<u4").view(np.uint8)])
    if m == 0:
        return header
    if kind == "list":
        body = idx.astype("<i4").view(np.uint8)
    elif kind == "delta":
        b = _gap_width(idx)
        body = np.concatenate([np.asarray([b], np.uint8),
                               np.asarray([idx[0]], "<i4").view(np.uint8),
                               _pack_bits(np.diff(idx) - 1, b)])
    else:
        flags = np.zeros(int(idx[-1] - idx[0]) + 1, np.uint8)
        flags[idx - idx[0]] = 1
        body = np.concatenate([np.asarray([idx[0]], "<i4").view(np.uint8),
                               np.packbits(flags, bitorder="little")])
    return np.concatenate([header, body])


def decode(message) -> np.ndarray:
    """The sorted int32 indices of a message written by :func:`encode`."""
    buf = np.asarray(message, np.uint8)
    if buf.size < HEADER_BYTES or buf[0] not in KINDS.values():
        raise ValueError("index_encoding.decode: not a message of encode() (short or unknown "
                         "kind byte)")
    kind, m = int(buf[0]), int(buf[1:5].view("<u4")[0])
    body = buf[HEADER_BYTES:]
    if m == 0:
        return np.zeros(0, np.int32)
    if kind == KINDS["list"]:
        return body[:4 * m].view("<i4").astype(np.int32)
    first = int(body[:4].view("<i4")[0]) if kind == KINDS["bitmap"] else int(
        body[1:5].view("<i4")[0])
    if kind == KINDS["delta"]:
        b = int(body[0])
        gaps = _unpack_bits(body[5:], m - 1, b) + 1
        return (first + np.concatenate([[0], np.cumsum(gaps)])).astype(np.int32)
    flags = np.unpackbits(body[4:], bitorder="little")
    return (first + np.flatnonzero(flags)).astype(np.int32)[:m]
