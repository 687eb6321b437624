"""kvcache_ext.hf.PagedCache: transformers models generate from a paged kvcache_ext cache.

Tiny random-weight Llama, Qwen2 and Qwen3 (head_dim != hidden / heads) configurations are built
here (no download). A batch of prompts of different lengths, left-padded, is generated greedily
with transformers' DynamicCache and with PagedCache: the tokens must be identical, and the K/V
bytes in the plan must be DynamicCache's tensors. With kv_cache_dtype="fp8" the reference is
DynamicCache fed the same e4m3 round trip (x / scale -> e4m3 -> x scale, in the model dtype).

transformers is needed: these tests skip without it, unless KVC_REQUIRE_TRANSFORMERS=1 (CI),
where a missing transformers fails them.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

PROMPT_LENS = (3, 9, 6)
NEW_TOKENS = 8
VOCAB = 128


def need_transformers():
    if os.environ.get("KVC_REQUIRE_TRANSFORMERS") == "1":
        import transformers  # CI: a missing transformers is a failure, not a skip
        return transformers
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf():
    need_transformers()
    import kvcache_ext.hf as hf
    return hf


def tiny(name: str, dtype: torch.dtype):
    t = need_transformers()
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  pad_token_id=0)
    config = {"llama": lambda: t.LlamaConfig(**common),
              "qwen2": lambda: t.Qwen2Config(**common),
              "qwen3": lambda: t.Qwen3Config(**common, head_dim=24)}[name]()
    model_cls = {"llama": t.LlamaForCausalLM, "qwen2": t.Qwen2ForCausalLM,
                 "qwen3": t.Qwen3ForCausalLM}[name]
    torch.manual_seed(0)
    return model_cls(config).to(dtype).eval(), config


def prompts(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batch: input_ids and attention_mask [B, max_len]."""
    g = torch.Generator().manual_seed(seed)
    width = max(PROMPT_LENS)
    ids = torch.zeros(len(PROMPT_LENS), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(PROMPT_LENS):
        ids[r, width - n:] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask


def generate(model, cache) -> torch.Tensor:
    ids, mask = prompts()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                         do_sample=False, pad_token_id=0, past_key_values=cache)
    return out[:, ids.shape[1]:]


def cached_rows(cache, name: str, layer: int, scale=None, dtype=torch.float32) -> torch.Tensor:
    """[B, H, S, D] read back with the reference gather, through each row's block table."""
    tables = cache.block_tables()
    s = cache.get_seq_length()
    table = torch.tensor(tables, dtype=torch.int32)
    cu = torch.arange(len(tables) + 1, dtype=torch.int32) * s
    rows = ref.gather_kv(cache.kv.view(name, layer), table, cu, dtype=dtype, scale=scale)
    return rows.view(len(tables), s, *rows.shape[1:]).transpose(1, 2)


CASES = [  # (model, layout, block_size, dtype): every layout, model and dtype at least once
    ("llama", "LBNHC", 4, torch.float32),
    ("llama", "BLHNC", 1, torch.bfloat16),
    ("llama", "LHBNC", 16, torch.float16),
    ("qwen2", "LBHNC", 4, torch.bfloat16),
    ("qwen2", "BLNHC", 8, torch.float32),
    ("qwen3", "BHLNC", 4, torch.float32),
    ("qwen3", "LBNHC", 2, torch.bfloat16),
]


@pytest.mark.parametrize("name,layout,block_size,dtype", CASES)
def test_greedy_tokens_match_dynamic_cache(hf, name, layout, block_size, dtype):
    from transformers import DynamicCache
    model, config = tiny(name, dtype)
    dyn = DynamicCache(config=config)
    want = generate(model, dyn)
    paged = hf.PagedCache(config, num_blocks=64, block_size=block_size, layout=layout, dtype=dtype)
    assert torch.equal(generate(model, paged), want)
    # The plan holds exactly DynamicCache's K and V, pad tokens included.
    assert paged.get_seq_length() == dyn.get_seq_length() == max(PROMPT_LENS) + NEW_TOKENS - 1
    for layer in range(config.num_hidden_layers):
        assert torch.equal(cached_rows(paged, "k", layer, dtype=dtype), dyn.layers[layer].keys)
        assert torch.equal(cached_rows(paged, "v", layer, dtype=dtype), dyn.layers[layer].values)


