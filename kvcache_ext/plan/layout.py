"""The six layouts, and plans of specs that share one block table (CachePlan).

A spec has logical shape [L, B, H, N, C] (layers, blocks, heads, tokens in a block, bytes per
(token, head)). The layout names the memory order of those dimensions, outermost first.
Layer-outer layouts store each spec as its own dense tensor, one after the other; block-outer
layouts share the B dimension, so block b holds every spec's pages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .spec import (INT64_MAX, CacheSpec, KVCacheTensor, SpecLookup, check_positive,
                   check_split_pages)

LAYOUTS: tuple[str, ...] = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
DEFAULT_LAYOUT = "LBNHC"
DIMS = "LBHNC"  # logical dimension names, in logical order


def dense_strides(order: str, sizes: dict[str, int], pad_at: str | None = None,
                   align: int = 1) -> dict[str, int]:
    """Byte strides of a dense array whose dimensions are stored in `order` (outermost first);
    the stride of dimension `pad_at` is rounded up to a multiple of `align` (padded pages)."""
    strides: dict[str, int] = {}
    step = 1
    for dim in reversed(order):
        if dim == pad_at:
            step = -(-step // align) * align
        strides[dim] = step
        step *= sizes[dim]
    return strides


@dataclass(frozen=True)
class CachePlan(SpecLookup):
    specs: tuple[CacheSpec, ...]
    num_blocks: int
    block_size: int
    layout: str
    tensors: dict[str, KVCacheTensor] = field(repr=False)
    total_bytes: int

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def block_stride(self) -> int:
        """Bytes of one physical block: every spec's pages of one block (= total / num_blocks)."""
        return self.total_bytes // self.num_blocks

    def page_bytes(self, name: str) -> int:
        s = self.spec(name)
        return self.block_size * s.num_heads * s.row_bytes

    def rows_per_block(self, name: str) -> int:
        self.spec(name)
        return self.block_size


def perm(layout: str) -> tuple[int, ...]:
    return tuple(DIMS.index(c) for c in layout)


def layout_order(layout: str) -> tuple[int, ...]:
    """The layout as a permutation of (L, B, H, N, C), e.g. LBNHC -> (0, 1, 3, 2, 4)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return perm(layout)


def plan_specs(specs: Iterable[CacheSpec], num_blocks: int, block_size: int,
               layout: str = DEFAULT_LAYOUT) -> CachePlan:
    """Lay out `specs` (sharing one block table) in one flat buffer -> CachePlan."""
    specs = tuple(specs)
    if not specs:
        raise ValueError("specs must hold at least one CacheSpec")
    for s in specs:
        if not isinstance(s, CacheSpec):
            raise TypeError(f"specs must be CacheSpec objects, got {type(s).__name__}")
        if s.compress_ratio != 1 or s.page_align != 1:
            raise ValueError(f"spec {s.name!r} has compress_ratio = {s.compress_ratio}, page_align"
                             f" = {s.page_align}: compressed or padded specs need a CacheGroup "
                             f"(plan_cache(groups=[CacheGroup(name, specs, block_size)], ...))")
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"spec names must be unique, duplicated: {dup}")
    check_positive("num_blocks", num_blocks)
    check_positive("block_size", block_size)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")

    order = "".join(DIMS[i] for i in perm(layout))
    block_outer = order[0] == "B"
    per_block = [s.num_layers * s.num_heads * block_size * s.row_bytes for s in specs]
    block_bytes = sum(per_block)
    total = block_bytes * num_blocks
    if total > INT64_MAX:  # every kernel addresses the buffer with int64 offsets
        raise ValueError(f"num_blocks = {num_blocks} makes a buffer of {total} bytes "
                         f"({block_bytes} per block), beyond int64 ({INT64_MAX}); "
                         f"at most {INT64_MAX // block_bytes} blocks fit")

    tensors: dict[str, KVCacheTensor] = {}
    offset = 0
    for s, spec_block_bytes in zip(specs, per_block):
        sizes = {"L": s.num_layers, "B": num_blocks, "H": s.num_heads, "N": block_size,
                 "C": s.row_bytes}
        if block_outer:
            st = dense_strides(order[1:], sizes)
            st["B"] = block_bytes
            step = spec_block_bytes
        else:
            st = dense_strides(order, sizes)
            step = spec_block_bytes * num_blocks
        tensors[s.name] = KVCacheTensor(
            size=total, layers=[f"{s.name}.{i}" for i in range(s.num_layers)],
            layer_stride=st["L"], block_stride=st["B"], offset=offset,
            head_stride=st["H"], token_stride=st["N"], row_bytes=s.row_bytes,
            num_heads=s.num_heads)
        check_split_pages(s, tensors[s.name], layout)
        offset += step
    return CachePlan(specs=specs, num_blocks=num_blocks, block_size=block_size, layout=layout,
                     tensors=tensors, total_bytes=total)
