"""The layout, seen: a self-contained HTML page (and SVG / PNG pictures) drawn from a real plan.

Everything the page shows comes from the planner: the memory map is an SVG drawn here from
`picture.map_picture` (the PNG draws the same boxes and labels with matplotlib, so both pictures
carry the same labels and legend), and the page embeds each plan's view table (offsets and strides) as
JSON. The page's script only applies the address formula of SPEC 2 to those numbers, and
highlights the map cell that holds each address. No network access: inline CSS, JS and SVG.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Sequence

from ..plan import CachePlan
from .model import Walk, address_walk, plan_data
from .picture import PICTURE_GAP, Picture, map_picture, region_name
from .slab import group_views_table, slab_lines, slab_runs

_SVG_STYLE = (".title{font-weight:bold;font-size:12px}.label{fill:#222}.walk{fill:#b00}"
              ".offset{fill:#777;font-size:9px}.elided,.gap{fill:#888;font-style:italic}"
              ".cell-text{fill:#fff;pointer-events:none}.cell.hit{stroke:#000;stroke-width:2.5}")
# The same styles for matplotlib: (size px, colour, weight, style).
_PNG_STYLE = {"title": (12, "#222", "bold", "normal"), "label": (11, "#222", "normal", "normal"),
              "walk": (11, "#b00", "normal", "normal"), "offset": (9, "#777", "normal", "normal"),
              "elided": (11, "#888", "normal", "italic"), "gap": (11, "#888", "normal", "italic"),
              "cell-text": (11, "#fff", "normal", "normal")}


def _svg(pic: Picture, x: float = 0) -> str:
    out = []
    for b in pic.boxes:
        if b.region is None:
            out.append(f'<rect x="{b.x:.1f}" y="{b.y}" width="{b.w}" height="{b.h}" fill="{b.fill}"/>')
            continue
        r = b.region
        out.append(
            f'<rect class="cell{" hit" if b.hit else ""}" x="{b.x:.2f}" y="{b.y}" width="{b.w:.2f}" '
            f'height="{b.h}" fill="{b.fill}" data-start="{r.start}" data-end="{r.end}" '
            f'data-spec="{r.spec}" data-layer="{r.layer}" data-block="{b.block}"><title>'
            f'{html.escape(region_name(r))} b{b.block}: bytes [{r.start:,}, {r.end:,})</title></rect>')
    out += [f'<text x="{t.x:.1f}" y="{t.y}" class="{t.cls}">{html.escape(t.text)}</text>'
            for t in pic.labels]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="map" data-layout="{pic.layout}" '
            f'x="{x:g}" y="0" width="{pic.width}" height="{pic.height}" '
            f'viewBox="0 0 {pic.width} {pic.height}" font-family="monospace" font-size="11">'
            f'<style>{_SVG_STYLE}</style>{"".join(out)}<g class="markers"></g></svg>')


def svg_map(plan: CachePlan, block_table: list[int], width: int = 960, walk: Walk | None = None) -> str:
    """The memory map of `plan` as an SVG element (cells carry their byte range as data)."""
    return _svg(map_picture(plan, block_table, walk, width))


def _pictures(plans: CachePlan | Sequence[CachePlan], token: int, block_table: list[int],
              layer: int) -> list[Picture]:
    plans = [plans] if isinstance(plans, CachePlan) else list(plans)
    # address_walk rejects what the page would reject, before a file is written
    return [map_picture(p, block_table, address_walk(p, token, block_table, layer)) for p in plans]


def svg_pictures(pics: Sequence[Picture]) -> str:
    """One SVG; several layouts side by side, each its own nested <svg data-layout=...>."""
    if len(pics) == 1:
        return _svg(pics[0])
    xs = [sum(p.width + PICTURE_GAP for p in pics[:i]) for i in range(len(pics))]
    width, height = xs[-1] + pics[-1].width, max(p.height for p in pics)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(_svg(p, x) for p, x in zip(pics, xs))}</svg>')


def write_svg(path: str | Path, plans: CachePlan | Sequence[CachePlan], token: int,
              block_table: list[int], layer: int) -> None:
    Path(path).write_text(svg_pictures(_pictures(plans, token, block_table, layer)))


def png_figure(plans: CachePlan | Sequence[CachePlan], token: int, block_table: list[int],
               layer: int, dpi: int = 100):
    """The SVG's picture as a matplotlib Figure: the same boxes and labels at the same pixels."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state
    from matplotlib.patches import Rectangle
    pics = _pictures(plans, token, block_table, layer)
    width = sum(p.width for p in pics) + PICTURE_GAP * (len(pics) - 1)
    height = max(p.height for p in pics)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)  # y down, as in SVG
    ax.set_axis_off()
    x0 = 0.0
    for pic in pics:
        for b in pic.boxes:
            ax.add_patch(Rectangle((x0 + b.x, b.y), b.w, b.h, facecolor=b.fill, edgecolor="black",
                                   linewidth=2.5 if b.hit else 0))  # the walked rows outlined
        for t in pic.labels:
            size, color, weight, style = _PNG_STYLE[t.cls]
            ax.text(x0 + t.x, t.y, t.text, fontsize=size * 72 / dpi, color=color, fontweight=weight,
                    fontstyle=style, family="monospace", va="baseline", ha="left")
        x0 += pic.width + PICTURE_GAP
    return fig


