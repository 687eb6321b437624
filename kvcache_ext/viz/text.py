"""A plan as text: the views table, a block's byte map, the address walk, columns side by side."""
from __future__ import annotations

from ..plan import CachePlan
from .model import Region, Walk, block_regions


# ---- text -----------------------------------------------------------------------------------
def table(headers: list[str], rows: list[list[object]]) -> list[str]:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return [fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]]


def split_text(split: tuple[int, int] | None) -> str:
    """A split page's two parts, "128+4" (first part of every token, then the second)."""
    return "-" if split is None else f"{split[0]}+{split[1]}"


def views_table(plan: CachePlan) -> list[str]:
    """The plan's views; a `split` column appears when some spec has split pages."""
    with_split = any(s.split for s in plan.specs)
    rows = []
    for s in plan.specs:
        t = plan.tensor(s.name)
        rows.append([s.name, s.num_layers, s.num_heads, t.offset, t.layer_stride, t.block_stride,
                     t.head_stride, t.token_stride, s.row_bytes, plan.page_bytes(s.name)]
                    + ([split_text(s.split)] if with_split else []))
    head = [f"{plan.layout}: {plan.num_blocks} blocks x {plan.block_size} tokens, "
            f"{plan.total_bytes} bytes"]
    return head + table(["spec", "L", "H", "offset", "layer_stride", "block_stride",
                          "head_stride", "token_stride", "row", "page"]
                         + (["split"] if with_split else []), rows)


def locate(plan: CachePlan, address: int) -> str:
    """Which page holds a byte: "mla L1 b5 +1312" (spec, layer[, head], block, byte in page)."""
    for pg in plan.block_pages():
        block, within = divmod(address - pg.start, pg.block_stride)
        if 0 <= block < plan.num_blocks and within < pg.length:
            head = "" if pg.head is None else f" H{pg.head}"
            return f"{pg.spec} L{pg.layer}{head} b{block} +{within}"
    raise IndexError(f"address {address} is outside the plan's {plan.total_bytes} bytes")


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
