"""The NumPy reference every implementation in this repository is checked against.

One source of truth: top-k by magnitude, the sparse allreduce sum, and
error-feedback Top-k SGD, written plainly in NumPy (float64 accumulation where
it matters, so the reference is at least as accurate as what it checks).
"""

from __future__ import annotations

import numpy as np


def magnitude_order(x: np.ndarray) -> np.ndarray:
    """Indices of x.ravel() from largest to smallest |x|, NaN above +inf, ties
    towards the lower index: the order the selection kernels use."""
    flat = np.asarray(x).reshape(-1)
    a = np.abs(flat.astype(np.float64))
    nan = np.isnan(a)
    return np.lexsort((np.arange(flat.size), -np.where(nan, 0.0, a), -nan.astype(np.int8)))


def topk_reference(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of |x| over x.ravel(); ties broken towards the lower index.

    Returns (values, indices) in ascending index order.
    """
    flat = np.asarray(x).reshape(-1)
    idx = np.sort(magnitude_order(flat)[:k]).astype(np.int32)
    return flat[idx], idx


def sparse_allreduce_reference(contributions, size: int) -> np.ndarray:
    """Dense sum of every rank's (values, indices); index -1 is padding."""
    out = np.zeros(size, np.float64)
    for values, indices in contributions:
        values = np.asarray(values, np.float64)
        indices = np.asarray(indices)
        keep = indices >= 0
        np.add.at(out, indices[keep], values[keep])
    return out


def round_to_wire_reference(x: np.ndarray, wire) -> np.ndarray:
    """``x`` (float32) rounded to the 16-bit ``wire`` dtype (``"bfloat16"`` /
    ``"float16"``, nearest even) and widened back to float32."""
    import ml_dtypes

    dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[wire]
    return np.asarray(x, np.float32).astype(dtype).astype(np.float32)


def ef_topk_sgd_reference(params0: np.ndarray, grad_fns, k: int, lr: float, steps: int,
                          select=None, decay: float = 1.0, select_at=None, wire_at=None,
                          keep_wire_rounding: bool = True):
    """Error-feedback Top-k SGD on P workers, flattened parameters.

    grad_fns[r](params, step) -> worker r's gradient (float32 vector).
    Each step: acc_r = residual_r + g_r; keep top-k of |acc_r|; update =
    sum_r topk(acc_r) / P; residual_r = acc_r with the kept entries zeroed;
    params -= lr * update. Returns the parameters after `steps` steps and the
    final residuals. `select(acc) -> (values, indices)` replaces the global
    top-k (e.g. bucketed selection; index -1 marks padding). `k` may be a
    function of the step (warm-up phases; k = N is a dense step). ``decay``
    (or ``decay(step)``) multiplies each residual before the gradient is added.
    ``select_at(acc, step)``: ``select`` that also takes the (0-based) step
    (e.g. :func:`grouped_topk_selection` with a warm-up).
    ``wire_at(step)``: None (float32), or ``"bfloat16"`` / ``"float16"``: that
    step's values travel rounded to it, and (``keep_wire_rounding``) each
    rank's residual keeps what the rounding took from its kept values
    (``v - round(v)``; otherwise the sent entries' residual is zero); a sparse step's
    sum is the rounded values' sum (``allgather``'s), a dense step's (k = N)
    is ``dense_allreduce(wire_dtype=)``'s: the rounded vectors summed in
    float32 in rank order, the sum rounded again.
    """
    k_at = k if callable(k) else (lambda step: k)
    nranks = len(grad_fns)
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros_like(params) for _ in range(nranks)]
    for step in range(steps):
        contributions = []
        for r in range(nranks):
            factor = np.float32(decay(step) if callable(decay) else decay)
            acc = residuals[r] * factor + grad_fns[r](params, step).astype(np.float32)
            values, idx = (select(acc) if select else select_at(acc, step) if select_at
                           else topk_reference(acc, k_at(step)))
            residuals[r] = acc.copy()
            residuals[r][idx[idx >= 0]] = 0.0
            wire = wire_at(step) if wire_at else None
            if wire is not None:
                sent = round_to_wire_reference(values, wire)
                if keep_wire_rounding:
                    residuals[r][idx[idx >= 0]] = (values - sent)[idx >= 0]
                values = sent
            contributions.append((values, idx))
        wire = wire_at(step) if wire_at else None
        if wire is not None and k_at(step) == params.size and select is None and not select_at:
            # the dense allreduce on a 16-bit wire: float32 sum in rank order, rounded
            total = np.zeros(params.size, np.float32)
            for values, idx in contributions:
                dense = np.zeros(params.size, np.float32)
                dense[idx] = values
                total = total + dense
            update = round_to_wire_reference(total, wire).astype(np.float64) / nranks
        else:
            update = sparse_allreduce_reference(contributions, params.size) / nranks
        params = (params - lr * update).astype(np.float32)
    return params, residuals


