"""python -m kvcache_ext {layout, capacity, demo}."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from . import capacity as cap
from .layout import LAYOUTS, CacheSpec, plan_cache
from .render import address_walk, byte_map, side_by_side, views_table, walk_lines


class CliError(Exception):
    """Bad input to a command: printed on one line, exit status 2."""


def parse_spec(text: str, default_layers: int) -> CacheSpec:
    """name:row_bytes[:layers[:heads]], e.g. mla:656 or kv:256:32:8."""
    parts = text.split(":")
    if len(parts) < 2 or len(parts) > 4 or not parts[0]:
        raise CliError(f"--spec must be NAME:ROW_BYTES[:LAYERS[:HEADS]], got {text!r}")
    try:
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise CliError(f"--spec must be NAME:ROW_BYTES[:LAYERS[:HEADS]] with integers, got {text!r}")
    layers = nums[1] if len(nums) > 1 else default_layers
    heads = nums[2] if len(nums) > 2 else 1
    return CacheSpec(parts[0], nums[0], layers, heads)


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{flag} must be comma-separated integers, got {text!r}")


def cmd_layout(args: argparse.Namespace) -> None:
    specs = [parse_spec(s, args.layers) for s in (args.spec or ["mla:656", "indexer:132"])]
    table = parse_ints(args.block_table, "--block-table")
    layouts = args.layout or ["BLHNC"]
    num_blocks = args.num_blocks or max(table + [0]) + 3
    plans = [plan_cache(specs, num_blocks, args.block_size, lay) for lay in layouts]
    columns = []
    for plan in plans:
        walk = address_walk(plan, args.token, table, args.layer)
        columns.append(views_table(plan) + [""] + byte_map(plan, walk.physical_block) + [""] +
                       walk_lines(walk))
    print("\n".join(side_by_side(columns) if args.side_by_side else
                    [line for c in columns for line in c + [""]]).rstrip())
    if args.html or args.svg or args.png:
        from .page import write_html, write_png, write_svg
        view = dict(token=args.token, block_table=table, layer=args.layer)
        if args.html:
            write_html(args.html, plans, **view)
            print(f"wrote {args.html}")
        if args.svg:
            write_svg(args.svg, plans[0], **view)
            print(f"wrote {args.svg}")
        if args.png:
            write_png(args.png, plans[0], **view)
            print(f"wrote {args.png}")


def cmd_capacity(args: argparse.Namespace) -> None:
    model = cap.ModelKV(args.layers, args.kv_heads, args.head_dim, args.dtype_bytes)
    r = cap.rank_kv(model, args.tokens, args.tp, args.pp, args.block_size)
    kib = lambda b: f"{b / 1024:g} KiB"  # noqa: E731
    mib = lambda b: f"{b / 2**20:g} MiB"  # noqa: E731
    print(f"model: {args.layers} layers, {args.kv_heads} KV heads, head_dim {args.head_dim}, "
          f"{args.dtype_bytes} B/elem -> {kib(cap.rank_kv(model, 1).bytes_per_token)}/token")
    print(f"rank (TP {args.tp}, PP {args.pp}): {r.local_layers} layers, {r.local_kv_heads} KV "
          f"heads, {kib(r.bytes_per_token)}/token")
    print(f"  {args.tokens} tokens: effective {mib(r.effective_bytes)}, block-rounded "
          f"({r.allocated_tokens} slots) {mib(r.allocated_bytes)}")
    print(f"TP sweep at PP {args.pp} (KiB/token per rank): " + ", ".join(
        f"TP{tp}={cap.rank_kv(model, 1, tp, args.pp).bytes_per_token / 1024:g}"
        for tp in (1, 2, 4, 8, 16) if _tp_ok(model, tp)))
    if args.requests:
        lens = parse_ints(args.requests, "--requests")
        bs = args.block_size or 16
        eff, alloc = cap.request_slots(lens, bs)
        per = r.bytes_per_token
        print(f"requests {lens} at block {bs}: {eff} effective vs {alloc} allocated slots "
              f"({mib(eff * per)} vs {mib(alloc * per)})")
    if args.budget_gib:
        specs = [CacheSpec("k", args.head_dim * args.dtype_bytes, r.local_layers, r.local_kv_heads),
                 CacheSpec("v", args.head_dim * args.dtype_bytes, r.local_layers, r.local_kv_heads)]
        bs = args.block_size or 16
        n = cap.max_num_blocks(lambda nb: plan_cache(specs, nb, bs), int(args.budget_gib * 2**30))
        print(f"pool for {args.budget_gib:g} GiB at block {bs}: {n} blocks = {n * bs} tokens")


def _tp_ok(model: cap.ModelKV, tp: int) -> bool:
    try:
        cap.local_kv_heads(model.num_kv_heads, tp)
        return True
    except ValueError:
        return False


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo
    run_demo(device=args.device, num_tokens=args.tokens)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m kvcache_ext", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    lay = sub.add_parser("layout", help="views table, byte map and address walk of a plan")
    lay.add_argument("--layout", action="append",
                     help=f"one of {', '.join(LAYOUTS)} (repeat to compare; default BLHNC)")
    lay.add_argument("--spec", action="append",
                     help="NAME:ROW_BYTES[:LAYERS[:HEADS]] (default mla:656 and indexer:132)")
    lay.add_argument("--layers", type=int, default=2, help="layers of specs that give none")
    lay.add_argument("--block-size", type=int, default=64)
    lay.add_argument("--num-blocks", type=int, default=0,
                     help="physical blocks (default: max block table entry + 3)")
    lay.add_argument("--token", type=int, default=130, help="token position in the request")
    lay.add_argument("--block-table", default="0,1,5", help="the request's block table")
    lay.add_argument("--layer", type=int, default=1)
    lay.add_argument("--side-by-side", action="store_true", help="print layouts in columns")
    lay.add_argument("--html", help="write an interactive page to this file")
    lay.add_argument("--svg", help="write the memory map as SVG")
    lay.add_argument("--png", help="write the memory map as PNG (matplotlib)")
    lay.set_defaults(func=cmd_layout)

    c = sub.add_parser("capacity", help="KV bytes per rank, effective vs rounded, pool size")
    c.add_argument("--layers", type=int, default=28)
    c.add_argument("--kv-heads", type=int, default=8)
    c.add_argument("--head-dim", type=int, default=128)
    c.add_argument("--dtype-bytes", type=int, default=2)
    c.add_argument("--tokens", type=int, default=4096)
    c.add_argument("--tp", type=int, default=1)
    c.add_argument("--pp", type=int, default=1)
    c.add_argument("--block-size", type=int, default=None)
    c.add_argument("--requests", default="", help="request lengths, e.g. 17,32")
    c.add_argument("--budget-gib", type=float, default=0.0, help="size a K/V pool for this budget")
    c.set_defaults(func=cmd_capacity)

    d = sub.add_parser("demo", help="plan, write and read the DSA pair; check and time it")
    d.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    d.add_argument("--tokens", type=int, default=4096)
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (CliError, ValueError, IndexError, KeyError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 0
