"""Layout planner: one flat uint8 buffer, many cache specs, six memory orders.

A spec ("cache group") has logical shape [L, B, H, N, C] (layers, blocks, heads, tokens in a
block, bytes per (token, head)). The layout names the memory order of those dimensions,
outermost first. Layer-outer layouts store each spec as its own dense tensor, one after the
other; block-outer layouts share the B dimension, so block b holds every spec's pages.
All numbers here are plain Python ints (arbitrary precision, so > 4 GiB plans are exact).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch

LAYOUTS: tuple[str, ...] = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
DEFAULT_LAYOUT = "LBNHC"
INT64_MAX = 2**63 - 1
_DIMS = "LBHNC"  # logical dimension names, in logical order


@dataclass(frozen=True)
class CacheSpec:
    """One cache group: `num_layers` layers of `num_heads` heads, `row_bytes` per (token, head)."""

    name: str
    row_bytes: int
    num_layers: int = 1
    num_heads: int = 1
    # (a, b): a page holds the first a bytes of every token, then the last b bytes of every
    # token (the indexer's "split" placement is (128, 4)); None: token rows one after another.
    split: tuple[int, int] | None = None
    # logical tokens per stored row (DeepSeek-V4 C4 / C128 caches): a group of block size B
    # holds B / compress_ratio rows of this spec per block (SPEC 10); 1 = one row per token
    compress_ratio: int = 1
    # pages (one block of one layer) padded to a multiple of this many bytes (576 or 512 B in
    # the V4 layouts); 1 = unpadded. Only plans made from CacheGroups pad (plan_cache(groups=))
    page_align: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"CacheSpec.name must be a non-empty string, got {self.name!r}")
        for arg in ("row_bytes", "num_layers", "num_heads", "compress_ratio", "page_align"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"CacheSpec.{arg} must be a positive int, got {value!r}")
        if self.split is not None:
            split = self.split
            if (not isinstance(split, (tuple, list)) or len(split) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in split)):
                raise ValueError(f"CacheSpec.split must be None or two positive ints (a, b), got "
                                 f"{split!r}")
            if split[0] + split[1] != self.row_bytes:
                raise ValueError(f"CacheSpec.split {tuple(split)} must add up to row_bytes = "
                                 f"{self.row_bytes} (spec {self.name!r})")
            if self.num_heads != 1:
                raise ValueError(f"CacheSpec.split needs num_heads == 1 (a split page is one "
                                 f"head's), got num_heads = {self.num_heads} (spec {self.name!r})")
            object.__setattr__(self, "split", (int(split[0]), int(split[1])))
        if self.page_align != 1 and self.num_heads != 1:
            raise ValueError(f"CacheSpec.page_align needs num_heads == 1 (a padded page is one "
                             f"head's), got num_heads = {self.num_heads} (spec {self.name!r})")


@dataclass(frozen=True)
class KVCacheTensor:
    """Where one spec's views live in the flat buffer (mirrors vLLM's KVCacheTensor)."""

    size: int                 # bytes of the whole flat allocation (= plan.total_bytes)
    layers: list[str]         # layer names, in layer order
    layer_stride: int
    block_stride: int
    offset: int               # byte offset of layer 0, block 0, head 0, token 0
    head_stride: int
    token_stride: int
    row_bytes: int            # C
    num_heads: int

    def address(self, layer: int, block: int, pos: int, head: int = 0, byte: int = 0) -> int:
        return (self.offset + layer * self.layer_stride + block * self.block_stride
                + head * self.head_stride + pos * self.token_stride + byte)


def split_address(s: "CacheSpec", t: KVCacheTensor, rows: int, layer: int, block: int, pos: int,
                  head: int = 0, byte: int = 0) -> int:
    """Address of (layer, block, row pos, head, byte). A split page (H = 1, so one contiguous
    page of `rows` rows) holds the first `a` bytes of every row, then the last `b` bytes."""
    if s.split is None:
        return t.address(layer, block, pos, head, byte)
    a, b = s.split
    page = t.address(layer, block, 0, head, 0)
    return page + (pos * a + byte if byte < a else rows * a + pos * b + (byte - a))


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _dense_strides(order: str, sizes: dict[str, int], pad_at: str | None = None,
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


class SpecLookup:
    """What every plan answers by spec name (CachePlan here, GroupPlan in groups.py): needs
    `specs`, `tensors` and `layout`."""

    @property
    def block_outer(self) -> bool:
        return self.layout[0] == "B"

    def spec(self, name: str) -> CacheSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(f"no spec named {name!r}; the plan has {[s.name for s in self.specs]}")

    def tensor(self, name: str) -> KVCacheTensor:
        self.spec(name)
        return self.tensors[name]

    def _check_layer(self, name: str, layer: int) -> None:
        n = self.spec(name).num_layers
        if not 0 <= layer < n:
            raise IndexError(f"layer must be in [0, {n}) for spec {name!r}, got {layer}")

    def rows_per_block(self, name: str) -> int:
        """Rows of spec `name` in one block (a slot counts rows: block x rows + row)."""
        raise NotImplementedError

    def address(self, name: str, layer: int, slot: int, head: int = 0, byte: int = 0) -> int:
        """Byte offset in the flat buffer of (spec, layer, slot, head, byte)."""
        s = self.spec(name)
        self._check_layer(name, layer)
        rows = self.rows_per_block(name)
        if not 0 <= slot < self.num_blocks * rows:
            raise IndexError(f"slot must be in [0, {self.num_blocks * rows}) for spec {name!r} "
                             f"({rows} rows per block), got {slot}")
        if not 0 <= head < s.num_heads:
            raise IndexError(f"head must be in [0, {s.num_heads}), got {head}")
        if not 0 <= byte < s.row_bytes:
            raise IndexError(f"byte must be in [0, {s.row_bytes}), got {byte}")
        block, row = divmod(slot, rows)
        return split_address(s, self.tensors[name], rows, layer, block, row, head, byte)

    def view(self, buffer: torch.Tensor, name: str, layer: int) -> torch.Tensor:
        """uint8 [num_blocks, H, rows per block, C] view of one layer of one spec in `buffer`."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise TypeError(f"buffer must be a 1-D torch.uint8 tensor, got {buffer.dtype} "
                            f"with shape {tuple(buffer.shape)}")
        if buffer.numel() < self.total_bytes or buffer.stride(0) != 1:
            raise ValueError(f"buffer must be contiguous and hold {self.total_bytes} bytes, "
                             f"got {buffer.numel()}")
        self._check_layer(name, layer)
        s, t = self.spec(name), self.tensors[name]
        return torch.as_strided(
            buffer, (self.num_blocks, s.num_heads, self.rows_per_block(name), s.row_bytes),
            (t.block_stride, t.head_stride, t.token_stride, 1),
            buffer.storage_offset() + t.offset + layer * t.layer_stride)


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

    def block_pages(self) -> list[BlockPage]:
        """The pages of block 0 in address order; block b's are `block_stride * b` further on.

        A (spec, layer) page is contiguous when heads are stored inside the layer and the block
        (H after L and B in the layout); in LHBNC and BHLNC each head's N x C bytes are a page.
        """
        pages = []
        for s in self.specs:
            t = self.tensors[s.name]
            whole = s.num_heads == 1 or self.layout.index("H") > max(self.layout.index("L"),
                                                                    self.layout.index("B"))
            heads: list[int | None] = [None] if whole else list(range(s.num_heads))
            length = self.block_size * s.row_bytes * (s.num_heads if whole else 1)
            for layer in range(s.num_layers):
                for h in heads:
                    start = t.offset + layer * t.layer_stride + (h or 0) * t.head_stride
                    pages.append(BlockPage(s.name, layer, h, start, length, t.block_stride))
        return sorted(pages, key=lambda pg: pg.start)


