"""python -m kvcache_ext {layout, capacity, demo, transfer}: see a plan, size a cache, run the
kernels, list the spans that move a request between two plans.

Bad arguments give one line on stderr and exit status 2 before anything else is printed;
no subcommand prints this help on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Sequence

import torch

from .layout import LAYOUTS, CacheSpec, plan_cache
from .presets import GROUP_PRESETS, group_preset, preset, preset_names
from .render import (address_walk, byte_map, group_views_table, group_walk_lines, side_by_side,
                     slab_lines, views_table, walk_lines)


class CliError(Exception):
    """Bad input to a command: printed on one line, exit status 2."""


# ---- argument types: argparse turns their errors into one line before any command runs ------
def _int_at_least(low: int, what: str):
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return check


positive_int = _int_at_least(1, "a positive integer")
nonneg_int = _int_at_least(0, "an integer >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None


def lengths(text: str) -> list[int]:
    values = int_list(text)
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 0, got {text!r}")
    return values


def layout_name(text: str) -> str:
    if text not in LAYOUTS:
        raise argparse.ArgumentTypeError(f"layout must be one of {', '.join(LAYOUTS)}, got {text!r}")
    return text


def model_name(text: str) -> str:
    if text.lower() in GROUP_PRESETS:
        return text.lower()
    try:
        return preset(text).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}, {', '.join(GROUP_PRESETS)}") from None


def group_model_name(text: str) -> str:
    if text.lower() not in GROUP_PRESETS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(GROUP_PRESETS)}, got {text!r}")
    return text.lower()


def device_name(text: str) -> str:
    """cpu or an available CUDA device (checked here, so the demo never starts on a bad one)."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"must be cpu or cuda[:N], got {text!r}") from None
    if dev.type == "cpu":
        return text
    if dev.type != "cuda":
        raise argparse.ArgumentTypeError(f"must be cpu or cuda[:N], got {text!r}")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device is available (use --device cpu)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text!r}: only {torch.cuda.device_count()} CUDA device(s) are available")
    return text


