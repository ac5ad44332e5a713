"""Exact index bytes of one sparse message under each encoding (list, delta, bitmap).

For a message of sorted distinct indices, :mod:`jax_sparse_sync.ops.index_encoding`
gives the exact bytes of a plain int32 list, delta-coded bit-packed gaps and a
bitmap, and picks the smallest. This script counts them for the messages the
sparse allreduce sends: one rank's top-k support (``allgather``, phase 1 of the
split algorithms) and one ``hash_partition`` owner's merged stream (phase 2:
the union's indices that hash to it), at densities 0.01 % to 10 % of N = 16M
(uniform supports, P = 8 for the owner's stream). No timing: counts.

Usage::

    python benchmarks/index_encoding_sizes.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (fmt_size, machine_info, parse_size, pyplot, save_figure,  # noqa: E402
                      write_record)

from jax_sparse_sync.mesh.hash_partition import hash_owner_np  # noqa: E402
from jax_sparse_sync.ops.index_encoding import (choose, decode, encode,  # noqa: E402
                                                encoded_sizes)

RESULTS = Path(__file__).resolve().parent / "results"
DENSITIES = (1e-4, 1e-3, 1e-2, 1e-1)


def run(size: int, densities, nranks: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    records = []
    for d in densities:
        k = max(1, int(d * size))
        supports = [np.sort(rng.choice(size, k, replace=False)) for _ in range(nranks)]
        union = np.unique(np.concatenate(supports))
        owner0 = union[hash_owner_np(union, nranks) == 0]
        for message, idx in (("rank_topk", supports[0]), ("hash_owner_stream", owner0)):
            sizes = encoded_sizes(idx)
            best = choose(idx)
            buf = encode(idx)
            assert len(buf) == sizes[best] and np.array_equal(decode(buf), idx)
            records.append({"density": d, "message": message, "entries": int(len(idx)),
                            "bytes": sizes, "chosen": best,
                            "int32_over_chosen": (4 * len(idx)) / sizes[best]})
    return {"benchmark": "index_encoding_sizes",
            "config": {"size": size, "nranks": nranks, "seed": seed,
                       "densities": list(densities)},
            "records": records}


def plot(data: dict, path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, message in zip(axes, ("rank_topk", "hash_owner_stream")):
        rows = [r for r in data["records"] if r["message"] == message]
        d = [100 * r["density"] for r in rows]
        for kind in ("list", "delta", "bitmap"):
            ax.plot(d, [r["bytes"][kind] / r["entries"] for r in rows], marker="o", label=kind)
        ax.set(xscale="log", yscale="log", xlabel="density (% of N)", title=message)
    axes[0].set_ylabel("index bytes per entry")
    axes[0].legend()
    fig.suptitle(f"Index encodings of one message, N = {fmt_size(data['config']['size'])} "
                 "(exact bytes)")
    save_figure(fig, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="16M")
    ap.add_argument("--nranks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "index_encoding_sizes"))
    args = ap.parse_args(argv)
    data = run(parse_size(args.size), DENSITIES, args.nranks, args.seed)
    data["machine"] = machine_info(mpi=False)
    out = Path(args.out)
    write_record(data, out.with_suffix(".json"))
    plot(data, out.with_suffix(".png"))
    for r in data["records"]:
        b = r["bytes"]
        print(f"{100 * r['density']:7.2f}% {r['message']:18s} m={r['entries']:9d} "
              f"list={b['list']:10d} delta={b['delta']:10d} bitmap={b['bitmap']:10d} "
              f"-> {r['chosen']:6s} {r['int32_over_chosen']:.2f}x fewer than int32")
    return data


if __name__ == "__main__":
    main()
