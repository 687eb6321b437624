"""Cache groups (SPEC 10): several block sizes, compressed rows and padded pages in one buffer.

A `CacheGroup` is a set of specs that share one block table of `block_size` tokens per block;
each spec stores `block_size / compress_ratio` rows per block (its "rows"), and its page (one
block of one layer) is padded to a multiple of `page_align` bytes. Every group draws its blocks
from one physical pool of `num_blocks` blocks.

Block-outer layouts (BLHNC, BLNHC, BHLNC) give each block one region per group:
- packing="overlay" (vLLM PR #48993): every group is dense from offset 0 inside the block, the
  groups overlap (a block belongs to one group at a time), block_stride = the largest group;
- packing="stack": the groups one after another in each block, block_stride = their sum.
Inside a group's region the specs follow one another as in SPEC 2's block-outer rule, with the
padded page in place of `H x N x C` as the per-layer stride.

Layer-outer layouts store each spec as its own dense [L, B, H, rows, C] tensor (padded page as
the block stride), so groups never share bytes: "stack" works for any block sizes; "overlay"
(which needs a shared block) is refused when there is more than one group.

Plan math only: imports nothing but the spec and layout modules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .layout import DEFAULT_LAYOUT, DIMS, LAYOUTS, dense_strides, perm
from .spec import INT64_MAX, CacheSpec, KVCacheTensor, SpecLookup, check_split_pages

PACKINGS = ("overlay", "stack")


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


@dataclass(frozen=True)
class CacheGroup:
    """Specs sharing one block table of `block_size` tokens per block."""

    name: str
    specs: tuple[CacheSpec, ...]
    block_size: int
    # tokens a request keeps in this group (the last `window` tokens: SWA 128, compressor
    # states 8 / 128), None: every token. Planning ignores it; capacity and transfers use it.
    window: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"CacheGroup.name must be a non-empty string, got {self.name!r}")
        specs = tuple(self.specs)
        if not specs:
            raise ValueError(f"CacheGroup {self.name!r} must hold at least one CacheSpec")
        for s in specs:
            if not isinstance(s, CacheSpec):
                raise TypeError(f"CacheGroup {self.name!r}: specs must be CacheSpec objects, got "
                                f"{type(s).__name__}")
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
            raise ValueError(f"CacheGroup.block_size must be a positive int, got {bs!r}")
        for s in specs:
            if bs % s.compress_ratio:
                raise ValueError(f"CacheGroup {self.name!r}: block_size ({bs}) must be a multiple "
                                 f"of spec {s.name!r}'s compress_ratio ({s.compress_ratio})")
        w = self.window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0):
            raise ValueError(f"CacheGroup.window must be None or a positive int, got {w!r}")
        object.__setattr__(self, "specs", specs)

    def blocks_for(self, tokens: int) -> int:
        """Blocks of this group a request of `tokens` tokens holds (a windowed group: the
        blocks that hold its last `window` tokens)."""
        if tokens <= 0:
            return 0
        first = 0 if self.window is None else max(tokens - self.window, 0)
        return (tokens - 1) // self.block_size - first // self.block_size + 1

    def rows(self, spec: CacheSpec) -> int:
        """Rows of `spec` in one block of this group (block_size / compress_ratio)."""
        return self.block_size // spec.compress_ratio

    def page_bytes(self, spec: CacheSpec) -> int:
        """One block of one layer of `spec`, padded to the spec's page_align."""
        return _round_up(self.rows(spec) * spec.num_heads * spec.row_bytes, spec.page_align)

    @property
    def block_bytes(self) -> int:
        """Bytes of this group in one block: sum over its specs of layers x padded page."""
        return sum(s.num_layers * self.page_bytes(s) for s in self.specs)


def _strides(order: str, s: CacheSpec, rows: int, num_blocks: int) -> dict[str, int]:
    """Byte strides of one spec's dense tensor in `order` (outermost first), where the page (the
    unit below the inner of L and B; page_align > 1 needs H = 1) is padded to s.page_align."""
    sizes = {"L": s.num_layers, "B": num_blocks, "H": s.num_heads, "N": rows, "C": s.row_bytes}
    pad_at = "L" if "B" not in order or order.index("L") > order.index("B") else "B"
    return dense_strides(order, sizes, pad_at, s.page_align)


