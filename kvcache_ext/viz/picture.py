"""The memory map as a picture: rows of boxes and labels, which page.py draws as SVG and PNG."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import CachePlan
from .model import Region, Walk, block_regions
from .text import split_text


PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
MAX_SHOWN_BLOCKS = 16


@dataclass
class Row:
    label: str
    start: int
    cells: list[tuple[Region, int]] = field(default_factory=list)  # (region, block)
    gaps: list[tuple[int, int]] = field(default_factory=list)      # (position among cells, count)
    elided_rows: int = 0  # a placeholder row standing for this many elided rows


def shown_blocks(plan: CachePlan, block_table: list[int]) -> list[int]:
    """All blocks of a small plan; else the first few, the last, and the block table's."""
    if plan.num_blocks <= MAX_SHOWN_BLOCKS:
        return list(range(plan.num_blocks))
    keep = set(range(4)) | {plan.num_blocks - 1}
    keep |= {b for b in block_table if 0 <= b < plan.num_blocks}
    return sorted(keep)


def map_rows(plan: CachePlan, blocks: list[int]) -> list[Row]:
    """Rows of the memory map: one per block (block-outer) or per (spec, layer[, head])."""
    rows: list[Row] = []
    if plan.block_outer:
        prev = -1
        for b in blocks:
            if b > prev + 1:
                rows.append(Row(label="", start=0, elided_rows=b - prev - 1))
            regions = block_regions(plan, b)
            rows.append(Row(label=f"block {b}", start=regions[0].start,
                            cells=[(r, b) for r in regions]))
            prev = b
        if blocks[-1] < plan.num_blocks - 1:
            rows.append(Row(label="", start=0, elided_rows=plan.num_blocks - 1 - blocks[-1]))
        return rows
    for piece in block_regions(plan, 0):  # each piece of block 0 starts one row
        stride = plan.tensor(piece.spec).block_stride
        row = Row(label=f"{piece.spec} L{piece.layer}" + ("" if piece.head is None else f" H{piece.head}"),
                  start=piece.start)
        prev = -1
        for b in blocks:
            if b > prev + 1:
                row.gaps.append((len(row.cells), b - prev - 1))
            shift = b * stride
            row.cells.append((Region(piece.start + shift, piece.end + shift, piece.spec, piece.layer,
                                     piece.head), b))
            prev = b
        if blocks[-1] < plan.num_blocks - 1:
            row.gaps.append((len(row.cells), plan.num_blocks - 1 - blocks[-1]))
        rows.append(row)
    return rows


# ---- the picture: one list of boxes and labels that the SVG and the PNG both draw -----------
LABEL_W, GAP_W, ROW_H, PAD, CHAR_W = 150, 34, 26, 6, 7  # px; CHAR_W: one 11 px monospace char
PICTURE_GAP = 24  # px between layouts drawn side by side


@dataclass(frozen=True)
class Box:
    """A filled rectangle: a cell of the map (`region` set) or a legend swatch."""

    x: float
    y: float
    w: float
    h: float
    fill: str
    region: Region | None = None
    block: int | None = None
    hit: bool = False  # holds a byte the walked token addresses


@dataclass(frozen=True)
class Label:
    x: float
    y: float  # baseline
    text: str
    cls: str  # title, walk, label, offset, elided, gap, cell-text


@dataclass(frozen=True)
class Picture:
    layout: str
    width: int
    height: int
    boxes: tuple[Box, ...]
    labels: tuple[Label, ...]


def region_name(r: Region) -> str:
    return f"{r.spec} L{r.layer}" + ("" if r.head is None else f" H{r.head}")


def map_picture(plan: CachePlan, block_table: list[int], walk: Walk | None = None,
                width: int = 960) -> Picture:
    """The memory map of `plan`: title, walk line, rows of cells with labels, legend."""
    colors = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(plan.specs)}
    rows = map_rows(plan, shown_blocks(plan, block_table))
    span = max(sum(r.end - r.start for r, _ in row.cells) for row in rows if row.cells)
    max_gaps = max(len(row.gaps) for row in rows)
    scale = (width - LABEL_W - PAD - max_gaps * GAP_W) / span
    hits = {a.address for a in walk.addresses} if walk else set()
    boxes: list[Box] = []
    labels = [Label(4, 16, f"{plan.layout}: {plan.num_blocks} blocks x {plan.block_size} tokens, "
                           f"{plan.total_bytes:,} bytes", "title")]
    y = 28
    if walk is not None:
        labels.append(Label(4, 31, f"token {walk.token} -> slot {walk.slot}: " + ", ".join(
            f"{a.spec} L{a.layer} @ {a.address:,}" for a in walk.addresses), "walk"))
        y = 40
    for row in rows:
        if row.elided_rows:
            labels.append(Label(LABEL_W, y + 15, f"... {row.elided_rows} block"
                                f"{'s' if row.elided_rows > 1 else ''} not drawn ...", "elided"))
            y += ROW_H
            continue
        labels += [Label(4, y + 11, row.label, "label"),
                   Label(4, y + 22, f"@{row.start:,}", "offset")]
        x = float(LABEL_W)
        gaps = dict(row.gaps)
        for i, (r, b) in enumerate(row.cells + [(None, None)]):
            if i in gaps:
                labels.append(Label(x + 3, y + 16, f"...{gaps[i]}", "gap"))
                x += GAP_W
            if r is None:
                break
            w = (r.end - r.start) * scale
            boxes.append(Box(x, y, max(w - 1, 0.5), ROW_H - 4, colors[r.spec], r, b,
                             any(r.start <= h < r.end for h in hits)))
            name = f"{region_name(r)} b{b}"
            text = name if w > CHAR_W * len(name) else (f"b{b}" if w > 22 else "")
            if text:
                labels.append(Label(x + 3, y + 15, text, "cell-text"))
            x += w
        y += ROW_H
    legend_x = 4.0
    for s in plan.specs:
        split = f" split {split_text(s.split)}" if s.split else ""
        text = (f"{s.name} ({s.row_bytes} B/token{split}, {s.num_layers} layers, {s.num_heads} "
                f"head{'s' if s.num_heads > 1 else ''})")
        if legend_x > 4 and legend_x + 16 + CHAR_W * len(text) > width:  # wrap the legend
            legend_x, y = 4.0, y + 18
        boxes.append(Box(legend_x, y + 4, 12, 12, colors[s.name]))
        labels.append(Label(legend_x + 16, y + 14, text, "label"))
        legend_x += 32 + CHAR_W * len(text)
    return Picture(plan.layout, width, y + 24, tuple(boxes), tuple(labels))