@dataclass(frozen=True)
class BlockPage:
    """Contiguous bytes of one block: (spec, layer[, head]), at `start + block * block_stride`."""

    spec: str
    layer: int
    head: int | None  # None: the page holds every head
    start: int        # in block 0
    length: int
    block_stride: int


def plan_cache(specs: Iterable[CacheSpec] | None = None, num_blocks: int | None = None,
               block_size: int | None = None, layout: str = DEFAULT_LAYOUT, *,
               groups: Iterable | None = None, packing: str = "overlay"):
    """Lay out `specs` (sharing one block table) in one flat buffer -> CachePlan.

    With `groups=[CacheGroup, ...]` instead (each group its own block size and block tables,
    SPEC 10) -> GroupPlan; see kvcache_ext.groups.plan_groups."""
    if groups is not None:
        if specs is not None or block_size is not None:
            raise ValueError("plan_cache takes either specs and block_size or groups=, not both "
                             "(each CacheGroup has its own block_size)")
        from .groups import plan_groups
        return plan_groups(groups, num_blocks=num_blocks, layout=layout, packing=packing)
    if specs is None or block_size is None or num_blocks is None:
        raise ValueError("plan_cache needs specs, num_blocks and block_size (or groups= and "
                         "num_blocks)")
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
    _check_positive("num_blocks", num_blocks)
    _check_positive("block_size", block_size)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")

    order = "".join(_DIMS[i] for i in _perm(layout))
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
            st = _dense_strides(order[1:], sizes)
            st["B"] = block_bytes
            step = spec_block_bytes
        else:
            st = _dense_strides(order, sizes)
            step = spec_block_bytes * num_blocks
        tensors[s.name] = KVCacheTensor(
            size=total, layers=[f"{s.name}.{i}" for i in range(s.num_layers)],
            layer_stride=st["L"], block_stride=st["B"], offset=offset,
            head_stride=st["H"], token_stride=st["N"], row_bytes=s.row_bytes,
            num_heads=s.num_heads)
        offset += step
    return CachePlan(specs=specs, num_blocks=num_blocks, block_size=block_size, layout=layout,
                     tensors=tensors, total_bytes=total)


