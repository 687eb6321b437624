"""The suite's two tiers, and the guard that keeps the fast one fast.

- The fast tier (`pytest -q`, no `-m`): everything that starts no vLLM engine, no server and no
  fresh environment. Tests marked `engine` are left out, and the run ends by saying how many and
  the command that runs them.
- The engine tier (`pytest -q -m engine`): the tests marked `engine`.

Outside the engine tier a test runs under a guard that looks at what it starts, never at its
time: a command that makes a venv, starts vLLM's OpenAI server or vllm-router fails it here, and
every process it starts inherits KVC_TEST_TIER=fast, under which a vLLM engine refuses to start
(kvc_harness's vLLM plugin, loaded by every process vLLM starts, and the harness's own launchers).
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import venv
from pathlib import Path
from typing import Iterator

import pytest

ENGINE = "engine"
FAST_COMMAND = ".venv/bin/python -m pytest -q"
ENGINE_COMMAND = ".venv/bin/python -m pytest -q -m engine"
ENV = "KVC_TEST_TIER"  # kvc_harness.tier reads it (keep the two names the same)
_LEFT_OUT = pytest.StashKey[dict]()  # {file: engine-tier tests of it left out}

# What a command line may not start outside the engine tier, and why (a shell's -c text is read
# as a command line too).
FORBIDDEN = [
    (re.compile(r"(^|\s)-m\s*(venv|virtualenv)\b|(^|[\s/])virtualenv\s|(^|[\s/])uv\s+venv\b"),
     "a fresh environment"),
    (re.compile(r"(^|[\s/])vllm-router(\s|$)"), "vllm-router (a server)"),
    (re.compile(r"vllm\.entrypoints|(^|[\s/])vllm\s+serve\b"), "vLLM's OpenAI server"),
]


class TierError(RuntimeError):
    """A test outside the engine tier started an engine, a server or a fresh environment."""


def refusal(args) -> str | None:
    """What the command `args` (as subprocess takes it) would start that the fast tier may not,
    or None."""
    parts = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    line = " ".join(os.fsdecode(a) for a in parts)
    for pattern, what in FORBIDDEN:
        if pattern.search(line):
            return what
    return None


def _refuse(what: str, command: str) -> None:
    raise TierError(f"this test starts {what} ({command[:200]!r}) outside the engine tier: mark "
                    f"it @pytest.mark.{ENGINE} (the engine tier runs it: {ENGINE_COMMAND})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{ENGINE}: starts a vLLM engine, a server or a fresh "
                                       f"environment: the engine tier ({ENGINE_COMMAND})")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a -m expression, leave the engine tier out (and count what was left out)."""
    if config.option.markexpr:
        return
    kept = [i for i in items if not i.get_closest_marker(ENGINE)]
    left = [i for i in items if i.get_closest_marker(ENGINE)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    by_file: dict[str, int] = {}
    for i in left:
        by_file[i.nodeid.split("::")[0]] = by_file.get(i.nodeid.split("::")[0], 0) + 1
    config.stash[_LEFT_OUT] = by_file


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """A test runs (its fixtures' set-up and tear-down included) under its tier's environment."""
    with guard(item):
        yield


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config):
    """Last before the closing counts (after the durations and the skip reasons): what the fast
    tier left out, and the command that runs it."""
    try:
        return (yield)
    finally:
        left = config.stash.get(_LEFT_OUT, {})
        if left:
            terminalreporter.write_sep("-", "engine tier")
            terminalreporter.write_line(
                f"fast tier: {sum(left.values())} engine-tier test(s) left out (they start vLLM "
                f"engines, servers or fresh environments): "
                + ", ".join(f"{f} ({n})" for f, n in sorted(left.items())))
            terminalreporter.write_line(f"run them with: {ENGINE_COMMAND}")


@contextlib.contextmanager
def _env(value: str | None) -> Iterator[None]:
    before = os.environ.get(ENV)
    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


@contextlib.contextmanager
def guard(item: pytest.Item) -> Iterator[None]:
    """An engine-tier test runs as it is (KVC_TEST_TIER unset). Any other runs with
    KVC_TEST_TIER=fast for it and every process it starts, and may not run a command that starts
    a server or a venv, nor venv.create."""
    if item.get_closest_marker(ENGINE):
        with _env(None):
            yield
        return
    init, create = subprocess.Popen.__init__, venv.EnvBuilder.create

    def popen_init(self, args, *a, **kw):
        what = refusal(args)
        if what:
            _refuse(what, args if isinstance(args, str) else " ".join(map(str, args)))
        env = kw.get("env")
        if env is not None and env.get(ENV) != "fast":
            kw["env"] = dict(env, **{ENV: "fast"})
        return init(self, args, *a, **kw)

    def venv_create(self, env_dir, *a, **kw):
        _refuse("a fresh environment", f"venv.create({Path(env_dir)})")

    subprocess.Popen.__init__ = popen_init
    venv.EnvBuilder.create = venv_create
    try:
        with _env("fast"):
            yield
    finally:
        subprocess.Popen.__init__, venv.EnvBuilder.create = init, create
