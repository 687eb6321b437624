"""The layout, seen: a self-contained HTML page (and SVG / PNG pictures) drawn from a real plan.

Everything the page shows comes from the planner: the memory map is an SVG drawn here from
`render.block_regions`, and the page embeds each plan's view table (offsets and strides) as
JSON. The page's script only applies the address formula of SPEC 2 to those numbers, and
highlights the map cell that holds each address. No network access: inline CSS, JS and SVG.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from .layout import CachePlan
from .render import Region, address_walk, block_regions, plan_data

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


def svg_map(plan: CachePlan, block_table: list[int], width: int = 960) -> str:
    """The memory map of `plan` as an SVG element (cells carry their byte range as data)."""
    colors = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(plan.specs)}
    rows = map_rows(plan, shown_blocks(plan, block_table))
    label_w, gap_w, row_h, pad = 150, 34, 26, 6
    span = max(sum(r.end - r.start for r, _ in row.cells) for row in rows if row.cells)
    max_gaps = max(len(row.gaps) for row in rows)
    scale = (width - label_w - pad - max_gaps * gap_w) / span
    out, y = [], 28
    title = (f"{plan.layout}: {plan.num_blocks} blocks x {plan.block_size} tokens, "
             f"{plan.total_bytes:,} bytes")
    out.append(f'<text x="4" y="16" class="title">{html.escape(title)}</text>')
    for row in rows:
        if row.elided_rows:
            out.append(f'<text x="{label_w}" y="{y + 15}" class="elided">... {row.elided_rows} '
                       f'block{"s" if row.elided_rows > 1 else ""} not drawn ...</text>')
            y += row_h
            continue
        out.append(f'<text x="4" y="{y + 11}" class="label">{html.escape(row.label)}</text>'
                   f'<text x="4" y="{y + 22}" class="offset">@{row.start:,}</text>')
        x = float(label_w)
        gaps = dict(row.gaps)
        for i, (r, b) in enumerate(row.cells + [(None, None)]):
            if i in gaps:
                out.append(f'<text x="{x + 3:.1f}" y="{y + 16}" class="gap">...{gaps[i]}</text>')
                x += gap_w
            if r is None:
                break
            w = (r.end - r.start) * scale
            name = f"{r.spec} L{r.layer}" + ("" if r.head is None else f" H{r.head}") + f" b{b}"
            out.append(
                f'<rect class="cell" x="{x:.2f}" y="{y}" width="{max(w - 1, 0.5):.2f}" height="{row_h - 4}" '
                f'fill="{colors[r.spec]}" data-start="{r.start}" data-end="{r.end}" data-spec="{r.spec}" '
                f'data-layer="{r.layer}" data-block="{b}"><title>{html.escape(name)}: bytes '
                f'[{r.start:,}, {r.end:,})</title></rect>')
            text = name if w > 7 * len(name) else (f"b{b}" if w > 22 else "")
            if text:
                out.append(f'<text x="{x + 3:.1f}" y="{y + 15}" class="cell-text">{html.escape(text)}</text>')
            x += w
        y += row_h
    legend_x = 4
    for s in plan.specs:
        out.append(f'<rect x="{legend_x}" y="{y + 4}" width="12" height="12" fill="{colors[s.name]}"/>'
                   f'<text x="{legend_x + 16}" y="{y + 14}" class="label">{html.escape(s.name)} '
                   f'({s.row_bytes} B/token, {s.num_layers} layers, {s.num_heads} '
                   f'head{"s" if s.num_heads > 1 else ""})</text>')
        legend_x += 24 + 7 * (len(s.name) + 40)
    height = y + 24
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="map" data-layout="{plan.layout}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" '
            f'font-size="11"><style>.title{{font-weight:bold;font-size:12px}}.label{{fill:#222}}'
            f'.offset{{fill:#777;font-size:9px}}.elided,.gap{{fill:#888;font-style:italic}}'
            f'.cell-text{{fill:#fff;pointer-events:none}}.cell.hit{{stroke:#000;stroke-width:2.5}}'
            f'</style>{"".join(out)}<g class="markers"></g></svg>')


def write_svg(path: str | Path, plan: CachePlan, token: int, block_table: list[int], layer: int) -> None:
    address_walk(plan, token, block_table, layer)  # reject what the page would reject
    Path(path).write_text(svg_map(plan, block_table))


def write_png(path: str | Path, plan: CachePlan, token: int, block_table: list[int], layer: int) -> None:
    """The memory map as PNG, drawn with matplotlib from the same rows as the SVG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    walk = address_walk(plan, token, block_table, layer)
    rows = map_rows(plan, shown_blocks(plan, block_table))
    colors = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(plan.specs)}
    hits = {a.address for a in walk.addresses}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1))
    for i, row in enumerate(rows):
        y = len(rows) - i
        if row.elided_rows:
            ax.text(0.01, y, f"... {row.elided_rows} blocks not drawn ...", style="italic", va="center")
            continue
        ax.text(-0.01, y, row.label, ha="right", va="center", fontsize=8)
        span = sum(r.end - r.start for r, _ in row.cells)
        x = 0.0
        for r, b in row.cells:
            w = (r.end - r.start) / span
            hit = any(r.start <= h < r.end for h in hits)
            ax.barh(y, w, left=x, color=colors[r.spec], edgecolor="black" if hit else "white",
                    linewidth=2.5 if hit else 0.5)
            x += w
    ax.set_axis_off()
    ax.set_title(f"{plan.layout}: token {token} -> slot {walk.slot}; " + ", ".join(
        f"{a.spec} L{a.layer} @ {a.address}" for a in walk.addresses), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_html(path: str | Path, plans: list[CachePlan], token: int, block_table: list[int],
               layer: int) -> None:
    for plan in plans:
        address_walk(plan, token, block_table, layer)  # bad input fails here, not in the page
    data = {"plans": [plan_data(p) for p in plans],
            "initial": {"token": token, "block_table": block_table, "layer": layer}}
    maps = "".join(f'<div class="map-wrap" data-layout="{p.layout}">{svg_map(p, block_table)}</div>'
                   for p in plans)
    page = (_TEMPLATE.replace("__DATA__", json.dumps(data).replace("</", "<\\/"))
            .replace("__MAPS__", maps))
    Path(path).write_text(page)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>kvcache_ext: paged KV cache layout</title>
<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222;max-width:1000px}
h1{font-size:18px} h2{font-size:15px;margin:18px 0 6px}
.controls label{margin-right:14px} .controls input[type=number]{width:90px}
#block-table-input{width:220px}
table{border-collapse:collapse;font-family:monospace;font-size:12px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right} th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
.chain{font-family:monospace;font-size:13px;background:#f7f7f7;padding:8px;border-radius:4px}
.chain b{color:#b00} .err{color:#b00;font-weight:bold} .map-wrap{margin:8px 0;overflow-x:auto}
.marker{stroke:#000;stroke-width:2}
</style></head><body>
<h1>kvcache_ext: where a token's bytes live</h1>
<p>The memory map of the flat cache buffer, drawn from the planner's numbers. Pick a token of the
request (its position and the request's block table) and a layer: the page walks position &rarr;
logical block &rarr; block table &rarr; physical block &rarr; slot, then applies each spec's view
to the slot and marks the row's bytes in the map.</p>
<div class="controls">
<label>layout <select id="layout-select"></select></label>
<label><input type="checkbox" id="side-by-side"> side by side</label>
<label>token <input type="number" id="token-input" min="0"></label>
<label>layer <select id="layer-select"></select></label>
<label>block table <input type="text" id="block-table-input"></label>
</div>
<h2>Address walk</h2>
<div class="chain" id="chain"></div>
<table id="addresses"><thead><tr><th>spec</th><th>offset</th><th>+ layer &times; layer_stride</th>
<th>+ block &times; block_stride</th><th>+ position &times; token_stride</th><th>= address</th>
<th>row bytes</th></tr></thead><tbody></tbody></table>
<h2>Views</h2>
<table id="views"><thead><tr><th>spec</th><th>L</th><th>H</th><th>offset</th><th>layer_stride</th>
<th>block_stride</th><th>head_stride</th><th>token_stride</th><th>row</th><th>page</th></tr></thead>
<tbody></tbody></table>
<h2>Memory map</h2>
<div id="maps">__MAPS__</div>
<script id="plan-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("plan-data").textContent);
const $ = (id) => document.getElementById(id);
const fmt = (n) => n.toLocaleString("en-US");
const state = {plan: 0, token: DATA.initial.token, layer: DATA.initial.layer,
               table: DATA.initial.block_table.slice(), side: false};

function setup() {
  DATA.plans.forEach((p, i) => $("layout-select").add(new Option(p.layout, i)));
  const layers = Math.max(...DATA.plans[0].specs.map((s) => s.num_layers));
  for (let l = 0; l < layers; l++) $("layer-select").add(new Option(String(l), l));
  $("token-input").value = state.token;
  $("layer-select").value = state.layer;
  $("block-table-input").value = state.table.join(",");
  $("side-by-side").disabled = DATA.plans.length < 2;
  $("layout-select").onchange = (e) => { state.plan = +e.target.value; update(); };
  $("side-by-side").onchange = (e) => { state.side = e.target.checked; update(); };
  $("token-input").oninput = (e) => { state.token = parseInt(e.target.value, 10); update(); };
  $("layer-select").onchange = (e) => { state.layer = +e.target.value; update(); };
  $("block-table-input").oninput = (e) => {
    state.table = e.target.value.split(",").map((s) => s.trim()).filter((s) => s !== "").map(Number);
    update();
  };
  update();
}

// SPEC 2: address = offset + layer*layer_stride + block*block_stride + head*head_stride
//                   + position*token_stride + byte, with every number taken from the plan.
function walk(plan) {
  const t = state.token, bs = plan.block_size;
  if (!Number.isInteger(t) || t < 0) return {error: "token must be a non-negative integer"};
  const logical = Math.floor(t / bs), pos = t % bs;
  if (logical >= state.table.length)
    return {error: `token ${t} is in logical block ${logical}, but the block table has ${state.table.length} entries`};
  const physical = state.table[logical];
  if (!Number.isInteger(physical) || physical < 0 || physical >= plan.num_blocks)
    return {error: `block_table[${logical}] = ${physical} is outside [0, ${plan.num_blocks})`};
  const rows = plan.specs.filter((s) => state.layer < s.num_layers).map((s) => ({
    spec: s.name, offset: s.offset, layer: [state.layer, s.layer_stride],
    block: [physical, s.block_stride], token: [pos, s.token_stride], row: s.row_bytes,
    address: s.offset + state.layer * s.layer_stride + physical * s.block_stride + pos * s.token_stride}));
  return {logical, physical, pos, slot: physical * bs + pos, rows};
}

function update() {
  const plan = DATA.plans[state.plan];
  const w = walk(plan);
  const chain = $("chain"), body = document.querySelector("#addresses tbody");
  body.innerHTML = "";
  if (w.error) {
    chain.innerHTML = `<span class="err" id="walk-error"></span>`;
    $("walk-error").textContent = w.error;
  } else {
    chain.innerHTML =
      `position ${state.token} &rarr; logical block ${state.token} / ${plan.block_size} = <b id="chain-logical">${w.logical}</b>` +
      ` &rarr; block_table[${w.logical}] = <b id="chain-physical">${w.physical}</b>` +
      ` &rarr; position in block ${state.token} % ${plan.block_size} = <b id="chain-position">${w.pos}</b>` +
      ` &rarr; slot = ${w.physical} &times; ${plan.block_size} + ${w.pos} = <b id="chain-slot">${w.slot}</b>`;
    for (const r of w.rows) {
      const tr = body.insertRow();
      tr.dataset.spec = r.spec;
      const cells = [[r.spec, "spec"], [fmt(r.offset), "term-offset"],
        [`${r.layer[0]} × ${fmt(r.layer[1])} = ${fmt(r.layer[0] * r.layer[1])}`, "term-layer"],
        [`${r.block[0]} × ${fmt(r.block[1])} = ${fmt(r.block[0] * r.block[1])}`, "term-block"],
        [`${r.token[0]} × ${fmt(r.token[1])} = ${fmt(r.token[0] * r.token[1])}`, "term-token"],
        [String(r.address), "address"], [String(r.row), "row"]];
      for (const [text, cls] of cells) { const td = tr.insertCell(); td.textContent = text; td.className = cls; }
    }
  }
  const views = document.querySelector("#views tbody");
  views.innerHTML = "";
  for (const s of plan.specs) {
    const tr = views.insertRow();
    for (const v of [s.name, s.num_layers, s.num_heads, s.offset, s.layer_stride, s.block_stride,
                     s.head_stride, s.token_stride, s.row_bytes, s.page_bytes]) tr.insertCell().textContent = String(v);
  }
  document.querySelectorAll(".map-wrap").forEach((wrap, i) => {
    wrap.style.display = (state.side || i === state.plan) ? "" : "none";
    highlight(wrap.querySelector("svg"), walk(DATA.plans[i]));
  });
}

function highlight(svg, w) {
  svg.querySelectorAll(".cell.hit").forEach((c) => c.classList.remove("hit"));
  const markers = svg.querySelector(".markers");
  markers.innerHTML = "";
  if (w.error) return;
  for (const r of w.rows) {
    for (const cell of svg.querySelectorAll(".cell")) {
      const a = +cell.dataset.start, b = +cell.dataset.end;
      if (r.address < a || r.address >= b) continue;
      cell.classList.add("hit");
      const x = +cell.getAttribute("x") + (r.address - a) / (b - a) * +cell.getAttribute("width");
      const y = +cell.getAttribute("y"), h = +cell.getAttribute("height");
      const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
      Object.entries({x1: x, x2: x, y1: y - 3, y2: y + h + 3, class: "marker"}).forEach(([k, v]) => line.setAttribute(k, v));
      line.dataset.spec = r.spec;
      markers.appendChild(line);
    }
  }
}
setup();
</script></body></html>
"""
