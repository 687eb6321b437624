"""Published models' KV caches, as cache specs (whole model: every layer, every KV head).

Each number comes from the model's `config.json` on Hugging Face (field names quoted next to
it) and, for the row formats, from SPEC section 3. `capacity` splits these specs over TP/PP
ranks; `plan_cache` lays the per-rank specs out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .capacity import describe_specs
from .groups import CacheGroup
from .spec import CacheSpec


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


GROUP_PRESETS = ("deepseek-v4-pro", "deepseek-v4-flash")  # plan_cache(groups=...) models


def group_preset(name: str, mla: str = "fp8_ds_mla", indexer: str = "mxfp4") -> list:
    """"deepseek-v4-pro" / "deepseek-v4-flash" -> deepseek_v4(...)'s groups."""
    if name.lower() not in GROUP_PRESETS:
        raise ValueError(f"model must be one of {', '.join(GROUP_PRESETS)}, got {name!r}")
    return deepseek_v4(name.lower().rsplit("-", 1)[1], mla=mla, indexer=indexer)


def preset_names() -> tuple[str, ...]:
    return tuple(p.name for p in PRESETS)


def preset(name: str) -> ModelPreset:
    for p in PRESETS:
        if p.name == name.lower():
            return p
    raise ValueError(f"model must be one of {', '.join(preset_names())}, got {name!r}")


# DeepSeek-V4 (SPEC 10; vLLM, SGLang and TensorRT-LLM sources): per-layer caches with different
# compression ratios and block sizes, as cache groups sharing one physical block pool.
# V4-Pro: 61 layers, 0 SWA-only / 30 C4 / 31 C128; V4-Flash: 43 layers, 2 / 21 / 20.
_V4_LAYERS = {"pro": (61, 0, 30, 31), "flash": (43, 2, 21, 20)}  # layers, SWA-only, C4, C128
V4_MAIN_BLOCK = 256   # tokens per block of the main (compressed) group
V4_SWA_BLOCK = 64     # SWA keeps the last 128 tokens
V4_C4_STATE_BLOCK = 4     # compressor states: one fp32 row per token, group blocks of 4 / 8
V4_C128_STATE_BLOCK = 8
V4_SWA_WINDOW = 128       # SWA keeps the last 128 tokens
V4_C4_STATE_WINDOW = 8    # a C4 compressor state the last 8, a C128 state the last 128
V4_C128_STATE_WINDOW = 128


def v4_rows(mla: str = "fp8_ds_mla", indexer: str = "mxfp4") -> dict[str, tuple]:
    """Row bytes, split and page alignment of each V4 component (SPEC 10's component table)."""
    if mla == "fp8_ds_mla":
        # 448 e4m3 NoPE + 64 bf16 RoPE = 576 data bytes, then 7 UE8M0 scales + 1 zero byte;
        # page = [rows x 576][rows x 8][pad to 576]: the split placement (576, 8)
        kv, align, state_align = (448 + 64 * 2 + 8, (448 + 64 * 2, 8)), 576, 576
    elif mla == "flashinfer_fp8":
        kv, align, state_align = (512, None), 512, 1  # per-tensor e4m3 rows; states unpadded
    elif mla == "v41_mxfp8":
        # DeepSeek-V4.1 (FlashMLA's V4.1 record, vLLM PR #56893, SM100): 512 e4m3 codes (RoPE
        # quantized too), then 16 UE8M0 scales, one per 32 values: split (512, 16), pages padded
        # to 512 B; states as the FlashInfer layout's (unpadded: the PR does not pad them)
        kv, align, state_align = (512 + 16, (512, 16)), 512, 1
    else:
        raise ValueError(f"mla must be 'fp8_ds_mla', 'flashinfer_fp8' or 'v41_mxfp8', got {mla!r}")
    if indexer == "mxfp4":
        idx = (64 + 4, (64, 4))    # 128 e2m1 values in 64 bytes, then 4 UE8M0 scales
    elif indexer == "fp8":
        idx = (128 + 4, (128, 4))  # V3.2's indexer row, split placement
    else:
        raise ValueError(f"indexer must be 'mxfp4' or 'fp8', got {indexer!r}")
    return {"kv": (*kv, align), "indexer": (*idx, align),
            # fp32 states [kv | score]: C4 main 2x512 + 2x512, C128 512 + 512, C4 indexer 2x128 x2
            "c4_state": (4 * 2 * 512 * 2, None, state_align),
            "c128_state": (4 * 512 * 2, None, state_align),
            "c4_indexer_state": (4 * 2 * 128 * 2, None, state_align)}


def deepseek_v4(model: str = "pro", mla: str = "fp8_ds_mla", indexer: str = "mxfp4") -> list:
    """DeepSeek-V4 caches as a list of CacheGroup (whole model; plan_cache(groups=...)). mla:
    the main-KV record -- "fp8_ds_mla" (584 B), "flashinfer_fp8" (512-B per-tensor e4m3 rows) or
    "v41_mxfp8" (DeepSeek-V4.1's 528-B MXFP8 record, which vLLM writes on SM100 only: the format
    is the engine's choice).

    V4-Pro's groups are SPEC 10's (vLLM's): main = 30 C4 KV + 30 C4 indexer + 31 C128 KV
    (block 256), SWA groups of 31 and 30 layers (block 64), C4 states = 30 main + 30 indexer
    (block 4), C128 states = 31 (block 8). V4-Flash follows the same rule (this project's
    choice: the SWA layers split in two halves, the larger first): main = 21 + 21 + 20, SWA
    22 + 21, C4 states 21 + 21, C128 states 20."""
    if model not in _V4_LAYERS:
        raise ValueError(f"model must be 'pro' or 'flash', got {model!r}")
    layers, _, c4, c128 = _V4_LAYERS[model]
    rows = v4_rows(mla, indexer)

    def spec(name: str, kind: str, num_layers: int, ratio: int) -> CacheSpec:
        row, split, align = rows[kind]
        return CacheSpec(name, row, num_layers, 1, split=split, compress_ratio=ratio,
                         page_align=align)

    swa = [layers - layers // 2, layers // 2]
    groups = [
        CacheGroup("main", (spec("c4_kv", "kv", c4, 4), spec("c4_indexer", "indexer", c4, 4),
                            spec("c128_kv", "kv", c128, 128)), V4_MAIN_BLOCK),
        CacheGroup("swa0", (spec("swa0_kv", "kv", swa[0], 1),), V4_SWA_BLOCK, V4_SWA_WINDOW),
        CacheGroup("swa1", (spec("swa1_kv", "kv", swa[1], 1),), V4_SWA_BLOCK, V4_SWA_WINDOW),
        CacheGroup("c4_states", (spec("c4_state", "c4_state", c4, 1),
                                 spec("c4_indexer_state", "c4_indexer_state", c4, 1)),
                   V4_C4_STATE_BLOCK, V4_C4_STATE_WINDOW),
        CacheGroup("c128_states", (spec("c128_state", "c128_state", c128, 1),),
                   V4_C128_STATE_BLOCK, V4_C128_STATE_WINDOW),
    ]
    return groups
