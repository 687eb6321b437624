"""Capacity figures of seed 004, and of this project's own caches (specs, model presets)."""
import pytest

import kvcache_ext as kvc
from kvcache_ext.plan.capacity import (ModelKV, local_kv_heads, max_num_blocks, pool_for_budget,
                                  pp_stage_layers, rank_cache, rank_kv, rank_specs, request_slots)
from kvcache_ext.cli import main
from kvcache_ext.plan.presets import preset, preset_names

QWEN = ModelKV(num_layers=28, num_kv_heads=8, head_dim=128, bytes_per_elem=2)
KIB, MIB = 1024, 1024 * 1024


def test_bytes_per_token():
    assert rank_kv(QWEN, 1).bytes_per_token == 114688 == 112 * KIB
    assert rank_kv(QWEN, 4096).effective_bytes == 448 * MIB


@pytest.mark.parametrize("tp,kib", [(1, 112), (2, 56), (4, 28), (8, 14), (16, 14)])
def test_tensor_parallel(tp, kib):
    assert rank_kv(QWEN, 1, tp=tp).bytes_per_token == kib * KIB


def test_replication_when_tp_exceeds_heads():
    assert local_kv_heads(8, 16) == 1
    assert local_kv_heads(8, 4) == 2
    with pytest.raises(ValueError, match="divisible"):
        local_kv_heads(8, 3)


def test_tp4_pp2_block16():
    r = rank_kv(QWEN, 4096, tp=4, pp=2, block_size=16)
    assert (r.local_layers, r.local_kv_heads, r.allocated_tokens) == (14, 2, 4096)
    assert r.allocated_bytes == 56 * MIB


def test_effective_vs_rounded():
    assert request_slots([17, 32], 16) == (49, 64)
    per_token = rank_kv(QWEN, 1).bytes_per_token
    assert 49 * per_token == 5488 * KIB
    assert 64 * per_token == 7 * MIB
    r = rank_kv(QWEN, 17, block_size=16)
    assert (r.effective_bytes, r.allocated_bytes) == (17 * per_token, 32 * per_token)


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_pool_sizing(layout):
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)]
    make = lambda n: kvc.plan_cache(specs, num_blocks=n, block_size=64, layout=layout)  # noqa: E731
    budget = 10 * 100864 + 5
    assert max_num_blocks(make, budget) == 10
    assert max_num_blocks(make, 100863) == 0
    assert max_num_blocks(make, 100864 * 1000) == 1000


# ---- this project's own caches: specs, presets, TP replication, pools (issue 10, item 12) ----
DSA_PER_TOKEN = 61 * (656 + 132)  # 48068 B = 46.94 KiB, the same on every TP rank


def capacity(capsys, *args: str) -> str:
    assert main(["capacity", *args]) == 0
    return capsys.readouterr().out


def test_deepseek_v32_preset_is_the_dsa_pair():
    p = preset("deepseek-v3.2")
    assert [(s.name, s.row_bytes, s.num_layers, s.num_heads) for s in p.specs] == \
        [("mla", 656, 61, 1), ("indexer", 132, 61, 1)]
    assert DSA_PER_TOKEN == 48068 and round(DSA_PER_TOKEN / KIB, 2) == 46.94


@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_mla_and_indexer_rows_are_replicated_on_every_tp_rank(tp):
    assert rank_cache(preset("deepseek-v3.2").specs, 1, tp=tp).bytes_per_token == DSA_PER_TOKEN


@pytest.mark.parametrize("tp", ["1", "8"])
def test_capacity_model_deepseek(capsys, tp):
    out = capacity(capsys, "--model", "deepseek-v3.2", "--tp", tp)
    model, rank = out.splitlines()[:2]
    assert "46.9414 KiB/token (48068 B)" in model and "46.9414 KiB/token (48068 B)" in rank
    assert ("replicated on every TP rank" in rank) == (tp == "8")


def test_capacity_specs_match_the_preset(capsys):
    out = capacity(capsys, "--spec", "mla:656", "--spec", "indexer:132", "--layers", "61", "--tp", "8")
    assert out.count("(48068 B)") == 2
    old = capacity(capsys, "--kv-heads", "1", "--head-dim", "576", "--dtype-bytes", "1", "--layers", "61")
    assert "(70272 B)" in old and "K and V" in old  # the K+V wording stays for K/V shapes


@pytest.mark.parametrize("name,tp1", [("llama-3.1-8b", 32 * 2 * 8 * 256), ("qwen2.5-7b", 28 * 2 * 4 * 256),
                                      ("llama-3.1-70b", 80 * 2 * 8 * 256)])
def test_gqa_presets_split_heads_over_tp(name, tp1):
    specs = preset(name).specs
    assert rank_cache(specs, 1).bytes_per_token == tp1
    assert rank_cache(specs, 1, tp=2).bytes_per_token == tp1 // 2
    heads = specs[0].num_heads
    assert rank_cache(specs, 1, tp=2 * heads).bytes_per_token == tp1 // heads  # one head, replicated


def test_gqa_preset_cli_halves_from_tp1_to_tp2(capsys):
    one = capacity(capsys, "--model", "llama-3.1-8b").splitlines()[1]
    two = capacity(capsys, "--model", "llama-3.1-8b", "--tp", "2").splitlines()[1]
    assert "128 KiB/token (131072 B)" in one and "64 KiB/token (65536 B)" in two
    fp8 = capacity(capsys, "--model", "llama-3.1-8b", "--dtype-bytes", "1").splitlines()[0]
    assert "64 KiB/token (65536 B)" in fp8


def test_pp_splits_layers_like_vllm():
    assert pp_stage_layers(61, 2) == [31, 30] and pp_stage_layers(61, 4) == [15, 15, 16, 15]
    assert pp_stage_layers(28, 2) == [14, 14]
    assert [s.num_layers for s in rank_specs(preset("deepseek-v3.2").specs, tp=8, pp=2)] == [31, 31]
    with pytest.raises(ValueError, match="must not exceed"):
        pp_stage_layers(2, 3)


@pytest.mark.parametrize("name,tp,gib,layout", [("deepseek-v3.2", 8, 1.5, "BLHNC"),
                                                ("llama-3.1-8b", 2, 0.75, "LBNHC"),
                                                ("qwen2.5-7b", 8, 3, "BHLNC")])
def test_budget_sizes_the_largest_plan_that_fits(name, tp, gib, layout):
    p = preset(name)
    specs = rank_specs(p.specs, tp)
    budget = int(gib * 2**30)
    pool = pool_for_budget(specs, budget, p.block_size, layout)
    assert pool.num_blocks > 0 and pool.tokens == pool.num_blocks * p.block_size
    fits = kvc.plan_cache(specs, pool.num_blocks, p.block_size, layout).total_bytes
    assert fits == pool.total_bytes <= budget
    assert kvc.plan_cache(specs, pool.num_blocks + 1, p.block_size, layout).total_bytes > budget


def test_capacity_budget_on_the_command_line(capsys):
    out = capacity(capsys, "--model", "deepseek-v3.2", "--tp", "8", "--budget-gib", "1")
    n = (2**30) // (64 * DSA_PER_TOKEN)  # one block holds 64 tokens of every layer of both specs
    assert f"at block 64: {n} blocks = {n * 64} tokens" in out
    out = capacity(capsys, "--budget-gib", "1", "--block-size", "16", "--tp", "2")
    n = (2**30) // (16 * 57344)
    assert f"at block 16: {n} blocks = {n * 16} tokens" in out


def test_every_preset_cites_its_source():
    for name in preset_names():
        p = preset(name)
        assert "config.json" in p.source and p.block_size > 0
