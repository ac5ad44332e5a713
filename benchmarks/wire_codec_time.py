"""The wire codec's cost per message: ``pack_entries`` / ``unpack_entries``
(``ffi/collectives/wire_codec.h``, ``index_encoding="auto"``, float32 values) on one rank's
uniform support of the LM's N = 10,893,568 at the densities of the DGC ramp and
the 1 % step, one thread, pinned to one core.

Builds ``benchmarks/wire_codec_time.cc`` with the host compiler against the
repository's headers (no MPI, no XLA: the codec is plain C++), runs it per
density (median of ``--repeats``) and writes
``benchmarks/results/wire_codec_time.{json,png}``::

    python benchmarks/wire_codec_time.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import machine_info, pyplot, save_kernel_figure, write_record  # noqa: E402

KINDS = {0: "list", 1: "delta", 2: "bitmap"}


def xla_include() -> str:
    """The jaxlib include folder (wire_codec.h reaches ffi headers through its includes)."""
    import jax.ffi

    return str(jax.ffi.include_dir())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_893_568)
    ap.add_argument("--densities", type=float, nargs="+",
                    default=[0.01, 0.015625, 0.0625, 0.25])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--core", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "wire_codec_time")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "wire_codec_time"
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{ROOT}", f"-I{xla_include()}",
                        str(ROOT / "benchmarks" / "wire_codec_time.cc"), "-o", str(exe)],
                       check=True)
        records = []
        for d in args.densities:
            out = subprocess.run(["taskset", "-c", str(args.core), str(exe), str(args.n), str(d),
                                  str(args.repeats)], check=True, capture_output=True, text=True)
            rec = json.loads(out.stdout)
            rec["kind"] = KINDS[rec["kind"]]
            rec["ns_per_entry_pack"] = 1e6 * rec["pack_ms"] / rec["m"]
            rec["ns_per_entry_unpack"] = 1e6 * rec["unpack_ms"] / rec["m"]
            records.append(rec)
            print(f"density {d:g}: m = {rec['m']}, {rec['kind']}, {rec['bytes']} bytes, pack "
                  f"{rec['pack_ms']:.1f} ms, unpack {rec['unpack_ms']:.1f} ms", flush=True)
    result = {"benchmark": "wire_codec_time", "machine": machine_info(mpi=False),
              "records": records}
    write_record(result, args.out.with_suffix(".json"))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4))
    xs = range(len(records))
    ax.bar([x - 0.2 for x in xs], [r["pack_ms"] for r in records], 0.4, label="pack")
    ax.bar([x + 0.2 for x in xs], [r["unpack_ms"] for r in records], 0.4, label="unpack")
    ax.set_xticks(list(xs), [f"{100 * r['density']:g} %\n{r['kind']}" for r in records])
    ax.set_ylabel("ms per message (one core)")
    ax.set_title(f"wire codec, N = {args.n:,}, index_encoding='auto', float32", fontsize=9)
    ax.legend()
    save_kernel_figure(fig, args.out.with_suffix(".png"), result["benchmark"], result["machine"])
    print(f"# wrote {args.out}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
