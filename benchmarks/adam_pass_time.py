"""The fused Adam pass alone, this tree's kernel against an older revision's,
side by side: ``adam_accumulate_topk`` (``kernels/adam_accumulate.h``, restart
masking, top-k at 1 %) at the LM's N = 10,893,568 on one pinned core.

Builds ``benchmarks/adam_pass_time.cc`` twice with the host compiler, against this
tree's ``kernels/`` and against ``--base``'s (``git archive``), each with the age type
its ``kernels/adam_direction.h`` declares; the binaries take turns, ``--rounds`` rounds of
``--calls`` calls; a kernel's time is the median and the minimum over rounds of its
per-round medians. Writes ``benchmarks/results/adam_pass_time.{json,png}``::

    python benchmarks/adam_pass_time.py --base 34554dc
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import machine_info, pyplot, save_kernel_figure, write_record  # noqa: E402


def age_type(kernels: Path) -> str:
    """The C++ element type of ``AdamDirectionBuffers::age`` in that ``kernels/``."""
    m = re.search(r"\b(\w+)\* age;", (kernels / "adam_direction.h").read_text())
    if m is None:
        raise SystemExit(f"no `age` buffer in {kernels / 'adam_direction.h'}")
    return m.group(1)


def build(include: Path, exe: Path) -> str:
    ty = age_type(include / "kernels")
    subprocess.run(["g++", "-O2", "-std=c++17", "-ffp-contract=off", "-pthread",
                    f"-DAGE_T={ty}", f"-I{include}", str(ROOT / "benchmarks" / "adam_pass_time.cc"),
                    "-o", str(exe)], check=True)
    return ty


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the older revision (a git ref)")
    ap.add_argument("--n", type=int, default=10_893_568)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=11)
    ap.add_argument("--core", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "adam_pass_time")
    args = ap.parse_args(argv)
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        archive = subprocess.run(["git", "archive", args.base, "kernels"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp / "base", filter="data")
        kernels = {f"base {base_rev}": (tmp / "base", tmp / "base.x"),
                   "this tree": (ROOT, tmp / "tree.x")}
        types = {name: build(inc, exe) for name, (inc, exe) in kernels.items()}
        per_round = {name: [] for name in kernels}
        for r in range(args.rounds):
            order = list(kernels) if r % 2 == 0 else list(reversed(kernels))  # ABBA
            for name in order:
                out = subprocess.run(["taskset", "-c", str(args.core), str(kernels[name][1]),
                                      str(args.n), str(args.calls)], check=True,
                                     capture_output=True, text=True,
                                     env={"JSS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
                per_round[name].append(statistics.median(float(x) for x in out.stdout.split()))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{name} {per_round[name][-1]:.1f} ms" for name in kernels), flush=True)
    records = [{"kernel": name, "age_type": types[name], "n": args.n,
                "median_ms": statistics.median(v), "min_ms": min(v), "round_medians_ms": v}
               for name, v in per_round.items()]
    base, tree = records
    ratios = [t / b for b, t in zip(base["round_medians_ms"], tree["round_medians_ms"])]
    result = {"benchmark": "adam_pass_time", "base": base_rev, "machine": machine_info(mpi=False),
              "records": records, "paired_ratio_median": statistics.median(ratios),
              "paired_ratios": ratios}
    for rec in records:
        print(f"{rec['kernel']} (age {rec['age_type']}): median {rec['median_ms']:.1f} ms, "
              f"min {rec['min_ms']:.1f} ms")
    print(f"this tree / base, paired by round: median {result['paired_ratio_median']:.3f}")
    write_record(result, args.out.with_suffix(".json"))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4))
    for rec in records:
        ax.plot(range(1, args.rounds + 1), rec["round_medians_ms"], "o-",
                label=f"{rec['kernel']} (age {rec['age_type']})")
    ax.set(xlabel="round (the kernels take turns)", ylabel="ms per call, median of the round")
    ax.set_ylim(bottom=0)
    ax.set_title(f"fused Adam pass + top-k 1 %, N = {args.n:,}, one core", fontsize=9)
    ax.legend(fontsize=8)
    save_kernel_figure(fig, args.out.with_suffix(".png"), result["benchmark"], result["machine"])
    print(f"# wrote {args.out}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
