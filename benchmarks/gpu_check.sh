#!/usr/bin/env bash
# Device check, for a machine with an NVIDIA GPU (e.g. the H200 test machine, which reaches no
# package registry: everything runs on its own torch and tools). Builds the extension in place,
# runs the test suite (CUDA cases included), compute-sanitizer memcheck on a small case, and the
# benchmark (quick mode; FULL=1 for the full sweep). Logs and results go under $OUT.
#   OUT=/tmp/out bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); run this on a GPU machine" >&2
  exit 3
fi
status=0
step() {  # step NAME CMD...: run, log to $OUT/NAME.log, remember failures
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "gpu_check: $name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || { status=1; tail -25 "$OUT/$name.log"; }
  return "$rc"
}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
$PY -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
  | tee "$OUT/versions.txt"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
step build $PY setup.py build_ext --inplace || exit 1
step tests $PY -m pytest -q -x tests -p no:cacheprovider
if command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 $PY benchmarks/sanitize_case.py
else
  echo "gpu_check: compute-sanitizer not found" | tee -a "$OUT/summary.txt"; status=1
fi
if [ "${FULL:-0}" = 1 ]; then
  step bench $PY benchmarks/bench_cache_ops.py --out "$OUT"
else
  step bench_quick $PY benchmarks/bench_cache_ops.py --quick --out "$OUT"
fi
exit "$status"
