"""The cases bench_cache_ops.py times: every write, gather and read op at one size and layout, each
with its torch reference path and the bytes it reads and writes once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4
from kvcache_ext import reference as ref
from kvcache_ext import reference_v4 as r4

BLOCK = 64
ROTATE_BYTES = 256 << 20  # inputs rotated through at least this much memory (> L2 on any GPU)
MAX_SETS = 64             # ... or through this many input sets, whichever is fewer
MIN_BLOCKS = 2048         # a serving-sized cache (~0.5 GB here): rows land in cold memory


@dataclass
class Case:
    name: str
    kernel: Callable[[int], object]      # call on input set i
    torch_path: Callable[[int], object] | None
    bytes: int


def _window_len(rows: int) -> int:
    """Tokens L of a request whose compressed (L // 4) + SWA (min(L, 128)) rows are <= rows."""
    return 4 * (rows - 128) if rows >= 160 else rows // 5 * 4


def build_cases(layout: str, tokens: int, device: torch.device,
                gen: torch.Generator) -> tuple[int, list[Case]]:
    """The cases at one size, and how many input sets their calls rotate through."""
    num_blocks = max(-(-tokens // BLOCK) + 4, MIN_BLOCKS)
    specs = [kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("indexer", 132, 1),
             kvc.CacheSpec("mla_auto", 1152, 1), kvc.CacheSpec("kv", 128 * 2, 1, 8),
             kvc.CacheSpec("kv8", 128, 1, 8), kvc.CacheSpec("mla8", 576, 1),
             # DeepSeek-V4 (SPEC 10): 584-B rows and MXFP4 indexer rows in split pages; BLOCK = 64
             # rows per block, as a ratio-4 group of 256 tokens holds
             kvc.CacheSpec("v4", 584, 1, split=(576, 8)), kvc.CacheSpec("mxfp4", 68, 1, split=(64, 4))]
    plan = kvc.plan_cache(specs, num_blocks, BLOCK, layout)
    cache = kvc.allocate(plan, device, fill=0)
    mla, idx, auto, kvv, kv8, mla8, v4, mx = (cache.view(s.name, 0) for s in specs)
    scale = torch.tensor([0.05], device=device)
    per_call_in = tokens * (1152 + 256 + 2048 + 16)
    sets = max(2, min(MAX_SETS, ROTATE_BYTES // max(per_call_in, 1)))
    xs = [(torch.randn(tokens, 576, generator=gen) * 2).to(torch.bfloat16).to(device) for _ in range(sets)]
    ks = [torch.randn(tokens, 128, generator=gen).to(torch.bfloat16).to(device) for _ in range(sets)]
    keys = [torch.randn(tokens, 8, 128, generator=gen).to(torch.bfloat16).to(device) for _ in range(sets)]
    slots = [torch.randperm(plan.num_slots, generator=gen)[:tokens].to(device) for _ in range(sets)]
    # Reads: one request per 1024 tokens through a shuffled block table.
    lens = [min(1024, tokens - s) for s in range(0, tokens, 1024)]
    width = max(-(-n // BLOCK) for n in lens)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.stack([perm[(r * width + torch.arange(width)) % num_blocks] for r in range(len(lens))]).to(device)
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    out_bf = torch.empty(tokens, 576, dtype=torch.bfloat16, device=device)
    out_v4 = torch.empty(tokens, 512, dtype=torch.bfloat16, device=device)
    # window reads: each request's compressed + SWA rows fill its share of T; the SWA part reads
    # through its own table (token positions, 64 per block)
    win_lens = torch.tensor([_window_len(n) for n in lens], dtype=torch.int32).to(device)
    win_cu = o4.window_rows(win_lens, 4)
    swa_width = max(-(-_window_len(n) // BLOCK) for n in lens)
    swa_table = torch.stack([perm[(r * swa_width + torch.arange(swa_width)) % num_blocks]
                             for r in range(len(lens))]).to(device)
    out_mx = torch.empty(tokens, 128, dtype=torch.bfloat16, device=device)
    codes = torch.empty(tokens, 128, dtype=torch.uint8, device=device)
    scl = torch.empty(tokens, dtype=torch.float32, device=device)
    kv_out = torch.empty(tokens, 8, 128, dtype=torch.bfloat16, device=device)
    for i in range(sets):  # fill the caches so reads see real rows
        kvc.ops.dsa_write(xs[i][:, :512], xs[i][:, 512:], mla, ks[i], idx, slots[i])
        kvc.ops.reshape_and_cache(keys[i], kvv, slots[i])
        o4.v4_mla_quant_and_cache(xs[i][:, :512], v4, slots[i])
        o4.mxfp4_quant_and_cache(ks[i], mx, slots[i])
    # ... and every row the block tables reach (the random slots above cover about half of a
    # serving-sized cache; an unwritten row's zero scale would send its decoding down the
    # rare-scale path, which real caches do not take)
    table_slots = torch.cat([table.flatten(), swa_table.flatten()]).unique().long()
    table_slots = (table_slots[:, None] * BLOCK + torch.arange(BLOCK, device=device)).flatten()
    rows = torch.arange(table_slots.numel(), device=device) % tokens  # the first set's inputs again
    xt, kt = xs[0][rows], ks[0][rows]
    kvc.ops.dsa_write(xt[:, :512], xt[:, 512:], mla, kt, idx, table_slots)
    kvc.ops.reshape_and_cache(keys[0][rows], kvv, table_slots)
    o4.v4_mla_quant_and_cache(xt[:, :512], v4, table_slots)
    o4.mxfp4_quant_and_cache(kt, mx, table_slots)
    del xt, kt
    s = lambda i: slots[i % sets]  # noqa: E731
    x = lambda i: xs[i % sets]  # noqa: E731
    k = lambda i: ks[i % sets]  # noqa: E731
    t = tokens
    ops = kvc.ops
    return sets, [
        Case("reshape_and_cache", lambda i: ops.reshape_and_cache(keys[i % sets], kvv, s(i)),
             lambda i: ref.reshape_and_cache(keys[i % sets], kvv, s(i)), t * (2048 * 2 + 8)),
        Case("reshape_and_cache_fp8", lambda i: ops.reshape_and_cache(keys[i % sets], kv8, s(i), "fp8", scale),
             lambda i: ref.reshape_and_cache(keys[i % sets], kv8, s(i), "fp8", scale), t * (2048 + 1024 + 8)),
        Case("concat_and_cache_mla_fp8", lambda i: ops.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], mla8, s(i), "fp8", scale),
             lambda i: ref.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], mla8, s(i), "fp8", scale),
             t * (1152 + 576 + 8)),
        Case("concat_and_cache_mla", lambda i: ops.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], mla, s(i)),
             lambda i: ref.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], mla, s(i)), t * (1152 + 656 + 8)),
        Case("concat_and_cache_mla_auto", lambda i: ops.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], auto, s(i), "auto"),
             lambda i: ref.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], auto, s(i), "auto"), t * (1152 * 2 + 8)),
        Case("indexer_k_quant_and_cache", lambda i: ops.indexer_k_quant_and_cache(k(i), idx, s(i), "ue8m0", "split"),
             lambda i: ref.indexer_k_quant_and_cache(k(i), idx, s(i), "ue8m0", "split"), t * (256 + 132 + 8)),
        Case("dsa_write", lambda i: ops.dsa_write(x(i)[:, :512], x(i)[:, 512:], mla, k(i), idx, s(i)),
             lambda i: ref.dsa_write(x(i)[:, :512], x(i)[:, 512:], mla, k(i), idx, s(i)),
             t * (1152 + 656 + 256 + 132 + 8)),
        Case("gather_mla", lambda i: ops.gather_mla(mla, table, cu, out=out_bf, validate=False),
             lambda i: ref.gather_mla(mla, table, cu), t * (656 + 1152)),
        Case("gather_mla_slots", lambda i: ops.gather_mla_slots(mla, s(i), out=out_bf, validate=False),
             lambda i: ref.gather_mla_slots(mla, s(i)), t * (656 + 1152 + 8)),
        Case("gather_kv", lambda i: ops.gather_kv(kvv, table, cu, out=kv_out, validate=False),
             lambda i: ref.gather_kv(kvv, table, cu), t * 2 * 2048),
        Case("gather_indexer", lambda i: ops.gather_indexer(idx, table, cu, "split", out=(codes, scl), validate=False),
             lambda i: ref.gather_indexer(idx, table, cu, "split"), t * 2 * 132),
        Case("gather_indexer_slots", lambda i: ops.gather_indexer_slots(idx, s(i), "split", out=(codes, scl), validate=False),
             lambda i: ref.gather_indexer_slots(idx, s(i), "split"), t * (2 * 132 + 8)),
        Case("v4_mla_quant_and_cache", lambda i: o4.v4_mla_quant_and_cache(x(i)[:, :512], v4, s(i)),
             lambda i: r4.v4_mla_write(v4, s(i), x(i)[:, :512]), t * (1024 + 584 + 8)),
        Case("mxfp4_quant_and_cache", lambda i: o4.mxfp4_quant_and_cache(k(i), mx, s(i)),
             lambda i: r4.mxfp4_write(mx, s(i), k(i)), t * (256 + 68 + 8)),
        Case("v4_dsa_write", lambda i: o4.v4_dsa_write(x(i)[:, :512], v4, k(i), mx, s(i)),
             lambda i: (r4.v4_mla_write(v4, s(i), x(i)[:, :512]), r4.mxfp4_write(mx, s(i), k(i))),
             t * (1024 + 584 + 256 + 68 + 8)),
        Case("gather_v4", lambda i: o4.gather_v4(v4, table, cu, out=out_v4, validate=False),
             lambda i: r4.v4_mla_gather(v4, table, cu), t * (584 + 1024)),
        Case("gather_v4_slots", lambda i: o4.gather_v4_slots(v4, s(i), out=out_v4, validate=False),
             lambda i: r4.v4_mla_read(v4, s(i)), t * (584 + 1024 + 8)),
        # vLLM's dequantize_and_gather_k_cache, one view as both parts: per request of L tokens
        # L // 4 compressed rows + its last 128 rows; requests sized so the rows add up to T
        Case("gather_v4_window",
             lambda i: o4.gather_compressed_and_swa(v4, table, 4, v4, swa_table, win_lens,
                                                    out=out_v4, cu_out=win_cu, validate=False),
             lambda i: r4.gather_compressed_and_swa(v4, table.cpu(), 4, v4, swa_table.cpu(),
                                                    win_lens.cpu()),
             int(win_cu[-1]) * (584 + 1024)),
        Case("gather_v4_slots_mxfp4",
             lambda i: o4.gather_v4_slots(mx, s(i), "mxfp4", out=out_mx, validate=False),
             lambda i: r4.mxfp4_read(mx, s(i)), t * (68 + 256 + 8)),
    ]
