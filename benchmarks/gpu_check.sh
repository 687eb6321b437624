#!/usr/bin/env bash
# Device check, for a machine with an NVIDIA GPU (e.g. the H200 test machine, which reaches no
# package registry: everything runs on its own torch and tools). In order, so the most important
# finish first: build in place, the test suite (CUDA cases included), compute-sanitizer memcheck
# on a small case of every kernel and racecheck on one write and one gather, the benchmark's
# quick mode, ncu on dsa_write and gather_mla at T = 16384 (DRAM throughput, issue slots, stall
# reasons, instructions executed), the torch.profiler cross-check; FULL=1 adds the full sweep.
#
#   OUT=/tmp/out [FULL=1] [BUDGET_S=540] bash benchmarks/gpu_check.sh
#
# Every step runs under a timeout inside BUDGET_S seconds (the benchmarks stop themselves and
# write what they measured), so the script ends before a remote command limit kills it.
# $OUT ends up holding at most 8 files: summary.txt, logs.tgz (every step's log, the machine's
# description, the profiler tables) and bench_cuda_quick.* / bench_cuda.* (md, json, png).
# DRY=1 runs the same steps on a machine without a GPU (CPU device, no sanitizer), to test
# this script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/gpu_check}
LOGS=$OUT/logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
DRY=${DRY:-0}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}

if [ "$DRY" != 1 ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); run this on a GPU machine" >&2
  exit 3
fi
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

SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
{
  date -u; git rev-parse HEAD 2>/dev/null; uname -a
  nvidia-smi 2>&1; nvcc --version 2>&1 | tail -2; "${SANITIZER:-compute-sanitizer}" --version 2>&1 | head -2
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" 2>&1
} >"$LOGS/machine.txt"
note "device=$DEVICE budget=${BUDGET_S}s full=${FULL:-0} commit=$(git rev-parse --short HEAD 2>/dev/null)"

step build 300 $PY setup.py build_ext --inplace || exit 1
step tests 300 $PY -m pytest -q -rfE -p no:cacheprovider tests
grep -E "passed|failed" "$LOGS/tests.log" | tail -1 | sed 's/^/gpu_check: tests: /' \
  | tee -a "$OUT/summary.txt"
if [ "$DRY" = 1 ]; then
  note "memcheck skipped (DRY)"
elif [ -n "$SANITIZER" ]; then
  step memcheck 180 "$SANITIZER" --tool memcheck --error-exitcode 1 $PY benchmarks/sanitize_case.py
  grep -E "ERROR SUMMARY" "$LOGS/memcheck.log" | sed 's/^/gpu_check: memcheck: /' | tee -a "$OUT/summary.txt"
else
  note "compute-sanitizer not found"; status=1
fi
if [ "$DRY" != 1 ] && [ -n "$SANITIZER" ]; then
  step racecheck 90 "$SANITIZER" --tool racecheck --error-exitcode 1 $PY benchmarks/sanitize_case.py --racecheck
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/racecheck.log" | sed 's/^/gpu_check: racecheck: /' \
    | tee -a "$OUT/summary.txt"
fi
step bench_quick 150 $PY benchmarks/bench_cache_ops.py --device "$DEVICE" --quick --budget-s 90 --out "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ "$DRY" != 1 ] && [ -n "$NCU" ]; then
  # The second launch of each kernel (-s skips the first): sections for DRAM throughput and
  # issue-slot use, warp stall reasons, and instructions executed (checks sass_report.py's count).
  step ncu 150 "$NCU" --kernel-name regex:"dsa_kernel|mla_gather_kernel" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
    --metrics smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $PY benchmarks/sanitize_case.py --ncu
  grep -E "dsa_kernel|mla_gather_kernel|DRAM Throughput|Issue Slots Busy|Stall|inst_executed" \
    "$LOGS/ncu.log" | head -40 | sed 's/^/gpu_check: ncu: /' >> "$OUT/summary.txt"
fi
step profile 120 $PY benchmarks/profile_ops.py --device "$DEVICE" --out "$LOGS"
if [ "${FULL:-0}" = 1 ]; then
  # The sweep stops itself 45 s before the budget ends and writes what it measured.
  step bench 600 $PY benchmarks/bench_cache_ops.py --device "$DEVICE" --budget-s $(( $(left) - 45 )) \
    --out "$OUT"
fi
note "done in $SECONDS s, status $status"
exit "$status"
