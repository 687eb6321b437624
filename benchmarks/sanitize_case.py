"""Small cases that run the CUDA ops, for compute-sanitizer and ncu:

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_case.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python benchmarks/sanitize_case.py --racecheck
    ncu --kernel-name regex:"dsa_kernel|v4_pair_write_kernel|mla_gather_kernel" ... \
        python benchmarks/sanitize_case.py --ncu
    python benchmarks/sanitize_case.py --coverage   # every __global__ kernel launched?

The default runs every op once (every kernel; --coverage checks that under torch.profiler).
Covers unaligned views (block size 1 makes 656-byte rows 8-byte aligned only), padding slots,
out-of-range slots and block-table entries (skipped / zero rows, never touched), both indexer
placements, fp16 inputs, GPU <-> pinned CPU block copies, and DeepSeek-V4's ops (v4_case: the
584-B and V4.1's 528-B records).
"""
import argparse
import re
from pathlib import Path

import torch

import kvcache_ext as kvc


def racecheck_case(dev: torch.device) -> None:
    """One write (the fused DSA write) and one gather (gather_mla), small."""
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("indexer", 132, 1)], 8, 16,
                          "BLHNC")
    cache = kvc.allocate(plan, dev, fill=0)
    x = torch.randn(40, 576, device=dev, dtype=torch.bfloat16)
    k = torch.randn(40, 128, device=dev, dtype=torch.bfloat16)
    slots = torch.randperm(plan.num_slots, device=dev)[:40]
    kvc.ops.dsa_write(x[:, :512], x[:, 512:], cache.view("mla", 0), k, cache.view("indexer", 0), slots)
    table = torch.arange(8, dtype=torch.int32, device=dev).view(2, 4)
    cu = torch.tensor([0, 50, 64], dtype=torch.int32, device=dev)
    kvc.ops.gather_mla(cache.view("mla", 0), table, cu, validate=False)
    v4 = kvc.allocate(kvc.plan_cache(groups=kvc.presets.deepseek_v4("flash"), num_blocks=2,
                                     layout="BLHNC"), dev, fill=0)
    from kvcache_ext import ops_v4 as o4
    o4.v4_dsa_write(torch.randn(40, 512, device=dev, dtype=torch.bfloat16), v4.view("c4_kv", 0),
                    k, v4.view("c4_indexer", 0), torch.randperm(128, device=dev)[:40])


def v4_case(dev: torch.device, bad: bool = True) -> None:
    """DeepSeek-V4's ops on the packed V4-Flash slab, with the 584-B main-KV record and with
    V4.1's 528-B one: writes with padding and (bad=True, CUDA: skipped) out-of-range slots,
    inputs off 16-B alignment (the kernels' generic variants) and aligned (their aligned
    variants), reads by slots, through block tables with entries outside the view, and the
    compressed + SWA window read."""
    from kvcache_ext import ops_v4 as o4
    g = torch.Generator().manual_seed(1)
    t, rows = 70, 6 * 64
    x = torch.randn(t, 700, generator=g).to(dev, torch.bfloat16)
    slots = torch.randperm(rows, generator=g)[:t].to(dev)
    slots[::9] = -1
    if bad:
        slots[4] = rows + 5
    table = torch.randint(-2, 9, (3, 5), generator=g, dtype=torch.int32).to(dev)
    cu = torch.tensor([0, 70, 70, 200], dtype=torch.int32, device=dev)
    top = slots.clamp(min=-1).view(7, 10)
    lens = torch.tensor([300, 9, 0], dtype=torch.int32, device=dev)
    c_bt = torch.tensor([[0, 7], [1, -1], [-1, -1]], dtype=torch.int32, device=dev)
    for mla, fmt in (("fp8_ds_mla", "fp8_ds_mla_v4"), ("v41_mxfp8", "v41_mxfp8")):
        plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("flash", mla=mla), num_blocks=6,
                              layout="BLHNC")
        cache = kvc.allocate(plan, dev, fill=0)
        c4, mx, swa = cache.view("c4_kv", 1), cache.view("c4_indexer", 1), cache.view("swa0_kv", 1)
        for kv, k in ((x[:, :512], x[:, 512:640]), (x[:, 1:513], x[:, 513:641])):  # aligned, then not
            o4.v4_mla_quant_and_cache(kv, swa, slots, fmt=fmt)
            o4.v4_dsa_write(kv, c4, k, mx, slots, fmt=fmt)
            o4.mxfp4_quant_and_cache(k.float(), mx, slots.flip(0))
        o4.state_write(x[:20, :100].float(), x[:20, 100:200].float(),
                       cache.view("c4_indexer_state", 0)[..., :800], torch.arange(20, device=dev))
        for view_fmt, view in ((fmt, c4), ("mxfp4", mx)):
            for dtype, raw in ((torch.bfloat16, False), (torch.float32, False), (None, True)):
                o4.gather_v4(view, table, cu, view_fmt, dtype=dtype, raw=raw, validate=False)
                o4.gather_v4_slots(view, top, view_fmt, dtype=dtype, raw=raw, validate=False)
        for raw in (False, True):
            o4.gather_compressed_and_swa(c4, c_bt, 4, swa, table, lens, raw=raw, validate=False,
                                         fmt=fmt)


