"""The Python wrappers refuse arguments the ops would misread, with an error naming the
argument, before anything is written or computed: non-viewable outputs of slot gathers, out=
disagreeing with raw= / dtype=, bad window-gather and compressor-state arguments."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops
from kvcache_ext import ops_v4 as o4


@pytest.fixture(scope="module")
def cache():
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("k", 128, 1, 2),
                           kvc.CacheSpec("idx", 132, 1), kvc.CacheSpec("v4", 584, 1, split=(576, 8)),
                           kvc.CacheSpec("st", 2048, 1)], 4, 16, "BLHNC")
    return kvc.allocate(plan, fill=0)


SLOTS = torch.tensor([[5, -1, 63], [0, 17, 40]])


def _transposed(*shape, dtype) -> torch.Tensor:
    """[2, 3, ...] whose first two dimensions are swapped in memory (not viewable as rows)."""
    return torch.empty(shape[1], shape[0], *shape[2:], dtype=dtype).transpose(0, 1)


@pytest.mark.parametrize("op", ["mla", "kv", "indexer", "v4"])
def test_slot_gathers_refuse_outputs_not_viewable_as_rows(cache, op):
    calls = {
        "mla": lambda: ops.gather_mla_slots(cache.view("mla", 0), SLOTS,
                                            out=_transposed(2, 3, 576, dtype=torch.bfloat16)),
        "kv": lambda: ops.gather_kv_slots(cache.view("k", 0), SLOTS,
                                          out=_transposed(2, 3, 2, 64, dtype=torch.bfloat16)),
        "indexer": lambda: ops.gather_indexer_slots(
            cache.view("idx", 0), SLOTS, out=(_transposed(2, 3, 128, dtype=torch.uint8),
                                              torch.empty(2, 3))),
        "v4": lambda: o4.gather_v4_slots(cache.view("v4", 0), SLOTS,
                                         out=_transposed(2, 3, 512, dtype=torch.bfloat16)),
    }
    name = "codes" if op == "indexer" else "out"
    with pytest.raises(ValueError, match=rf"{name} of shape \(2, 3, .*cannot be seen as \[-1, "):
        calls[op]()


def test_slot_gathers_write_through_viewable_outputs(cache):
    """A [Q, K, ...] out that is a slice of a larger tensor (viewable) is written in place."""
    big = torch.full((2, 4, 576), 7.0, dtype=torch.bfloat16)
    out = big[:, :3]  # rows step as one within each Q; Q steps by 4 rows: not viewable -> refused
    with pytest.raises(ValueError, match="cannot be seen as"):
        ops.gather_mla_slots(cache.view("mla", 0), SLOTS, out=out)
    flat = torch.full((6, 576), 7.0, dtype=torch.bfloat16)
    got = ops.gather_mla_slots(cache.view("mla", 0), SLOTS, out=flat.view(2, 3, 576))
    assert got.data_ptr() == flat.data_ptr() and bool((flat[1] == 0).all())  # slot -1: zeros


def test_out_must_agree_with_raw_and_dtype(cache):
    bt, cu = torch.tensor([[0]], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    bf = torch.empty(4, 576, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="out must have dtype torch.float32, got torch.bfloat16"):
        ops.gather_mla(cache.view("mla", 0), bt, cu, dtype=torch.float32, out=bf)
    with pytest.raises(TypeError, match="raw=True writes uint8 rows, got out of dtype torch.bfloat16"):
        ops.gather_mla(cache.view("mla", 0), bt, cu, raw=True, out=bf)
    with pytest.raises(TypeError, match="raw=True writes uint8 rows"):
        ops.gather_mla_slots(cache.view("mla", 0), SLOTS[0], raw=True, out=bf[:3])
    with pytest.raises(TypeError, match="out must have dtype torch.float32"):
        o4.gather_v4(cache.view("v4", 0), bt, cu, dtype=torch.float32, out=bf[:, :512])
    with pytest.raises(TypeError, match="out must have dtype torch.float32"):
        o4.gather_v4_slots(cache.view("v4", 0), SLOTS[0], dtype=torch.float32, out=bf[:3, :512])
    # agreeing arguments are accepted; raw= means nothing for "auto" rows (their values)
    assert ops.gather_mla(cache.view("mla", 0), bt, cu, dtype=torch.bfloat16, out=bf) is bf
    auto = kvc.allocate(kvc.plan_cache([kvc.CacheSpec("m", 576 * 2, 1)], 4, 16), fill=0).view("m", 0)
    assert ops.gather_mla(auto, bt, cu, "auto", raw=True, out=bf) is bf
    raw = torch.empty(4, 656, dtype=torch.uint8)
    assert ops.gather_mla(cache.view("mla", 0), bt, cu, raw=True, out=raw) is raw


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(ratio=0), ValueError, r"ratio must be an int >= 1, got 0"),
    (dict(ratio=4.0), ValueError, r"ratio must be an int >= 1, got 4\.0"),
    (dict(window=-100), ValueError, r"window must be an int >= 0, got -100"),
    (dict(seq_lens=torch.tensor([10.9])), TypeError, r"seq_lens must be a tensor of integers"),
    (dict(seq_lens=torch.tensor([[10]], dtype=torch.int32)), ValueError, r"seq_lens must be 1-D"),
])
def test_window_gather_refuses_bad_arguments(cache, kw, exc, msg):
    v, bt = cache.view("v4", 0), torch.tensor([[0, 1]], dtype=torch.int32)
    args = dict(ratio=4, window=128, seq_lens=torch.tensor([10], dtype=torch.int32)) | kw
    out = torch.full((20, 512), 7.0)
    with pytest.raises(exc, match=msg):
        o4.gather_compressed_and_swa(v, bt, args["ratio"], v, bt, args["seq_lens"],
                                     window=args["window"], out=out, cu_out=torch.tensor([0, 12], dtype=torch.int32))
    assert bool((out == 7.0).all())
    with pytest.raises(exc, match=msg):
        o4.window_rows(args["seq_lens"], args["ratio"], args["window"])


def test_window_gather_takes_numpy_integers(cache):
    v, bt = cache.view("v4", 0), torch.tensor([[0, 1]], dtype=torch.int32)
    for lens in (torch.tensor([10]), torch.tensor([10], dtype=torch.int16)):
        out, cu = o4.gather_compressed_and_swa(v, bt, np.int64(4), v, bt, lens, window=np.int32(128))
        assert cu.tolist() == [0, 12] and out.shape == (12, 512)


def test_state_ops_name_their_arguments(cache):
    st = cache.view("st", 0)
    bt, cu = torch.tensor([[0]], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    for width in (1000, 512, 0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"width must be an int in \[1, 511\]"):
            o4.state_read(st, bt, cu, width)
    kv, score = o4.state_read(st, bt, cu, 300)
    assert kv.shape == (4, 300) and score.shape == (4, 212)
    before = cache.buffer.clone()
    with pytest.raises(ValueError, match=r"kv and score must hold at least slot_mapping.numel\(\) = 3 rows"):
        o4.state_write(torch.randn(2, 256), torch.randn(2, 256), st, torch.tensor([1, 2, 3]))
    assert torch.equal(cache.buffer, before)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.uint8])
def test_v4_indexer_refuses_other_dtypes(cache, dtype):
    before = cache.buffer.clone()
    with pytest.raises(TypeError, match=rf"k must be bfloat16, float16 or float32, got {dtype}"):
        o4.v4_indexer_quant_and_cache(torch.ones(2, 128, dtype=dtype), cache.view("idx", 0),
                                      torch.tensor([1, 2]))
    assert torch.equal(cache.buffer, before)
