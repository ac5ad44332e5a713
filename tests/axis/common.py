"""Shared by the axis-transport helpers: inputs that both transports can rebuild.

Every (pattern, rank, P) gives the same (values, indices) in any process, so a
shard_map run over P devices and an ``mpiexec -n P`` run see the same inputs.
"""

from __future__ import annotations

import functools
import os

import numpy as np

ALGORITHMS = ["dense", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather", "hash_partition"]
#: tests/axis/multiprocess.py's algorithms across two processes: each collective the
#: algorithms use crosses the process boundary (psum: dense; ppermute: recursive
#: doubling; all_gather: split_allgather, hash_partition; all_to_all: the job's Ok-Topk).
#: allgather and dsar_split_allgather call no other (all_gather) and are checked on one
#: process's 8 devices in axis_cases.py; their programs were 2 of the job's 9 compilations.
CROSS_PROCESS_ALGORITHMS = ["dense", "recursive_doubling", "split_allgather", "hash_partition"]
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
    elif pattern == "ties":  # small integers on overlapping indices: many equal magnitudes
        idx = rng.choice(n // 4, cap, replace=False)
        values = (rng.integers(1, 3, cap) * rng.choice([-1, 1], cap)).astype(np.float32)
        return values, idx.astype(np.int32)
    else:
        raise ValueError(pattern)
    values = rng.standard_normal(len(idx)).astype(np.float32)
    values[idx < 0] = 0.0
    return values, idx.astype(np.int32)


# ---- Ok-Topk and block-sparse cases (both transports build the same calls) -----------------
OKTOPK_K = 30


def oktopk_cases(nranks: int):
    """name -> (pattern, keyword arguments of jss.oktopk_allreduce except comm).

    ``exact/*``: regions and threshold recomputed (the tau / tau' steps).
    ``reuse/skewed``: even regions and a reused threshold of 0 (keep everything): every
    device's entries sit in owner 0's region, so the split exchange runs at the top of
    its capacity ladder (``cap``), owner 0 keeps the whole union, and at P > 4 the
    balancing step runs (largest > 4x the mean).
    ``given_regions/random``: boundaries reused, threshold recomputed.
    (``exact/all_zero``: fewer than k nonzero entries: threshold 0.)
    ``limits/*``: a reused threshold with ``region_counts``: owners over the cap keep
    their top entries (``capped``), owners under the floor add their next ones
    (``floor``), cuts through equal magnitudes (``ties``: the lower index first).
    ``hash/*``: ``partition="hash"`` (hash owners), exact and with the cap binding.
    The three share one ``region_counts`` (:data:`OKTOPK_REGION_COUNTS`): the limits
    are static arguments, so each distinct pair is one more compiled program (an
    Ok-Topk program over 8 devices costs ~5 CPU seconds of XLA); which limit binds is
    the input's doing (the threshold and pattern), checked case by case in
    tests/axis/axis_oktopk_block_cases.py.
    """
    even = [N * q // nranks for q in range(nranks + 1)]
    lopsided = [0] + [N // 2 + q for q in range(1, nranks)] + [N]
    cases = {f"exact/{p}": (p, dict(k=OKTOPK_K)) for p in PATTERNS if p != "k_equals_n"}
    cases["reuse/skewed"] = ("skewed", dict(k=OKTOPK_K, boundaries=even, global_threshold=0.0,
                                            recompute_boundaries=False,
                                            recompute_threshold=False))
    cases["given_regions/random"] = ("random", dict(k=OKTOPK_K, boundaries=lopsided,
                                                    recompute_boundaries=False))
    for name, pattern, thr in [("capped", "random", 0.2), ("floor", "same", 1e9),
                               ("ties", "ties", 1.5)]:
        cases[f"limits/{name}"] = (pattern, dict(k=OKTOPK_K, boundaries=lopsided,
                                                 global_threshold=thr, recompute_boundaries=False,
                                                 recompute_threshold=False,
                                                 region_counts=OKTOPK_REGION_COUNTS))
    # partition="hash" (hash owners; one program: the limits apply to reused thresholds
    # only): the exact step, and a reused threshold whose per-owner cap binds
    cases["hash/exact/random"] = ("random", dict(k=OKTOPK_K, partition="hash",
                                                 region_counts=OKTOPK_REGION_COUNTS))
    cases["hash/limits/capped"] = ("random", dict(k=OKTOPK_K, partition="hash",
                                                  global_threshold=0.2,
                                                  recompute_threshold=False,
                                                  region_counts=OKTOPK_REGION_COUNTS))
    return cases


#: the ``limits/*`` cases' (lo, hi): at the threshold 0.2 two owners hold more than 6
#: entries (``capped``), at 1e9 none passes and every owner with entries adds up to 3
#: (``floor``), on the +-1/+-2 pattern at 1.5 an owner's 6th and 7th kept magnitudes
#: are equal (``ties``), at P = 3 and 8 alike
OKTOPK_REGION_COUNTS = (3, 6)


#: oktopk_cases run again with wire_dtype=bfloat16 (both transports, bit for bit): the
#: exact step, the balancing path at P > 4 and the region limits
OKTOPK_WIRE_CASES = ("exact/random", "exact/same", "reuse/skewed", "limits/capped")


BLOCK_CASES = {  # name -> (pattern densified, block_size)
    "sparse/random": ("random", 16),
    "sparse/same": ("same", 16),
    "ragged/skewed": ("skewed", 7),
    "dense/k_equals_n": ("k_equals_n", 16),
    "empty/all_zero": ("all_zero", 16),
}


def block_input(pattern: str, rank: int, nranks: int) -> np.ndarray:
    """A dense float32 vector of length N: the pattern's entries added at their indices
    (``all_zero`` stays zero)."""
    values, indices = make_pattern(pattern, rank, nranks)
    x = np.zeros(N, np.float32)
    keep = indices >= 0
    np.add.at(x, indices[keep], values[keep])
    return x


# ---- a small training problem both transports run (oktopk_sync / block_sync) ---------------
SYNC_DIM, SYNC_K, SYNC_LR, SYNC_STEPS = 120, 6, 0.2, 8


def sync_targets(nranks: int) -> np.ndarray:
    return np.random.default_rng(5).standard_normal((nranks, SYNC_DIM)).astype(np.float32)


def sync_grad(w, target, step):
    """Device/rank gradient at step ``step`` (jnp or np): (w - target) * (1 + step % 3)."""
    return (w - target) * (1 + step % 3)


#: training runs saved by both transports (the comm is added by the caller)
SYNC_RUNS = {
    "oktopk_reuse": lambda jss, **c: jss.oktopk_sync(k=6, selection="threshold_reuse", tau=3,
                                                     tau_prime=5, **c),
    "block": lambda jss, **c: jss.block_sync(block_size=8, **c),
}


# ---- shared by axis_cases.py and axis_oktopk_block_cases.py ---------------------------------
@functools.cache
def mpi_results(p):
    """The MPI transport's results at P = p (``$JSS_AXIS_MPI_DIR/mpi{p}.npz``), or None."""
    path = os.path.join(os.environ.get("JSS_AXIS_MPI_DIR", "/nonexistent"), f"mpi{p}.npz")
    return dict(np.load(path)) if os.path.exists(path) else None


def lg(p):
    """Rounds of a recursive doubling over p ranks: ceil(log2 p)."""
    return (p - 1).bit_length() if p > 1 else 0


def ladder(hi, lo):
    """The static capacity ladder of jax_sparse_sync/axis/ladder.py: hi, ceil(hi/2), ...
    down to the first <= lo."""
    out = [max(1, hi)]
    while out[-1] > max(1, lo):
        out.append(-(-out[-1] // 2))
    return sorted(set(out))


def fit(need, steps):
    """The smallest of the capacities `steps` that holds `need`."""
    return min(s for s in steps if s >= need)


def replicated_trainer(mesh, tx, grad_fn, targets, dim, check_vma):
    """``train(steps, w=None, state=None, start=0) -> (w, state)``: steps of `tx` in a
    jit(shard_map)-ped step over `mesh`'s "data" axis, the parameters ``w`` replicated (`dim`
    zeros at the start), the state one row per device; device r's gradient at step s is
    ``grad_fn(w, targets[r], s)``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def expand(tree):
        return jax.tree_util.tree_map(lambda x: x[None], tree)

    def step(w, state, t, i):
        state = jax.tree_util.tree_map(lambda x: x[0], state)
        updates, state = tx.update({"w": grad_fn(w, t[0], i)}, state, {"w": w})
        return w + updates["w"], expand(state)

    init = jax.jit(jax.shard_map(lambda w: expand(tx.init({"w": w})), mesh=mesh, in_specs=P(),
                                 out_specs=P("data"), check_vma=check_vma))
    step = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data"), P("data"), P()),
                                 out_specs=(P(), P("data")), check_vma=check_vma))
    rows, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    def train(steps, w=None, state=None, start=0):
        w = jax.device_put(np.zeros(dim, np.float32) if w is None else w, rep)
        state = init(w) if state is None else state
        t = jax.device_put(targets, rows)
        for s in range(start, start + steps):
            w, state = step(w, state, t, jnp.int32(s))
        return w, state

    return train


def device_copies(x):
    """Each of this process's devices' buffer of `x`."""
    return [np.asarray(s.data) for s in x.addressable_shards]
