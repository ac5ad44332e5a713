"""Shared by the axis-transport helpers: inputs that both transports can rebuild.

Every (pattern, rank, P) gives the same (values, indices) in any process, so a
shard_map run over P devices and an ``mpiexec -n P`` run see the same inputs.
"""

from __future__ import annotations

import numpy as np

ALGORITHMS = ["dense", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather"]
PATTERNS = ["random", "same", "disjoint", "skewed", "all_zero", "padding",
            "duplicates_unsorted", "uneven", "k_equals_n"]
N = 4096
CAP = 64


def make_pattern(pattern: str, rank: int, nranks: int, n: int = N, cap: int = CAP):
    """(values f32[cap'], indices i32[cap']) of one rank; every rank has the same cap'."""
    rng = np.random.default_rng([1000, rank, nranks])
    if pattern == "k_equals_n":
        idx = np.arange(n)
    elif pattern == "random":
        idx = rng.choice(n, cap, replace=False)
    elif pattern == "same":  # full overlap
        idx = np.random.default_rng(7).choice(n, cap, replace=False)
    elif pattern == "disjoint":  # no two ranks share an index
        idx = np.arange(cap) * nranks + rank
    elif pattern == "skewed":  # every rank's entries fall in the first owner's range
        idx = rng.choice(n // nranks, cap, replace=False)
    elif pattern == "all_zero":  # top-k of an all-zero gradient
        return np.zeros(cap, np.float32), np.arange(cap, dtype=np.int32)
    elif pattern == "padding":  # half of the slots are padding
        idx = rng.choice(n, cap, replace=False)
        idx[::2] = -1
    elif pattern == "duplicates_unsorted":
        idx = rng.integers(0, n // 8, cap)
    elif pattern == "uneven":  # ranks fill different numbers of slots (the rest is padding)
        idx = rng.choice(n, cap, replace=False)
        idx[cap * (rank + 1) // nranks:] = -1
    else:
        raise ValueError(pattern)
    values = rng.standard_normal(len(idx)).astype(np.float32)
    values[idx < 0] = 0.0
    return values, idx.astype(np.int32)
