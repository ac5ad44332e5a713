#!/usr/bin/env bash
# GPU checks for a lent GPU machine that has JAX with its CUDA plugin but no
# network (the device tool's machines): installs the carried MPI wheels,
# builds jax_sparse_sync with its CUDA module against that machine's jaxlib,
# then runs the steps named on the command line, each with its own time
# limit, logging to $OUT (or /tmp/gpu-out).
#
#   bash scripts/gpu_session.sh campaign                  # everything, in at most 9 minutes:
#                                                         # scripts/gpu_campaign.sh (the first call
#                                                         # of a lent machine goes to this)
#   bash scripts/gpu_session.sh emulate cuda-tests        # kernels, then the CUDA tests
#   bash scripts/gpu_session.sh suite                     # the whole suite under cuda,cpu
#   bash scripts/gpu_session.sh bench                     # benchmarks/selection.py --large
#
# Carry `.whl` (git ignores it): the mpich and mpi4py wheels for the GPU
# machine's Python, fetched where pip works, e.g. for Python 3.12:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl mpich==5.0.2 mpi4py==4.1.2
# Steps:
#   emulate      tests/cuda_host/emulate_kernels.cu on the GPU (--device, then --bench)
#   cuda-tests   tests/test_cuda_kernels.py, tests/test_cuda_module.py and their jss.axis twins
#                (tests/test_cuda_axis.py), JAX_PLATFORMS=cuda,cpu
#   suite        the whole test suite, JAX_PLATFORMS=cuda,cpu
#   profile      per-kernel times of the launchers at 64M under ncu
#   debug        cuda-gdb backtrace of DEBUG_TEST (a crashing test)
#   bench        python benchmarks/selection.py --large (results/selection_gpu.{json,png}),
#                then benchmarks/compression.py at 16M 64M 256M (results/compression_gpu.*)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = campaign ]; then exec bash scripts/gpu_campaign.sh; fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# the interpreter's own bin (a venv's) first: mpicc, mpiexec and cmake come from there
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
export PATH="$BIN:$PATH"
# several JAX processes share the GPU in the MPI tests: no preallocation
export XLA_PYTHON_CLIENT_PREALLOCATE=false
phase() { echo "=== $1 ($(date +%T))"; }

phase "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
nvcc --version | tail -2
"$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, jax.devices())'

phase "install wheels + build (JSS_CUDA=ON, CUDAARCHS=90)"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl || exit 1
fi
export CUDAARCHS=${CUDAARCHS:-90} JSS_CUDA=ON
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
start=$(date +%s)
# JSS_BUILD_TYPE=Debug keeps symbols (for the debug step); SKIP_BUILD=1 for
# steps that need no package (emulate, profile)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if ! "$PY" -m pip install -q --no-build-isolation --no-deps \
      --config-settings=cmake.build-type="${JSS_BUILD_TYPE:-Release}" -e . >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
  "$PY" -c 'import jax_sparse_sync as jss; print("CUDA module:", jss.cuda_available())'
fi

for step in "$@"; do
  case $step in
    emulate)
      phase "emulate_kernels on the GPU"
      nvcc -std=c++17 -O2 -arch=sm_90 -diag-suppress 1675 -DJSS_DEVICE_RUN -I. \
        tests/cuda_host/emulate_kernels.cu -o /tmp/emu_gpu 2>&1 | tail -20
      timeout 240 /tmp/emu_gpu --device 2>&1 | tee "$OUT/emulate_device.log" | tail -25
      timeout 120 /tmp/emu_gpu --bench 2>&1 | tee "$OUT/emulate_bench.log" | tail -30
      ;;
    profile)
      phase "per-kernel times at N = 64M (ncu)"
      nvcc -std=c++17 -O2 -arch=sm_90 -diag-suppress 1675 -DJSS_DEVICE_RUN -I. \
        tests/cuda_host/emulate_kernels.cu -o /tmp/emu_gpu 2>&1 | tail -20
      timeout ${PROFILE_LIMIT:-150} ncu --metrics gpu__time_duration.sum --print-summary per-kernel \
        /tmp/emu_gpu --bench 67108864 > "$OUT/profile.log" 2>&1
      grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|Invocations" "$OUT/profile.log" | head -120 \
        > "$OUT/profile_summary.log"
      tail -60 "$OUT/profile_summary.log"
      ;;
    cuda-tests)
      phase "CUDA tests (JAX_PLATFORMS=cuda,cpu)"
      JAX_PLATFORMS=cuda,cpu timeout ${CUDA_TESTS_LIMIT:-300} "$PY" -m pytest -q --timeout 120 -p no:cacheprovider \
        tests/test_cuda_kernels.py tests/test_cuda_module.py tests/test_cuda_axis.py -rfE ${CUDA_TESTS_EXTRA:-} 2>&1 \
        | tee "$OUT/cuda_tests.log" | tail -40
      ;;
    suite)
      phase "whole suite (JAX_PLATFORMS=cuda,cpu)"
      JAX_PLATFORMS=cuda,cpu timeout ${SUITE_LIMIT:-560} "$PY" -m pytest -q --timeout 300 \
        -p no:cacheprovider -n ${SUITE_WORKERS:-8} -rfE 2>&1 | tee "$OUT/suite.log" | tail -40
      ;;
    debug)
      # a native backtrace of one crashing test: DEBUG_TEST=tests/file.py::name
      phase "cuda-gdb backtrace of ${DEBUG_TEST:?set DEBUG_TEST}"
      JAX_PLATFORMS=cuda,cpu timeout 150 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" \
        --args "$PY" -m pytest -q -x -p no:cacheprovider -p no:faulthandler "$DEBUG_TEST" 2>&1 \
        | grep -v "^\[New Thread\|^\[Thread .* exited" | tee "$OUT/debug.log" | tail -60
      ;;
    bench)
      phase "selection benchmark --large"
      PYTHONUNBUFFERED=1 timeout ${BENCH_LIMIT:-400} "$PY" benchmarks/selection.py --large \
        --out "$OUT/selection_gpu.json" 2>&1 | tee "$OUT/bench.log" | tail -40
      PYTHONUNBUFFERED=1 timeout ${BENCH_LIMIT:-400} "$PY" benchmarks/compression.py \
        --sizes 16M 64M 256M --out "$OUT/compression_gpu.json" 2>&1 | tee -a "$OUT/bench.log" | tail -12
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
phase "done"