@dataclass(frozen=True)
class GroupPlan(SpecLookup):
    """A plan of several cache groups in one flat buffer (plan_cache(groups=...))."""

    groups: tuple[CacheGroup, ...]
    num_blocks: int
    layout: str
    packing: str
    tensors: dict[str, KVCacheTensor] = field(repr=False)
    group_offsets: dict[str, int] = field(repr=False)  # start of each group's region in block 0
    block_stride: int          # bytes of one physical block (layer-outer: total / num_blocks)
    total_bytes: int

    @property
    def specs(self) -> tuple[CacheSpec, ...]:
        return tuple(s for g in self.groups for s in g.specs)

    def group(self, name: str) -> CacheGroup:
        """The group named `name`, or the group holding the spec named `name`."""
        for g in self.groups:
            if g.name == name or any(s.name == name for s in g.specs):
                return g
        raise KeyError(f"no group or spec named {name!r}; groups: {[g.name for g in self.groups]}")

    def rows_per_block(self, name: str) -> int:
        return self.group(name).rows(self.spec(name))

    def page_bytes(self, name: str) -> int:
        """Padded page of spec `name` (one block, one layer)."""
        return self.group(name).page_bytes(self.spec(name))

    def num_slots(self, name: str) -> int:
        return self.num_blocks * self.rows_per_block(name)

    def group_region(self, name: str, block: int = 0) -> tuple[int, int]:
        """[start, end) of group `name`'s bytes in `block` (block-outer layouts)."""
        if not self.block_outer:
            raise ValueError(f"group regions are per block in block-outer layouts; {self.layout} "
                             f"is layer-outer")
        g = self.group(name)
        start = block * self.block_stride + self.group_offsets[g.name]
        return start, start + g.block_bytes


def plan_groups(groups: Iterable[CacheGroup], num_blocks: int, layout: str = DEFAULT_LAYOUT,
                packing: str = "overlay") -> GroupPlan:
    """Lay out cache groups (each with its own block size) in one flat buffer."""
    groups = tuple(groups)
    if not groups:
        raise ValueError("groups must hold at least one CacheGroup")
    for g in groups:
        if not isinstance(g, CacheGroup):
            raise TypeError(f"groups must be CacheGroup objects, got {type(g).__name__}")
    gnames = [g.name for g in groups]
    names = [s.name for g in groups for s in g.specs]
    dup = sorted({n for n in names if names.count(n) > 1} | {n for n in gnames
                                                               if gnames.count(n) > 1})
    if dup:
        raise ValueError(f"group and spec names must be unique across the plan, duplicated: {dup}")
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
        raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
    order = "".join(DIMS[i] for i in perm(layout))
    block_outer = order[0] == "B"
    if not block_outer and packing == "overlay" and len(groups) > 1:
        raise ValueError(f"packing='overlay' shares each physical block between groups, which "
                         f"needs a block-outer layout (BLHNC, BLNHC, BHLNC); {layout} is "
                         f"layer-outer: use a block-outer layout or packing='stack'")

    group_bytes = [g.block_bytes for g in groups]
    if block_outer:
        if packing == "overlay":
            offsets = [0] * len(groups)
            stride = max(group_bytes)
        else:
            offsets = [sum(group_bytes[:i]) for i in range(len(groups))]
            stride = sum(group_bytes)
    else:
        stride = sum(group_bytes)
    total = stride * num_blocks
    if total > INT64_MAX:
        raise ValueError(f"num_blocks = {num_blocks} makes a buffer of {total} bytes "
                         f"({stride} per block), beyond int64; at most {INT64_MAX // stride} "
                         f"blocks fit")

    tensors: dict[str, KVCacheTensor] = {}
    group_offsets: dict[str, int] = {}
    layer_outer_offset = 0
    for gi, g in enumerate(groups):
        if block_outer:
            group_offsets[g.name] = offsets[gi]
        offset = offsets[gi] if block_outer else None
        for s in g.specs:
            rows, page = g.rows(s), g.page_bytes(s)
            if block_outer:
                st = _strides(order[1:], s, rows, num_blocks)
                st["B"] = stride
                start = offset
                offset += s.num_layers * page
            else:
                st = _strides(order, s, rows, num_blocks)
                start = layer_outer_offset
                layer_outer_offset += s.num_layers * page * num_blocks
            tensors[s.name] = KVCacheTensor(
                size=total, layers=[f"{s.name}.{i}" for i in range(s.num_layers)],
                layer_stride=st["L"], block_stride=st["B"], offset=start,
                head_stride=st["H"], token_stride=st["N"], row_bytes=s.row_bytes,
                num_heads=s.num_heads)
            check_split_pages(s, tensors[s.name], layout)
    return GroupPlan(groups=groups, num_blocks=num_blocks, layout=layout, packing=packing,
                     tensors=tensors, group_offsets=group_offsets, block_stride=stride,
                     total_bytes=total)