def round_trip(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(1, -1, 1, 1)
    return (ref.e4m3_decode(ref.e4m3_encode(x.float() / s)) * s).to(x.dtype)


def fp8_dynamic_cache(config, k_scale, v_scale):
    from transformers import DynamicCache

    class Fp8RoundTrip(DynamicCache):
        """transformers' own cache, fed K/V through the same e4m3 round trip."""

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return super().update(round_trip(key_states, k_scale),
                                  round_trip(value_states, v_scale), layer_idx, *args, **kwargs)

    return Fp8RoundTrip(config=config)


FP8_CASES = [  # (model, layout, dtype, k_scale, v_scale): per-tensor and per-KV-head scales
    ("llama", "BLHNC", torch.bfloat16, 0.01, 0.005),
    ("qwen2", "LBNHC", torch.float32, torch.tensor([0.02, 0.005]), torch.tensor([0.004, 0.01])),
    ("qwen3", "BHLNC", torch.float16, 0.02, torch.tensor([0.01, 0.003])),
]


@pytest.mark.parametrize("name,layout,dtype,k_scale,v_scale", FP8_CASES)
def test_fp8_tokens_match_dynamic_cache_with_the_same_round_trip(hf, name, layout, dtype,
                                                                  k_scale, v_scale):
    model, config = tiny(name, dtype)
    dyn = fp8_dynamic_cache(config, k_scale, v_scale)
    want = generate(model, dyn)
    paged = hf.PagedCache(config, num_blocks=40, block_size=4, layout=layout, dtype=dtype,
                          kv_cache_dtype="fp8", k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(generate(model, paged), want)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert paged.kv.plan.spec("k").row_bytes == head_dim  # one e4m3 code per value
    # The plan holds codes whose decoding is exactly what the round-trip cache kept.
    for layer in range(config.num_hidden_layers):
        for name_, scale, kept in (("k", k_scale, dyn.layers[layer].keys),
                                   ("v", v_scale, dyn.layers[layer].values)):
            got = cached_rows(paged, name_, layer, scale=scale, dtype=dtype)
            assert torch.equal(got, kept)


def test_plan_and_views(hf):
    model, config = tiny("qwen3", torch.bfloat16)
    paged = hf.PagedCache(config, num_blocks=10, block_size=16, layout="BHLNC")
    assert paged.dtype == torch.float32  # dtype=None: config.dtype, else torch's default
    paged = hf.PagedCache(config, num_blocks=10, block_size=16, layout="BHLNC",
                          dtype=torch.bfloat16)
    assert isinstance(paged.kv, kvc.KVCache) and paged.kv.plan.layout == "BHLNC"
    for name in ("k", "v"):
        spec = paged.kv.plan.spec(name)
        assert (spec.num_layers, spec.num_heads, spec.row_bytes) == (2, 2, 24 * 2)
        assert paged.kv.view(name, 1).shape == (10, 2, 16, 48)
    with pytest.raises(TypeError, match="dtype=torch.bfloat16"):
        model(*prompts(), past_key_values=hf.PagedCache(config, num_blocks=10, block_size=16))


def test_blocks_are_taken_as_sequences_grow(hf):
    model, config = tiny("llama", torch.float32)
    ids, mask = prompts()
    paged = hf.PagedCache(config, num_blocks=20, block_size=4)
    model(input_ids=ids, attention_mask=mask, past_key_values=paged)
    assert [len(t) for t in paged.block_tables()] == [3] * 3  # 9 tokens: 3 blocks per row
    assert len(paged.pager.free) == 20 - 9
    paged.reset()
    generate(model, paged)  # 9 + 7 tokens cached: 4 blocks per row, none shared
    blocks = [b for t in paged.block_tables() for b in t]
    assert len(blocks) == 12 and len(set(blocks)) == 12 and len(paged.pager.free) == 8


def test_a_cache_too_small_for_the_request_is_a_clear_error(hf):
    model, config = tiny("llama", torch.float32)
    paged = hf.PagedCache(config, num_blocks=10, block_size=4)  # prompts fit (9), 16 do not
    with pytest.raises(hf.CacheFullError, match=r"num_blocks = 10 .*num_blocks >= 12"):
        generate(model, paged)
    assert isinstance(hf.CacheFullError("x"), RuntimeError)
    # refused at prefill: the pager is as it was, so a smaller batch fits without reset()
    ids, mask = prompts()
    small = hf.PagedCache(config, num_blocks=5, block_size=4)  # 3 rows x 9 tokens need 9
    with pytest.raises(hf.CacheFullError):
        model(input_ids=ids, attention_mask=mask, past_key_values=small)
    assert small.block_tables() == [] and len(small.pager.free) == 5
    model(input_ids=ids[:1], attention_mask=mask[:1], past_key_values=small)
    assert [len(t) for t in small.block_tables()] == [3]


def test_importing_kvcache_ext_does_not_import_transformers():
    code = ("import sys, kvcache_ext, kvcache_ext.models.dsa; "
            "sys.exit(1 if 'transformers' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
