"""torch.library.opcheck on every op: schema (mutations declared), fake impls, autograd
registration, and AOT dispatch (torch.compile's path)."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops, ops_v4

from conftest import dsa_plan

OPS = torch.ops.kvcache_ext


def cases(device: str):
    plan = dsa_plan("BLHNC", 16, 8)
    cache = kvc.allocate(plan, device=device, fill=0)
    mla, idx = cache.view("mla", 1), cache.view("indexer", 1)
    x = torch.randn(20, 576, dtype=torch.bfloat16, device=device)
    k = torch.randn(20, 128, dtype=torch.bfloat16, device=device)
    slots = torch.randperm(plan.num_slots, device=device)[:20]
    slots[3] = -1
    kv_plan = kvc.plan_cache([kvc.CacheSpec("k", 64, 1, 2), kvc.CacheSpec("v", 64, 1, 2)], 4, 16,
                             "LBHNC")
    kv8 = kvc.allocate(kvc.plan_cache([kvc.CacheSpec("k", 32, 1, 2), kvc.CacheSpec("v", 32, 1, 2)],
                                      4, 16, "BLHNC"), device=device, fill=0)
    mla8 = kvc.allocate(dsa_plan("BLNHC", 16, 8, mla_row=576), device=device, fill=0).view("mla", 0)
    kv_cache = kvc.allocate(kv_plan, device=device, fill=0)
    key = torch.randn(20, 2, 32, dtype=torch.float16, device=device)
    kv_slots = torch.randperm(kv_plan.num_slots, device=device)[:20]
    table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 40, 45], dtype=torch.int32, device=device)
    cu_kv = torch.tensor([0, 16, 20], dtype=torch.int32, device=device)
    u8 = lambda n, c: torch.empty(n, c, dtype=torch.uint8, device=device)  # noqa: E731
    bf = torch.empty(45, 576, dtype=torch.bfloat16, device=device)
    other = kvc.allocate(plan, device=device, fill=1)
    spans = kvc.block_spans(plan, torch.tensor([[0, 1], [2, 3]]))
    ops.concat_and_cache_mla(x[:, :512], x[:, 512:], mla, slots)
    v4 = kvc.allocate(kvc.plan_cache(groups=kvc.presets.deepseek_v4("flash"), num_blocks=3,
                                     layout="BLHNC"), device=device, fill=0)
    c4, swa, mx = v4.view("c4_kv", 0), v4.view("swa0_kv", 0), v4.view("c4_indexer", 0)
    v4_slots = torch.tensor([0, 5, -1, 130], device=device)
    v4_lens = torch.tensor([70, 9], dtype=torch.int32, device=device)
    v4_bt = torch.tensor([[0], [1]], dtype=torch.int32, device=device)
    v4_swa_bt = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32, device=device)
    ops_v4.v4_mla_quant_and_cache(x[:, :512], c4, v4_slots)
    v4_fp8 = kvc.allocate(kvc.plan_cache(groups=kvc.presets.deepseek_v4("flash", indexer="fp8"),
                                         num_blocks=3, layout="BLHNC"), device=device, fill=0)
    return {
        "v4_dsa_write_fp8": (OPS.v4_dsa_write, (x[:4, :512], v4_fp8.view("c4_kv", 0), k[:4],
                                                v4_fp8.view("c4_indexer", 0), v4_slots, "amax", "fp8")),
        "v4_mla_quant_and_cache": (OPS.v4_mla_quant_and_cache, (x[:4, :512], c4, v4_slots, "scale")),
        "v4_dsa_write": (OPS.v4_dsa_write, (x[:4, :512], c4, k[:4], mx, v4_slots, "amax")),
        "mxfp4_quant_and_cache": (OPS.mxfp4_quant_and_cache, (k[:4], mx, v4_slots)),
        "v4_indexer_quant_and_cache": (OPS.v4_indexer_quant_and_cache, (
            k[:4].float(), v4_fp8.view("c4_indexer", 1), v4_slots)),
        "state_write": (OPS.state_write, (torch.randn(4, 1024, device=device),
                                          torch.randn(4, 1024, device=device),
                                          v4.view("c4_state", 0),
                                          torch.tensor([0, 5, -1, 11], device=device))),
        "gather_v4": (OPS.gather_v4, (c4, v4_bt, torch.tensor([0, 17, 20], dtype=torch.int32,
                                                               device=device),
                                      None, "fp8_ds_mla_v4", bf[:20, :512], True)),
        "gather_v4_slots": (OPS.gather_v4_slots, (mx, v4_slots, "mxfp4", u8(4, 68), True)),
        "gather_v4_window": (OPS.gather_v4_window, (
            c4, v4_bt, swa, v4_swa_bt, v4_lens, ops_v4.window_rows(v4_lens, 4),
            4, 128, torch.empty(70 + 17 + 2 + 9, 512, device=device), True)),
        "reshape_and_cache": (OPS.reshape_and_cache, (key, kv_cache.view("k", 0), kv_slots, "auto", None)),
        "reshape_and_cache_fp8": (OPS.reshape_and_cache, (
            key, kvc.allocate(kvc.plan_cache([kvc.CacheSpec("k", 32, 1, 2)], 4, 16), device=device,
                              fill=0).view("k", 0), kv_slots, "fp8", torch.ones(1, device=device))),
        "reshape_and_cache_kv": (OPS.reshape_and_cache_kv, (
            key, key, kv_cache.view("k", 0), kv_cache.view("v", 0), kv_slots, "auto", None, None)),
        "reshape_and_cache_kv_fp8": (OPS.reshape_and_cache_kv, (
            key, key, kv8.view("k", 0), kv8.view("v", 0), kv_slots, "fp8",
            torch.tensor([0.5, 2.0], device=device), torch.ones(1, device=device))),
        "reshape_and_cache_kv_split": (OPS.reshape_and_cache_kv_split, (
            key, key[:, :, :16], kvc.allocate(kvc.plan_cache(
                [kvc.CacheSpec("kv", 96, 1, 2, split=(64, 32), channel_major=2)], 4, 16, "LBHNC"),
                device=device, fill=0).view("kv", 0), kv_slots, True)),
        "gather_kv": (OPS.gather_kv, (kv_cache.view("k", 0), table[:, :1], cu_kv, None,
                                      torch.empty(20, 2, 32, dtype=torch.float16, device=device),
                                      True, None)),
        "gather_kv_fp8": (OPS.gather_kv, (kv8.view("v", 0), table[:, :1], cu_kv, None,
                                          torch.empty(20, 2, 32, dtype=torch.float32, device=device),
                                          True, torch.tensor([0.5], device=device))),
        "gather_kv_slots": (OPS.gather_kv_slots, (kv8.view("v", 0), kv_slots, torch.empty(
            20, 2, 32, dtype=torch.bfloat16, device=device), True, torch.tensor([0.5], device=device))),
        "concat_and_cache_mla": (OPS.concat_and_cache_mla, (x[:, :512], x[:, 512:], mla, slots, "fp8_ds_mla")),
        "concat_and_cache_mla_fp8": (OPS.concat_and_cache_mla, (x[:, :512], x[:, 512:], mla8, slots, "fp8",
                                                                torch.tensor([0.25], device=device))),
        "indexer_k_quant_and_cache": (OPS.indexer_k_quant_and_cache, (k, idx, slots, "ue8m0", "split")),
        "dsa_write": (OPS.dsa_write, (x[:, :512], x[:, 512:], mla, k, idx, slots, "fp8_ds_mla", None, "row")),
        "gather_mla": (OPS.gather_mla, (mla, table, cu, None, "fp8_ds_mla", bf, True)),
        "gather_mla_raw": (OPS.gather_mla, (mla, table, cu, None, "fp8_ds_mla", u8(45, 656), True)),
        "gather_mla_slots": (OPS.gather_mla_slots, (mla, slots.clamp(min=0), "fp8_ds_mla", bf[:20], True)),
        "gather_indexer": (OPS.gather_indexer, (idx, table, cu, None, "row", u8(45, 128),
                                                torch.empty(45, device=device), True)),
        "gather_indexer_slots": (OPS.gather_indexer_slots, (idx, slots, "split", u8(20, 128),
                                                            torch.empty(20, device=device), True)),
        "copy_spans": (OPS.copy_spans, (cache.buffer, other.buffer, spans)),
        "check_spans": (OPS.check_spans, (spans, cache.buffer.numel(), other.buffer.numel(), False)),
        "check_slot_mapping": (OPS.check_slot_mapping, (slots, mla)),
        "runs_of_spans": (OPS.runs_of_spans, (spans, torch.empty(spans.shape[0], 6, dtype=torch.long),
                                              torch.zeros(1, dtype=torch.long))),
        "check_runs": (OPS.check_runs, (torch.tensor([[0, 0, 8, 16, 16, 3]]), cache.buffer.numel(),
                                        other.buffer.numel())),
        "copy_runs": (OPS.copy_runs, (cache.buffer, other.buffer,
                                      torch.tensor([[0, 0, 8, 16, 32, 3], [64, 8, 8, 16, 32, 3]]))),
        "plan_token_runs": (OPS.plan_token_runs, (
            kvc.TransferPlan(cache.plan, other.plan).move_table, torch.arange(4), torch.arange(4),
            cache.plan.block_size, other.plan.block_size, cache.plan.num_blocks,
            other.plan.num_blocks, 10, 0, 0, torch.empty(4096, 6, dtype=torch.long),
            torch.zeros(1, dtype=torch.long))),
        "plan_token_runs count only": (OPS.plan_token_runs, (  # a runs table of 0 rows
            kvc.TransferPlan(cache.plan, other.plan).move_table, torch.arange(4), torch.arange(4),
            cache.plan.block_size, other.plan.block_size, cache.plan.num_blocks,
            other.plan.num_blocks, 10, 0, 0, torch.empty(0, 6, dtype=torch.long),
            torch.zeros(1, dtype=torch.long))),
    }


NAMES = list(cases("cpu"))


@pytest.mark.parametrize("name", NAMES)
def test_opcheck(device, name):
    op, args = cases(device)[name]
    torch.library.opcheck(op, args)


def test_compiles_with_torch_compile():
    plan = dsa_plan("LBNHC", 16, 8)
    cache = kvc.allocate(plan, fill=0)
    eager = kvc.allocate(plan, fill=0)
    x = torch.randn(10, 576, dtype=torch.bfloat16)
    k = torch.randn(10, 128, dtype=torch.bfloat16)
    slots = torch.arange(10) * 3

    # Model code receives its layer's views once, at start-up, and calls the op every step.
    def step(mla_view: torch.Tensor, indexer_view: torch.Tensor) -> None:
        ops.dsa_write(x[:, :512], x[:, 512:], mla_view, k, indexer_view, slots)

    step(eager.view("mla", 0), eager.view("indexer", 0))
    torch.compile(step, backend="aot_eager", fullgraph=True)(cache.view("mla", 0),
                                                             cache.view("indexer", 0))
    assert torch.equal(cache.buffer, eager.buffer)


def test_ops_bump_the_version_of_what_they_write():
    """Writes and gathers are in-place ops to autograd: the written tensor's version counter
    moves (so a backward reading bytes saved before the write refuses to run), inference
    tensors (no counter) are written in and outside inference mode, and inputs that require
    grad leave the cache free of autograd history (the ops are not differentiable)."""
    names = [n for n in dir(torch.ops.kvcache_ext) if isinstance(
        getattr(torch.ops.kvcache_ext, n), torch._ops.OpOverloadPacket)]
    assert len(names) >= 17
    for name in names:  # every op (csrc/ops/op_list.h lists them; dispatch_keys.cpp registers the kernel)
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"kvcache_ext::{name}", "ADInplaceOrView"), name
    plan = kvc.plan_cache([kvc.CacheSpec("k", 128, 1, 2)], 4, 16)
    cache = kvc.allocate(plan, fill=0)
    key, slots = torch.randn(4, 2, 32), torch.tensor([1, 2, 3, 4])
    before = cache.buffer._version, key._version, slots._version
    ops.reshape_and_cache(key, cache.view("k", 0), slots)
    assert cache.buffer._version > before[0]
    assert (key._version, slots._version) == before[1:]  # what an op reads keeps its version
    out = torch.zeros(4, 2, 32)
    w = torch.randn(4, 2, 32, requires_grad=True)
    loss = (w * out).sum()  # saves out for the backward
    ops.gather_kv_slots(cache.view("k", 0), slots, dtype=torch.float32, out=out)
    assert torch.equal(out, key)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    codes, scales = torch.zeros(4, 128, dtype=torch.uint8), torch.zeros(4)
    idx = kvc.allocate(kvc.plan_cache([kvc.CacheSpec("i", 132, 1)], 4, 16), fill=0)
    versions = codes._version, scales._version
    ops.gather_indexer_slots(idx.view("i", 0), slots, out=(codes, scales))
    assert codes._version > versions[0] and scales._version > versions[1]  # both outputs

    with torch.inference_mode():
        inf = kvc.allocate(plan, fill=0)
        ops.reshape_and_cache(key, inf.view("k", 0), slots)
    ops.reshape_and_cache(key * 2, inf.view("k", 0), slots)  # outside: still allowed
    assert torch.equal(ops.gather_kv_slots(inf.view("k", 0), slots, dtype=torch.float32), key * 2)

    ops.reshape_and_cache(key.requires_grad_(), cache.view("k", 0), slots)
    assert not cache.buffer.requires_grad and cache.buffer.grad_fn is None
    # a tensor autograd tracks is not overwritten (its graph would describe bytes that are gone)
    tracked = w * 1.0
    with pytest.raises(ValueError, match="gather_kv_slots: out requires grad"):
        ops.gather_kv_slots(cache.view("k", 0), slots, dtype=torch.float32, out=tracked)
    assert torch.equal(tracked, w.detach())
    with torch.no_grad():
        ops.gather_kv_slots(cache.view("k", 0), slots, dtype=torch.float32, out=tracked)
    assert torch.equal(tracked.detach(), key.detach())
