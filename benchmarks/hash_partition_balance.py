"""How evenly each partition of the index space spreads a skewed support (exact counts).

ZEN's hash partition (OSDI '25): owners of contiguous index ranges or of regions from
earlier indices get most entries when the gradients concentrate; a hash of the index
does not. This script counts, for the ranks' actual supports (``support()``:
``uniform``, ``zipf``, ``embedding_rows``; k = density * N per rank), what each owner
receives (``received``) and merges (``merged``) under ``hash``
(:func:`jax_sparse_sync.mesh.hash_partition.hash_owner_np`), ``contiguous``
(split-allgather's ranges), ``oktopk_fresh`` (Ok-Topk's regions from this step) and
``oktopk_from_uniform`` (from a uniform step), each as the largest share over the mean,
and the largest bytes any rank sends with ``hash_partition`` and ``split_allgather``.
No timing: ``hash_partition_time.py`` times it.

    python benchmarks/hash_partition_balance.py             # N = 4M, 1 %, P = 4 and 8
    python benchmarks/hash_partition_balance.py --size 1M --out /tmp/hp

Results: docs/topics/wire_formats.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (fmt_size, grouped_bars, machine_info, parse_size, pyplot,  # noqa: E402
                      save_figure, write_record)

from jax_sparse_sync.mesh.hash_partition import hash_owner_np  # noqa: E402

SCHEMES = ("hash", "contiguous", "oktopk_fresh", "oktopk_from_uniform")
WORKLOADS = ("uniform", "zipf", "embedding_rows")
RESULTS = Path(__file__).resolve().parent / "results"


def support(workload: str, n: int, k: int, rank: int, seed: int, *, zipf_s: float = 1.1,
            hot: float = 0.9) -> np.ndarray:
    """Sorted distinct indices of one rank's selection."""
    rng = np.random.default_rng([seed, rank, WORKLOADS.index(workload)])
    if workload == "uniform":
        return np.sort(rng.choice(n, k, replace=False))
    if workload == "zipf":
        seen: dict[int, None] = {}
        while len(seen) < k:  # distinct draws in draw order, until k of them
            draw = rng.zipf(zipf_s, 4 * k) - 1
            for i in draw[draw < n].tolist():
                seen.setdefault(i)
                if len(seen) == k:
                    break
        return np.sort(np.fromiter(seen, np.int64, k))
    if workload == "embedding_rows":
        block = n // 16
        lo = n // 4  # the table's position in the flattened parameters
        k_hot = min(int(hot * k), block)
        hot_idx = lo + rng.choice(block, k_hot, replace=False)
        rest = np.setdiff1d(np.arange(n), np.arange(lo, lo + block), assume_unique=True)
        cold_idx = rng.choice(rest, k - k_hot, replace=False)
        return np.sort(np.concatenate([hot_idx, cold_idx]))
    raise ValueError(workload)