def ncu_case(dev: torch.device, tokens: int = 16384) -> None:
    """At T = 16384 in serving-sized BLHNC caches, twice each (the second launches are the ones
    to read: warm instruction cache, same data sizes): the fused DSA write (bf16, ue8m0) and
    gather_mla on the V3.2 pair; v4_dsa_write and gather_v4 (584-B rows) on the V4-Flash slab."""
    from kvcache_ext import ops_v4 as o4
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("indexer", 132, 1)], 2048,
                          64, "BLHNC")
    cache = kvc.allocate(plan, dev, fill=0)
    x = torch.randn(tokens, 576, device=dev, dtype=torch.bfloat16)
    k = torch.randn(tokens, 128, device=dev, dtype=torch.bfloat16)
    slots = torch.randperm(plan.num_slots, device=dev)[:tokens]
    table = torch.randperm(2048, device=dev)[: tokens // 64].to(torch.int32).view(1, -1)
    cu = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
    out = torch.empty(tokens, 576, dtype=torch.bfloat16, device=dev)
    v4 = kvc.allocate(kvc.plan_cache(groups=kvc.presets.deepseek_v4("flash"), num_blocks=256,
                                     layout="BLHNC"), dev, fill=0)
    c4, mx = v4.view("c4_kv", 0), v4.view("c4_indexer", 0)  # 64 rows a block: 256 blocks
    v4_slots = torch.randperm(256 * 64, device=dev)[:tokens]
    v4_table = torch.randperm(256, device=dev)[: tokens // 64].to(torch.int32).view(1, -1)
    v4_out = torch.empty(tokens, 512, dtype=torch.bfloat16, device=dev)
    for _ in range(2):
        kvc.ops.dsa_write(x[:, :512], x[:, 512:], cache.view("mla", 0), k, cache.view("indexer", 0),
                          slots, scale_fmt="ue8m0")
        kvc.ops.gather_mla(cache.view("mla", 0), table, cu, out=out, validate=False)
        o4.v4_dsa_write(x[:, :512], c4, k, mx, v4_slots)
        o4.gather_v4(c4, v4_table, cu, "fp8_ds_mla_v4", out=v4_out, validate=False)


def kernel_names(src: Path = Path(__file__).resolve().parents[1] / "csrc" / "cuda") -> list[str]:
    """Every __global__ kernel's name in csrc/cuda/*.cuh."""
    pat = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")
    return sorted({m for f in sorted(src.glob("*.cuh")) for m in pat.findall(f.read_text())})


def never_launched(launched: list[str], names: list[str]) -> list[str]:
    """The names that no launched kernel's (demangled) name holds as a whole word."""
    return [n for n in names if not any(re.search(rf"\b{n}\b", k) for k in launched)]


def every_op(dev: torch.device) -> None:
    """Every op once, in three layouts; out-of-range slots only on CUDA, which skips them (the
    CPU ops refuse them), and pinned host memory only there."""
    bad = dev.type == "cuda"
    g = torch.Generator().manual_seed(0)
    for layout, bs in (("BLHNC", 1), ("LBNHC", 16), ("BHLNC", 64)):
        specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2),
                 kvc.CacheSpec("kv", 6, 1, 3), kvc.CacheSpec("kv8", 5, 1, 3),
                 kvc.CacheSpec("vv8", 5, 1, 3), kvc.CacheSpec("mla8", 576, 1),
                 kvc.CacheSpec("mla16", 1152, 1)]
        nb = max(4, 300 // bs)
        plan = kvc.plan_cache(specs, nb, bs, layout)
        cache = kvc.allocate(plan, dev, fill=0)
        host = kvc.allocate(plan, "cpu", pin_memory=bad, fill=0)
        t = 100
        x = torch.randn(t, 576, generator=g).to(dev, torch.bfloat16)
        k = torch.randn(t, 128, generator=g).to(dev, torch.bfloat16)
        slots = torch.randperm(plan.num_slots, generator=g)[:t].to(dev)
        slots[::7] = -1
        if bad:
            slots[3] = plan.num_slots + 1000  # skipped on CUDA
        for dtype in (torch.bfloat16, torch.float16):
            kvc.ops.dsa_write(x[:, :512].to(dtype), x[:, 512:].to(dtype), cache.view("mla", 1),
                              k.to(dtype), cache.view("indexer", 1), slots, "fp8_ds_mla", "ue8m0", "split")
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], cache.view("mla", 0), slots)
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], cache.view("mla16", 0), slots, "auto")
        kvc.ops.dsa_write(x[:, :512], x[:, 512:], cache.view("mla16", 0), k, cache.view("indexer", 0),
                          slots, "auto")
        kvc.ops.indexer_k_quant_and_cache(k, cache.view("indexer", 0), slots, None, "row")
        kvc.ops.reshape_and_cache(torch.randn(t, 3, 3, device=dev, dtype=torch.float16),
                                  cache.view("kv", 0), slots)
        kvc.ops.reshape_and_cache(torch.randn(t, 3, 5, device=dev), cache.view("kv8", 0), slots,
                                  "fp8", torch.ones(1, device=dev))
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], cache.view("mla8", 0), slots, "fp8",
                                     torch.full((1,), 0.05, device=dev))
        kv_in = torch.randn(t, 3, 5, device=dev)
        kvc.ops.reshape_and_cache_kv(kv_in, -kv_in, cache.view("kv8", 0), cache.view("vv8", 0), slots,
                                     "fp8", torch.tensor([0.5, 1.0, 2.0], device=dev), 0.25)
        table = torch.randint(-3, nb + 3, (3, 320 // bs + 1), generator=g, dtype=torch.int32).to(dev)
        cu = torch.tensor([0, 50, 50, 300], dtype=torch.int32, device=dev)
        for view, raw in ((cache.view("mla", 1), False), (cache.view("mla", 1), True)):
            kvc.ops.gather_mla(view, table, cu, raw=raw, validate=False)
            kvc.ops.gather_mla(view, table, cu, dtype=torch.float32, validate=False)
        for placement in ("row", "split"):
            kvc.ops.gather_indexer(cache.view("indexer", 1), table, cu, placement, validate=False)
            kvc.ops.gather_indexer_slots(cache.view("indexer", 1), slots.view(4, 25), placement,
                                         validate=False)
        kvc.ops.gather_mla_slots(cache.view("mla", 0), slots, validate=False)
        kvc.ops.gather_mla(cache.view("mla8", 0), table, cu, "fp8", validate=False, scale=0.05)
        kvc.ops.gather_kv(cache.view("kv", 0), table, cu, dtype=torch.float16, validate=False)
        kvc.ops.gather_kv(cache.view("kv8", 0), table, cu, dtype=torch.float32, validate=False,
                          scale=torch.tensor([0.5, 1.0, 2.0], device=dev))
        mapping = torch.tensor([[0, 1], [1, 2], [3, 0]])
        kvc.copy_blocks(cache, host, mapping)
        kvc.copy_blocks(host, cache, mapping)
        kvc.copy_blocks(cache, cache, torch.tensor([[0, 3]]))
    v4_case(dev, bad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--racecheck", action="store_true", help="one write and one gather only")
    ap.add_argument("--ncu", action="store_true",
                    help="dsa_write, gather_mla, v4_dsa_write and gather_v4 at T = 16384")
    ap.add_argument("--coverage", action="store_true",
                    help="run the default case under torch.profiler; fail naming any kernel never launched")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    dev = torch.device("cuda")
    if args.coverage:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            every_op(dev)
            torch.cuda.synchronize()
        launched = sorted({e.key for e in prof.key_averages()})
        print("\n".join(f"launched: {k}" for k in launched))
        names = kernel_names()
        missing = never_launched(launched, names)
        print(f"sanitize_case: {len(names) - len(missing)} of {len(names)} kernels "
              f"launched" + (f"; never launched: {', '.join(missing)}" if missing else ""))
        raise SystemExit(1 if missing else 0)
    if args.racecheck or args.ncu:
        (racecheck_case if args.racecheck else ncu_case)(dev)
        torch.cuda.synchronize()
        print("sanitize_case: done")
        return
    every_op(dev)
    torch.cuda.synchronize()
    print("sanitize_case: all ops ran")


if __name__ == "__main__":
    main()
