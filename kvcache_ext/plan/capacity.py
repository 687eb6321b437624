"""KV-cache capacity (seed 004): per-rank bytes under TP/PP, effective vs block-rounded, pools.

Payload of plain attention: 2 * L_local * T * N_kv_local * D * e. TP splits KV heads; when TP
exceeds the KV heads each rank keeps one replicated head. PP splits layers.

Any set of cache specs (`CacheSpec`: L layers x H heads x C bytes per token and head) follows
the same rule per spec: its H heads split over TP ranks and are replicated once TP exceeds H,
so an H = 1 spec (the MLA latent row, the DSA indexer key) is whole on every TP rank; its L
layers split over PP stages.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from .groups import plan_groups
from .layout import DEFAULT_LAYOUT, CachePlan
from .planner import plan_cache
from .spec import CacheSpec


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

    def specs(self) -> tuple[CacheSpec, ...]:
        """The model's K and V caches as cache specs (whole model)."""
        row = self.head_dim * self.bytes_per_elem
        return (CacheSpec("k", row, self.num_layers, self.num_kv_heads),
                CacheSpec("v", row, self.num_layers, self.num_kv_heads))


@dataclass(frozen=True)
class RankKV:
    local_layers: int
    local_kv_heads: int
    bytes_per_token: int       # 2 * L_local * N_kv_local * D * e
    tokens: int
    allocated_tokens: int      # tokens rounded up to whole blocks (== tokens without blocks)
    effective_bytes: int
    allocated_bytes: int


