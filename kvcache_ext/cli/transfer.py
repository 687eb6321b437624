"""python -m kvcache_ext transfer: the spans that move one request between two plans.

    python -m kvcache_ext transfer                          # the seed: BLHNC -> LBNHC, block 64
    python -m kvcache_ext transfer --src BLHNC --dst BLHNC --blocks 0:0,1:1,5:2
    python -m kvcache_ext transfer --dst-block-size 16 --show 0   # token runs, every span
    python -m kvcache_ext transfer --matrix                 # span counts, every pair of layouts
    python -m kvcache_ext transfer --nixl [--path staged]   # and through NIXL, with its stats
"""
from __future__ import annotations

import argparse

import torch

from ..cache import KVCache, allocate
from ..plan import LAYOUTS, CachePlan, plan_cache
from ..transfer import TransferPlan, copy_spans, runs_of_spans
from ..viz.text import locate, split_text, table
from .args import CliError, int_list, layout_name, nonneg_int, parse_spec, positive_int


def block_pairs(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in p.split(":")) for p in text.split(",") if p.strip()]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 0 for p in pairs):
        raise argparse.ArgumentTypeError(f"must be SRC:DST block pairs, e.g. 0:0,1:1,5:2, got "
                                         f"{text!r}")
    return pairs


def spec_range(text: str) -> tuple[str, tuple[int, int, int]]:
    parts = text.split(":")
    try:
        nums = tuple(int(v) for v in parts[1:])
    except ValueError:
        nums = ()
    if len(parts) != 4 or not parts[0] or len(nums) != 3 or min(nums) < 0 or nums[2] == 0:
        raise argparse.ArgumentTypeError(f"must be NAME:SRC_FIRST:DST_FIRST:COUNT, e.g. "
                                         f"mla:30:0:31, got {text!r}")
    return parts[0], nums


