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
from dataclasses import dataclass
from typing import Sequence

import torch

from . import capacity as cap
from .layout import LAYOUTS, CacheSpec, plan_cache
from .presets import GROUP_PRESETS, group_preset, preset, preset_names
from .render import (address_walk, byte_map, group_views_table, group_walk_lines, side_by_side,
                     slab_lines, views_table, walk_lines)


class CliError(Exception):
    """Bad input to a command: printed on one line, exit status 2."""


# ---- argument types: argparse turns their errors into one line before any command runs ------
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


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


# ---- capacity -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CapacityModel:
    title: str                     # how the model line names it
    specs: tuple[CacheSpec, ...]   # whole model
    block_size: int                # default block for --requests and --budget-gib
    kv: cap.ModelKV | None = None  # set for the K/V shape options (the seed 004 wording)


def capacity_model(args: argparse.Namespace) -> CapacityModel:
    kv_opts = {"--kv-heads": args.kv_heads, "--head-dim": args.head_dim}
    if args.model and args.spec:
        raise CliError("--model and --spec cannot be combined")
    if args.model or args.spec:
        given = [flag for flag, v in kv_opts.items() if v is not None]
        if args.model and args.layers is not None:
            given.insert(0, "--layers")
        if args.spec and args.dtype_bytes is not None:
            given.append("--dtype-bytes")
        if given:
            raise CliError(f"{', '.join(given)} cannot be combined with "
                           f"{'--model' if args.model else '--spec'} (they describe a K/V model)")
    if args.model:
        p = preset(args.model)
        if args.dtype_bytes is not None:
            p = p.with_dtype_bytes(args.dtype_bytes)
        return CapacityModel(f"model {p.name} ({p.source})", p.specs, p.block_size)
    layers = args.layers if args.layers is not None else 28
    if args.spec:
        return CapacityModel("model (specs)", tuple(parse_spec(s, layers) for s in args.spec), 16)
    kv = cap.ModelKV(layers, args.kv_heads or 8, args.head_dim or 128, args.dtype_bytes or 2)
    return CapacityModel(f"model: {kv.num_layers} layers, {kv.num_kv_heads} KV heads, head_dim "
                         f"{kv.head_dim}, {kv.bytes_per_elem} B/elem, K and V", kv.specs(), 16, kv)


def _replication(spec: CacheSpec, tp: int) -> str:
    if not cap.replicated(spec, tp):
        return ""
    return (" (replicated on every TP rank)" if spec.num_heads == 1
            else f" (each head on {tp // spec.num_heads} TP ranks)")


def _per_token(b: int) -> str:
    return f"{b / 1024:g} KiB/token ({b} B)"


