"""The main job: plan the DSA pair (MLA fp8_ds_mla 656 B + indexer 132 B, one block table) in
BLHNC and LBNHC, write every layer with the fused op, check the bytes against the torch
reference, read everything back with the gathers, and time each op."""
from __future__ import annotations

import torch

from . import ops
from . import reference as ref
from .cache import allocate
from .layout import CacheSpec, plan_cache, slot_mapping
from .render import address_walk, byte_map, views_table, walk_lines
from .timing import time_calls
from .transfer import copy_blocks

LAYERS, BLOCK = 2, 64


def request_lengths(num_tokens: int) -> list[int]:
    """Up to three requests of uneven length; request 0 is the longest (4096: 2048, 1365, 683).
    Empty requests are left out, so any num_tokens >= 1 gives at least request 0."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    first = -(-num_tokens // 2)
    lens = [first, num_tokens // 3, num_tokens - first - num_tokens // 3]
    return [n for n in lens if n > 0]


def make_requests(num_tokens: int, num_blocks: int, gen: torch.Generator):
    """The requests' block tables; request 0's starts 0, 1, 5 (seed 000)."""
    lens = request_lengths(num_tokens)
    width = max(-(-n // BLOCK) for n in lens)
    rest = [b for b in torch.randperm(num_blocks, generator=gen).tolist() if b not in (0, 1, 5)]
    ids = [0, 1, 5] + rest
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    at = 0
    for r, n in enumerate(lens):
        need = -(-n // BLOCK)
        table[r, :need] = torch.tensor(ids[at:at + need], dtype=torch.int32)
        at += need
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(lens)])
    pos = torch.cat([torch.arange(n) for n in lens])
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return table, cu, slot_mapping(table, pos, BLOCK, req)


def walked_token(num_tokens: int) -> int:
    """Token 130 of request 0 (the seed's walk), or request 0's last token when it is shorter."""
    return min(130, request_lengths(num_tokens)[0] - 1)


def run_layout(layout: str, device: torch.device, num_tokens: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    num_blocks = max(8, -(-num_tokens // BLOCK) + 8)
    specs = [CacheSpec("mla", 656, LAYERS), CacheSpec("indexer", 132, LAYERS)]
    plan = plan_cache(specs, num_blocks, BLOCK, layout)
    cache = allocate(plan, device, fill=0)
    expected = allocate(plan, "cpu", fill=0)
    table, cu, slots = make_requests(num_tokens, num_blocks, gen)

    print("\n".join(views_table(plan)))
    walk = address_walk(plan, walked_token(num_tokens), table[0].tolist(), 1)
    print("\n".join(byte_map(plan, walk.physical_block) + walk_lines(walk)))

    x = (torch.randn(num_tokens, 576, generator=gen) * 2).to(torch.bfloat16)
    k = torch.randn(num_tokens, 128, generator=gen).to(torch.bfloat16)
    dx, dk, dslots = x.to(device), k.to(device), slots.to(device)
    for layer in range(LAYERS):
        ops.dsa_write(dx[:, :512], dx[:, 512:], cache.view("mla", layer), dk,
                      cache.view("indexer", layer), dslots)
        ref.dsa_write(x[:, :512], x[:, 512:], expected.view("mla", layer), k,
                      expected.view("indexer", layer), slots)
    ok_write = torch.equal(cache.buffer.cpu(), expected.buffer)

    dtable, dcu = table.to(device), cu.to(device)
    got = ops.gather_mla(cache.view("mla", 1), dtable, dcu)
    codes, scales = ops.gather_indexer(cache.view("indexer", 1), dtable, dcu)
    want = ref.mla_dequant(ref.mla_fp8_rows(x[:, :512], x[:, 512:]))
    want_codes, want_scales = ref.indexer_rows(k)
    ok_read = (torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
               and torch.equal(codes.cpu(), want_codes) and torch.equal(scales.cpu(), want_scales))
    print(f"{layout}: fused write of {num_tokens} tokens x {LAYERS} layers "
          f"{'matches' if ok_write else 'DIFFERS FROM'} the reference byte for byte; "
          f"gathers {'return' if ok_read else 'DO NOT return'} what was written")

    mla_v, idx_v = cache.view("mla", 0), cache.view("indexer", 0)
    nt = num_tokens
    bytes_mla = nt * (1152 + 656 + 8)
    bytes_idx = nt * (256 + 132 + 8)
    other = allocate(plan, device, fill=0)
    mapping = torch.stack([torch.arange(0, num_blocks, 2), torch.arange(0, num_blocks, 2)], 1)
    timings = {
        "dsa_write (fused)": (lambda: ops.dsa_write(dx[:, :512], dx[:, 512:], mla_v, dk, idx_v, dslots),
                              bytes_mla + bytes_idx - 8 * nt),
        "concat_and_cache_mla": (lambda: ops.concat_and_cache_mla(dx[:, :512], dx[:, 512:], mla_v, dslots),
                                 bytes_mla),
        "indexer_k_quant_and_cache": (lambda: ops.indexer_k_quant_and_cache(dk, idx_v, dslots), bytes_idx),
        "gather_mla (bf16)": (lambda: ops.gather_mla(mla_v, dtable, dcu, num_tokens=nt, validate=False),
                              nt * (656 + 1152)),
        "gather_indexer": (lambda: ops.gather_indexer(idx_v, dtable, dcu, num_tokens=nt, validate=False),
                           nt * (132 + 132)),
        "copy_blocks (half the blocks)": (lambda: copy_blocks(cache, other, mapping),
                                          2 * len(mapping) * plan.total_bytes // num_blocks),
    }
    print(f"{'op':<32}{'us/call':>10}{'GB/s':>10}")
    for name, (fn, nbytes) in timings.items():
        us = time_calls([fn], device, repeats=20, use_graph=False)
        print(f"{name:<32}{us:>10.1f}{nbytes / us / 1e3:>10.1f}")
    print()
    return ok_write and ok_read


def run_demo(device: str = "cpu", num_tokens: int = 4096) -> None:
    request_lengths(num_tokens)  # a bad --tokens fails before the first line is printed
    dev = torch.device(device)
    print(f"kvcache_ext demo on {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}\n")
    results = [run_layout(lay, dev, num_tokens) for lay in ("BLHNC", "LBNHC")]
    if not all(results):
        raise SystemExit("demo: a check FAILED")
    print("demo: all checks passed")
