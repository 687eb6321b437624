"""KV-cache capacity (seed 004): per-rank bytes under TP/PP, effective vs block-rounded, pools.

Payload of plain attention: 2 * L_local * T * N_kv_local * D * e. TP splits KV heads; when TP
exceeds the KV heads each rank keeps one replicated head. PP splits layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .layout import CachePlan


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def local_kv_heads(num_kv_heads: int, tp: int) -> int:
    """KV heads one TP rank stores (replicated to one head when tp > num_kv_heads)."""
    _positive("num_kv_heads", num_kv_heads)
    _positive("tp", tp)
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must be divisible by tp ({tp})")
        return num_kv_heads // tp
    if tp % num_kv_heads:
        raise ValueError(f"tp ({tp}) must be a multiple of num_kv_heads ({num_kv_heads})")
    return 1


@dataclass(frozen=True)
class ModelKV:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_elem: int = 2

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_kv_heads", "head_dim", "bytes_per_elem"):
            _positive(f, getattr(self, f))


@dataclass(frozen=True)
class RankKV:
    local_layers: int
    local_kv_heads: int
    bytes_per_token: int       # 2 * L_local * N_kv_local * D * e
    tokens: int
    allocated_tokens: int      # tokens rounded up to whole blocks (== tokens without blocks)
    effective_bytes: int
    allocated_bytes: int


def rank_kv(model: ModelKV, tokens: int, tp: int = 1, pp: int = 1,
            block_size: int | None = None) -> RankKV:
    """Per-rank KV payload of one sequence of `tokens` tokens."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative int, got {tokens!r}")
    _positive("pp", pp)
    if model.num_layers % pp:
        raise ValueError(f"num_layers ({model.num_layers}) must be divisible by pp ({pp})")
    layers = model.num_layers // pp
    heads = local_kv_heads(model.num_kv_heads, tp)
    per_token = 2 * layers * heads * model.head_dim * model.bytes_per_elem
    allocated = tokens
    if block_size is not None:
        _positive("block_size", block_size)
        allocated = math.ceil(tokens / block_size) * block_size
    return RankKV(layers, heads, per_token, tokens, allocated, per_token * tokens,
                  per_token * allocated)


def request_slots(lengths: Sequence[int], block_size: int) -> tuple[int, int]:
    """(effective tokens, block-rounded slots) for requests of the given lengths."""
    _positive("block_size", block_size)
    if any(n < 0 for n in lengths):
        raise ValueError("request lengths must be >= 0")
    return sum(lengths), sum(math.ceil(n / block_size) * block_size for n in lengths)


def max_num_blocks(make_plan: Callable[[int], CachePlan], budget_bytes: int) -> int:
    """Largest num_blocks whose plan fits `budget_bytes` (0 if not even one block fits).

    Plan size grows monotonically with num_blocks, so an exponential then binary search
    works for any layout and any specs.
    """
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if make_plan(1).total_bytes > budget_bytes:
        return 0
    lo, hi = 1, 2
    while make_plan(hi).total_bytes <= budget_bytes:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if make_plan(mid).total_bytes <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo
