"""reshape_and_cache_kv_split: K and V of a token into one split page per (block, head), K
channel-major (vLLM-CPU's attention page: the plan kvcache_ext.vllm builds from its tensors,
CacheSpec(split=(K bytes, V bytes), channel_major=es)) or as rows. CPU op, CUDA kernels on the
host and the reference give the same bytes in every layout, nothing outside the view changes,
and what the transfer plans read from such a page is the token's K and V."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as R

from conftest import guarded

T, H, N = 11, 2, 8


def plan_for(layout: str, dk: int, dv: int, es: int, channel_major: bool) -> kvc.CachePlan:
    spec = kvc.CacheSpec("kv", (dk + dv) * es, 2, H, split=(dk * es, dv * es),
                         channel_major=es if channel_major else None)
    return kvc.plan_cache([spec], num_blocks=5, block_size=N, layout=layout)


def inputs(dtype: torch.dtype, dk: int, dv: int):
    g = torch.Generator().manual_seed(dk * 7 + dv)
    key = torch.randn(T + 2, H, dk + 3, generator=g).to(dtype)[:, :, :dk]  # strided heads
    value = torch.randn(T + 2, H, dv, generator=g).to(dtype)
    value[3, 1, 0] = float("nan")
    slots = torch.tensor([3, 17, -1, 0, 39, 8, 9, 12, 5, 30, 21])
    return key, value, slots


@pytest.mark.parametrize("layout", ["LBHNC", "BLHNC", "LHBNC", "BHLNC"])
@pytest.mark.parametrize("dtype,dk,dv", [(torch.float32, 32, 32), (torch.bfloat16, 64, 64),
                                         (torch.float16, 24, 8)])
@pytest.mark.parametrize("channel_major", [True, False])
@pytest.mark.parametrize("impl", ["cpu", "cuda_on_host"])
def test_split_page_write_gives_the_reference_bytes(request, layout, dtype, dk, dv,
                                                    channel_major, impl):
    plan = plan_for(layout, dk, dv, dtype.itemsize, channel_major)
    gc = guarded(plan, seed=dk)
    key, value, slots = inputs(dtype, dk, dv)
    ops = kvc.ops if impl == "cpu" else request.getfixturevalue("simt")
    ops.reshape_and_cache_kv_split(key, value, gc.view("kv", 1), slots, channel_major)
    R.reshape_and_cache_kv_split(key, value, gc.expected_view("kv", 1), slots, channel_major)
    gc.assert_matches()


def test_the_transfer_plan_reads_back_each_tokens_k_and_v():
    """Token spans of the channel-major plan (what the vLLM connector moves) carry exactly the
    token's K and V: a move into a plan of another block size, then read back by index."""
    es, dk = 4, 16
    src_plan = plan_for("LBHNC", dk, dk, es, True)
    dst_plan = kvc.plan_cache([kvc.CacheSpec("kv", 2 * dk * es, 2, H, split=(dk * es, dk * es),
                                             channel_major=es)], num_blocks=12, block_size=4,
                              layout="LBHNC")
    src, dst = kvc.allocate(src_plan, fill=0), kvc.allocate(dst_plan, fill=0xFF)
    key, value = torch.randn(20, H, dk), torch.randn(20, H, dk)
    table = torch.tensor([4, 1, 3], dtype=torch.int32)
    kvc.ops.reshape_and_cache_kv_split(key, value, src.view("kv", 1),
                                       kvc.slot_mapping(table, torch.arange(20), N))
    dst_table = torch.tensor([7, 0, 11, 2, 9], dtype=torch.int32)
    kvc.copy_spans(src, dst, kvc.TransferPlan(src_plan, dst_plan).token_spans(table, dst_table, 20))
    page = dst.view("kv", 1)
    for n in range(20):
        b, pos = int(dst_table[n // 4]), n % 4
        for h in range(H):
            flat = page[b, h].reshape(-1)
            k = flat[: 4 * dk * es].view(torch.float32).reshape(dk, 4)[:, pos]
            v = flat[4 * dk * es:].view(torch.float32).reshape(4, dk)[pos]
            assert torch.equal(k, key[n, h]) and torch.equal(v, value[n, h]), (n, h)


def test_bad_input_is_refused_before_writing():
    plan = plan_for("LBHNC", 8, 8, 4, True)
    gc = guarded(plan)
    key, value, slots = inputs(torch.float32, 8, 8)
    view = gc.view("kv", 0)
    with pytest.raises(ValueError, match=r"view rows must be \(D_k \+ D_v\) x 4 = 48 bytes"):
        kvc.ops.reshape_and_cache_kv_split(key, torch.randn(T, H, 4), view, slots)
    with pytest.raises(TypeError, match="key and value must have one dtype"):
        kvc.ops.reshape_and_cache_kv_split(key, value.to(torch.bfloat16), view, slots)
    with pytest.raises(IndexError, match="slot_mapping"):
        kvc.ops.reshape_and_cache_kv_split(key, value, view, torch.full((T,), 40))
    gc.assert_unchanged()
    wide = guarded(kvc.plan_cache([kvc.CacheSpec("kv", 80, 1, H)], num_blocks=5, block_size=N))
    with pytest.raises(ValueError, match="must have contiguous pages"):
        kvc.ops.reshape_and_cache_kv_split(key, value, wide.view("kv", 0)[..., :64], slots)
    wide.assert_unchanged()
