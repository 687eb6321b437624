"""Cache groups (SPEC 10): the packed slab of one physical block, its views table, and where a
token lands in each spec of each group."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..plan import slot_mapping
from .text import split_text, table


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
    return head + table(["group", "block", "spec", "L", "ratio", "rows", "row", "split", "page",
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