def cmd_capacity_groups(args: argparse.Namespace) -> None:
    """--model deepseek-v4-pro|flash: bytes per token per group, blocks for a budget, and the
    V3.2 pair for comparison (one rank: the H = 1 caches are whole on every TP rank)."""
    others = [f for f, v in (("--spec", args.spec), ("--layers", args.layers),
                             ("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim),
                             ("--dtype-bytes", args.dtype_bytes), ("--requests", args.requests),
                             ("--block-size", args.block_size)) if v is not None]
    if args.pp != 1:
        others.append("--pp")
    if others:
        raise CliError(f"{', '.join(others)} cannot be combined with --model {args.model} "
                       f"(cache groups with fixed row formats and block sizes)")
    groups = group_preset(args.model, mla=args.mla, indexer=args.indexer)
    usage = cap.group_usage(groups)
    budget = int((args.budget_gib or 80) * 2**30)
    pool = cap.group_pool_for_budget(groups, budget, args.tokens)
    v32 = preset("deepseek-v3.2")
    v32_tok = cap.bytes_per_token(v32.specs)
    v32_pool = cap.pool_for_budget(v32.specs, budget, v32.block_size)
    print(f"model {args.model} (mla={args.mla}, indexer={args.indexer}; SPEC 10), "
          f"{len(groups)} cache groups in one block pool, packing=overlay, block stride "
          f"{pool.block_stride} B:")
    for u in usage:
        window = "every token" if u.window is None else f"last {u.window} tokens"
        print(f"  {u.name:<12} block {u.block_size:>3} tokens, {window:<16} {u.bytes_per_token:g} "
              f"B per token held ({u.padded_bytes_per_token:g} with padded pages), "
              f"{u.block_bytes} B/block")
    need = sum(pool.blocks_per_request.values())
    per_tok = need * pool.block_stride / args.tokens if args.tokens else 0
    print(f"one request of {args.tokens} tokens: blocks "
          + ", ".join(f"{k} {v}" for k, v in pool.blocks_per_request.items())
          + f" = {need} blocks = {need * pool.block_stride / 2**20:g} MiB "
            f"({per_tok:.0f} B/token)")
    print(f"pool for {budget / 2**30:g} GiB per rank: {pool.num_blocks} blocks of "
          f"{pool.block_stride} B = {pool.requests} requests of {args.tokens} tokens")
    v32_need = math.ceil(args.tokens / v32.block_size) if args.tokens else 0
    print(f"DeepSeek-V3.2 (mla 656 B + indexer 132 B, 61 layers, block {v32.block_size}): "
          f"{v32_tok} B/token; {v32_pool.num_blocks} blocks = "
          f"{v32_pool.num_blocks // v32_need if v32_need else 0} requests of {args.tokens} tokens"
          + (f" ({v32_tok / per_tok:.1f}x the bytes per token)" if per_tok else ""))


def cmd_capacity(args: argparse.Namespace) -> None:
    if args.model in GROUP_PRESETS:
        return cmd_capacity_groups(args)
    m = capacity_model(args)
    whole = cap.rank_cache(m.specs, 1)
    r = cap.rank_cache(m.specs, args.tokens, args.tp, args.pp, args.block_size)
    sweep = []
    for tp in (1, 2, 4, 8, 16):
        try:
            sweep.append(f"TP{tp}={cap.rank_cache(m.specs, 1, tp, args.pp).bytes_per_token / 1024:g}")
        except ValueError:
            pass  # heads not divisible by this TP
    bs = args.block_size or m.block_size
    slots = cap.request_slots(args.requests, bs) if args.requests else None
    pool = (cap.pool_for_budget(r.specs, int(args.budget_gib * 2**30), bs)
            if args.budget_gib else None)

    # Everything is computed and checked; print.
    mib = lambda b: f"{b / 2**20:g} MiB"  # noqa: E731
    if m.kv is not None:
        print(f"{m.title} -> {_per_token(whole.bytes_per_token)}")
        k = r.specs[0]
        rank = f"{k.num_layers} layers, {k.num_heads} KV heads"
    else:
        print(f"{m.title}: {cap.describe_specs(m.specs)} -> {_per_token(whole.bytes_per_token)}")
        rank = " + ".join(
            f"{s.name} {s.num_layers} layers x {s.num_heads} head{'s' if s.num_heads > 1 else ''}"
            + _replication(w, args.tp) for s, w in zip(r.specs, m.specs))
    stages = cap.pp_stage_layers(m.specs[0].num_layers, args.pp)
    uneven = f", the largest of stages {'/'.join(map(str, stages))}" if len(set(stages)) > 1 else ""
    print(f"rank (TP {args.tp}, PP {args.pp}{uneven}): {rank}, {_per_token(r.bytes_per_token)}")
    print(f"  {args.tokens} tokens: effective {mib(r.effective_bytes)}, block-rounded "
          f"({r.allocated_tokens} slots) {mib(r.allocated_bytes)}")
    print(f"TP sweep at PP {args.pp} (KiB/token per rank): " + ", ".join(sweep))
    if slots is not None:
        eff, alloc = slots
        per = r.bytes_per_token
        print(f"requests {args.requests} at block {bs}: {eff} effective vs {alloc} allocated slots "
              f"({mib(eff * per)} vs {mib(alloc * per)})")
    if pool is not None:
        print(f"pool for {args.budget_gib:g} GiB per rank at block {bs}: {pool.num_blocks} blocks = "
              f"{pool.tokens} tokens (plan_cache of the rank's specs: {pool.total_bytes} of "
              f"{pool.budget_bytes} bytes)")


# ---- demo -----------------------------------------------------------------------------------
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
