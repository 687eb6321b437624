"""A small case that runs every CUDA op once, for compute-sanitizer:

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_case.py

Covers unaligned views (block size 1 makes 656-byte rows 8-byte aligned only), padding slots,
out-of-range slots and block-table entries (skipped / zero rows, never touched), both indexer
placements, fp16 inputs, and GPU <-> pinned CPU block copies.
"""
import torch

import kvcache_ext as kvc


def main() -> None:
    assert torch.cuda.is_available(), "needs a GPU"
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    for layout, bs in (("BLHNC", 1), ("LBNHC", 16), ("BHLNC", 64)):
        specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2),
                 kvc.CacheSpec("kv", 6, 1, 3), kvc.CacheSpec("kv8", 5, 1, 3)]
        nb = max(4, 300 // bs)
        plan = kvc.plan_cache(specs, nb, bs, layout)
        cache = kvc.allocate(plan, dev, fill=0)
        host = kvc.allocate(plan, "cpu", pin_memory=True, fill=0)
        t = 100
        x = torch.randn(t, 576, generator=g).to(dev, torch.bfloat16)
        k = torch.randn(t, 128, generator=g).to(dev, torch.bfloat16)
        slots = torch.randperm(plan.num_slots, generator=g)[:t].to(dev)
        slots[::7] = -1
        slots[3] = plan.num_slots + 1000  # skipped on CUDA
        for dtype in (torch.bfloat16, torch.float16):
            kvc.ops.dsa_write(x[:, :512].to(dtype), x[:, 512:].to(dtype), cache.view("mla", 1),
                              k.to(dtype), cache.view("indexer", 1), slots, "fp8_ds_mla", "ue8m0", "split")
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], cache.view("mla", 0), slots)
        kvc.ops.indexer_k_quant_and_cache(k, cache.view("indexer", 0), slots, None, "row")
        kvc.ops.reshape_and_cache(torch.randn(t, 3, 3, device=dev, dtype=torch.float16),
                                  cache.view("kv", 0), slots)
        kvc.ops.reshape_and_cache(torch.randn(t, 3, 5, device=dev), cache.view("kv8", 0), slots,
                                  "fp8", torch.ones(1, device=dev))
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
        mapping = torch.tensor([[0, 1], [1, 2], [3, 0]])
        kvc.copy_blocks(cache, host, mapping)
        kvc.copy_blocks(host, cache, mapping)
        kvc.copy_blocks(cache, cache, torch.tensor([[0, 3]]))
    torch.cuda.synchronize()
    print("sanitize_case: all ops ran")


if __name__ == "__main__":
    main()
