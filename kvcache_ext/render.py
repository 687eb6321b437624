"""What a plan looks like, as data and as text: the views table, a block's byte map and the
address walk of one token (block table -> slot -> byte address per spec), and the memory map
as a picture (boxes and labels). The HTML page, the SVG and the PNG are drawn from the same
data (page.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

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


# ---- text -----------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
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
    return head + _table(["spec", "L", "H", "offset", "layer_stride", "block_stride",
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


# ---- the memory map as a picture: boxes and labels that page.py draws as SVG and PNG ---------
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


# ---- cache groups (SPEC 10): the packed slab of one physical block ---------------------------
@dataclass(frozen=True)
class SlabRun:
    """Consecutive pages of one spec inside one group's region of a block."""

    group: str
    spec: str
    start: int   # in block 0
    end: int
    layers: int
    page: int    # padded page (the layer stride)


def slab_runs(plan) -> list[list[SlabRun]]:
    """For each group of a block-outer GroupPlan, its specs' runs of pages in block 0."""
    if not plan.block_outer:
        raise ValueError(f"a packed slab needs a block-outer layout (BLHNC, BLNHC, BHLNC), got "
                         f"{plan.layout}")
    out = []
    for g in plan.groups:
        runs = []
        for s in g.specs:
            t = plan.tensor(s.name)
            page = g.page_bytes(s)
            runs.append(SlabRun(g.name, s.name, t.offset, t.offset + s.num_layers * page,
                                s.num_layers, page))
        out.append(runs)
    return out


def group_views_table(plan) -> list[str]:
    rows = []
    for g in plan.groups:
        for s in g.specs:
            t = plan.tensor(s.name)
            rows.append([g.name, g.block_size, s.name, s.num_layers, s.compress_ratio,
                         g.rows(s), s.row_bytes, split_text(s.split), g.page_bytes(s), t.offset,
                         t.layer_stride, t.block_stride])
    head = [f"{plan.layout}, packing={plan.packing}: {plan.num_blocks} blocks x "
            f"{plan.block_stride} bytes (block stride) = {plan.total_bytes} bytes"]
    return head + _table(["group", "block", "spec", "L", "ratio", "rows", "row", "split", "page",
                          "offset", "layer_stride", "block_stride"], rows)


def slab_lines(plan, width: int = 64) -> list[str]:
    """Text picture of one physical block: a bar per group, drawn to the block stride's scale."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines = [f"block b (bytes [b x {plan.block_stride}, (b + 1) x {plan.block_stride})): "
             + ("groups overlaid, each dense from offset 0; a block belongs to one group at a "
                "time" if plan.packing == "overlay" else "groups one after another")]
    legend, k = [], 0
    for runs in slab_runs(plan):
        bar = ["."] * width
        for r in runs:
            ch = letters[k % len(letters)]
            legend.append(f"    {ch} = {r.spec}: {r.layers} x {r.page} B = [{r.start}, {r.end})")
            k += 1
            lo = r.start * width // plan.block_stride
            hi = max(lo + 1, -(-r.end * width // plan.block_stride))
            bar[lo:hi] = ch * (hi - lo)
        end = runs[-1].end
        lines.append(f"  {runs[0].group:<12}|{''.join(bar)}| {end - runs[0].start} B "
                     f"({100 * (end - runs[0].start) / plan.block_stride:.1f}%)")
    return lines + legend


def group_walk_lines(plan, token: int, block_table: list[int], layer: int) -> list[str]:
    """Where token `token` of a request lands in each spec's layer `layer`: SPEC 10's
    compressed slot (-1: the token closes no window and writes nothing). Every group is given
    the same block table here (a drawing; real groups have their own)."""
    import torch

    from .layout import slot_mapping
    lines = [f"token {token}, block table {block_table} (each group's own in a real engine), "
             f"layer {layer}:"]
    bt = torch.tensor(block_table, dtype=torch.int32)
    for g in plan.groups:
        if token >= len(block_table) * g.block_size:
            lines.append(f"  {g.name}: token {token} is past the block table "
                         f"({len(block_table)} x {g.block_size} tokens)")
            continue
        for s in g.specs:
            slot = int(slot_mapping(bt, torch.tensor([token]), g.block_size,
                                    compress_ratio=s.compress_ratio)[0])
            if layer >= s.num_layers:
                continue
            if slot < 0:
                lines.append(f"  {s.name:<18} ratio {s.compress_ratio}: ({token} + 1) % "
                             f"{s.compress_ratio} != 0 -> slot -1 (no row written)")
                continue
            rows = g.rows(s)
            if slot >= plan.num_blocks * rows:
                lines.append(f"  {s.name:<18} slot {slot} is past the plan's {plan.num_blocks} "
                             f"blocks")
                continue
            lines.append(f"  {s.name:<18} ratio {s.compress_ratio}: slot {slot} = block "
                         f"{slot // rows} x {rows} rows + row {slot % rows} -> byte "
                         f"{plan.address(s.name, layer, slot)}")
    return lines