def ef_cyclic_topk_sgd_reference(params0: np.ndarray, grad_fns, k, lr: float, steps: int):
    """ScaleCom's cyclic local top-k with error feedback, SGD, P workers, flattened.

    Each step: acc_r = residual_r + g_r; the indices are the top-k of |acc_l| of
    the leader l = step mod P; update = sum_r acc_r[indices] / P at those
    indices; every residual_r = acc_r with them zeroed; params -= lr * update.
    `k` may be a function of the step. Returns the parameters and the residuals.
    """
    k_at = k if callable(k) else (lambda step: k)
    nranks = len(grad_fns)
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros_like(params) for _ in range(nranks)]
    for step in range(steps):
        accs = [residuals[r] + grad_fns[r](params, step).astype(np.float32)
                for r in range(nranks)]
        _, idx = topk_reference(accs[step % nranks], k_at(step))
        update = sparse_allreduce_reference([(a[idx], idx) for a in accs], params.size) / nranks
        for r in range(nranks):
            residuals[r] = accs[r].copy()
            residuals[r][idx] = 0.0
        params = (params - lr * update).astype(np.float32)
    return params, residuals


def ef_union_topk_sgd_reference(params0: np.ndarray, grad_fns, k, lr: float, steps: int):
    """``topk_sync(selection="union")`` with SGD, P workers, flattened.

    Each step: acc_r = residual_r + g_r; U = the union over r of the top-k of
    |acc_r|; update = sum_r acc_r[U] / P at U; every residual_r = acc_r with U
    zeroed; params -= lr * update. Returns the parameters, the residuals and
    the last step's union (sorted).
    """
    nranks = len(grad_fns)
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros_like(params) for _ in range(nranks)]
    union = np.zeros(0, np.int64)
    for step in range(steps):
        accs = [residuals[r] + grad_fns[r](params, step).astype(np.float32)
                for r in range(nranks)]
        union = np.unique(np.concatenate([topk_reference(a, k)[1] for a in accs]))
        update = np.zeros_like(params)
        update[union] = np.sum([a[union] for a in accs], axis=0) / nranks
        for r in range(nranks):
            residuals[r] = accs[r].copy()
            residuals[r][union] = 0.0
        params = (params - lr * update).astype(np.float32)
    return params, residuals, union