def _plans(args) -> tuple[CachePlan, CachePlan, list[int], list[int]]:
    src_specs = [parse_spec(s, args.layers) for s in (args.spec or ["mla:656", "indexer:132"])]
    dst_specs = ([parse_spec(s, args.layers, "--dst-spec") for s in args.dst_spec]
                 if args.dst_spec else src_specs)
    ns = args.block_size
    nd = args.dst_block_size or ns
    if args.blocks:
        src_table = [s for s, _ in args.blocks]
        dst_table = [d for _, d in args.blocks]
    else:
        src_table = args.block_table
        if not src_table:
            raise CliError("--block-table must hold at least one block")
        tokens = args.tokens if args.tokens is not None else len(src_table) * ns - args.src_start
        dst_table = args.dst_block_table or list(range(-(-(args.dst_start + tokens) // nd)))
    src_n = args.num_blocks or max(src_table) + 3
    dst_n = args.dst_num_blocks or max(dst_table + [0]) + 3
    src = plan_cache(src_specs, src_n, ns, args.src)
    dst = plan_cache(dst_specs, dst_n, nd, args.dst)
    return src, dst, src_table, dst_table


def _spans(args, xp: TransferPlan, src_table, dst_table, tokens) -> torch.Tensor:
    if args.blocks:
        return xp.block_spans(torch.tensor(args.blocks, dtype=torch.int64), arg="--blocks")
    return xp.token_spans(torch.tensor(src_table, dtype=torch.int32),
                          torch.tensor(dst_table, dtype=torch.int32), tokens,
                          src_start=args.src_start, dst_start=args.dst_start)


def _describe(plan: CachePlan) -> str:
    specs = ", ".join(f"{s.name}:{s.row_bytes}"
                      + (f" split {split_text(s.split)}" if s.split else "")
                      + f" x {s.num_layers} layer{'s' if s.num_layers > 1 else ''}"
                      + (f" x {s.num_heads} heads" if s.num_heads > 1 else "") for s in plan.specs)
    return (f"{plan.layout}: {plan.num_blocks} blocks x {plan.block_size} tokens, "
            f"{plan.total_bytes} bytes ({specs})")


def cmd_transfer(args: argparse.Namespace) -> None:
    src, dst, src_table, dst_table = _plans(args)
    if args.blocks and src.block_size != dst.block_size:
        raise CliError(f"--blocks needs equal block sizes (got {src.block_size} and "
                       f"{dst.block_size}): give --block-table / --dst-block-table instead")
    layers = dict(args.layer_range or [])
    heads = dict(args.head_range or [])
    xp = TransferPlan(src, dst, specs=args.move, layers=layers or None, heads=heads or None)
    tokens = (len(args.blocks) * src.block_size if args.blocks else
              args.tokens if args.tokens is not None else len(src_table) * src.block_size
              - args.src_start)
    spans = _spans(args, xp, src_table, dst_table, tokens)
    matrix = None
    if args.matrix:  # every check ran above; the same request in every pair of layouts
        matrix = []
        for a in LAYOUTS:
            row = [a]
            for b in LAYOUTS:
                pair = TransferPlan(plan_cache(src.specs, src.num_blocks, src.block_size, a),
                                    plan_cache(dst.specs, dst.num_blocks, dst.block_size, b),
                                    specs=args.move, layers=layers or None, heads=heads or None)
                row.append(_spans(args, pair, src_table, dst_table, tokens).shape[0])
            matrix.append(row)

    print(f"src {_describe(src)}")
    print(f"dst {_describe(dst)}")
    moved = []
    for m in xp.moves:
        (sl, dl, nl), (sh, dh, nh) = m.layers, m.heads
        heads_text = "" if nh == 1 and sh == dh == 0 else f", heads {sh}..{sh + nh - 1} -> {dh}..{dh + nh - 1}"
        moved.append(f"{m.name} layers {sl}..{sl + nl - 1} -> {dl}..{dl + nl - 1}{heads_text}")
    print("moving " + "; ".join(moved))
    if args.blocks:
        print("request: blocks " + ", ".join(f"{s}->{d}" for s, d in args.blocks) +
              f" ({tokens} tokens)")
    else:
        print(f"request: {tokens} tokens, src positions {args.src_start}.. of block table "
              f"{','.join(map(str, src_table))} -> dst positions {args.dst_start}.. of block table "
              f"{','.join(map(str, dst_table))}")
    total = int(spans[:, 2].sum()) if spans.numel() else 0
    sizes = (f"; {total // max(len(spans), 1)} B per span on average, smallest "
             f"{int(spans[:, 2].min())}, largest {int(spans[:, 2].max())}" if spans.numel() else "")
    print(f"spans: {spans.shape[0]} for {total} bytes ({xp.bytes_per_token()} B per token{sizes})")
    print(f"as strided runs (src, dst, length, src_stride, dst_stride, count): "
          f"{runs_of_spans(spans).shape[0]}")
    if args.nixl:
        _nixl_move(src, dst, spans, args.path)
    shown = spans if args.show == 0 else spans[:args.show]
    if shown.numel():
        rows = [[i, s, d, n, locate(src, s), locate(dst, d)]
                for i, (s, d, n) in enumerate(shown.tolist())]
        print()
        print("\n".join(table(["#", "src_offset", "dst_offset", "length", "src", "dst"], rows)))
        if shown.shape[0] < spans.shape[0]:
            print(f"... {spans.shape[0] - shown.shape[0]} more (--show 0 lists every span)")
    if matrix is not None:
        print()
        print(f"spans of this request for every pair of layouts (rows: src, columns: dst; "
              f"block sizes {src.block_size} -> {dst.block_size}):")
        print("\n".join(table(["src \\ dst"] + list(LAYOUTS), matrix)))


def _nixl_move(src: CachePlan, dst: CachePlan, spans: torch.Tensor, path: str) -> None:
    """The request read through NIXL between two Endpoints of this process (loopback), checked
    against copy_spans, and what the transfer did (its stats)."""
    import kvcache_ext.nixl as kn
    a = KVCache(src, torch.randint(0, 256, (src.total_bytes,), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(0)))
    b, want = KVCache(dst, torch.zeros(dst.total_bytes, dtype=torch.uint8)), allocate(dst, fill=0)
    copy_spans(a, want, spans)
    with kn.Endpoint("cli-src", a) as ep_a, kn.Endpoint("cli-dst", b) as ep_b:
        h = ep_b.read(ep_b.add_peer(ep_a.metadata()), spans, path=path)
        h.wait(120)
    st = h.stats
    same = "the same bytes as copy_spans" if torch.equal(b.buffer, want.buffer) else \
        "BYTES DIFFER from copy_spans"
    print(f"NIXL read (two agents in this process): path {st.path}, {st.pieces} pieces posted in "
          f"{st.parts} transfer(s), {st.bytes} bytes ({st.staged_bytes} staged); lists "
          f"{1e3 * st.lists_s:.2f} ms, NIXL prep {1e3 * st.prep_s:.2f} ms, post {1e3 * st.post_s:.2f}"
          f" ms, move {1e3 * st.move_s:.2f} ms, unpack {1e3 * st.unpack_s:.2f} ms; {same}")
    if "DIFFER" in same:
        raise CliError("the NIXL read moved other bytes than copy_spans")


def add_parser(sub) -> None:
    t = sub.add_parser("transfer", help="the spans that move a request between two plans")
    t.add_argument("--src", type=layout_name, default="BLHNC",
                   help=f"source layout, one of {', '.join(LAYOUTS)} (default: %(default)s)")
    t.add_argument("--dst", type=layout_name, default="LBNHC",
                   help="destination layout (default: %(default)s)")
    t.add_argument("--spec", action="append",
                   help="source spec NAME:ROW_BYTES[:LAYERS[:HEADS]], repeatable; ROW_BYTES A+B "
                        "is a split page (default: mla:656 and indexer:132)")
    t.add_argument("--dst-spec", action="append",
                   help="destination specs, same syntax (default: the --spec list)")
    t.add_argument("--layers", type=positive_int, default=2,
                   help="layers of specs that give none (default: %(default)s)")
    t.add_argument("--block-size", type=positive_int, default=64,
                   help="source tokens per block (default: %(default)s)")
    t.add_argument("--dst-block-size", type=positive_int, default=None,
                   help="destination tokens per block (default: --block-size)")
    t.add_argument("--num-blocks", type=positive_int, default=None,
                   help="source physical blocks (default: largest source block id + 3)")
    t.add_argument("--dst-num-blocks", type=positive_int, default=None,
                   help="destination physical blocks (default: largest destination block id + 3)")
    t.add_argument("--blocks", type=block_pairs, default=None,
                   help="move whole blocks SRC:DST,... (equal block sizes) instead of tokens "
                        "(default: none)")
    t.add_argument("--block-table", type=int_list, default="0,1,5",
                   help="the request's source block table (default: %(default)s)")
    t.add_argument("--dst-block-table", type=int_list, default=None,
                   help="the request's destination block table (default: 0, 1, 2, ... as many "
                        "blocks as the tokens need)")
    t.add_argument("--tokens", type=nonneg_int, default=None,
                   help="tokens moved (default: every token the source block table holds "
                        "from --src-start)")
    t.add_argument("--src-start", type=nonneg_int, default=0,
                   help="first source position (default: %(default)s)")
    t.add_argument("--dst-start", type=nonneg_int, default=0,
                   help="first destination position (default: %(default)s)")
    t.add_argument("--move", action="append",
                   help="a spec to move, repeatable (default: every destination spec)")
    t.add_argument("--layer-range", type=spec_range, action="append",
                   help="NAME:SRC_FIRST:DST_FIRST:COUNT, a PP stage's layers, repeatable "
                        "(default: all layers)")
    t.add_argument("--head-range", type=spec_range, action="append",
                   help="NAME:SRC_FIRST:DST_FIRST:COUNT, a TP rank's heads, repeatable "
                        "(default: all heads)")
    t.add_argument("--show", type=nonneg_int, default=20,
                   help="spans listed, 0 for all (default: %(default)s)")
    t.add_argument("--matrix", action="store_true",
                   help="also count the spans for every pair of layouts (default: off)")
    t.add_argument("--nixl", action="store_true",
                   help="also read the request through NIXL (two agents in this process) and "
                        "print what the transfer did (default: off)")
    t.add_argument("--path", default="auto",
                   choices=["auto", "plain", "prepared", "strided", "staged"],
                   help="with --nixl: how the spans reach NIXL (default: %(default)s)")
    t.set_defaults(func=cmd_transfer)
