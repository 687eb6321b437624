"""What a plan looks like, as data and as text: the views table, a block's byte map and the
address walk of one token (block table -> slot -> byte address per spec). The HTML page and
the SVG picture are drawn from the same data (page.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .layout import CachePlan


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
        terms = (AddressTerm("layer", layer, t.layer_stride),
                 AddressTerm("block", physical, t.block_stride),
                 AddressTerm("token", pos, t.token_stride))
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
             **{k: v for k, v in asdict(plan.tensor(s.name)).items()
                if k in ("offset", "layer_stride", "block_stride", "head_stride", "token_stride")}}
            for s in plan.specs
        ],
    }


# ---- text -----------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return [fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]]


def views_table(plan: CachePlan) -> list[str]:
    rows = []
    for s in plan.specs:
        t = plan.tensor(s.name)
        rows.append([s.name, s.num_layers, s.num_heads, t.offset, t.layer_stride, t.block_stride,
                     t.head_stride, t.token_stride, s.row_bytes, plan.page_bytes(s.name)])
    head = [f"{plan.layout}: {plan.num_blocks} blocks x {plan.block_size} tokens, "
            f"{plan.total_bytes} bytes"]
    return head + _table(["spec", "L", "H", "offset", "layer_stride", "block_stride",
                          "head_stride", "token_stride", "row", "page"], rows)


def _label(r: Region) -> str:
    return f"{r.spec} L{r.layer}" + ("" if r.head is None else f" H{r.head}")


def byte_map(plan: CachePlan, block: int) -> list[str]:
    regions = block_regions(plan, block)
    lines = [f"block {block}:"]
    adjacent = all(a.end == b.start for a, b in zip(regions, regions[1:]))
    if adjacent:  # block-outer: one contiguous span, drawn as the seed draws it
        lines.append("  [ " + " | ".join(_label(r) for r in regions) + " ]")
        lines.append("    " + " ".join(str(r.start) for r in regions) + f" {regions[-1].end}")
    else:
        lines.append(f"  {len(regions)} separate spans:")
        lines += [f"    {_label(r):<16} [{r.start}, {r.end})" for r in regions]
    return lines


def walk_lines(w: Walk) -> list[str]:
    lines = [f"token {w.token}: logical block {w.token} // {w.block_size} = {w.logical_block}, "
             f"block_table[{w.logical_block}] = {w.physical_block}",
             f"  position {w.token} % {w.block_size} = {w.position}, slot = {w.physical_block} x "
             f"{w.block_size} + {w.position} = {w.slot}"]
    for a in w.addresses:
        terms = " + ".join(f"{t.index}x{t.stride}" for t in a.terms)
        lines.append(f"  {a.spec} layer {a.layer}: {a.offset} + {terms} = {a.address}")
    return lines


def side_by_side(columns: list[list[str]], gap: int = 4) -> list[str]:
    if len(columns) == 1:
        return columns[0]
    widths = [max(map(len, c)) for c in columns]
    height = max(map(len, columns))
    return [(" " * gap).join((c[i] if i < len(c) else "").ljust(w)
                             for c, w in zip(columns, widths)).rstrip() for i in range(height)]
