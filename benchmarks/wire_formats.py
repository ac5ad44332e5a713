"""Index and value bytes of the sparse allreduce's wire formats, from its byte counters.

Runs ``jss.sparse_allreduce`` over MPI (run it under ``mpiexec -n P``) on each
rank's uniform random support of ``density * N`` indices, for densities 0.01 %
to 10 % of N = 16M, with ``index_encoding="int32"`` and ``"auto"`` and with
float32 and bfloat16 values, and reads rank 0's ``SyncStats.bytes_sent``: the
bytes that went on the wire. From them it derives the index bytes per call
(what is left after the header check and the values) and, for ``allgather``
(one message per rank), checks that the encoded message is exactly as long as
the smallest of the three encodings of :mod:`jax_sparse_sync.ops.index_encoding`
(the Python definition of the format). Counts, not times.

Usage::

    mpiexec -n 4 python -m mpi4py benchmarks/wire_formats.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (fmt_size, machine_info, parse_size, pyplot, save_figure,  # noqa: E402
                      write_record)

import jax_sparse_sync as jss  # noqa: E402
from jax_sparse_sync.model import cost_model  # noqa: E402
from jax_sparse_sync.ops.index_encoding import encoded_sizes  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DENSITIES = (1e-4, 1e-3, 1e-2, 1e-1)
ALGORITHMS = ("allgather", "split_allgather", "hash_partition")


def bytes_sent(values, indices, size, algorithm, **wire) -> int:
    fn = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=size, algorithm=algorithm,
                                                   return_stats=True, **wire)[1].bytes_sent)
    return int(fn(values, indices))


def run(size: int, densities, seed: int) -> dict:
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    records = []
    for d in densities:
        k = max(1, int(d * size))
        rng = np.random.default_rng([seed, rank, int(d * 1e6)])
        idx = np.sort(rng.choice(size, k, replace=False)).astype(np.int32)
        vals = rng.standard_normal(k).astype(np.float32)
        v, i = jnp.asarray(vals), jnp.asarray(idx)
        all_idx = comm.allgather(idx)
        for algorithm in ALGORITHMS:
            sent = {(enc, dt): bytes_sent(v, i, size, algorithm, index_encoding=enc,
                                          wire_dtype=None if dt == "float32" else jnp.bfloat16)
                    for enc in ("int32", "auto") for dt in ("float32", "bfloat16")}
            rec = {"density": d, "algorithm": algorithm, "entries_per_rank": k,
                   "bytes_sent": {f"{e}/{t}": b for (e, t), b in sent.items()}}
            if algorithm == "allgather":
                # one message per rank: index bytes = sent - header check - the values
                # (- the 8-byte message sizes, which only the encoded run gathers)
                hb = cost_model.HEADER_BYTES * (p - 1)
                int32_index = sent["int32", "float32"] - hb - 4 * k * (p - 1)
                auto_index = sent["auto", "float32"] - hb - 4 * k * (p - 1)
                message = auto_index // (p - 1) - 8
                sizes = encoded_sizes(idx)
                smallest = min(sizes.values())
                rec.update(index_bytes_int32=int32_index, index_bytes_auto=auto_index,
                           int32_over_auto=int32_index / auto_index,
                           message_index_bytes=message, python_sizes=sizes,
                           message_over_smallest=message / smallest,
                           value_bytes_float32=sent["int32", "float32"] - hb - int32_index,
                           value_bytes_bfloat16=sent["int32", "bfloat16"] - hb - int32_index)
                assert message == smallest, (message, sizes)
                assert rec["value_bytes_float32"] == 2 * rec["value_bytes_bfloat16"]
            records.append(rec)
        del all_idx
    return {"benchmark": "wire_formats",
            "config": {"size": size, "nranks": p, "seed": seed, "densities": list(densities),
                       "algorithms": list(ALGORITHMS), "what": "rank 0's bytes_sent"},
            "records": records}


def plot(data: dict, path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    rows = [r for r in data["records"] if r["algorithm"] == "allgather"]
    d = [100 * r["density"] for r in rows]
    ax = axes[0]
    ax.plot(d, [r["int32_over_auto"] for r in rows], marker="o")
    ax.axhline(1.6, color="grey", ls=":", label="goal at 1 %: 1.6x")
    ax.set(xscale="log", xlabel="density (% of N)",
           ylabel="int32 index bytes / encoded index bytes",
           title="allgather, from the byte counters")
    ax.legend()
    ax = axes[1]
    for algorithm in data["config"]["algorithms"]:
        rs = [r for r in data["records"] if r["algorithm"] == algorithm]
        base = [r["bytes_sent"]["int32/float32"] for r in rs]
        for key, ls in (("auto/float32", "-"), ("int32/bfloat16", "--"), ("auto/bfloat16", ":")):
            ax.plot([100 * r["density"] for r in rs],
                    [r["bytes_sent"][key] / b for r, b in zip(rs, base)], ls=ls, marker="o",
                    label=f"{algorithm} {key}")
    ax.set(xscale="log", xlabel="density (% of N)", ylabel="bytes sent / int32 + float32",
           title="every byte (rank 0)")
    ax.legend(fontsize=6)
    fig.suptitle(f"Sparse allreduce wire formats, N = {fmt_size(data['config']['size'])}, "
                 f"P = {data['config']['nranks']} (exact counts)")
    save_figure(fig, path)


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="16M")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "wire_formats_p4"))
    args = ap.parse_args(argv)
    data = run(parse_size(args.size), DENSITIES, args.seed)
    if MPI.COMM_WORLD.Get_rank() != 0:
        return None
    data["machine"] = machine_info()
    out = Path(args.out)
    write_record(data, out.with_suffix(".json"))
    plot(data, out.with_suffix(".png"))
    for r in data["records"]:
        b = r["bytes_sent"]
        line = (f"{100 * r['density']:6.2f}% {r['algorithm']:16s} " +
                " ".join(f"{key}={val}" for key, val in b.items()))
        if "int32_over_auto" in r:
            line += (f" | index bytes int32/auto = {r['int32_over_auto']:.2f}x, message = "
                     f"{r['message_over_smallest']:.3f} x smallest")
        print(line)
    return data


if __name__ == "__main__":
    main()