def ef_adam_direction_reference(params0: np.ndarray, grad_fns, k, lr: float, steps: int,
                                b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                                masking: str = "restart", lr_before_sync: bool = False,
                                select_at=None):
    """``jss.adam_direction_sync(topk_sync(k))`` then SGD, on P workers, flattened.

    Per worker r and step t: Adam moments of g_r, direction d_r = mu_hat /
    (sqrt(nu_hat) + eps) (mu's bias correction over the coordinate's age with
    "restart", over t otherwise); acc_r = residual_r + d_r; top-k of |acc_r| sent;
    where an entry is sent while residual_r was nonzero before the step, mu (and
    with "restart" the age) is zeroed unless masking is "off". Update = sum of the
    sent entries / P; params -= lr * update. `k` and `lr` may be functions of the
    (0-based) step (k = N: a dense step). With `lr_before_sync` the direction is
    scaled by lr before it joins the residual (acc_r = residual_r + lr * d_r) and
    params -= update. ``select_at(acc, step) -> (values, indices)`` replaces the
    global top-k (e.g. :func:`grouped_topk_selection`). Returns the parameters and
    each worker's (mu, age).
    """
    k_at = k if callable(k) else (lambda step: k)
    lr_at = lr if callable(lr) else (lambda step: lr)
    nranks, n = len(grad_fns), params0.size
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros(n, np.float32) for _ in range(nranks)]
    mus = [np.zeros(n, np.float32) for _ in range(nranks)]
    nus = [np.zeros(n, np.float32) for _ in range(nranks)]
    ages = [np.zeros(n, np.float32) for _ in range(nranks)]
    for step in range(steps):
        t = np.float32(step + 1)
        contributions = []
        for r in range(nranks):
            g = grad_fns[r](params, step).astype(np.float32)
            mus[r] = np.float32(b1) * mus[r] + np.float32(1 - b1) * g
            nus[r] = np.float32(b2) * nus[r] + np.float32(1 - b2) * g * g
            ages[r] = ages[r] + 1
            power = ages[r] if masking == "restart" else t
            direction = (mus[r] / (1 - np.float32(b1) ** power)) / (
                np.sqrt(nus[r] / (1 - np.float32(b2) ** t)) + np.float32(eps))
            if lr_before_sync:
                direction = direction * np.float32(lr_at(step))
            acc = residuals[r] + direction.astype(np.float32)
            values, idx = (select_at(acc, step) if select_at
                           else topk_reference(acc, k_at(step)))
            contributions.append((values, idx))
            held = residuals[r] != 0
            residuals[r] = acc.copy()
            residuals[r][idx] = 0.0
            if masking != "off":
                masked = held & (residuals[r] == 0)
                mus[r][masked] = 0.0
                ages[r][masked] = 0.0
        update = sparse_allreduce_reference(contributions, n) / nranks
        scale = 1.0 if lr_before_sync else lr_at(step)
        params = (params - np.float32(scale) * update).astype(np.float32)
    return params, list(zip(mus, ages))


def grouped_topk_selection(sizes, groups, k_at):
    """``grouped_topk_sync``'s selection as a ``select_at(acc, step)``.

    ``sizes``: the leaves' entries (tree order); ``groups``: each group's leaf
    ids; ``k_at(step)``: the entries kept over all N at that step (N: a dense
    step). Group g of n_g entries keeps the exact top ``min(n_g, max(1,
    round(k * n_g / N)))`` of its own entries (all of them at a dense step).
    Returns (values, indices), indices ascending.
    """
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(offsets[-1])
    positions = [np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in sorted(ids)])
                 for ids in groups]

    def select_at(acc, step):
        k = k_at(step)
        chosen = []
        for pos in positions:
            kg = len(pos) if k >= total else min(len(pos), max(1, int(round(k * len(pos) / total))))
            chosen.append(pos[topk_reference(acc[pos], kg)[1]])
        idx = np.sort(np.concatenate(chosen)).astype(np.int32)
        return acc[idx], idx

    return select_at


def plain_message_bytes(indices) -> int:
    """Bytes of a sparse message of these indices with float32 values and int32 indices."""
    return 8 * len(indices)


