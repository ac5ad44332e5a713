#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer) of the C++ collectives under ASan + UBSan.
#
#   bash scripts/fuzz.sh build                 # build the targets into build/fuzz/
#   bash scripts/fuzz.sh run 30                # each target 30 s (CI: 4 targets, side by side
#                                              # on the cores: 60 s on 2 cores)
#   bash scripts/fuzz.sh runs 10000000 [jobs]  # each target a fixed number of executions
#   bash scripts/fuzz.sh regress               # every committed regression/seed input once
#   bash scripts/fuzz.sh measure 10000000 2    # `runs`, then their record: benchmarks/results/fuzz_runs.json
#   bash scripts/fuzz.sh install               # clang-19 + libFuzzer with apt-get (root) unless one works
#
# The targets (fuzz/*.cc) link the library's real collective code with
# fuzz/fake_mpi.cc, in which the other ranks are the fuzzer: corrupted or
# truncated peer messages must give an error, never an out-of-bounds access.
# Needs clang with libFuzzer (Debian: apt-get install clang-19 libclang-rt-19-dev)
# and the venv of scripts/setup.sh (XLA FFI headers, the mpich wheel's mpi.h).
#
# Environment: JSS_FUZZ_TARGETS (default: all four), JSS_FUZZ_MAX_TIME (runs: a time
# limit per job in seconds, default none), JSS_FUZZ_RECORD (measure: the record to write,
# default benchmarks/results/fuzz_runs.json); CLANGXX (default: clang++, else clang++-19 .. clang++-15);
# JSS_FUZZ_INSTALL=1 makes `build` run `install` first when no clang++ is found.
# scripts/setup.sh runs `install` (JSS_FUZZ=OFF skips it).
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

find_clang() {  # the first clang++ that links a libFuzzer target, else the first found
  if [ -n "${CLANGXX:-}" ]; then echo "$CLANGXX"; return; fi
  local c first=
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15; do
    command -v "$c" >/dev/null 2>&1 || continue
    if links_fuzzer "$c"; then echo "$c"; return; fi
    first=${first:-$c}
  done
  if [ "${JSS_FUZZ_INSTALL:-0}" = 1 ] && install >&2; then echo clang++-19; return; fi
  if [ -n "$first" ]; then echo "$first"; fi
}

links_fuzzer() {  # links_fuzzer CXX: CXX links a libFuzzer target under ASan + UBSan
  # (clang without libclang-rt-NN-dev compiles but fails to link -fsanitize=fuzzer)
  local tmp rc=0
  tmp=$(mktemp -d)
  printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
    'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$tmp/t.cc"
  "$1" -fsanitize=fuzzer,address,undefined "$tmp/t.cc" -o "$tmp/t" >/dev/null 2>&1 || rc=1
  rm -rf "$tmp"
  return "$rc"
}

install() {  # Debian's clang-19 and its sanitizer / libFuzzer runtimes, unless a clang links
  local cxx
  cxx=$(JSS_FUZZ_INSTALL=0 find_clang)
  if [ -n "$cxx" ] && links_fuzzer "$cxx"; then
    echo "[fuzz] $cxx links libFuzzer targets: nothing to install"
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "[fuzz] no clang++ that links libFuzzer, and not root with apt-get: not installed" \
         "(as root: apt-get install clang-19 libclang-rt-19-dev)" >&2
    return 2
  fi
  local start=$SECONDS
  # --no-install-recommends: 13 packages instead of 18 (no llvm-19-dev and friends)
  local packages=(clang-19 libclang-rt-19-dev)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
       "${packages[@]}" >/dev/null; then
    # a fresh container has no package lists yet
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${packages[@]}" >/dev/null
  fi
  links_fuzzer clang++-19
  echo "[fuzz] installed ${packages[*]} in $((SECONDS - start)) s"
}

build() {
  local cxx
  cxx=$(find_clang)
  if [ -z "$cxx" ]; then
    echo "[fuzz] no clang++ found (bash scripts/fuzz.sh install as root, or set CLANGXX)" >&2
    return 2
  fi
  local python=$ROOT/.venv/bin/python
  local xla
  xla=$("$python" -c "import jax.ffi; print(jax.ffi.include_dir())")
  local mpi_include
  mpi_include=$("$python" -c "import sys, os; print(os.path.join(sys.prefix, 'include'))")
  mkdir -p "$OUT/obj"
  # one build at a time (the test suite's workers may ask for it together)
  exec 9>"$OUT/.lock"
  flock 9
  local flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -I "$ROOT" -isystem "$xla"
               -isystem "$mpi_include" -fsanitize=address,undefined
               -fno-sanitize-recover=undefined -Wno-deprecated-declarations)
  # What the objects and targets were compiled with, read back by `measure`'s record;
  # another compiler or other flags than last time rebuild everything.
  local info="$cxx ${flags[*]} (objects: -fsanitize=fuzzer-no-link -c; targets: -fsanitize=fuzzer)"
  if [ "$(cat "$OUT/build_flags.txt" 2>/dev/null)" != "$info" ]; then
    rm -f "$OUT"/obj/*.o
    for t in $TARGETS; do rm -f "$OUT/$t"; done
  fi
  echo "[fuzz] building with $cxx ($("$cxx" --version | head -1))"
  local objects=() pids=() pid
  for src in $LIBRARY_SOURCES; do
    local obj=$OUT/obj/$(basename "${src%.cc}").o
    objects+=("$obj")
    # Rebuilt when the source or any header changed since.
    if [ "$obj" -nt "$src" ] && [ -z "$(find ffi kernels fuzz -name '*.h' -newer "$obj")" ]; then
      continue
    fi
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # a failed compile fails the build
  # the targets compile and link side by side too, each when it or an object is newer
  pids=()
  for t in $TARGETS; do
    if [ -e "$OUT/$t" ] && [ -z "$(find "fuzz/$t.cc" "${objects[@]}" -newer "$OUT/$t")" ]; then
      continue
    fi
    "$cxx" "${flags[@]}" -fsanitize=fuzzer "fuzz/$t.cc" "${objects[@]}" -o "$OUT/$t" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  echo "$info" >"$OUT/build_flags.txt"
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

measure() {  # measure N [JOBS]: build, run_count, then benchmarks/results/fuzz_runs.json
  build  # the targets of this tree (the record reads their sanitizers from the build)
  mkdir -p "$OUT/logs"
  local log=$OUT/logs/measure.log
  run_count "$@" | tee "$log"
  # the command as run (this script's arguments and the environment it reads)
  local command="bash scripts/fuzz.sh measure $*" var
  for var in JSS_FUZZ_RECORD JSS_FUZZ_MAX_TIME JSS_FUZZ_TARGETS; do
    if [ -n "${!var:-}" ]; then command="$var='${!var}' $command"; fi
  done
  "$ROOT/.venv/bin/python" "$ROOT/fuzz/record_runs.py" --command "$command" \
    --out "${JSS_FUZZ_RECORD:-$ROOT/benchmarks/results/fuzz_runs.json}" "$log"
}

case "${1:-}" in
  build) build ;;
  run) run_for "${2:-15}" ;;
  runs) run_count "${2:-10000000}" "${3:-1}" ;;
  regress) regress ;;
  measure) shift; measure "$@" ;;
  install) install ;;
  *) sed -n '2,22p' "$0"; exit 1 ;;
esac
