"""python -m kvcache_ext layout: the views table, a block's byte map and the address walk of a
plan, in text, HTML, SVG or PNG; --preset: the packed slab of a cache-group model."""
from __future__ import annotations

import argparse

from ..plan import LAYOUTS, plan_cache
from ..plan.presets import GROUP_PRESETS, group_preset
from ..viz.model import address_walk
from ..viz.page import write_html, write_png, write_slab_html, write_slab_svg, write_svg
from ..viz.slab import group_views_table, group_walk_lines, slab_lines
from ..viz.text import byte_map, side_by_side, views_table, walk_lines
from .args import (CliError, group_model_name, int_list, layout_name, nonneg_int, out_file_with,
                   parse_spec, positive_int, v4_options)


def cmd_layout_groups(args: argparse.Namespace) -> None:
    """--preset deepseek-v4-pro: the packed slab of the real plan (SPEC 10)."""
    if args.spec or args.side_by_side or args.png:
        raise CliError("--preset cannot be combined with --spec, --side-by-side or --png")
    groups = group_preset(args.preset, mla=args.mla, indexer=args.indexer)
    table = args.block_table
    num_blocks = args.num_blocks if args.num_blocks is not None else max(table + [0]) + 3
    plans = [plan_cache(groups=groups, num_blocks=num_blocks, layout=lay, packing=args.packing)
             for lay in (args.layout or ["BLHNC"])]
    out = []
    for plan in plans:  # every check runs here, before the first line is printed
        out += ([f"{args.preset} (mla={args.mla}, indexer={args.indexer})"]
                + group_views_table(plan) + [""] + slab_lines(plan) + [""]
                + group_walk_lines(plan, args.token, table, args.layer) + [""])
    print("\n".join(out).rstrip())
    if args.svg or args.html:
        for path, write in ((args.svg, write_slab_svg), (args.html, write_slab_html)):
            if path:
                write(path, plans)
                print(f"wrote {path}")


def cmd_layout(args: argparse.Namespace) -> None:
    if args.preset:
        return cmd_layout_groups(args)
    specs = [parse_spec(s, args.layers) for s in (args.spec or ["mla:656", "indexer:132"])]
    table = args.block_table
    layouts = args.layout or ["BLHNC"]
    num_blocks = args.num_blocks if args.num_blocks is not None else max(table + [0]) + 3
    plans = [plan_cache(specs, num_blocks, args.block_size, lay) for lay in layouts]
    columns = []
    for plan in plans:  # every check runs here, before the first line is printed
        walk = address_walk(plan, args.token, table, args.layer)
        columns.append(views_table(plan) + [""] + byte_map(plan, walk.physical_block) + [""] +
                       walk_lines(walk))
    print("\n".join(side_by_side(columns) if args.side_by_side else
                    [line for c in columns for line in c + [""]]).rstrip())
    if args.html or args.svg or args.png:
        view = dict(token=args.token, block_table=table, layer=args.layer)
        for path, write in ((args.html, write_html), (args.svg, write_svg), (args.png, write_png)):
            if path:
                write(path, plans, **view)
                print(f"wrote {path}")


def add_parser(sub) -> None:
    lay = sub.add_parser("layout", help="views table, byte map and address walk of a plan")
    lay.add_argument("--layout", action="append", type=layout_name,
                     help=f"one of {', '.join(LAYOUTS)}; repeat to compare (default: BLHNC)")
    lay.add_argument("--spec", action="append",
                     help="NAME:ROW_BYTES[:LAYERS[:HEADS]], repeatable; ROW_BYTES A+B is a "
                          "split page, e.g. indexer:128+4 (default: mla:656 and indexer:132)")
    lay.add_argument("--layers", type=positive_int, default=2,
                     help="layers of specs that give none (default: %(default)s)")
    lay.add_argument("--block-size", type=positive_int, default=64,
                     help="tokens per block (default: %(default)s)")
    lay.add_argument("--num-blocks", type=positive_int, default=None,
                     help="physical blocks (default: largest block table entry + 3)")
    lay.add_argument("--token", type=nonneg_int, default=130,
                     help="token position in the request (default: %(default)s)")
    lay.add_argument("--block-table", type=int_list, default="0,1,5",
                     help="the request's block table (default: %(default)s)")
    lay.add_argument("--layer", type=nonneg_int, default=1,
                     help="layer whose addresses are walked (default: %(default)s)")
    lay.add_argument("--side-by-side", action="store_true",
                     help="print the layouts in columns (default: one after the other)")
    lay.add_argument("--html", type=out_file_with(".html"),
                     help="write an interactive page of every layout to this file (default: none)")
    lay.add_argument("--svg", type=out_file_with(".svg"),
                     help="write the memory maps as SVG, layouts side by side (default: none)")
    lay.add_argument("--png", type=out_file_with(".png"),
                     help="write the memory maps as PNG (matplotlib), layouts side by side "
                          "(default: none)")
    lay.add_argument("--preset", type=group_model_name, default=None,
                     help=f"draw a cache-group model's packed slab from its real plan: "
                          f"{', '.join(GROUP_PRESETS)} (default: none; --spec)")
    lay.add_argument("--packing", choices=("overlay", "stack"), default="overlay",
                     help="with --preset: groups overlaid in a block (vLLM) or stacked "
                          "(default: %(default)s)")
    v4_options(lay)
    lay.set_defaults(func=cmd_layout)
