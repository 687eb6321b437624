#!/usr/bin/env bash
# Sets up a fresh machine and runs the main job:
#   .venv with torch (CUDA build) and the tools, the extension built in place (CPU kernels,
#   plus CUDA kernels when nvcc is found), then `python -m kvcache_ext demo`.
# Options: --no-demo (set up only), --browser (also install Debian's chromium + chromedriver,
# which the page tests use; needs root and apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

demo=1 browser=0
for arg in "$@"; do
  case "$arg" in
    --no-demo) demo=0 ;;
    --browser) browser=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

if [ "$browser" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
# CUDA_HOME: the nvcc on PATH may be a wrapper script; setup.py prefers /usr/local/cuda.
MAX_JOBS=${MAX_JOBS:-$(nproc)} .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
.venv/bin/python -c "import kvcache_ext.ops.library as e; print('kvcache_ext built; CUDA kernels:', e.has_cuda_kernels())"

if [ "$demo" = 1 ]; then
  .venv/bin/python -m kvcache_ext demo
fi
