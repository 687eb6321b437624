"""Capacity figures of seed 004."""
import pytest

import kvcache_ext as kvc
from kvcache_ext.capacity import ModelKV, local_kv_heads, max_num_blocks, rank_kv, request_slots

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
