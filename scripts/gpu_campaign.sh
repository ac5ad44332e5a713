#!/usr/bin/env bash
# The device campaign: every measurement that needs a GPU machine (one H100 or
# H200 with 16 CPU cores, no network), in order of value, in one call of at
# most CAMPAIGN_S seconds (default 530), each step under its own time limit so
# a slow step cannot eat the rest. Results go into $OUT/campaign_results.tgz
# (re-packed after every step, so a cut-off call still returns what was done)
# and the log into $OUT/campaign.log.
#
#   bash scripts/gpu_session.sh campaign                     # on the GPU machine (carry .whl)
#   JSS_CAMPAIGN_DRY_RUN=1 bash scripts/gpu_campaign.sh      # here: CPU, tiny sizes, no build
#
# Steps (device sizes; the dry run uses tiny ones on the CPU and skips what
# needs a GPU):
#   build        wheels + pip build with the CUDA module (background: nvcc of the
#                kernel emulation), as gpu_session.sh does
#   selection    benchmarks/selection.py at 16M 64M 256M x 0.1%, 1% against lax.top_k
#   gpu_step     benchmarks/gpu_step.py: topk_sync / oktopk_sync + SGD on 16M and 64M
#                GPU parameters, P = 1 and 2 ranks sharing the GPU, against no sync; at
#                P = 1 each sync also through jss.axis on a one-device mesh (--transports
#                mpi axis: the fully on-device step, checked against the MPI one)
#   kernels      tests/cuda_host/emulate_kernels.cu --device fused (the fused accumulator
#                passes against the CPU kernels, no XLA), then --bench: kernel-only times
#                (CUDA events), the fused passes' too
#   gpu_step_lm  benchmarks/gpu_step.py --models lm: the examples' LM at 101.6M parameters,
#                topk_sync + SGD against SGD, adam_direction_sync(topk_sync) against AdamW, P = 1,
#                each sync also through jss.axis (--transports mpi axis)
#   gpu_step_tuned  gpu_step with --tune-host-allocator (jss.mpi.tune_host_allocator in
#                every rank; device only; not a default step: `import jax_sparse_sync` tunes
#                the allocator already, so gpu_step measures the tuned host side)
#   host_group   benchmarks/grouping.py, P = 4, core:4 per rank, shared memory: every plan
#                measured against its prediction
#   host_step    benchmarks/step_time.py on the host CPUs, P = 4 and 8, each rank bound
#                to its own cores (-bind-to core:16/P), shared memory
#   host_hash    benchmarks/hash_partition_time.py, P = 4 and 8, 2 cores per rank: the hash
#                partition's allreduce beside Ok-Topk's (regions, and hash owners: partition="hash")
#                on skewed and uniform supports (device only: the 2-core machine's numbers are
#                load, not algorithm)
#   cuda_tests   tests/test_cuda_kernels.py + tests/test_cuda_module.py + tests/test_cuda_axis.py
#                (their jss.axis twins) under cuda,cpu (run right after the build)
#   jax_tests    the transforms' own tests on the GPU as the default device (cuda,cpu): the
#                jax.numpy twins that stand in for the CPU-only fused kernels there (the Adam
#                pass, its range and clip forms), jss.topk's ascending order, shared_support_sync
# Unpack the results here with
#   tar xzf campaign_results.tgz -C benchmarks/results   (files named *_<device>.*)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
DRY=${JSS_CAMPAIGN_DRY_RUN:-0}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ "$DRY" = 1 ] && [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
export PATH="$BIN:$PATH" PYTHONUNBUFFERED=1
# several JAX processes share the GPU: no preallocation
export XLA_PYTHON_CLIENT_PREALLOCATE=false
CAMPAIGN_S=${CAMPAIGN_S:-530}
T0=$(date +%s)
WORK=$(mktemp -d /tmp/jss_campaign.XXXXXX)
LOG="$OUT/campaign.log"
: >"$LOG"
STEPS=${CAMPAIGN_STEPS:-build selection gpu_step kernels gpu_step_lm host_group host_step host_hash cuda_tests jax_tests}

say() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
left() { echo $(( CAMPAIGN_S - ($(date +%s) - T0) )); }
# limit N: N seconds, or what is left of the campaign less 5 s, whichever is less
limit() { local l; l=$(left); l=$(( l - 5 )); [ "$1" -lt "$l" ] && l=$1; echo $(( l > 0 ? l : 0 )); }
pack() { tar czf "$OUT/campaign_results.tgz.tmp" -C "$WORK" . 2>/dev/null &&
         mv "$OUT/campaign_results.tgz.tmp" "$OUT/campaign_results.tgz"; }
# run NAME LIMIT CMD...: one step under its limit, its output in the log, its status recorded
run() {
  local name=$1 lim; lim=$(limit "$2"); shift 2
  if [ "$lim" -lt 10 ]; then say "$name: skipped (${lim} s left)"; echo "$name skipped" >>"$WORK/steps.txt"; return; fi
  say "$name (limit ${lim} s)"
  local s=$(date +%s)
  timeout --kill-after=5 "$lim" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - s ))" | tee -a "$LOG" >>"$WORK/steps.txt"
  pack
}
want() { [[ " $STEPS " == *" $1 "* ]]; }