def split_allgather_bytes_sent(indices_per_rank, rank: int, size: int, dense_phase: bool,
                               quantize_bits: int = 0, qsgd_bucket: int = 1024,
                               message_bytes=plain_message_bytes, value_bytes: int = 4) -> int:
    """Exact bytes `rank` sends in SSAR/DSAR split-allgather for these inputs.

    Same convention as the C++ counters (jax_sparse_sync/stats.py): a 56-byte
    argument check to P-1 peers, 8-byte slice sizes to P-1 peers, 8 bytes per
    entry of phase 1 sent to other owners, then phase 2: DSAR sends its range
    densely (4 bytes per element, padded to the longest range) to P-1 peers; SSAR sends 8-byte block sizes
    and its merged range, sparse (8 bytes per entry) or, past len/2, dense.
    With quantize_bits, DSAR's range travels as one float32 scale per
    qsgd_bucket entries plus quantize_bits per entry, packed.
    ``message_bytes(sorted indices)`` and ``value_bytes``: another wire format
    (16-bit values, encoded indices): a message's bytes and a dense value's.
    """
    p = len(indices_per_rank)
    if p == 1:
        return 0
    bounds = [size * q // p for q in range(p + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    mine = np.unique(np.asarray(indices_per_rank[rank])[np.asarray(indices_per_rank[rank]) >= 0])
    sent = 56 * (p - 1) + 8 * (p - 1)
    for q in range(p):  # phase 1: one message per other owner with entries in its range
        part = mine[(mine >= bounds[q]) & (mine < bounds[q + 1])]
        if q != rank and len(part):
            sent += message_bytes(part)
    if dense_phase:  # every owner's block padded to the longest: one MPI_Allgather
        lengths = {size * (q + 1) // p - size * q // p for q in range(p)}
        if quantize_bits:
            block = max(4 * -(-m // qsgd_bucket) + (m * quantize_bits + 7) // 8 for m in lengths)
        else:
            block = value_bytes * max(lengths)
        return sent + (p - 1) * block
    union = np.unique(np.concatenate([np.asarray(i)[np.asarray(i) >= 0] for i in indices_per_rank]))
    sparse = message_bytes(union[(union >= lo) & (union < hi)])
    block = value_bytes * (hi - lo) if sparse > value_bytes * (hi - lo) else sparse
    return sent + 8 * (p - 1) + (p - 1) * block


def hash_owner_reference(indices, nranks: int) -> np.ndarray:
    """Owner rank of each index in ``hash_partition``: murmur3's fmix32 of the
    index as uint32, mod P (restated with Python ints, independently of the library)."""
    out = []
    for i in np.asarray(indices).reshape(-1).tolist():
        h = i & 0xFFFFFFFF
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        h ^= h >> 16
        out.append(h % nranks)
    return np.asarray(out, np.int64)


def hash_partition_bytes_sent(indices_per_rank, rank: int, size: int,
                              message_bytes=plain_message_bytes) -> int:
    """Exact bytes `rank` sends in the MPI ``hash_partition`` allreduce.

    Same convention as the C++ counters: the 56-byte argument check to P-1 peers,
    8-byte slice sizes to P-1 peers, 8 bytes per entry of phase 1 sent to other
    owners (owner = :func:`hash_owner_reference`), 8-byte block sizes to P-1
    peers, then this owner's merged stream (8 bytes per entry) to P-1 peers.
    ``message_bytes(sorted indices)``: another wire format's bytes of a message.
    """
    p = len(indices_per_rank)
    if p == 1:
        return 0
    mine = np.unique(np.asarray(indices_per_rank[rank])[np.asarray(indices_per_rank[rank]) >= 0])
    owners = hash_owner_reference(mine, p)
    sent = 56 * (p - 1) + 8 * (p - 1) + 8 * (p - 1)
    for q in range(p):  # phase 1: one message per other owner it holds entries of
        if q != rank and np.any(owners == q):
            sent += message_bytes(mine[owners == q])
    union = np.unique(np.concatenate([np.asarray(i)[np.asarray(i) >= 0] for i in indices_per_rank]))
    merged = union[hash_owner_reference(union, p) == rank]
    return sent + (p - 1) * message_bytes(merged)


def bucket_topk_reference(x: np.ndarray, k_per_bucket: int, bucket: int):
    """Top-k of |x| in each bucket of `bucket` entries, padded with (0, -1)."""
    flat = np.asarray(x).reshape(-1)
    values, indices = [], []
    for lo in range(0, flat.size, bucket):
        v, i = topk_reference(flat[lo:lo + bucket], min(k_per_bucket, flat[lo:lo + bucket].size))
        pad = k_per_bucket - len(i)
        values.append(np.concatenate([v, np.zeros(pad, flat.dtype)]))
        indices.append(np.concatenate([i + lo, -np.ones(pad, np.int32)]).astype(np.int32))
    return np.concatenate(values), np.concatenate(indices)


def oktopk_reference(contributions, size: int, k: int, threshold: float | None = None,
                     boundaries=None, region_counts=None, owners=None):
    """Ok-Topk's result: Top-k of the sum of every rank's (values, indices).

    With threshold=None the exact k-th largest magnitude of the sum is the
    threshold (ties at it are all kept); otherwise the given one is used.
    With a given threshold and ``region_counts=(lo, hi)``, each region
    ``[boundaries[q], boundaries[q+1])`` keeps between min(lo, its nonzero
    entries) and hi entries: its top ones by magnitude, ties to the lower index.
    ``owners`` (int (size,), each index's owner; ``partition="hash"`` passes
    :func:`hash_owner_reference`): the owners' index sets take the regions' place.
    Returns (dense result, threshold, per-rank contributed masks).
    """
    total = sparse_allreduce_reference(contributions, size)
    mags = np.abs(total[total != 0])
    given = threshold is not None
    if threshold is None:
        threshold = 0.0 if mags.size < k else np.sort(mags)[::-1][k - 1]
    keep = (np.abs(total) >= threshold) & (total != 0)
    if given and region_counts is not None:
        lo, hi = region_counts
        if owners is None:
            groups = [np.arange(a, b) for a, b in zip(boundaries[:-1], boundaries[1:])]
        else:
            owners = np.asarray(owners)
            groups = [np.flatnonzero(owners == q) for q in range(int(owners.max()) + 1)]
        for group in groups:  # each sorted by index
            part = total[group]
            nonzero = np.flatnonzero(part != 0)
            above = int(np.count_nonzero(keep[group]))
            want = min(max(above, min(lo, nonzero.size)), hi)
            # by magnitude, descending; ties: the lower index (a stable sort)
            order = nonzero[np.argsort(-np.abs(part[nonzero]), kind="stable")]
            keep[group] = False
            keep[group[order[:want]]] = True
    result = np.where(keep, total, 0.0)
    masks = [np.array([i >= 0 and keep[i] for i in np.asarray(idx)]) for _, idx in contributions]
    return result, threshold, masks


def oktopk_sgd_reference(params0: np.ndarray, grad_fns, k: int, lr: float, steps: int):
    """Ok-Topk SGD with exact local top-k and exact global threshold every step.

    The residual keeps the accumulator except at the local entries that made
    it into the global top-k; the update is the global top-k of the sum / P.
    `k` may be a function of the step (warm-up phases; k = N is a dense step).
    """
    k_at = k if callable(k) else (lambda step: k)
    nranks = len(grad_fns)
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros_like(params) for _ in range(nranks)]
    for step in range(steps):
        accs = [residuals[r] + grad_fns[r](params, step).astype(np.float32) for r in range(nranks)]
        local = [topk_reference(acc, k_at(step)) for acc in accs]
        result, _, masks = oktopk_reference(local, params.size, k_at(step))
        for r in range(nranks):
            residuals[r] = accs[r].copy()
            residuals[r][local[r][1][masks[r]]] = 0.0
        params = (params - lr * result / nranks).astype(np.float32)
    return params, residuals


def rank_order_sum(vectors) -> np.ndarray:
    """((x_0 + x_1) + x_2) + ... in float32: the dense sum, in rank order."""
    out = np.asarray(vectors[0], np.float32).copy()
    for v in vectors[1:]:
        out = (out + np.asarray(v, np.float32)).astype(np.float32)
    return out


def block_allreduce_bytes_sent(vectors, rank: int, block: int) -> int:
    """Exact bytes `rank` sends in the block-sparse allreduce (stats.py convention):
    header, message sizes, a bitmap + this rank's nonzero blocks to every other
    owner, the result-size allgather, then its owned nonzero result blocks."""
    p = len(vectors)
    if p == 1:
        return 0
    n = len(vectors[0])
    nb = -(-n // block)

    def owned(q):
        return range(nb * q // p, nb * (q + 1) // p)

    def block_len(b):
        return min(block, n - b * block)

    def nonzero(x, b):
        return np.any(np.asarray(x[b * block:b * block + block_len(b)]) != 0)

    sent = 56 * (p - 1) + 8 * (p - 1) + 8 * (p - 1)
    mine = vectors[rank]
    for q in range(p):
        if q != rank:
            r = owned(q)
            sent += (len(r) + 7) // 8 + 4 * sum(block_len(b) for b in r if nonzero(mine, b))
    total = rank_order_sum(vectors)
    r = owned(rank)
    sent += (p - 1) * ((len(r) + 7) // 8 + 4 * sum(block_len(b) for b in r if nonzero(total, b)))
    return sent


def kth_magnitude_reference(x: np.ndarray, k: int, stride: int = 1) -> np.float32:
    """The k-th largest |x| over x.ravel()[::stride], widened to float32; NaN
    ranks above +inf (the result is NaN if the top k hold a NaN); k = 0 -> +inf."""
    sample = np.asarray(x).reshape(-1)[::stride]
    if k == 0:
        return np.float32(np.inf)
    return np.float32(np.abs(sample[magnitude_order(sample)[k - 1]].astype(np.float32)))


def sampled_threshold_reference(x: np.ndarray, k: int, stride: int) -> np.float32:
    """estimate_threshold(method="sampled"): the k_s-th magnitude of the strided
    sample, k_s = round(k * m / N) clamped to [1, m] (0 only for k = 0)."""
    n = np.asarray(x).size
    m = -(-n // stride)
    k_s = 0 if k == 0 else min(m, max(1, int(round(k * m / n))))
    return kth_magnitude_reference(x, k_s, stride)


def threshold_select_reference(x: np.ndarray, threshold: float, capacity: int):
    """Entries with |x| >= threshold and x != 0 (NaN always), in index order,
    padded with (0, -1) to `capacity`; returns (values, indices, count)."""
    flat = np.asarray(x).reshape(-1)
    a = np.abs(flat.astype(np.float32))
    keep = np.isnan(a) | ((a >= np.float32(max(threshold, 0.0))) & (a != 0))
    idx = np.flatnonzero(keep).astype(np.int32)
    count = idx.size
    idx = idx[:capacity]
    values = np.zeros(capacity, flat.dtype)
    indices = -np.ones(capacity, np.int32)
    values[:idx.size] = flat[idx]
    indices[:idx.size] = idx
    return values, indices, count


def residual_update_reference(acc: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """acc with acc[i] = +0 for every index i >= 0 (-1 is padding)."""
    out = np.array(acc, copy=True)
    idx = np.asarray(indices)
    out[idx[idx >= 0]] = 0
    return out


def scatter_add_reference(dense: np.ndarray, values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """dense[indices[j]] += values[j] in slot order (-1 skipped); each touched
    entry is summed in float32 from its dense value and rounded to the dtype once."""
    dense = np.asarray(dense)
    values = np.asarray(values)
    idx = np.asarray(indices)
    acc = {}
    for j in range(idx.size):
        i = int(idx[j])
        if i < 0:
            continue
        acc[i] = (acc.get(i, np.float32(dense[i])) + np.float32(values[j])).astype(np.float32)
    out = dense.copy()
    for i, s in acc.items():
        out[i] = np.asarray(s, np.float32).astype(dense.dtype)
    return out


def block_scan_reference(x: np.ndarray, block: int) -> np.ndarray:
    """True for every block of `block` entries of x.ravel() holding a nonzero (NaN counts)."""
    flat = np.asarray(x).reshape(-1).astype(np.float32)
    nz = (flat != 0) | np.isnan(flat)
    return np.array([nz[lo:lo + block].any() for lo in range(0, flat.size, block)], bool)


def topk_reference_large(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of topk_reference(x, k) without sorting all of x (for inputs of
    tens of millions): every |x| above the k-th magnitude, then the lowest
    indices among those equal to it. Finite inputs only."""
    a = np.abs(np.asarray(x).reshape(-1).astype(np.float32))
    if k == 0:
        return np.zeros(0, np.int32)
    kth = -np.partition(-a, k - 1)[k - 1]
    above = np.flatnonzero(a > kth)
    ties = np.flatnonzero(a == kth)[:k - above.size]
    return np.sort(np.concatenate([above, ties])).astype(np.int32)


def ef_shared_support_sgd_reference(params0: np.ndarray, grad_fns, k: int, lr: float, steps: int,
                                    refresh_every: int, random_fraction: float = 0.0,
                                    offsets=None):
    """``shared_support_sync`` with SGD, P workers, flattened.

    Each step: acc_r = residual_r + g_r. A refresh step (step % refresh_every
    == 0) is an error-feedback Top-k step (each rank's own top-k summed, the
    residual zeroed at it), and the support becomes the top k_fixed of |sum|
    (in float32, ties to the lower index), k_fixed = k - round(random_fraction
    k). Any other step sends the support and, with random_fraction, the
    ``offsets(step, m, r)``-th coordinates (r = k - k_fixed draws into the m =
    N - k_fixed coordinates off the support, in index order): update = sum_r
    acc_r[sent] / P there; every residual_r = acc_r zeroed there.
    params -= lr * update. Returns the parameters, the residuals and the support.
    """
    nranks = len(grad_fns)
    params = params0.astype(np.float32).copy()
    residuals = [np.zeros_like(params) for _ in range(nranks)]
    support = np.zeros(0, np.int64)
    k_fixed = k - int(round(random_fraction * k))
    for step in range(steps):
        accs = [residuals[r] + grad_fns[r](params, step).astype(np.float32)
                for r in range(nranks)]
        if step % refresh_every == 0:
            chosen = [topk_reference(a, k) for a in accs]
            summed = sparse_allreduce_reference(chosen, params.size)
            support = topk_reference(summed.astype(np.float32), k_fixed)[1]
            zeroed = [idx for _, idx in chosen]
        else:
            sent = support
            if k > k_fixed:
                off = np.setdiff1d(np.arange(params.size), support)
                sent = np.concatenate([support, off[np.asarray(
                    offsets(step, off.size, k - k_fixed))]])
                assert np.unique(sent).size == k
            summed = np.zeros(params.size, np.float64)
            summed[sent] = np.sum([a[sent].astype(np.float64) for a in accs], axis=0)
            zeroed = [sent] * nranks
        for r in range(nranks):
            residuals[r] = accs[r].copy()
            residuals[r][zeroed[r]] = 0.0
        params = (params - lr * (summed / nranks)).astype(np.float32)
    return params, residuals, support


def bits_differ(a, b) -> np.ndarray:
    """Flat indices where ``a`` and ``b`` differ bit for bit, any NaN counting as equal to
    any NaN: a GPU gives its canonical NaN (0x7fffffff), x86 passes an operand's on
    (np.nan is 0x7fc00000, inf - inf gives 0xffc00000). A NaN on one side only differs.
    Any dtype of 1, 2, 4 or 8 bytes (bfloat16 and float16 included)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"bits_differ: {a.dtype}{a.shape} against {b.dtype}{b.shape}")
    a, b = a.reshape(-1), b.reshape(-1)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    differ = a.view(width) != b.view(width)
    if a.dtype.kind == "f" or "float" in a.dtype.name:  # ml_dtypes' bfloat16: kind "V"
        differ &= ~(np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))
    return np.flatnonzero(differ)
