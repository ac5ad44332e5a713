"""A NumPy restatement of ``jss.chunked_topk_sync``'s compressor and step, written from its
docstring (chunked top-k, the sign + magnitude-level quantizer, error feedback), not from
its code: per chunk a stable sort by magnitude (ties to the lower index), the level
nearest ``|v| L / s`` in float32, the decoded values, the rank-order sum, the residual."""

from __future__ import annotations

import numpy as np


def compress(acc: np.ndarray, chunk: int, k: int, bits: int = 2, dtype=None):
    """One rank's kept entries and what it sends of them: ``(indices int64 (m,) ascending,
    sent float32 (m,))`` (``bits`` 2 / 4 / 8, or ``dtype`` bfloat16 / float32 unquantized)."""
    acc = np.asarray(acc, np.float32)
    all_idx, all_sent = [], []
    for lo in range(0, acc.size, chunk):
        x = acc[lo:lo + chunk]
        keep = np.sort(np.argsort(-np.abs(x), kind="stable")[:min(k, x.size)])
        keep = keep[x[keep] != 0]  # a kept zero is an empty slot: nothing sent
        v = x[keep]
        if dtype is not None:
            sent = v.astype(dtype).astype(np.float32)
        else:
            levels = np.float32(2 ** (bits - 1))
            s = np.abs(v).max() if v.size else np.float32(0)
            per_level = levels / s if s > 0 else np.float32(0)
            q = np.clip(np.round(np.abs(v) * per_level), 1, levels).astype(np.float32)
            magnitude = q * (s / levels)
            sent = np.where(np.signbit(v), -magnitude, magnitude).astype(np.float32)
        all_idx.append(lo + keep)
        all_sent.append(sent)
    return np.concatenate(all_idx), np.concatenate(all_sent)


def step(residuals, grads, chunk, k, bits=2, dtype=None, decay=1.0):
    """One step on every rank: ``(update float32 (N,), new residuals, sent per rank)``;
    ``residuals`` and ``grads`` are per-rank lists."""
    n, p = grads[0].size, len(grads)
    summed = np.zeros(n, np.float32)
    new_residuals, sents = [], []
    for r in range(p):
        res = residuals[r] if decay == 1.0 else residuals[r] * np.float32(decay)
        acc = (res + np.asarray(grads[r], np.float32)).astype(np.float32)
        idx, sent = compress(acc, chunk, k, bits, dtype)
        summed[idx] += sent  # rank order: ((0 + v0) + v1) + ...
        kept = acc.copy()
        kept[idx] = acc[idx] - sent
        new_residuals.append(kept)
        dense_sent = np.zeros(n, np.float32)
        dense_sent[idx] = sent
        sents.append(dense_sent)
    return summed / np.float32(p), new_residuals, sents


def payload_bytes(n: int, chunk: int, k: int, bits: int = 2, value_bytes: int = 0) -> int:
    """One rank's payload, counted from the format: offsets, codes (or values), scales."""
    chunks = -(-n // chunk)
    slots = chunks * k
    offsets = slots * (2 if chunk < 65536 else 4)
    if value_bytes:
        return offsets + slots * value_bytes
    return offsets + (slots * bits + 7) // 8 + 4 * chunks
