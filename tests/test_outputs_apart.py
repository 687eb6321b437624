"""Two tensors one call writes are refused exactly when they share a byte (SPEC 4).

K and V kept as the two halves of one row (vLLM's *_diffkv backends: K and V head sizes differ)
are views with the same strides and different widths; they share no byte and must be written.
A byte-set oracle (numpy: every byte address each view covers) decides every fuzz case, both
ways: refused iff the sets meet. Refused calls write nothing (guarded buffers)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as R

from conftest import guarded

T, H = 9, 2
APART = r"k_view and v_view \(both written by this op\) must not share memory"
# (kv_cache_dtype, dtype, K bytes, V bytes) per head: the shapes differential fuzzing found
# refused, and equal halves
HALVES = [("fp8", torch.bfloat16, 64, 8), ("auto", torch.bfloat16, 392, 4),
          ("fp8", torch.float16, 2, 137), ("auto", torch.float32, 4, 60),
          ("auto", torch.bfloat16, 64, 64)]


def byte_set(t: torch.Tensor, base: int) -> np.ndarray:
    """Every byte offset (from base) of a uint8 tensor, by its sizes and strides."""
    idx = np.zeros(1, dtype=np.int64)
    for n, s in zip(t.shape, t.stride()):
        idx = (idx[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
    return np.unique(idx + (t.storage_offset() - base))


def halves(gc, layer: int, k_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    view = gc.view("kv", layer)
    return view[..., :k_bytes], view[..., k_bytes:]


def row_inputs(dtype: torch.dtype, k_bytes: int, v_bytes: int, fp8: bool):
    g = torch.Generator().manual_seed(k_bytes + v_bytes)
    per = 1 if fp8 else dtype.itemsize
    key = torch.randn(T, H, k_bytes // per, generator=g).to(dtype)
    value = torch.randn(T, H, v_bytes // per, generator=g).to(dtype)
    return key, value


def call(ops, key, value, k_view, v_view, slots, fmt):
    scale = torch.tensor([0.25]) if fmt == "fp8" else None
    ops.reshape_and_cache_kv(key, value, k_view, v_view, slots, fmt, scale, scale)


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("fmt,dtype,k_bytes,v_bytes", HALVES)
@pytest.mark.parametrize("impl", ["cpu", "cuda_on_host"])
def test_unequal_halves_of_one_row_are_written(request, layout, fmt, dtype, k_bytes, v_bytes, impl):
    plan = kvc.plan_cache([kvc.CacheSpec("kv", k_bytes + v_bytes, 2, H)], num_blocks=5,
                          block_size=4, layout=layout)
    gc = guarded(plan, seed=k_bytes)
    key, value = row_inputs(dtype, k_bytes, v_bytes, fmt == "fp8")
    slots = torch.tensor([3, 17, -1, 0, 19, 8, 9, 12, 5])
    ops = kvc.ops if impl == "cpu" else request.getfixturevalue("simt")
    call(ops, key, value, *halves(gc, 1, k_bytes), slots, fmt)
    ek, ev = (gc.expected_view("kv", 1)[..., :k_bytes], gc.expected_view("kv", 1)[..., k_bytes:])
    scale = torch.tensor([0.25]) if fmt == "fp8" else None
    R.reshape_and_cache_kv(key, value, ek, ev, slots, fmt, scale, scale)
    gc.assert_matches()


@pytest.mark.parametrize("impl", ["cpu", "cuda_on_host"])
def test_one_shared_byte_is_refused_and_nothing_written(request, impl):
    """K's last byte is V's first (a view shifted to start there, same strides): one byte in
    common of the ~18 KB each writes. Shifted one byte on, the two are written."""
    plan = kvc.plan_cache([kvc.CacheSpec("kv", 64, 1, H)], num_blocks=12, block_size=4,
                          layout="LBHNC")
    gc = guarded(plan, seed=1)
    whole = gc.view("kv", 0)
    k_view = whole[:6, ..., :32]
    last = (k_view.storage_offset() + sum((n - 1) * s for n, s in zip(k_view.shape, k_view.stride())))
    key, value = row_inputs(torch.bfloat16, 64, 64, False)
    slots = torch.tensor([0, 5, 9, 13, 17, 21, 2, 7, 11])
    ops = kvc.ops if impl == "cpu" else request.getfixturevalue("simt")
    for shift, refused in ((0, True), (1, False)):
        v_view = torch.as_strided(gc.cache.buffer, k_view.shape, k_view.stride(),
                                  last + shift)
        assert len(np.intersect1d(byte_set(k_view, 0), byte_set(v_view, 0))) == int(refused)
        if refused:
            with pytest.raises(ValueError, match=APART):
                call(ops, key[..., :16], value[..., :16], k_view, v_view, slots, "auto")
            gc.assert_unchanged()
        else:
            call(ops, key[..., :16], value[..., :16], k_view, v_view, slots, "auto")
            R.reshape_and_cache_kv(key[..., :16], value[..., :16],
                                   torch.as_strided(gc.expected.buffer, k_view.shape, k_view.stride(),
                                                    k_view.storage_offset()),
                                   torch.as_strided(gc.expected.buffer, k_view.shape, k_view.stride(),
                                                    last + shift), slots, "auto")
            gc.assert_matches()


def random_strides(rng: np.random.Generator, blocks: int, block_size: int,
                   width: int) -> tuple[int, int, int]:
    """Strides of a [blocks, H, block_size, width] view without self-overlap: its three outer
    dimensions in a random order, each stride at least what the ones inside it cover, plus a
    random gap."""
    order = rng.permutation(3)
    sizes = (blocks, H, block_size)
    strides = [0, 0, 0]
    covered = width
    for d in order[::-1]:
        strides[d] = covered + int(rng.integers(0, 3)) * int(rng.integers(1, 9))
        covered = strides[d] * sizes[d]
    return tuple(strides)


def random_view(rng: np.random.Generator, buf: torch.Tensor, blocks: int, block_size: int,
                width: int, strides: tuple[int, int, int]) -> torch.Tensor:
    """A [blocks, H, block_size, width] uint8 view at a random offset that fits."""
    reach = (blocks - 1) * strides[0] + (H - 1) * strides[1] + (block_size - 1) * strides[2] + width
    off = int(rng.integers(0, buf.numel() - reach + 1))
    return torch.as_strided(buf, (blocks, H, block_size, width), (*strides, 1), off)


@pytest.mark.parametrize("impl", ["cpu", "cuda_on_host"])
def test_fuzz_refused_iff_a_byte_is_shared(request, impl):
    """300 random pairs of K and V views over one small buffer (same strides or not, any
    widths): the op refuses exactly the pairs whose byte sets meet; the others are written
    as the reference writes them, and nothing else changes."""
    rng = np.random.default_rng(7)
    ops = kvc.ops if impl == "cpu" else request.getfixturevalue("simt")
    counts = {"refused": 0, "written": 0, "same strides": 0}
    for case in range(300):
        blocks, bs = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        kw, vw = int(rng.integers(1, 9)) * 2, int(rng.integers(1, 9)) * 2
        buf0 = torch.randint(0, 256, (int(rng.integers(300, 900)),), dtype=torch.uint8,
                             generator=torch.Generator().manual_seed(case))
        buf, want = buf0.clone(), buf0.clone()
        try:
            same = rng.random() < 0.5
            ks = random_strides(rng, blocks, bs, max(kw, vw) if same else kw)
            k_view = random_view(rng, buf, blocks, bs, kw, ks)
            v_view = random_view(rng, buf, blocks, bs, vw,
                                 ks if same else random_strides(rng, blocks, bs, vw))
        except ValueError:  # rng.integers(0, <=0): the view does not fit this buffer
            continue
        counts["same strides"] += same
        meet = len(np.intersect1d(byte_set(k_view, 0), byte_set(v_view, 0))) > 0
        key = torch.randn(T, H, kw // 2).to(torch.bfloat16)
        value = torch.randn(T, H, vw // 2).to(torch.bfloat16)
        slots = torch.randperm(blocks * bs)[:min(T, blocks * bs)]
        k, v = key[:len(slots)], value[:len(slots)]
        if meet:
            with pytest.raises(ValueError, match=APART):
                call(ops, k, v, k_view, v_view, slots, "auto")
            counts["refused"] += 1
        else:
            call(ops, k, v, k_view, v_view, slots, "auto")
            R.reshape_and_cache_kv(k, v, torch.as_strided(want, k_view.shape, k_view.stride(),
                                                          k_view.storage_offset()),
                                   torch.as_strided(want, v_view.shape, v_view.stride(),
                                                    v_view.storage_offset()), slots, "auto")
            counts["written"] += 1
        assert torch.equal(buf, want), (case, meet, k_view.stride(), v_view.stride())
    assert counts["refused"] >= 30 and counts["written"] >= 30 and counts["same strides"] >= 50, counts


def test_codes_and_scales_of_one_gather_may_interleave():
    """A gather's codes as rows 160 B apart and its scales in the 32-B gap after the first row:
    inside the codes' span but on no byte of theirs, so written; moved 4 B back, onto the
    first row's last codes, refused with nothing written."""
    plan = kvc.plan_cache([kvc.CacheSpec("indexer", 132, 1)], num_blocks=4, block_size=16)
    cache = kvc.allocate(plan, fill=0)
    slots = torch.tensor([3, 17, 40, 63])
    kvc.ops.indexer_k_quant_and_cache(torch.randn(4, 128, generator=torch.Generator().manual_seed(0))
                                      .to(torch.bfloat16), cache.view("indexer", 0), slots)
    want_codes, want_scales = kvc.ops.gather_indexer_slots(cache.view("indexer", 0), slots)
    buf = torch.zeros(4 * 160, dtype=torch.uint8)
    codes = torch.as_strided(buf, (4, 128), (160, 1))
    scales = buf[128:144].view(torch.float32)
    got_c, got_s = kvc.ops.gather_indexer_slots(cache.view("indexer", 0), slots, out=(codes, scales))
    assert torch.equal(got_c, want_codes) and torch.equal(got_s, want_scales)
    before = buf.clone()
    with pytest.raises(ValueError, match=r"codes and scales \(both written by this op\)"):
        kvc.ops.gather_indexer_slots(cache.view("indexer", 0), slots,
                                     out=(codes, buf[124:140].view(torch.float32)))
    assert torch.equal(buf, before)