def oktopk_boundaries(supports, n: int, p: int) -> np.ndarray:
    """Ok-Topk's regions from these supports: each rank proposes the P-1 boundaries
    splitting its own sorted entries evenly; the floor average (jss's rule)."""
    props = []
    for s in supports:
        nnz = len(s)
        pos = [nnz * q // p for q in range(1, p)]
        props.append([n * q // p for q in range(1, p)] if nnz == 0
                     else [int(s[min(x, nnz - 1)]) for x in pos])
    every = np.asarray(props, np.int64)
    avg = (every // p).sum(0) + (every % p).sum(0) // p
    return np.concatenate([[0], avg, [n]])


def owners(indices: np.ndarray, scheme: str, n: int, p: int, bounds=None) -> np.ndarray:
    if scheme == "hash":
        return hash_owner_np(indices, p).astype(np.int64)
    if scheme == "contiguous":
        bounds = np.asarray([n * q // p for q in range(p + 1)])
    return np.searchsorted(np.asarray(bounds), indices, side="right") - 1


def max_rank_bytes(supports, owner_of, p: int, dense_switch_len=None) -> int:
    """Largest bytes any rank sends (MPI counting: header 56 (P-1), slice sizes
    8 (P-1), phase 1 8 per entry to other owners, block sizes 8 (P-1), phase 2 the
    owner's merged stream 8 per entry, or 4 per element of its range past len/2
    when ``dense_switch_len`` gives the range lengths: split_allgather)."""
    union = np.unique(np.concatenate(supports))
    merged = np.bincount(owner_of(union), minlength=p)
    worst = 0
    for r, s in enumerate(supports):
        own = int(np.count_nonzero(owner_of(s) == r))
        block = 8 * int(merged[r])
        if dense_switch_len is not None and merged[r] > dense_switch_len[r] // 2:
            block = 4 * int(dense_switch_len[r])
        sent = 56 * (p - 1) + 8 * (p - 1) + 8 * (len(s) - own) + 8 * (p - 1) + (p - 1) * block
        worst = max(worst, sent)
    return worst


def measure(n: int, density: float, nranks: int, workload: str, seed: int) -> dict:
    p = nranks
    k = max(1, int(density * n))
    supports = [support(workload, n, k, r, seed) for r in range(p)]
    union = np.unique(np.concatenate(supports))
    uniform = [support("uniform", n, k, r, seed + 1) for r in range(p)]
    bounds = {"oktopk_fresh": oktopk_boundaries(supports, n, p),
              "oktopk_from_uniform": oktopk_boundaries(uniform, n, p)}
    row = {"size": n, "density": density, "k": k, "nranks": p, "workload": workload,
           "union": int(len(union)), "schemes": {}}
    for scheme in SCHEMES:
        def owner_of(x, scheme=scheme):
            return owners(x, scheme, n, p, bounds.get(scheme))
        merged = np.bincount(owner_of(union), minlength=p)
        received = sum(np.bincount(owner_of(s), minlength=p) for s in supports)
        row["schemes"][scheme] = {
            "merged": merged.tolist(),
            "received": received.tolist(),
            "merged_max_over_mean": float(merged.max() / merged.mean()),
            "received_max_over_mean": float(received.max() / received.mean()),
        }
    lens = [n * (q + 1) // p - n * q // p for q in range(p)]
    row["max_rank_bytes_sent"] = {
        "hash_partition": max_rank_bytes(supports, lambda x: owners(x, "hash", n, p), p),
        "split_allgather": max_rank_bytes(supports, lambda x: owners(x, "contiguous", n, p), p,
                                          dense_switch_len=lens),
    }
    return row


def plot(data: dict, path: Path) -> None:
    rows = data["records"]
    fig, ax = pyplot().subplots(figsize=(10, 4.2))
    grouped_bars(ax, [f"{r['workload']}\nP={r['nranks']}" for r in rows],
                 {s: [r["schemes"][s]["merged_max_over_mean"] for r in rows] for s in SCHEMES})
    ax.axhline(1.15, color="k", ls="--", lw=0.8, label="1.15x (goal for hash)")
    ax.axhline(1.5, color="r", ls=":", lw=0.8, label="1.5x")
    ax.set(yscale="log", ylabel="largest owner's share / mean (merged entries)")
    cfg = data["config"]
    ax.set_title(f"Owner balance of the sparse reduce, N = {fmt_size(cfg['size'])}, "
                 f"{100 * cfg['density']:g} % per rank (exact counts)")
    ax.legend(fontsize=8, ncol=2)
    save_figure(fig, path)


def run(size: int, density: float, nranks_list, seed: int) -> dict:
    records = [measure(size, density, p, w, seed) for w in WORKLOADS for p in nranks_list]
    return {"benchmark": "hash_partition_balance",
            "config": {"size": size, "density": density, "nranks": list(nranks_list),
                       "seed": seed, "zipf_s": 1.1, "embedding_hot_fraction": 0.9},
            "records": records}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="4M", help="dense size N (default 4M)")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--nranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "hash_partition_balance"),
                    help="output path without extension (.json and .png are written)")
    args = ap.parse_args(argv)
    data = run(parse_size(args.size), args.density, args.nranks, args.seed)
    data["machine"] = machine_info(mpi=False)
    out = Path(args.out)
    write_record(data, out.with_suffix(".json"))
    plot(data, out.with_suffix(".png"))
    print(f"{'workload':16s} {'P':>2s} " + " ".join(f"{s:>20s}" for s in SCHEMES)
          + "   max bytes hash / split")
    for r in data["records"]:
        print(f"{r['workload']:16s} {r['nranks']:2d} "
              + " ".join(f"{r['schemes'][s]['merged_max_over_mean']:10.3f} "
                         f"{r['schemes'][s]['received_max_over_mean']:9.3f}" for s in SCHEMES)
              + f"   {r['max_rank_bytes_sent']['hash_partition']:,} / "
                f"{r['max_rank_bytes_sent']['split_allgather']:,}")
    return data


if __name__ == "__main__":
    main()