def pp_stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers of each PP stage; an uneven split gives the extra layers to the stages before the
    last (vLLM's get_pp_indices), e.g. 61 layers over 2 stages -> [31, 30]."""
    _positive("num_layers", num_layers)
    _positive("pp", pp)
    if pp > num_layers:
        raise ValueError(f"pp ({pp}) must not exceed num_layers ({num_layers})")
    stages = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        stages[-i] += 1
    return stages


def rank_specs(specs: Sequence[CacheSpec], tp: int = 1, pp: int = 1) -> tuple[CacheSpec, ...]:
    """What the largest rank stores of each spec: the layers of the largest PP stage and the
    heads of one TP rank (one head, replicated, once TP exceeds the spec's heads)."""
    if not specs:
        raise ValueError("specs must hold at least one CacheSpec")
    out = []
    for s in specs:
        try:
            out.append(replace(s, num_layers=max(pp_stage_layers(s.num_layers, pp)),
                               num_heads=local_kv_heads(s.num_heads, tp)))
        except ValueError as e:  # name the spec: several specs may be split at once
            raise ValueError(f"spec {s.name!r}: {e}") from None
    return tuple(out)


def describe_specs(specs: Sequence[CacheSpec]) -> str:
    """e.g. "mla 61 layers x 1 head x 656 B + indexer 61 layers x 1 head x 132 B"."""
    return " + ".join(f"{s.name} {s.num_layers} layers x {s.num_heads} head"
                      f"{'s' if s.num_heads > 1 else ''} x {s.row_bytes} B" for s in specs)


def bytes_per_token(specs: Sequence[CacheSpec]) -> int:
    return sum(s.num_layers * s.num_heads * s.row_bytes for s in specs)


def replicated(spec: CacheSpec, tp: int) -> bool:
    """True when TP ranks hold copies of the same heads of `spec` (TP > H, e.g. H = 1 latent)."""
    return tp > 1 and tp > spec.num_heads


@dataclass(frozen=True)
class RankCache:
    specs: tuple[CacheSpec, ...]   # what one rank stores (largest PP stage, one TP rank)
    bytes_per_token: int           # sum over specs of L_local * H_local * C
    tokens: int
    allocated_tokens: int          # tokens rounded up to whole blocks (== tokens without blocks)
    effective_bytes: int
    allocated_bytes: int


def rank_cache(specs: Sequence[CacheSpec], tokens: int, tp: int = 1, pp: int = 1,
               block_size: int | None = None) -> RankCache:
    """Per-rank cache payload of one sequence of `tokens` tokens, for any cache specs."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative int, got {tokens!r}")
    local = rank_specs(specs, tp, pp)
    per_token = bytes_per_token(local)
    allocated = tokens
    if block_size is not None:
        _positive("block_size", block_size)
        allocated = math.ceil(tokens / block_size) * block_size
    return RankCache(local, per_token, tokens, allocated, per_token * tokens, per_token * allocated)


def rank_kv(model: ModelKV, tokens: int, tp: int = 1, pp: int = 1,
            block_size: int | None = None) -> RankKV:
    """Per-rank KV payload of one sequence of `tokens` tokens."""
    r = rank_cache(model.specs(), tokens, tp, pp, block_size)
    k = r.specs[0]
    return RankKV(k.num_layers, k.num_heads, r.bytes_per_token, r.tokens, r.allocated_tokens,
                  r.effective_bytes, r.allocated_bytes)


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


@dataclass(frozen=True)
class Pool:
    """The largest pool of one rank's specs that fits a byte budget."""

    num_blocks: int
    block_size: int
    tokens: int            # num_blocks * block_size
    total_bytes: int       # plan_cache(...).total_bytes of num_blocks (0 when none fits)
    budget_bytes: int


def pool_for_budget(specs: Sequence[CacheSpec], budget_bytes: int, block_size: int,
                    layout: str = DEFAULT_LAYOUT) -> Pool:
    """Size one rank's pool: `specs` are that rank's (see rank_specs). Every layout gives the
    same total (blocks x the bytes of one block of every spec), `layout` only names the plan."""
    _positive("block_size", block_size)
    n = max_num_blocks(lambda nb: plan_cache(specs, nb, block_size, layout), budget_bytes)
    total = plan_cache(specs, n, block_size, layout).total_bytes if n else 0
    return Pool(n, block_size, n * block_size, total, budget_bytes)


# ---- cache groups (DeepSeek-V4, SPEC 10) ----------------------------------------------------
@dataclass(frozen=True)
class GroupUsage:
    """One cache group's bytes: per token (raw rows, and padded pages amortised over the
    group's block) and per block."""

    name: str
    block_size: int
    window: int | None
    bytes_per_token: float         # sum over specs of L x H x C / compress_ratio (unpadded)
    padded_bytes_per_token: float  # block_bytes / block_size (padded pages)
    block_bytes: int               # the group's region in one physical block


@dataclass(frozen=True)
class GroupPool:
    """The largest shared pool of cache groups that fits a byte budget."""

    num_blocks: int
    block_stride: int
    total_bytes: int
    budget_bytes: int
    blocks_per_request: dict[str, int]  # for `tokens`, by group
    tokens: int                          # tokens of one request
    requests: int                        # requests of `tokens` tokens the pool holds at once


def rank_groups(groups, pp: int = 1) -> list:
    """The cache groups of the largest pipeline stage: every spec keeps the layers of its largest
    stage (rank_specs; V4's caches have one head, whole on every TP rank). SPEC 10 does not give
    the order of V4's layer kinds, so each kind is split on its own: an upper bound of what any
    one stage holds, exact when a kind's layers spread evenly over the stages."""
    return [replace(g, specs=rank_specs(g.specs, 1, pp)) for g in groups]


def group_usage(groups) -> list[GroupUsage]:
    out = []
    for g in groups:
        raw = sum(s.num_layers * s.num_heads * s.row_bytes / s.compress_ratio for s in g.specs)
        out.append(GroupUsage(g.name, g.block_size, g.window, raw,
                              g.block_bytes / g.block_size, g.block_bytes))
    return out


def group_pool_for_budget(groups, budget_bytes: int, tokens: int, layout: str = "BLHNC",
                          packing: str = "overlay") -> GroupPool:
    """Blocks of the plan_cache(groups=...) pool that fit `budget_bytes`, and how many requests
    of `tokens` tokens it holds (every group takes its own blocks from the one pool: the full
    groups ceil(tokens / block_size), the windowed ones only the blocks of their window)."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative int, got {tokens!r}")
    groups = list(groups)
    stride = plan_groups(groups, 1, layout, packing).total_bytes
    n = budget_bytes // stride
    need = {g.name: g.blocks_for(tokens) for g in groups}
    per_request = sum(need.values()) if packing == "overlay" else max(need.values())
    requests = n // per_request if per_request else 0
    return GroupPool(n, stride, n * stride, budget_bytes, need, tokens, requests)