def out_file(text: str) -> str:
    """A file path whose folder exists and is writable (checked before anything is printed)."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {text!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {text!r} is not writable")
    return text


def out_file_with(suffix: str):
    """out_file, and the name must end in `suffix` (the format is taken from it)."""
    def check(text: str) -> str:
        if not text.lower().endswith(suffix):
            raise argparse.ArgumentTypeError(f"{text!r} must end in {suffix}")
        return out_file(text)
    return check


MAX_DEMO_TOKENS = 1 << 20  # the demo keeps inputs, a CPU copy and the reference in memory


def demo_tokens(text: str) -> int:
    n = positive_int(text)
    if n > MAX_DEMO_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DEMO_TOKENS}, got {n}")
    return n


def parse_spec(text: str, default_layers: int, flag: str = "--spec") -> CacheSpec:
    """name:row_bytes[:layers[:heads]], e.g. mla:656 or kv:256:32:8; row_bytes A+B is a split
    page (the first A bytes of every token, then the last B), e.g. indexer:128+4."""
    parts = text.split(":")
    if len(parts) < 2 or len(parts) > 4 or not parts[0]:
        raise CliError(f"{flag} must be NAME:ROW_BYTES[:LAYERS[:HEADS]], got {text!r}")
    split = None
    try:
        if "+" in parts[1]:
            split = tuple(int(p) for p in parts[1].split("+"))
            if len(split) != 2:
                raise ValueError
            parts[1] = str(sum(split))
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise CliError(f"{flag} must be NAME:ROW_BYTES[:LAYERS[:HEADS]] with integers (ROW_BYTES "
                       f"may be A+B for a split page), got {text!r}")
    layers = nums[1] if len(nums) > 1 else default_layers
    heads = nums[2] if len(nums) > 2 else 1
    return CacheSpec(parts[0], nums[0], layers, heads, split=split)


# ---- layout ---------------------------------------------------------------------------------
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
        from .page import write_slab_html, write_slab_svg
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
        from .page import write_html, write_png, write_svg
        view = dict(token=args.token, block_table=table, layer=args.layer)
        for path, write in ((args.html, write_html), (args.svg, write_svg), (args.png, write_png)):
            if path:
                write(path, plans, **view)
                print(f"wrote {path}")


def cmd_capacity(args: argparse.Namespace) -> None:
    from .cli_capacity import cmd_capacity as run  # it uses this module's argument helpers
    run(args)


def cmd_demo(args: argparse.Namespace) -> None:
    if args.model == "llama":  # checked before anything is printed
        import importlib.util
        if importlib.util.find_spec("transformers") is None:
            raise CliError("--model llama needs transformers (pip install transformers==5.23.0)")
    from .demo import run_demo
    run_demo(device=args.device, num_tokens=args.tokens, model=args.model)


# ---- parser ---------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"error: {message}\n")


def _v4_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mla", choices=("fp8_ds_mla", "flashinfer_fp8"), default="fp8_ds_mla",
                   help="DeepSeek-V4 KV row layout (default: %(default)s)")
    p.add_argument("--indexer", choices=("mxfp4", "fp8"), default="mxfp4",
                   help="DeepSeek-V4 indexer row (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m kvcache_ext", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{layout,capacity,demo,transfer}",
                           parser_class=_Parser)

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
    _v4_options(lay)
    lay.set_defaults(func=cmd_layout)

    c = sub.add_parser("capacity", help="cache bytes per rank, effective vs rounded, pool size")
    c.add_argument("--model", type=model_name,
                   help=f"a published model: {', '.join(preset_names() + GROUP_PRESETS)} "
                        f"(default: none; the K/V "
                        f"shape options below)")
    c.add_argument("--spec", action="append",
                   help="NAME:ROW_BYTES[:LAYERS[:HEADS]], repeatable, e.g. --spec mla:656 --spec "
                        "indexer:132 --layers 61; heads split over TP, H=1 is replicated "
                        "(default: none; the K/V shape options below)")
    c.add_argument("--layers", type=positive_int, default=None,
                   help="layers of the K/V model, or of specs that give none (default: 28)")
    c.add_argument("--kv-heads", type=positive_int, default=None, help="KV heads (default: 8)")
    c.add_argument("--head-dim", type=positive_int, default=None, help="head_dim (default: 128)")
    c.add_argument("--dtype-bytes", type=positive_int, default=None,
                   help="bytes per K/V element; with a K/V --model, overrides its bf16 (e.g. 1 "
                        "for an fp8 cache) (default: 2)")
    c.add_argument("--tokens", type=nonneg_int, default=4096,
                   help="tokens of the sequence sized per rank (default: %(default)s)")
    c.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel ranks (default: %(default)s)")
    c.add_argument("--pp", type=positive_int, default=1,
                   help="pipeline stages; the largest stage is shown (default: %(default)s)")
    c.add_argument("--block-size", type=positive_int, default=None,
                   help="tokens per block (default: no rounding of --tokens; for --requests and "
                        "--budget-gib the --model's block size, else 16)")
    c.add_argument("--requests", type=lengths, default=None,
                   help="request lengths, e.g. 17,32: effective vs block-rounded (default: none)")
    c.add_argument("--budget-gib", type=positive_float, default=None,
                   help="size one rank's pool for this many GiB (default: none; 80 for the "
                        "cache-group models)")
    _v4_options(c)
    c.set_defaults(func=cmd_capacity)

    d = sub.add_parser("demo", help="plan, write and read the DSA pair; check and time it; "
                                     "run a model on the cache")
    d.add_argument("--device", type=device_name,
                   default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda[:N] (default: cuda when available, else cpu; here "
                        "%(default)s)")
    d.add_argument("--tokens", type=demo_tokens, default=4096,
                   help="tokens written, split over three requests (default: %(default)s)")
    d.add_argument("--model", choices=("dsa", "llama"), default="dsa",
                   help="model run on the cache after the checks: dsa (DeepSeek sparse attention "
                        "from the cache ops) or llama (a tiny transformers Llama on "
                        "kvcache_ext.hf.PagedCache; needs transformers) (default: %(default)s)")
    d.set_defaults(func=cmd_demo)

    from .cli_transfer import add_parser as add_transfer
    add_transfer(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # usage and the list of subcommands, not a one-line error
        parser.print_help(sys.stderr)
        return 2
    try:
        args.func(args)
    except (CliError, ValueError, IndexError, KeyError, TypeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 0
