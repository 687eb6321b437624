"""benchmarks/results/ holds one current result per published configuration, under plain names;
earlier runs are rows of one history table per benchmark (benchmarks/results/history/), never
copies of their files; every results file the docs, README and scripts name exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HISTORY = RESULTS / "history"
NAMED_IN = ([ROOT / "README.md", ROOT / ".ci" / "run"] + sorted((ROOT / "docs").glob("*.md"))
            + sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.sh"))
            + sorted((ROOT / "tests").glob("*.py")))
COMMIT = re.compile(r"_[0-9a-f]{7}(_\w+)?$")  # a run kept under its commit (vllm_pd_cpu_d643216_2)


def test_no_earlier_run_is_kept_as_a_file():
    kept = [p.name for p in RESULTS.iterdir() if p.is_file() and COMMIT.search(p.stem)]
    assert not kept, f"earlier runs go into {HISTORY.relative_to(ROOT)}/<benchmark>.md as rows: {kept}"
    assert all(p.suffix in (".json", ".md", ".png", ".svg", ".csv") for p in RESULTS.iterdir()
               if p.is_file())


def test_each_current_result_has_its_json_and_markdown():
    stems = {p.stem for p in RESULTS.iterdir() if p.is_file()}
    for stem in stems:
        assert (RESULTS / f"{stem}.json").exists() and (RESULTS / f"{stem}.md").exists(), stem


def test_every_history_table_has_a_row_per_run_with_commit_date_host():
    tables = sorted(HISTORY.glob("*.md"))
    assert len(tables) >= 3
    for table in tables:
        lines = [line for line in table.read_text().splitlines() if line.startswith("|")]
        head = [c.strip() for c in lines[0].strip("|").split("|")]
        assert head[:3] == ["commit", "date (UTC)", "host"], (table.name, head)
        rows = lines[2:]
        assert len(rows) >= 2, table.name
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert len(cells) == len(head), (table.name, row[:120])
            assert re.fullmatch(r"[0-9a-f]{7}", cells[0]), (table.name, cells[0])
        assert sum("(current)" in row for row in rows) >= 1, table.name


def test_every_results_file_named_in_the_docs_and_scripts_exists():
    missing = []
    for page in NAMED_IN:
        for name in re.findall(r"benchmarks/results/([\w./<>*{},-]*[\w*}])", page.read_text()):
            if "<" in name:  # a pattern in prose (bench_<device>.json)
                continue
            m = re.fullmatch(r"(.*)\{(.*)\}(.*)", name)  # sass_{before,after}.md
            names = [m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")] if m else [name]
            for n in names:
                if not (list(RESULTS.glob(n)) if "*" in n else (RESULTS / n).exists()):
                    missing.append(f"{page.relative_to(ROOT)}: {n}")
    assert not missing, missing


def test_every_earlier_run_the_docs_name_is_a_history_row():
    history = "\n".join(t.read_text() for t in HISTORY.glob("*.md"))
    named = set()
    for page in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
        named |= set(re.findall(r"\b([a-z][a-z0-9_]*_[0-9a-f]{7}(?:_[a-z0-9]+)?)\.(?:json|md|\*)",
                                page.read_text()))
    assert named  # the docs do name earlier runs (vllm_pd_cpu_d643216_2.* ...)
    missing = sorted(n for n in named if f"`{n}.*`" not in history and f"`{n}." not in history)
    assert not missing, f"named in the docs, in no row of {HISTORY.relative_to(ROOT)}: {missing}"
