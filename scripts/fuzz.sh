#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer) of the C++ collectives under ASan + UBSan.
#
#   bash scripts/fuzz.sh build                 # build the targets into build/fuzz/
#   bash scripts/fuzz.sh run 15                # each target 15 s (CI: 4 targets, side by side
#                                              # on the cores: 30 s on 2 cores)
#   bash scripts/fuzz.sh runs 10000000 [jobs]  # each target a fixed number of executions
#   bash scripts/fuzz.sh regress               # every committed regression/seed input once
#   bash scripts/fuzz.sh record LOG...         # runs' RESULT lines -> benchmarks/results/fuzz_runs.json
#
# The targets (fuzz/*.cc) link the library's real collective code with
# fuzz/fake_mpi.cc, in which the other ranks are the fuzzer: corrupted or
# truncated peer messages must give an error, never an out-of-bounds access.
# Needs clang with libFuzzer (Debian: apt-get install clang-19 libclang-rt-19-dev)
# and the venv of scripts/setup.sh (XLA FFI headers, the mpich wheel's mpi.h).
#
# Environment: JSS_FUZZ_TARGETS (default: all four), JSS_FUZZ_MAX_TIME (runs: a time
# limit per job in seconds, default none); CLANGXX (default: clang++, else clang++-19 .. clang++-15);
# JSS_FUZZ_INSTALL=1 installs clang-19 with apt-get when none is found.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/build/fuzz
TARGETS=${JSS_FUZZ_TARGETS:-"fuzz_sparse_stream fuzz_sparse_allreduce fuzz_oktopk fuzz_block_dense"}
LIBRARY_SOURCES="ffi/runtime/mpi_comm.cc ffi/runtime/blocked_on.cc
  ffi/collectives/sparse_allreduce_ffi.cc ffi/collectives/dense_and_allgather.cc
  ffi/collectives/recursive_doubling.cc ffi/collectives/split_allgather.cc
  ffi/collectives/hash_partition.cc ffi/collectives/oktopk.cc ffi/collectives/block_allreduce.cc
  fuzz/fake_mpi.cc"

find_clang() {
  if [ -n "${CLANGXX:-}" ]; then echo "$CLANGXX"; return; fi
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return; fi
  done
  if [ "${JSS_FUZZ_INSTALL:-0}" = 1 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -q clang-19 libclang-rt-19-dev >&2
    echo clang++-19
  fi
}

build() {
  local cxx
  cxx=$(find_clang)
  if [ -z "$cxx" ]; then
    echo "[fuzz] no clang++ found (set CLANGXX, or JSS_FUZZ_INSTALL=1 to apt-get install clang-19)" >&2
    return 2
  fi
  local python=$ROOT/.venv/bin/python
  local xla
  xla=$("$python" -c "import jax.ffi; print(jax.ffi.include_dir())")
  local mpi_include
  mpi_include=$("$python" -c "import sys, os; print(os.path.join(sys.prefix, 'include'))")
  mkdir -p "$OUT/obj"
  local flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -I "$ROOT" -isystem "$xla"
               -isystem "$mpi_include" -fsanitize=address,undefined
               -fno-sanitize-recover=undefined -Wno-deprecated-declarations)
  echo "[fuzz] building with $cxx ($("$cxx" --version | head -1))"
  local objects=()
  for src in $LIBRARY_SOURCES; do
    local obj=$OUT/obj/$(basename "${src%.cc}").o
    objects+=("$obj")
    # Rebuilt when the source or any header changed since.
    if [ "$obj" -nt "$src" ] && [ -z "$(find ffi kernels fuzz -name '*.h' -newer "$obj")" ]; then
      continue
    fi
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" &
  done
  wait
  # the targets compile and link side by side too (a failed one fails the build)
  local pids=() pid
  for t in $TARGETS; do
    "$cxx" "${flags[@]}" -fsanitize=fuzzer "fuzz/$t.cc" "${objects[@]}" -o "$OUT/$t" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  echo "[fuzz] built: $TARGETS -> $OUT"
}

# Seeds and regression inputs committed under fuzz/corpus/<target>/.
corpus_of() { echo "$ROOT/fuzz/corpus/$1"; }

run_for() {  # run_for SECONDS: each target that long, new inputs kept in build/fuzz/corpus
  # The targets run side by side, as many at once as there are cores (each target is
  # one single-threaded process): every target still gets its SECONDS on a core of its
  # own, and CI's minute of fuzzing takes 30 s of wall time on 2 cores.
  local seconds=$1
  local cores
  cores=$(nproc 2>/dev/null || echo 1)
  mkdir -p "$OUT/logs"
  local batch=() t
  for t in $TARGETS; do
    batch+=("$t")
    if [ "${#batch[@]}" -ge "$cores" ]; then
      run_batch "$seconds" "${batch[@]}" || return $?
      batch=()
    fi
  done
  if [ "${#batch[@]}" -gt 0 ]; then run_batch "$seconds" "${batch[@]}" || return $?; fi
}

