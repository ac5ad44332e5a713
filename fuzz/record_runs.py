"""Writes benchmarks/results/fuzz_runs.json from `bash scripts/fuzz.sh measure`'s log.

Called by `scripts/fuzz.sh measure` (not by hand): the log's RESULT lines become
the runs, `--command` is the measure command as it was run, and each run's
sanitizers are read from the build, not stated: a sanitizer is listed when the
target binary links its runtime AND every library object in build/fuzz/obj/
calls into it (so the collectives themselves are instrumented, not only the
target's main). The compiler and flags are the ones `fuzz.sh build` recorded in
build/fuzz/build_flags.txt, and the compiler's own stamp in the binary.

    python fuzz/record_runs.py --command "bash scripts/fuzz.sh measure 10000 1" LOG
    python fuzz/record_runs.py --probe build/fuzz/fuzz_oktopk   # print what a target has
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "fuzz"
RECORD = ROOT / "benchmarks" / "results" / "fuzz_runs.json"

# sanitizer: (a symbol its runtime defines in the binary, the prefix of the calls an
# instrumented object makes into it)
SANITIZERS = {
    "address": ("__asan_init", "__asan_"),
    "undefined": ("__ubsan_handle_", "__ubsan_handle_"),
    "fuzzer": ("LLVMFuzzerRunDriver", "__sanitizer_cov_"),  # libFuzzer + coverage edges
}


def symbols(path: Path, undefined: bool) -> list[str]:
    """The symbol names `nm` lists for ``path``: the undefined ones (what an object
    calls) or the defined ones (what a binary contains)."""
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", flag, str(path)], check=True, capture_output=True,
                         text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def sanitizers_of(binary: Path, objects: list[Path]) -> list[str]:
    """The sanitizers ``binary`` was built with, as the build shows them."""
    if not objects:
        raise SystemExit(f"no library objects in {BUILD / 'obj'}: run `bash scripts/fuzz.sh build`")
    defined = symbols(binary, undefined=False)
    calls = [symbols(obj, undefined=True) for obj in objects]
    found = []
    for name, (runtime, prefix) in SANITIZERS.items():
        linked = any(s.startswith(runtime) for s in defined)
        instrumented = all(any(s.startswith(prefix) for s in c) for c in calls)
        if linked and instrumented:
            found.append(name)
    return found


def compiler_of(binary: Path) -> str | None:
    """The clang that compiled ``binary``, from its .comment section."""
    out = subprocess.run(["readelf", "-p", ".comment", str(binary)], capture_output=True,
                         text=True).stdout
    stamps = [line.split("]", 1)[1].strip() for line in out.splitlines() if "]" in line]
    return next((s for s in stamps if "clang" in s), None)


def read_runs(logs: list[str]) -> list[dict]:
    """The RESULT lines of `fuzz.sh measure`, one run each, with the target's sanitizers."""
    objects = sorted((BUILD / "obj").glob("*.o"))
    runs = []
    for path in logs:
        for line in open(path):
            if not line.startswith("RESULT "):
                continue
            r = dict(kv.split("=", 1) for kv in line.split()[1:])
            binary = BUILD / r["target"]
            runs.append({"target": r["target"], "executions": int(r["executions"]),
                         "seconds": int(r["seconds"]), "coverage": int(r["coverage"]),
                         "findings": int(r["findings"]), "jobs": int(r["jobs"]),
                         "commit": r.get("commit"),
                         "sanitizers": sanitizers_of(binary, objects)})
    if not runs:
        raise SystemExit(f"no RESULT lines in {logs}: nothing to record")
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--command", help="the measure command as it was run")
    ap.add_argument("--probe", metavar="BINARY", help="print a target's sanitizers and exit")
    ap.add_argument("--out", default=str(RECORD))
    ap.add_argument("logs", nargs="*")
    args = ap.parse_args(argv)
    objects = sorted((BUILD / "obj").glob("*.o"))
    if args.probe:
        print(" ".join(sanitizers_of(Path(args.probe), objects)))
        return 0
    if not args.command or not args.logs:
        ap.error("--command and at least one LOG are needed (run `bash scripts/fuzz.sh measure`)")
    sys.path.insert(0, str(ROOT))
    from benchmarks._harness import machine_info

    runs = read_runs(args.logs)
    info = machine_info(mpi=False)
    info["command"] = args.command
    flags = BUILD / "build_flags.txt"
    build = {"compiler": compiler_of(BUILD / runs[0]["target"]),
             "command": flags.read_text().strip() if flags.exists() else None}
    with open(args.out, "w") as f:
        json.dump({"machine": info, "build": build, "runs": runs}, f, indent=1)
        f.write("\n")
    print(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