# --- the machine
if [ "$DRY" = 1 ]; then
  DEV=dryrun
  say "dry run on $(nproc) CPUs (JAX_PLATFORMS=cpu, tiny sizes, no build)"
  export JAX_PLATFORMS=cpu
  CORES=$(nproc)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG"
  DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' |
        grep -oE 'h100|h200|a100|l40s|l4|b200|gh200' | head -1)
  DEV=${DEV:-gpu}
  CORES=$(nproc)
fi
# the commit: git's where the tree has its .git, else what the caller names in JSS_COMMIT
export JSS_COMMIT=${JSS_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null)}
{ echo "device=$DEV cores=$CORES started=$(date -u +%FT%TZ) commit=$JSS_COMMIT"
  echo "steps=$STEPS"; } >"$WORK/campaign.txt"
say "device $DEV, $CORES cores, steps: $STEPS"

# --- build (device only): wheels, the package with its CUDA module; nvcc of the
# kernel emulation in the background meanwhile
if [ "$DRY" != 1 ] && want build; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl >>"$LOG" 2>&1
  fi
  if want kernels; then
    (nvcc -std=c++17 -O2 -arch=sm_90 -diag-suppress 1675 -DJSS_DEVICE_RUN -I. \
       tests/cuda_host/emulate_kernels.cu -o "$WORK/emu_gpu" >"$WORK/emu_build.log" 2>&1) &
    EMU_PID=$!
  fi
  export CUDAARCHS=${CUDAARCHS:-90} JSS_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$CORES}
  run build 240 "$PY" -m pip install -q --no-build-isolation --no-deps -e .
  "$PY" -c 'import jax, jax_sparse_sync as jss; print("jax", jax.__version__, jax.devices(), "CUDA module:", jss.cuda_available())' 2>&1 | tee -a "$LOG"
fi

# --- the CUDA tests first: they check fixes that no GPU has run yet, and
# correctness is worth more than any timing below
if want cuda_tests && [ "$DRY" != 1 ]; then
  run cuda_tests 130 env JAX_PLATFORMS=cuda,cpu "$PY" -m pytest -q -p no:cacheprovider -n 8 \
    --timeout 90 -rfE tests/test_cuda_kernels.py tests/test_cuda_module.py tests/test_cuda_axis.py \
    --junitxml="$WORK/cuda_tests_$DEV.xml"
fi

# the transforms' tests with the GPU as the default device: the accumulator and Adam
# passes run their CUDA twins there (kernels/fused_accumulate.cuh), fused and unfused
# steps must still agree bit for bit
if want jax_tests && [ "$DRY" != 1 ]; then
  run jax_tests 150 env JAX_PLATFORMS=cuda,cpu "$PY" -m pytest -q -p no:cacheprovider -n 8 \
    --timeout 120 -rfE tests/test_adam_accumulate.py tests/test_adam_clip.py \
    tests/test_adam_direction_pass.py tests/test_shared_support_sync.py tests/test_topk.py \
    tests/test_topk_sync.py --junitxml="$WORK/jax_tests_$DEV.xml"
fi

# --- the measurements, in order of value
if want selection; then
  if [ "$DRY" = 1 ]; then
    run selection 120 "$PY" benchmarks/selection.py --sizes 64K --densities 0.01 --repeats 2 \
      --out "$WORK/selection_$DEV.json"
  else
    run selection 120 "$PY" benchmarks/selection.py --sizes 16M 64M 256M --densities 0.001 0.01 \
      --repeats 5 --out "$WORK/selection_gpu_$DEV.json"
  fi
