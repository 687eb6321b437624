"""The README's install into an environment that already has torch: its command, as written in
the README, run in a fresh venv holding only the CPU torch 2.13.0 wheel these machines keep on
disk (no second torch is built or downloaded); the installed package then loads its own compiled
library (CPU kernels: that torch has no CUDA) and passes a smoke test against the reference."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- run by: tests/test_install.py"


def readme_command() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(re.escape(MARK) + r"[^\n]*\n```bash\n(.*?)\n```", text, re.S)
    assert m, "the README's install block (marked for this test) is missing"
    return m.group(1).strip()


SMOKE = """
import sys, torch, kvcache_ext as kvc, kvcache_ext._C as C
from kvcache_ext import reference as R
import kvcache_ext.ops.library as lib
assert sys.prefix in C.__file__, C.__file__
assert not lib.has_cuda_kernels() and torch.__version__.startswith("2.13.0")
plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)], 8, 64, "BLNHC")
got, want = kvc.allocate(plan, fill=0), kvc.allocate(plan, fill=0)
slots = kvc.slot_mapping(torch.tensor([0, 1, 5], dtype=torch.int32), torch.arange(150), 64)
kv_c, k_pe, k = (torch.randn(150, n).bfloat16() for n in (512, 64, 128))
kvc.ops.dsa_write(kv_c, k_pe, got.view("mla", 1), k, got.view("indexer", 1), slots)
R.dsa_write(kv_c, k_pe, want.view("mla", 1), k, want.view("indexer", 1), slots)
assert torch.equal(got.buffer, want.buffer)
print("installed:", C.__file__, kvc.ops.library.cpu_isa())
"""


@pytest.mark.engine  # a fresh venv and a build of the extension in it
def test_readme_install_into_an_environment_with_torch(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    # the README's command, run as written, in the tree (its own build folder for this test)
    env |= {"KVC_BUILD_DIR": str(ROOT / "build" / "install-test"), "MAX_JOBS": str(os.cpu_count() or 2)}
    r = subprocess.run(["bash", "-c", readme_command()], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    frozen = subprocess.run([str(py), "-m", "pip", "freeze"], env=env, capture_output=True,
                            text=True).stdout
    assert "torch==2.13.0" in frozen and frozen.count("torch") == 1, frozen  # that torch, untouched
    r = subprocess.run([str(py), "-c", SMOKE], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert str(venv) in r.stdout


def test_setup_sh_uses_the_same_command():
    assert readme_command().split("&&")[-1].strip().replace("python -m pip", "").strip() in \
        (ROOT / "scripts" / "setup.sh").read_text().replace(".venv-vllm/bin/python -m pip", "").replace(" -q", "")