def _perm(layout: str) -> tuple[int, ...]:
    return tuple(_DIMS.index(c) for c in layout)


def layout_order(layout: str) -> tuple[int, ...]:
    """The layout as a permutation of (L, B, H, N, C), e.g. LBNHC -> (0, 1, 3, 2, 4)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return _perm(layout)


def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, block_size: int,
                 req_indices: torch.Tensor | None = None, compress_ratio: int = 1) -> torch.Tensor:
    """int64 [T] slots: block_table[req, pos // block_size] * block_size + pos % block_size.

    A block-table entry < 0 (an unassigned block) gives slot -1: padding, which every write
    skips (vLLM's rule: every negative slot is padding).

    compress_ratio = r > 1 (SPEC 10, vLLM's get_compressed_slot_mapping): slots count rows of
    a spec that stores one row per r tokens. Only a token with (pos + 1) % r == 0 writes:
    cpos = pos // r, rows = block_size // r, slot = block_table[req, cpos // rows] * rows
    + cpos % rows; every other token gets -1. `block_size` is the group's (tokens per block)."""
    _check_positive("block_size", block_size)
    _check_positive("compress_ratio", compress_ratio)
    if block_size % compress_ratio:
        raise ValueError(f"block_size ({block_size}) must be a multiple of compress_ratio "
                         f"({compress_ratio})")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype not in (torch.int32,
                                                                              torch.int64):
        raise TypeError("block_table must be an int32 (or int64) tensor")
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int64,
                                                                          torch.int32):
        raise TypeError("positions must be an int64 (or int32) tensor")
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D [T], got shape {tuple(positions.shape)}")
    if block_table.dim() == 1:
        block_table = block_table.unsqueeze(0)
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be [R, M] or [M], got shape {tuple(block_table.shape)}")
    rows, width = block_table.shape
    if req_indices is None:
        if rows != 1:
            raise ValueError(f"req_indices is required when block_table has {rows} rows")
        req_indices = torch.zeros_like(positions, dtype=torch.int64)
    else:
        if not isinstance(req_indices, torch.Tensor) or req_indices.dtype not in (torch.int64,
                                                                                  torch.int32):
            raise TypeError("req_indices must be an int64 (or int32) tensor")
        if req_indices.shape != positions.shape:
            raise ValueError(f"req_indices must have the shape of positions "
                             f"{tuple(positions.shape)}, got {tuple(req_indices.shape)}")
    positions = positions.to(torch.int64)
    req_indices = req_indices.to(torch.int64)
    if positions.numel():
        if int(positions.min()) < 0:
            raise IndexError("positions must be >= 0")
        if int(positions.max()) >= width * block_size:
            raise IndexError(f"positions must be < block_table width x block_size = "
                             f"{width * block_size}, got {int(positions.max())}")
        if int(req_indices.min()) < 0 or int(req_indices.max()) >= rows:
            raise IndexError(f"req_indices must be in [0, {rows})")
    blocks = block_table.to(torch.int64)[req_indices, positions // block_size]
    if compress_ratio == 1:
        slots = blocks * block_size + positions % block_size
        return torch.where(blocks < 0, torch.full_like(slots, -1), slots)
    rows = block_size // compress_ratio
    cpos = positions // compress_ratio  # cpos // rows == pos // block_size: the same block
    slots = blocks * rows + cpos % rows
    closes = (positions + 1) % compress_ratio == 0
    return torch.where((blocks < 0) | ~closes, torch.full_like(slots, -1), slots)

