"""Published models' KV caches, as cache specs (whole model: every layer, every KV head).

Each number comes from the model's `config.json` on Hugging Face (field names quoted next to
it) and, for the row formats, from SPEC section 3. `capacity` splits these specs over TP/PP
ranks; `plan_cache` lays the per-rank specs out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .capacity import describe_specs
from .layout import CacheSpec


@dataclass(frozen=True)
class ModelPreset:
    name: str
    specs: tuple[CacheSpec, ...]  # whole-model cache groups (all layers, all KV heads)
    kind: str                     # "gqa": K and V heads; "mla": one latent row per token
    block_size: int               # the block size serving engines run it with
    source: str                   # where the numbers come from
    dtype_bytes: int | None = None  # K/V element size of a "gqa" model; None: fixed row formats

    def with_dtype_bytes(self, dtype_bytes: int) -> ModelPreset:
        """The same GQA model with another K/V element size (e.g. 1 for an fp8 KV cache)."""
        if self.dtype_bytes is None:
            raise ValueError(f"--dtype-bytes applies to K/V models; {self.name}'s rows have fixed "
                             f"formats ({describe_specs(self.specs)})")
        head_dim = self.specs[0].row_bytes // self.dtype_bytes
        return replace(self, dtype_bytes=dtype_bytes,
                       specs=tuple(replace(s, row_bytes=head_dim * dtype_bytes) for s in self.specs))


_BF16 = 2  # bytes per element of `"torch_dtype": "bfloat16"`


def gqa(name: str, layers: int, kv_heads: int, head_dim: int, source: str,
        dtype_bytes: int = _BF16, block_size: int = 16) -> ModelPreset:
    """K and V caches of a (grouped-query) attention model: one row of head_dim elements per head."""
    row = head_dim * dtype_bytes
    specs = (CacheSpec("k", row, layers, kv_heads), CacheSpec("v", row, layers, kv_heads))
    return ModelPreset(name, specs, "gqa", block_size, source, dtype_bytes)


# DeepSeek-V3.2(-Exp), deepseek-ai/DeepSeek-V3.2-Exp config.json: "num_hidden_layers": 61,
# "kv_lora_rank": 512, "qk_rope_head_dim": 64 (one latent row per token: MLA has no per-head K/V),
# "index_head_dim": 128 (the indexer keeps one 128-wide key per token, shared by its 64 heads).
# Rows (SPEC 3): fp8_ds_mla = 512 fp8 codes + 4 fp32 tile scales + 64 bf16 RoPE values = 656 B;
# indexer = 128 fp8 codes + 1 fp32 scale = 132 B. vLLM runs the FlashMLA sparse kernels at block 64.
# (The MTP layer, "num_nextn_predict_layers": 1, only has a cache when speculative decoding is on.)
_DSV32_LAYERS = 61
_MLA_ROW = 512 + 4 * 4 + 64 * 2
_INDEXER_ROW = 128 + 4

PRESETS: tuple[ModelPreset, ...] = (
    ModelPreset("deepseek-v3.2", (CacheSpec("mla", _MLA_ROW, _DSV32_LAYERS),
                                  CacheSpec("indexer", _INDEXER_ROW, _DSV32_LAYERS)),
                "mla", 64, "deepseek-ai/DeepSeek-V3.2-Exp config.json; rows per SPEC 3"),
    # meta-llama/Llama-3.1-8B config.json: "num_hidden_layers": 32, "num_key_value_heads": 8,
    # "hidden_size": 4096 / "num_attention_heads": 32 = head_dim 128, "torch_dtype": "bfloat16".
    gqa("llama-3.1-8b", 32, 8, 128, "meta-llama/Llama-3.1-8B config.json"),
    # meta-llama/Llama-3.1-70B config.json: "num_hidden_layers": 80, "num_key_value_heads": 8,
    # "hidden_size": 8192 / "num_attention_heads": 64 = head_dim 128, "torch_dtype": "bfloat16".
    gqa("llama-3.1-70b", 80, 8, 128, "meta-llama/Llama-3.1-70B config.json"),
    # Qwen/Qwen2.5-7B config.json: "num_hidden_layers": 28, "num_key_value_heads": 4,
    # "hidden_size": 3584 / "num_attention_heads": 28 = head_dim 128, "torch_dtype": "bfloat16".
    gqa("qwen2.5-7b", 28, 4, 128, "Qwen/Qwen2.5-7B config.json"),
)


def preset_names() -> tuple[str, ...]:
    return tuple(p.name for p in PRESETS)


def preset(name: str) -> ModelPreset:
    for p in PRESETS:
        if p.name == name.lower():
            return p
    raise ValueError(f"model must be one of {', '.join(preset_names())}, got {name!r}")
