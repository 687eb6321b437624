"""python -m kvcache_ext capacity: KV bytes per rank (TP/PP), effective vs block-rounded, and the
pool a budget holds; model presets (DeepSeek-V3.2, GQA models, DeepSeek-V4 cache groups)."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ..plan import CacheSpec
from ..plan import capacity as cap
from ..plan.presets import GROUP_PRESETS, group_preset, preset, preset_names
from .args import (CliError, lengths, model_name, nonneg_int, parse_spec, positive_float,
                   positive_int, v4_options)


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
    V3.2 pair for comparison (one rank: the H = 1 caches are whole on every TP rank; --pp: the
    largest pipeline stage, capacity.rank_groups)."""
    others = [f for f, v in (("--spec", args.spec), ("--layers", args.layers),
                             ("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim),
                             ("--dtype-bytes", args.dtype_bytes), ("--requests", args.requests),
                             ("--block-size", args.block_size)) if v is not None]
    if others:
        raise CliError(f"{', '.join(others)} cannot be combined with --model {args.model} "
                       f"(cache groups with fixed row formats and block sizes)")
    try:
        groups = cap.rank_groups(group_preset(args.model, mla=args.mla, indexer=args.indexer), args.pp)
    except ValueError as e:
        raise CliError(f"--pp {args.pp}: {e}") from None
    usage = cap.group_usage(groups)
    budget = int((args.budget_gib or 80) * 2**30)
    pool = cap.group_pool_for_budget(groups, budget, args.tokens)
    v32 = preset("deepseek-v3.2")
    v32_specs = cap.rank_specs(v32.specs, 1, args.pp)
    v32_tok = cap.bytes_per_token(v32_specs)
    v32_pool = cap.pool_for_budget(v32_specs, budget, v32.block_size)
    stage = (f"; the largest of {args.pp} PP stages: "
             + ", ".join(f"{s.name} {s.num_layers}" for g in groups for s in g.specs) + " layers"
             if args.pp > 1 else "")
    print(f"model {args.model} (mla={args.mla}, indexer={args.indexer}; SPEC 10{stage}), "
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
    print(f"DeepSeek-V3.2 (mla 656 B + indexer 132 B, {v32_specs[0].num_layers} layers, "
          f"block {v32.block_size}): "
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


def add_parser(sub) -> None:
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
    v4_options(c)
    c.set_defaults(func=cmd_capacity)
