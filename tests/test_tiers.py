"""The two test tiers: the README gives them, .ci/run runs them exactly as given, and the guard
catches a test that starts an engine, a server or a fresh environment outside the engine tier
(by what it starts, never by its time)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import tiers

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> tuple[list[str], str]:
    """The commands of the README's opening block, and the engine tier's from the line after it."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```bash\n(.*?)\n```\n([^\n]*)\n", text, re.S)
    assert m, "the README opens with no bash block"
    lines = [line.split("#")[0].strip() for line in m.group(1).splitlines()]
    engine = re.findall(r"`([^`]+)`", m.group(2))
    assert len(engine) == 1 and "engine tier" in m.group(2), m.group(2)
    return lines, engine[0]


def test_the_readme_opens_with_setup_and_the_fast_tier_then_gives_the_engine_tier():
    lines, engine = readme_commands()
    assert lines == ["bash scripts/setup.sh", tiers.FAST_COMMAND]
    assert engine == tiers.ENGINE_COMMAND


def test_ci_runs_both_tiers_exactly_as_the_readme_gives_them():
    lines, engine = readme_commands()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if not line.strip().startswith("#")]
    assert any(line.startswith(lines[0]) for line in ci), lines[0]  # setup.sh (and its options)
    for command in (lines[1], engine):
        runs = [line for line in ci if line.endswith(command + " ;;") or line == command]
        assert len(runs) == 1, (command, runs)
    assert "for tier in fast engine; do" in ci  # both tiers, every run
    assert "exit \"$rc\"" in ci[-1]


CASES = {  # what a test may not start outside the engine tier, each as a test body
    "venv_by_command": "subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(tmp_path / 'e')], check=True)",
    "venv_by_call": "venv.create(tmp_path / 'e', with_pip=False)",
    "router": "subprocess.run(['/nonexistent/bin/vllm-router', '--port', '1'])",
    "server_in_a_shell": "subprocess.run(['bash', '-c', 'python -m vllm.entrypoints.openai.api_server --port 1'])",
    "engine_by_the_harness": "from kvc_harness.engines import Engines; Engines('m').start('a', 16, 0)",
    "engine_by_vllm": "from kvc_harness.tier import vllm_plugin; vllm_plugin()",  # vLLM calls it
}
ORDINARY = ("out = subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"KVC_TEST_TIER\"])'],"
            " capture_output=True, text=True, env={'PATH': '/usr/bin'}).stdout; assert out.strip() == 'fast'")
MARKED = CASES["venv_by_command"] + "; import os; assert 'KVC_TEST_TIER' not in os.environ"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[str, dict[str, str]]]:
    """One test file (each case unmarked, an ordinary test, and an engine-marked one) run by a
    pytest of its own with the tier plugin, as the fast tier and as the engine tier: its output
    and each test's outcome."""
    import os
    import subprocess
    folder = tmp_path_factory.mktemp("inner")
    body = ["import subprocess, sys, venv", "import pytest", ""]
    for name, code in CASES.items():
        body += [f"def test_{name}(tmp_path):", f"    {code}", ""]
    body += ["def test_ordinary():", f"    {ORDINARY}", "",
             "@pytest.mark.engine", "def test_marked(tmp_path):", f"    {MARKED}", ""]
    (folder / "test_inner.py").write_text("\n".join(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    out = {}
    for tier, extra in (("fast", []), ("engine", ["-m", "engine"])):
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "tiers", "-p", "no:cacheprovider",
                            "-rA", "-q", "--rootdir", str(folder), "test_inner.py", *extra],
                           cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        out[tier] = (r.stdout + r.stderr, {test: what for what, test in
                                             re.findall(r"^(PASSED|FAILED|ERROR) test_inner.py::(\w+)",
                                                        r.stdout, re.M)})
    return out


@pytest.mark.parametrize("case", CASES)
def test_a_test_outside_the_engine_tier_that_starts_one_fails(runs, case):
    log, outcomes = runs["fast"]
    assert outcomes.get(f"test_{case}") == "FAILED", log[-3000:]
    failure = log.split(f"test_{case} ")[1] if f"test_{case} " in log else log
    assert "TierError" in log and "engine tier" in failure, log[-3000:]


def test_an_ordinary_test_runs_and_its_processes_inherit_the_fast_tier(runs):
    log, outcomes = runs["fast"]
    assert outcomes.get("test_ordinary") == "PASSED", log[-3000:]


def test_a_marked_test_is_left_out_of_the_fast_tier_and_runs_in_the_engine_one(runs):
    log, outcomes = runs["fast"]
    assert "test_marked" not in outcomes and "1 deselected" in log, log[-3000:]
    assert "1 engine-tier test(s) left out" in log and tiers.ENGINE_COMMAND in log  # and how
    tail = [line for line in log.splitlines() if line.strip()][-3:]  # last, before the counts
    assert "left out" in tail[0] and "test_inner.py (1)" in tail[0], tail
    assert tail[1] == f"run them with: {tiers.ENGINE_COMMAND}" and "deselected" in tail[2], tail
    log, outcomes = runs["engine"]
    assert outcomes == {"test_marked": "PASSED"}, log[-3000:]


@pytest.mark.parametrize("args,what", [
    (["python3", "-m", "venv", "x"], "a fresh environment"),
    ("virtualenv x", "a fresh environment"),
    ([Path("/a/.venv-vllm/bin/vllm-router"), "--port", "1"], "vllm-router (a server)"),
    (["bash", "-c", "$PY -m vllm.entrypoints.openai.api_server --model m"], "vLLM's OpenAI server"),
    (["vllm", "serve", "m"], "vLLM's OpenAI server"),
    ([sys.executable, "-m", "pytest", "-q", "tests/vllm_env"], None),
    (["pip", "install", "vllm-router==0.1.17"], None),
    (["ninja", "-v"], None),
])
def test_what_the_guard_refuses(args, what):
    assert tiers.refusal(args) == what
