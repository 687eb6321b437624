"""What a plan looks like, as data: the pages of a block (regions), the address walk of one
token (block table -> slot -> byte address per spec) and the plan as JSON-able data for the page.
text.py prints them, picture.py draws them, page.py writes HTML, SVG and PNG."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..plan import CachePlan


@dataclass(frozen=True)
class Region:
    """A contiguous piece of one block: [start, end) bytes of (spec, layer[, head])."""

    start: int
    end: int
    spec: str
    layer: int
    head: int | None  # None when the piece holds every head


@dataclass(frozen=True)
class AddressTerm:
    name: str
    index: int
    stride: int

    @property
    def value(self) -> int:
        return self.index * self.stride


@dataclass(frozen=True)
class SpecAddress:
    spec: str
    layer: int
    offset: int
    terms: tuple[AddressTerm, ...]
    address: int
    row_bytes: int


@dataclass(frozen=True)
class Walk:
    token: int
    block_size: int
    logical_block: int
    physical_block: int
    position: int
    slot: int
    layer: int
    addresses: tuple[SpecAddress, ...]


def block_regions(plan: CachePlan, block: int) -> list[Region]:
    """The pages of physical block `block`, in address order."""
    return [Region(pg.start + block * pg.block_stride, pg.start + block * pg.block_stride + pg.length,
                   pg.spec, pg.layer, pg.head) for pg in plan.block_pages()]


def address_walk(plan: CachePlan, token: int, block_table: list[int], layer: int) -> Walk:
    """Token position -> logical block -> block_table -> physical block -> slot -> addresses."""
    if token < 0:
        raise ValueError(f"token must be >= 0, got {token}")
    logical, pos = divmod(token, plan.block_size)
    if logical >= len(block_table):
        raise IndexError(f"token {token} is in logical block {logical}, but the block table has "
                         f"{len(block_table)} entries")
    physical = block_table[logical]
    if not 0 <= physical < plan.num_blocks:
        raise IndexError(f"block_table[{logical}] = {physical} is outside "
                         f"[0, num_blocks = {plan.num_blocks})")
    addrs = []
    for s in plan.specs:
        if layer >= s.num_layers:
            continue
        t = plan.tensor(s.name)
        # a split page puts token pos's first part at pos x a (its row's start here)
        step = s.split[0] if s.split else t.token_stride
        terms = (AddressTerm("layer", layer, t.layer_stride),
                 AddressTerm("block", physical, t.block_stride),
                 AddressTerm("token", pos, step))
        addr = t.offset + sum(x.value for x in terms)
        assert addr == plan.address(s.name, layer, physical * plan.block_size + pos)
        addrs.append(SpecAddress(s.name, layer, t.offset, terms, addr, s.row_bytes))
    if not addrs:
        raise IndexError(f"layer must be below some spec's num_layers, got {layer}")
    return Walk(token, plan.block_size, logical, physical, pos,
                physical * plan.block_size + pos, layer, tuple(addrs))


def plan_data(plan: CachePlan) -> dict:
    """The plan as plain data (what the HTML page embeds)."""
    return {
        "layout": plan.layout,
        "block_outer": plan.block_outer,
        "num_blocks": plan.num_blocks,
        "block_size": plan.block_size,
        "total_bytes": plan.total_bytes,
        "block_bytes": plan.total_bytes // plan.num_blocks,
        "specs": [
            {"name": s.name, "row_bytes": s.row_bytes, "num_layers": s.num_layers,
             "num_heads": s.num_heads, "page_bytes": plan.page_bytes(s.name),
             "split": list(s.split) if s.split else None,
             **{k: v for k, v in asdict(plan.tensor(s.name)).items()
                if k in ("offset", "layer_stride", "block_stride", "head_stride", "token_stride")}}
            for s in plan.specs
        ],
    }
