#!/usr/bin/env bash
# Device check, for a machine with an NVIDIA GPU (e.g. the H200 lent through the device tool,
# which reaches no package registry: everything runs on its own torch and tools). Two phases,
# sized for a 15-minute lease (start-up included) of commands of at most 10 minutes each, the
# most important steps first:
#   PHASE=1 (about 6 min): build with the machine's torch (pip install -e . --no-deps
#     --no-build-isolation), the CUDA tests (`pytest -m gpu`: CUDA vs CPU bytes for every op and
#     layout, graph capture and replay, pinned copies, the hardware conversions on every input),
#     the kernel-coverage check, compute-sanitizer memcheck on a small case of every kernel, the
#     benchmark's quick mode.
#   PHASE=2 (only with >= 5 min of device time left; reuses phase 1's build on a warm machine):
#     racecheck on one write and one gather, ncu on the fused DSA write, v4_dsa_write, gather_mla
#     and gather_v4 at T = 16384 (DRAM throughput, issue slots, stall reasons, instructions per
#     token beside sass_report.py's static count), the torch.profiler cross-check, then the full
#     sweep in what time is left.
#
#   OUT=/tmp/out PHASE=1 BUDGET_S=390 COMMIT=<hash> bash benchmarks/gpu_check.sh
#
# Every step runs under a timeout inside BUDGET_S seconds (the benchmarks stop themselves and
# write what they measured), so the script ends before a remote command limit kills it. COMMIT
# names the measured commit where the copy of the tree has no .git. $OUT ends up holding at most
# 8 files: summary.txt, logs.tgz (every step's log, the machine's description, the ncu report and
# the profiler tables) and the results (bench_cuda_quick.* / ncu_T16384.*, bench_cuda.*).
# DRY=1 runs the same steps on a machine without a GPU (CPU device; no sanitizer, no ncu), to
# test this script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
# The scripts under benchmarks/ import kvcache_ext from this tree whichever way it was built;
# pip never asks a registry (the device machine has none).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1
OUT=${OUT:-benchmarks/out/gpu_check}
LOGS=$OUT/logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
PHASE=${PHASE:-1}
BUDGET_S=${BUDGET_S:-390}
DRY=${DRY:-0}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export KVC_COMMIT=$COMMIT KVC_BUILD_DIR=${KVC_BUILD_DIR:-build/gpu_check}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
NCU_TOKENS=16384
NCU_KERNELS="dsa_kernel|v4_pair_write_kernel|mla_gather_kernel"  # the last: v4_mla_gather_kernel too

if [ "$DRY" != 1 ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); run this on a GPU machine" >&2
  exit 3
fi
case "$PHASE" in 1|2) ;; *) echo "gpu_check: PHASE must be 1 or 2, got $PHASE" >&2; exit 2 ;; esac
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu

status=0
note() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((BUDGET_S - SECONDS)); }
finish() {  # pack the logs into one file (the device tool returns few files)
  tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
}
trap finish EXIT

# step NAME CAP_S CMD...: run under a timeout of min(CAP_S, budget left - 15 s), log to
# $LOGS/NAME.log, note the result and the log's tail on failure.
step() {
  local name=$1 cap=$2; shift 2
  local limit=$(( $(left) - 15 ))
  [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt 20 ]; then note "$name skipped: budget spent"; status=1; return 1; fi
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  note "$name rc=$rc ($((SECONDS - t0)) s$([ "$rc" = 124 ] && echo ", timed out at $limit s"))"
  if [ "$rc" != 0 ]; then status=1; { tail -30 "$LOGS/$name.log"; echo; } | tee -a "$OUT/summary.txt"; fi
  return "$rc"
}
# quote NAME PATTERN: the log lines that matter, into the summary
quote() { grep -E "$2" "$LOGS/$1.log" 2>/dev/null | tail -"${3:-1}" | sed "s/^/gpu_check: $1: /" | tee -a "$OUT/summary.txt"; }

SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
{
  date -u; echo "commit $COMMIT"; uname -a; nproc
  nvidia-smi 2>&1; nvcc --version 2>&1 | tail -2; "${SANITIZER:-compute-sanitizer}" --version 2>&1 | head -2
  "${NCU:-ncu}" --version 2>&1 | tail -1
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" 2>&1
  $PY -m pip list 2>/dev/null | grep -iE "^(torch|pytest|pytest-xdist|hypothesis|transformers|nixl|numpy) "
} >"$LOGS/machine.txt"
GPU=$($PY -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU')" 2>/dev/null)
note "phase=$PHASE device=$DEVICE ($GPU) budget=${BUDGET_S}s commit=$COMMIT"

have_build() { $PY -c "import sys, kvcache_ext.ops.library as e; sys.exit(0 if e.has_cuda_kernels() else 1)" 2>/dev/null; }
if [ "$PHASE" = 2 ] && ! have_build && [ "$BUDGET_S" -lt 420 ]; then
  # a machine that went cold between the phases: a rebuild would spend the whole budget
  note "phase 2: no build here (the machine went cold?) and too little budget to rebuild; nothing measured"
  exit 1
fi
if [ "$PHASE" = 1 ] || ! have_build; then
  # setup.py's own build_ext if pip cannot install in place (same CMake build, same folder)
  step build 240 $PY -m pip install --no-deps --no-build-isolation -e . \
    || step build_inplace 180 $PY setup.py build_ext --inplace || exit 1
  have_build || { note "build: the CUDA kernels are missing from the built extension"; status=1; }
fi

if [ "$PHASE" = 1 ]; then
  XDIST=()
  $PY -c "import xdist" 2>/dev/null && XDIST=(-n 8)
  # leave the coverage check, memcheck and the quick benchmark their time (about 150 s)
  step tests $(( $(left) - 165 < 200 ? $(left) - 165 : 200 )) \
    $PY -m pytest -q -rfE -p no:cacheprovider -m gpu "${XDIST[@]}" --durations=15 tests
  quote tests "passed|failed|error"
  if [ "$DRY" = 1 ]; then
    note "coverage and memcheck skipped (DRY)"
  else
    step coverage 60 $PY benchmarks/sanitize_case.py --coverage
    quote coverage "kernels launched"
    if [ -n "$SANITIZER" ]; then
      # no caching allocator, so an overrun into a neighbouring tensor of one pool segment shows;
      # torch's own probing API errors are not the kernels' (their launch errors raise in Python)
      step memcheck 120 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool memcheck \
        --report-api-errors no --error-exitcode 1 $PY benchmarks/sanitize_case.py
      quote memcheck "ERROR SUMMARY"
    else
      note "compute-sanitizer not found"; status=1
    fi
  fi
  step bench_quick 90 $PY benchmarks/bench_cache_ops.py --device "$DEVICE" --quick \
    --budget-s $(( $(left) > 105 ? 60 : $(left) - 45 )) --out "$OUT"
  quote bench_quick "copy bandwidth|wrote |warning" 4
else
  if [ "$DRY" = 1 ] || [ -z "$SANITIZER" ]; then
    note "racecheck skipped (DRY or no compute-sanitizer)"
  else
    step racecheck 60 "$SANITIZER" --tool racecheck --error-exitcode 1 $PY benchmarks/sanitize_case.py --racecheck
    quote racecheck "ERROR SUMMARY|RACECHECK SUMMARY" 2
    # the kernels share no memory; synccheck checks their warp shuffles after early returns
    step synccheck 60 "$SANITIZER" --tool synccheck --error-exitcode 1 $PY benchmarks/sanitize_case.py --racecheck
    quote synccheck "ERROR SUMMARY" 1
  fi
  if [ "$DRY" = 1 ] || [ -z "$NCU" ]; then
    note "ncu skipped (DRY or no ncu)"
  else
    # Every launch of the four ops (two of each, 8 launches: the report reads the second, warm
    # one); clocks left alone (the device machine refuses to lock them): percentages and counts,
    # not times. The filter matches a part of the demangled name: keep it to base names.
    step ncu 150 "$NCU" --kernel-name-base demangled --kernel-name regex:"$NCU_KERNELS" --launch-count 12 \
      --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --metrics "$($PY benchmarks/ncu_report.py --print-metrics)" -f -o "$LOGS/ncu" \
      $PY benchmarks/sanitize_case.py --ncu \
    && step ncu_csv 60 bash -c 'LC_ALL=C "$0" --import "$1" --page raw --csv --print-units base \
         --print-kernel-base demangled >"$2"' "$NCU" "$LOGS/ncu.ncu-rep" "$LOGS/ncu.csv" \
    && step ncu_details 60 "$NCU" --import "$LOGS/ncu.ncu-rep" --page details \
    && step ncu_report 30 $PY benchmarks/ncu_report.py "$LOGS/ncu.csv" --tokens "$NCU_TOKENS" \
         --gpu "$GPU" --commit "$COMMIT" --out "$OUT" \
    && quote ncu_report "ncu_report:" 8
  fi
  step profile 90 $PY benchmarks/profile_ops.py --device "$DEVICE" --out "$LOGS"
  # The sweep stops itself 45 s before the budget ends and writes what it measured.
  if [ "$(left)" -gt 120 ]; then
    step bench 600 $PY benchmarks/bench_cache_ops.py --device "$DEVICE" --budget-s $(( $(left) - 45 )) \
      --out "$OUT" && quote bench "copy bandwidth|wrote |warning" 4
  else
    note "bench (the sweep) skipped: $(left) s left"
  fi
fi
note "phase $PHASE done in $SECONDS s, status $status"
exit "$status"