fi
# gpu_step (gpu_step_tuned, the same steps with jss.mpi.tune_host_allocator() in every
# rank, comes later: does the host side's per-entry cost come from page faults of
# freshly mapped k-sized vectors?); each P with its own limit (the job's own timeout a
# little less); the dry run checks the untuned one at a tiny size
gpu_step_run() {
  local variant=$1 flags=()
  want "gpu_step$variant" || return 0
  [ -n "$variant" ] && [ "$DRY" = 1 ] && return 0
  [ -n "$variant" ] && flags=(--tune-host-allocator)
  for P in 1 2; do
    # P = 1 also runs each sync mode through the mesh transport (jss.axis in shard_map
    # over a one-device mesh: the fully on-device reference, checked against the MPI
    # step); not in the tuned rerun (the allocator is the MPI path's host side)
    local axis=() lim=85
    [ "$P" = 1 ] && [ -z "$variant" ] && axis=(--transports mpi axis) && lim=150
    # the dry run: P = 2 with a tiny LM's Adam modes in the same job (gpu_step_lm's path;
    # topk_sync + SGD is the MLP's); P = 1 only the axis twin of the MLP's topk_sync and its
    # MPI step (the transport's path: each further mode is two more programs to compile,
    # and the whole P = 1 job timed out at 140 s beside CI's workers)
    if [ "$DRY" = 1 ] && [ "$P" = 1 ]; then
      run "gpu_step_p$P" 150 "$PY" benchmarks/gpu_step.py --models mlp --sizes 64K \
        --procs "$P" --steps 2 --warmup 1 --batch 16 --modes none topk_1pct \
        "${axis[@]}" --timeout 140 --out "$WORK/gpu_step_${DEV}_p$P.json"
    elif [ "$DRY" = 1 ]; then
      run "gpu_step_p$P" 150 "$PY" benchmarks/gpu_step.py --models mlp lm --sizes 64K \
        --procs "$P" --steps 2 --warmup 1 --batch 16 --modes none topk_1pct oktopk_1pct \
        --lm-modes adam_topk_1pct --lm-dim 32 --lm-layers 1 --lm-heads 2 --lm-seq 16 \
        --lm-batch 2 --timeout 140 --out "$WORK/gpu_step_${DEV}_p$P.json"
    else
      run "gpu_step${variant}_p$P" "$lim" "$PY" benchmarks/gpu_step.py --sizes 16M 64M \
        --procs "$P" --steps 10 "${flags[@]}" "${axis[@]}" --timeout "$(( $(limit "$lim") - 5 ))" \
        --out "$WORK/gpu_step_${DEV}${variant}_p$P.json"
    fi
  done
}
gpu_step_run ""
if want kernels && [ "$DRY" != 1 ]; then
  [ -n "${EMU_PID:-}" ] && wait "$EMU_PID"
  if [ -x "$WORK/emu_gpu" ]; then
    # the fused accumulator passes' real launchers against the CPU kernels, then the times
    run kernels 70 bash -c "'$WORK/emu_gpu' --device fused > '$WORK/kernels_check_$DEV.txt' 2>&1;
      '$WORK/emu_gpu' --bench > '$WORK/kernels_$DEV.txt' 2>&1"
  else
    say "kernels: the emulation did not build"; tail -5 "$WORK/emu_build.log" | tee -a "$LOG"
  fi
fi
# the examples' LM at 101.6M parameters, P = 1 (the dry run runs a tiny one in gpu_step_p2)
if want gpu_step_lm && [ "$DRY" != 1 ]; then
  run gpu_step_lm 170 "$PY" benchmarks/gpu_step.py --models lm --procs 1 --steps 10 \
    --transports mpi axis --timeout "$(( $(limit 170) - 5 ))" --out "$WORK/gpu_step_lm_$DEV.json"
fi
gpu_step_run _tuned
# the host's cores: ranks that never share a core (JAX on the CPU)
if want host_group; then
  if [ "$DRY" = 1 ]; then
    run host_group 200 env JAX_PLATFORMS=cpu "$PY" benchmarks/grouping.py --models mlp --links shm \
      --procs 2 --plans none wfbp --steps 1 --rounds 1 --warmup 1 --bind-to core:1 --mlp-hidden 64 \
      --timeout 180 --tag "campaign_$DEV" --out-dir "$WORK"
  else
    run host_group 95 env JAX_PLATFORMS=cpu "$PY" benchmarks/grouping.py --models mlp --links shm \
      --procs 4 --steps 2 --rounds 4 --bind-to "core:$(( CORES / 4 ))" \
      --timeout "$(( $(limit 95) - 5 ))" \
      --tag "campaign_$DEV" --out-dir "$WORK"
  fi
fi
if want host_step; then
  for P in 4 8; do
    C=$(( CORES / P )); [ "$C" -lt 1 ] && C=1
    if [ "$DRY" = 1 ]; then
      [ "$P" = 8 ] && continue
      run host_step_p2 150 env JAX_PLATFORMS=cpu "$PY" benchmarks/step_time.py --models mlp \
        --links shm --procs 2 --modes none dense topk_1pct_auto --steps 3 --warmup 1 \
        --max-seconds-per-mode 2 --batches 1 --mlp-input 64 --mlp-hidden 64 --mlp-layers 2 \
        --mlp-batch 8 --bind-to core:1 --timeout 120 --tag "campaign_${DEV}_p2" --out-dir "$WORK"
    else
      run "host_step_p$P" 70 env JAX_PLATFORMS=cpu "$PY" benchmarks/step_time.py \
        --models mlp --links shm --procs "$P" \
        --modes none dense topk_1pct_auto topk_0.1pct_auto oktopk_1pct --steps 10 --warmup 2 \
        --max-seconds-per-mode 3 --bind-to "core:$C" --timeout "$(( $(limit 70) - 5 ))" \
        --tag "campaign_${DEV}_p$P" --out-dir "$WORK"
    fi
  done
fi
if want host_hash && [ "$DRY" != 1 ]; then
  run host_hash 120 env JAX_PLATFORMS=cpu "$PY" benchmarks/hash_partition_time.py --size 4M \
    --nranks 4 8 --repeats 25 --bind-to "core:$(( CORES / 8 > 0 ? CORES / 8 : 1 ))" \
    --timeout "$(( $(limit 120) - 5 ))" --out "$WORK/hash_partition_time_4M_$DEV"
fi
pack
say "campaign done in $(( $(date +%s) - T0 )) s: $(tr '\n' ';' <"$WORK/steps.txt")"
rm -rf "$WORK"
