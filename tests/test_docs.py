"""The documentation: `mkdocs build --strict` (warnings and broken links fail), the op reference
generated from the code holds every public op wrapper, the interactive layout page is what the
CLI writes today, and every `bash` / `python` block of README.md and docs/*.md runs -- or says on
the line before it why not (`<!-- not run: reason -->`, or `<!-- run by: tests/X.py ... -->`
naming the test that runs it). Blocks run in a scratch folder holding links to the tree's
top-level entries (relative paths work, files they write stay out of the tree), python blocks
with .venv's python, bash blocks with .venv/bin first on PATH."""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvcache_ext as kvc
from kvcache_ext.ops import v4 as ops_v4

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(bash|python)\s*$")
MARK = re.compile(r"^<!-- (not run|run by): (.+?) -->\s*$")
TIMEOUT_S = {"docs/vllm.md": 900}


def blocks() -> list[tuple[str, int, str, str, str]]:
    """(page, line, language, code, mark) of every bash / python block; mark '' = run here."""
    out = []
    for page in PAGES:
        lines = page.read_text().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
                mark = MARK.match(prev)
                out.append((str(page.relative_to(ROOT)), i + 1, m.group(1),
                            "\n".join(lines[i + 1:end]), mark.group(0) if mark else ""))
                i = end
            i += 1
    return out


BLOCKS = blocks()


def test_every_block_is_run_or_says_why_not():
    for page, line, _, _, mark in BLOCKS:
        if mark.startswith("<!-- run by:"):
            test = re.search(r"tests/[\w/]+\.py", mark)
            assert test and (ROOT / test.group(0)).exists(), (page, line, mark)
            assert f"{page}" in (ROOT / test.group(0)).read_text() or page == "README.md", (page, line)
        elif mark:
            assert len(mark) > len("<!-- not run:  -->") + 10, f"{page}:{line}: give the reason"
    assert sum(not m for *_, m in BLOCKS) >= 7  # the usage example, CLI lines, served commands...


def scratch(tmp_path: Path) -> Path:
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def starts_engines(code: str) -> bool:
    """A block that starts vLLM engines or servers runs in the engine tier."""
    return ".venv-vllm" in code


@pytest.mark.parametrize("page,line,lang,code", [
    pytest.param(*b[:4], id=f"{b[0]}:{b[1]}",
                 marks=[pytest.mark.engine] if starts_engines(b[3]) else [])
    for b in BLOCKS if not b[4]])
def test_block_runs(tmp_path, page, line, lang, code):
    if page == "docs/vllm.md" and not (ROOT / ".venv-vllm" / "bin" / "vllm-router").exists():
        if os.environ.get("KVC_REQUIRE_VLLM") == "1":
            pytest.fail("KVC_REQUIRE_VLLM=1 but .venv-vllm has no vllm-router: run scripts/setup.sh")
        pytest.skip("needs .venv-vllm with vllm-router (scripts/setup.sh)")
    cwd = scratch(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1",
               PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S.get(page, 300), start_new_session=True)
    assert r.returncode == 0, f"{page}:{line} exited {r.returncode}:\n{(r.stdout + r.stderr)[-4000:]}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built from a folder outside the clone (`mkdocs build -f <clone>/mkdocs.yml`):
    every path the config names is taken from the config's folder, not the working directory."""
    out, elsewhere = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("elsewhere")
    r = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-f",
                        str(ROOT / "mkdocs.yml"), "-d", str(out)],
                       cwd=elsewhere, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "WARNING" not in r.stderr, r.stderr[-4000:]
    return out


def test_the_site_builds_strictly(site):
    for page in ("index.html", "layouts/index.html", "vllm/index.html", "formats/index.html",
                 "layout-explorer.html", "benchmarks/index.html"):
        assert (site / page).exists(), page


def test_every_public_op_wrapper_is_in_the_reference(site):
    html = (site / "api" / "index.html").read_text()
    names = [n for n in kvc.ops.__all__ if callable(getattr(kvc.ops, n))]
    v4 = [n for n, f in inspect.getmembers(ops_v4, inspect.isfunction)
          if not n.startswith("_") and f.__module__ == ops_v4.__name__]
    missing = [n for n in names + v4 if not re.search(rf'id="kvcache_ext\.ops\.\w+\.{n}"', html)]
    assert not missing and len(names) >= 12 and len(v4) >= 10, missing


def test_the_layout_explorer_is_what_the_cli_writes(tmp_path):
    out = tmp_path / "page.html"
    subprocess.run([sys.executable, "-m", "kvcache_ext", "layout", "--layout", "BLHNC", "--layout",
                    "LBNHC", "--html", str(out)], check=True, capture_output=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.read_text() == (ROOT / "docs" / "layout-explorer.html").read_text(), \
        "regenerate docs/layout-explorer.html with the command in docs/layout-explorer.md"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), link