run_batch() {  # run_batch SECONDS TARGET...: these targets at once, then their results in order
  local seconds=$1 t
  shift
  local pids=()
  for t in "$@"; do
    mkdir -p "$OUT/corpus/$t" "$(corpus_of "$t")"
    "$OUT/$t" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$OUT/$t-" \
      "$OUT/corpus/$t" "$(corpus_of "$t")" >"$OUT/logs/$t-run.log" 2>&1 &
    pids+=($!)
  done
  local i failed=0
  for i in "${!pids[@]}"; do
    t=${@:$((i + 1)):1}
    local rc=0
    wait "${pids[$i]}" || rc=$?
    local execs
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/logs/$t-run.log")
    echo "[fuzz] $t: ${execs:-?} executions in ${seconds} s, exit status $rc"
    if [ "$rc" != 0 ]; then
      grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$OUT/logs/$t-run.log" | head -n 20
      failed=$rc
    fi
  done
  return "$failed"
}

run_count() {  # run_count N [JOBS]: each target N executions, over JOBS processes
  local runs=$1 jobs=${2:-1}
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  for t in $TARGETS; do
    mkdir -p "$OUT/corpus/$t" "$OUT/logs/$t"
    echo "[fuzz] $t: $runs executions in $jobs jobs"
    local start=$SECONDS
    rm -f "$OUT"/logs/"$t"/fuzz-*.log
    (cd "$OUT/logs/$t" && "$OUT/$t" -runs=$((runs / jobs)) -max_total_time="${JSS_FUZZ_MAX_TIME:-0}" -jobs="$jobs" -workers="$jobs" \
      -print_final_stats=1 -artifact_prefix="$OUT/$t-" "$OUT/corpus/$t" "$(corpus_of "$t")" \
      >/dev/null 2>&1) || true
    local execs
    execs=$(cat "$OUT"/logs/"$t"/fuzz-*.log | sed -n 's/^stat::number_of_executed_units: *//p' \
            | awk '{s += $1} END {print s + 0}')
    local cov crashes
    cov=$(cat "$OUT"/logs/"$t"/fuzz-*.log | sed -n 's/.*DONE *cov: \([0-9]*\).*/\1/p' | sort -n | tail -n 1 || true)
    crashes=$(ls "$OUT/$t"-crash-* "$OUT/$t"-leak-* "$OUT/$t"-timeout-* "$OUT/$t"-oom-* 2>/dev/null | wc -l || true)
    echo "RESULT target=$t executions=$execs seconds=$((SECONDS - start)) coverage=${cov:-0} findings=$crashes jobs=$jobs commit=$commit"
  done
}

regress() {  # every committed input once (no fuzzing)
  for t in $TARGETS; do
    local dir rc=0
    dir=$(corpus_of "$t")
    [ -d "$dir" ] || continue
    "$OUT/$t" -runs=0 "$dir" >"$OUT/$t-regress.log" 2>&1 || rc=$?
    echo "[fuzz] $t: $(ls "$dir" | wc -l) committed inputs, exit status $rc"
    if [ "$rc" != 0 ]; then tail -n 30 "$OUT/$t-regress.log"; return "$rc"; fi
  done
}

record() {  # record LOG...: the RESULT lines of `runs` into benchmarks/results/fuzz_runs.json
  "$ROOT/.venv/bin/python" - "$@" <<'PY'
import json, re, sys
sys.path.insert(0, ".")
from benchmarks._harness import machine_info
runs = []
for path in sys.argv[1:]:
    for line in open(path):
        if line.startswith("RESULT "):
            r = dict(kv.split("=", 1) for kv in line.split()[1:])
            runs.append({"target": r["target"], "executions": int(r["executions"]),
                         "seconds": int(r["seconds"]), "coverage": int(r["coverage"]),
                         "findings": int(r["findings"]), "jobs": int(r["jobs"]),
                         "commit": r.get("commit"),
                         "sanitizers": "address,undefined (libFuzzer, clang)"})
info = machine_info(mpi=False)
info["command"] = "bash scripts/fuzz.sh runs 10000000 1 (each target; JSS_FUZZ_MAX_TIME set)"
out = {"machine": info, "runs": runs}
with open("benchmarks/results/fuzz_runs.json", "w") as f:
    json.dump(out, f, indent=1)
print(json.dumps(runs, indent=1))
PY
}

case "${1:-}" in
  build) build ;;
  run) run_for "${2:-15}" ;;
  runs) run_count "${2:-10000000}" "${3:-1}" ;;
  regress) regress ;;
  record) shift; record "$@" ;;
  *) sed -n '2,19p' "$0"; exit 1 ;;
esac
