"""The shard_map example's record: ``examples/shard_map_experiment.py`` (a CNN trained with
dense, Top-k, Ok-Topk, pmap Top-k and block sync through ``jss.axis`` on a device mesh),
run once with ``--json`` and ``--plot``, stamped with where it ran (commit, command, host)
as every benchmark record is. The example's own summary (accuracy against dense, bytes a
step per device) is the record's; the example fails, and no record is written, when a mode
ends more than ``--tolerance`` points below dense.

    python benchmarks/shard_map_example.py --out benchmarks/results/shard_map_example_8dev.json
    python benchmarks/shard_map_example.py --out benchmarks/results/shard_map_example_2x4.json \\
        -- --spawn 2 --devices 4 --modes dense topk oktopk topk-pmap

Arguments after ``--`` go to the example (``--epochs``, ``--devices``, ``--spawn``, ...);
its ``--json`` and ``--plot`` are this script's ``--out`` and the PNG beside it.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "shard_map_experiment.py"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the record (JSON); its plot goes beside it")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for the example run")
    ap.add_argument("example_args", nargs=argparse.REMAINDER,
                    help="after --: the example's arguments")
    args = ap.parse_args(argv)
    args.example_args = [a for a in args.example_args if a != "--"]
    for a in args.example_args:
        if a.split("=")[0] in ("--json", "--plot"):
            ap.error(f"{a.split('=')[0]} is this script's --out (and the PNG beside it)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        curves = Path(tmp) / "example.json"
        cmd = [sys.executable, str(EXAMPLE), *args.example_args, "--json", str(curves),
               "--plot", str(out.with_suffix(".png"))]
        print("running", " ".join(cmd[1:]), flush=True)
        code = subprocess.run(cmd, cwd=ROOT, timeout=args.timeout).returncode
        if code != 0 or not curves.exists():
            print(f"the example failed (exit {code}): no record written", file=sys.stderr)
            return code or 1
        result = H.load_record(curves)
    # the JAX of this process describes the host (one CPU device; the example's own
    # device count is the record's "devices")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    record = {"benchmark": "shard_map_example",
              "description": "examples/shard_map_experiment.py: every sync through jss.axis on "
                             "a device mesh against dense: accuracy and bytes a step per device",
              "machine": H.machine_info(mpi=False), **result}
    H.write_record(record, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