def write_png(path: str | Path, plans: CachePlan | Sequence[CachePlan], token: int,
              block_table: list[int], layer: int) -> None:
    """The memory maps as PNG (matplotlib), drawn from the same picture as the SVG."""
    fig = png_figure(plans, token, block_table, layer)
    fig.savefig(path, dpi=fig.dpi)


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
<th>block_stride</th><th>head_stride</th><th>token_stride</th><th>row</th><th>page</th><th>split</th></tr></thead>
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
    block: [physical, s.block_stride], token: [pos, s.split ? s.split[0] : s.token_stride],
    row: s.row_bytes,  // a split page: token pos's first part at pos x split[0]
    address: s.offset + state.layer * s.layer_stride + physical * s.block_stride
             + pos * (s.split ? s.split[0] : s.token_stride)}));
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
                     s.head_stride, s.token_stride, s.row_bytes, s.page_bytes,
                     s.split ? `${s.split[0]}+${s.split[1]}` : "-"]) tr.insertCell().textContent = String(v);
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


# ---- cache groups (SPEC 10): the packed slab, drawn from the real plan ----------------------
_SLAB_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
                 "#9c755f")


def svg_slab(plan, width: int = 960) -> str:
    """One physical block of a block-outer GroupPlan: a row per group, each spec's pages as
    cells (one per layer) at their byte offsets, to the scale of the block stride."""
    left, bar_w, row_h, top = 110, width - 130, 26, 34
    rows = slab_runs(plan)
    height = top + len(rows) * (row_h + 8) + 24
    scale = bar_w / plan.block_stride
    out = [f'<text x="4" y="14" class="title">{html.escape(plan.layout)} packing={plan.packing}: '
           f'block stride {plan.block_stride:,} B ({plan.num_blocks} blocks, '
           f'{plan.total_bytes:,} B)</text>',
           f'<text x="4" y="28" class="offset">each row is one group\'s bytes in block b, from '
           f'b x {plan.block_stride:,}; '
           + ("rows overlap: a block belongs to one group at a time" if plan.packing == "overlay"
              else "groups one after another") + '</text>']
    k = 0
    for i, runs in enumerate(rows):
        y = top + i * (row_h + 8)
        out.append(f'<text x="4" y="{y + 17}" class="label">{html.escape(runs[0].group)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{bar_w}" height="{row_h}" fill="#eee"/>')
        for r in runs:
            colour = _SLAB_COLOURS[k % len(_SLAB_COLOURS)]
            k += 1
            for layer in range(r.layers):
                x0 = left + (r.start + layer * r.page) * scale
                out.append(f'<rect class="cell" x="{x0:.2f}" y="{y}" '
                           f'width="{max(r.page * scale, 0.3):.2f}" height="{row_h}" '
                           f'fill="{colour}" stroke="#fff" stroke-width="0.2" '
                           f'data-spec="{html.escape(r.spec)}" data-layer="{layer}" '
                           f'data-start="{r.start + layer * r.page}" data-page="{r.page}"><title>'
                           f'{html.escape(r.spec)} L{layer}: bytes [{r.start + layer * r.page:,}, '
                           f'{r.start + (layer + 1) * r.page:,}) of the block</title></rect>')
            mid = left + (r.start + r.end) / 2 * scale
            label = f"{r.spec} {r.layers}x{r.page}"
            if (r.end - r.start) * scale > 7 * len(label) + 8:  # only where the label fits
                out.append(f'<text x="{mid:.1f}" y="{y + 17}" class="cell-text" '
                           f'text-anchor="middle">{html.escape(label)}</text>')
    out.append(f'<text x="{left}" y="{height - 6}" class="offset">0</text>'
               f'<text x="{left + bar_w}" y="{height - 6}" class="offset" text-anchor="end">'
               f'{plan.block_stride:,}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="slab" data-layout="{plan.layout}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'font-family="monospace" font-size="11"><style>{_SVG_STYLE}</style>'
            f'{"".join(out)}</svg>')


def write_slab_svg(path: str | Path, plans) -> None:
    plans = list(plans)
    svgs = [svg_slab(p) for p in plans]  # every check before the file is written
    if len(svgs) == 1:
        Path(path).write_text(svgs[0])
        return
    heights = [int(s.split('height="', 1)[1].split('"', 1)[0]) for s in svgs]
    ys = [sum(heights[:i]) for i in range(len(svgs))]
    body = "".join(s.replace("<svg ", f'<svg y="{y}" ', 1) for s, y in zip(svgs, ys))
    Path(path).write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="960" '
                          f'height="{sum(heights)}" viewBox="0 0 960 {sum(heights)}">{body}</svg>')


def write_slab_html(path: str | Path, plans) -> None:
    plans = list(plans)
    parts = []
    for p in plans:
        parts.append(svg_slab(p))
        parts.append("<pre>" + html.escape("\n".join(group_views_table(p) + [""] + slab_lines(p)))
                     + "</pre>")
    Path(path).write_text("<!doctype html><html><head><meta charset='utf-8'><title>packed cache "
                          "slab</title></head><body style='font-family:monospace'>"
                          + "".join(parts) + "</body></html>")
