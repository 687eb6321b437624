"""The CPU kernels' bytes do not depend on the caller's floating-point environment: a serving
engine that flushes denormals (torch.set_flush_denormal) or changes the rounding mode gets the
bytes the format defines (the CUDA kernels' bytes), and gets its own environment back."""
from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops, ops_v4
from kvcache_ext import reference as ref

T = 1536  # several parallel chunks, so worker threads run rows too


def _inputs() -> dict[str, torch.Tensor]:
    """Rows of every magnitude from normal to the smallest subnormals (per-row factors)."""
    g = torch.Generator().manual_seed(3)
    mag = torch.tensor([1.0, 3e3, 1e-38, 1e-39, 3e-40, 1e-42, 1e-44, 2.0 ** -133, 2.0 ** -126, 1e-5])

    def rows(n: int, width: int) -> torch.Tensor:
        return torch.randn(n, width, generator=g) * mag[torch.randint(0, len(mag), (n, 1), generator=g)]

    return {"x": rows(T, 576), "k": rows(T, 128), "kv": rows(T, 2 * 64),
            "slots": torch.randperm(64 * 32, generator=g)[:T], "s_mla": torch.tensor([3e-3]),
            "s_k": torch.tensor([1e-3, 2.5]), "s_v": torch.tensor([7e-4])}


def _run_ops(inp: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """Every CPU op that does float arithmetic; returns the bytes each wrote or returned. The
    scales are fp32 tensors made beforehand (a Python float becomes fp32 in the caller's
    rounding mode, before any kernel runs)."""
    x, k, s = inp["x"], inp["k"], inp["slots"]
    s_mla, s_k, s_v = inp["s_mla"], inp["s_k"], inp["s_v"]
    xb, kb = x.to(torch.bfloat16), k.to(torch.bfloat16)
    out: dict[str, bytes] = {}
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("idx", 132, 1),
                           kvc.CacheSpec("mla8", 576, 1), kvc.CacheSpec("k", 64, 1, 2),
                           kvc.CacheSpec("v", 64, 1, 2)], 64, 32)
    c = kvc.allocate(plan, fill=7)
    ops.dsa_write(xb[:, :512], xb[:, 512:], c.view("mla", 0), kb, c.view("idx", 0), s,
                  scale_fmt="ue8m0")
    ops.indexer_k_quant_and_cache(k.to(torch.float16), c.view("idx", 0), s.flip(0))
    xh = (x * 1e4).to(torch.float16)  # fp16 subnormals too
    ops.concat_and_cache_mla(xh[:, :512], xh[:, 512:], c.view("mla8", 0), s, "fp8", s_mla)
    kv = inp["kv"].view(T, 2, 64)
    ops.reshape_and_cache_kv(kv, kv.flip(1), c.view("k", 0), c.view("v", 0), s, "fp8", s_k, s_v)
    out["cache"] = c.buffer.numpy().tobytes()
    for dtype in (torch.bfloat16, torch.float32):
        r = ops.gather_mla_slots(c.view("mla", 0), s, dtype=dtype)
        out[f"gather_mla {dtype}"] = r.view(torch.uint8).numpy().tobytes()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        r = ops.gather_kv_slots(c.view("k", 0), s, dtype=dtype, scale=s_k)
        out[f"gather_kv {dtype}"] = r.view(torch.uint8).numpy().tobytes()
    r = ops.gather_mla_slots(c.view("mla8", 0), s, "fp8", dtype=torch.float32, scale=s_mla)
    out["gather_mla fp8"] = r.numpy().tobytes()

    p4 = kvc.plan_cache([kvc.CacheSpec("v4", 584, 1, split=(576, 8)),
                         kvc.CacheSpec("mx", 68, 1, split=(64, 4)),
                         kvc.CacheSpec("i4", 132, 1, split=(128, 4))], 64, 32)
    c4 = kvc.allocate(p4, fill=7)
    ops_v4.v4_dsa_write(xb[:, :512], c4.view("v4", 0), kb, c4.view("mx", 0), s)
    ops_v4.v4_mla_quant_and_cache(x[:, :512], c4.view("v4", 0), s.flip(0))
    ops_v4.v4_indexer_quant_and_cache(k, c4.view("i4", 0), s)
    out["v4 cache"] = c4.buffer.numpy().tobytes()
    bt, lens = torch.tensor([[0, 1, 2]], dtype=torch.int32), torch.tensor([70], dtype=torch.int32)
    r, _ = ops_v4.gather_compressed_and_swa(c4.view("v4", 0), bt, 4, c4.view("v4", 0), bt, lens,
                                            dtype=torch.float32)
    out["gather_compressed_and_swa"] = r.numpy().tobytes()
    for name, fmt in (("v4", "fp8_ds_mla_v4"), ("mx", "mxfp4")):
        for dtype in (torch.bfloat16, torch.float32):
            r = ops_v4.gather_v4_slots(c4.view(name, 0), s, fmt, dtype=dtype)
            out[f"gather_v4 {fmt} {dtype}"] = r.view(torch.uint8).numpy().tobytes()
    return out


@contextlib.contextmanager
def _flush_denormal():
    assert torch.set_flush_denormal(True), "this CPU cannot flush denormals"
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@contextlib.contextmanager
def _rounding(mode: int):
    libm = ctypes.CDLL("libm.so.6")
    assert libm.fesetround(mode) == 0
    try:
        yield
    finally:
        libm.fesetround(0)  # FE_TONEAREST


# x86-64 glibc <fenv.h>: FE_DOWNWARD 0x400, FE_UPWARD 0x800, FE_TOWARDZERO 0xc00
X86 = platform.machine() in ("x86_64", "AMD64")
ENVS = {"flush denormals": _flush_denormal,
        "round upward": lambda: _rounding(0x800),
        "round toward zero": lambda: _rounding(0xC00)}


@pytest.fixture(scope="module")
def default_bytes():
    inp = _inputs()
    return inp, _run_ops(inp)


def test_default_bytes_are_the_reference_bytes(default_bytes):
    """The baseline the other tests compare with is the format's bytes (reference rows)."""
    inp, got = default_bytes
    x, k, s = inp["x"], inp["k"], inp["slots"]
    view = torch.full((64, 1, 32, 656), 7, dtype=torch.uint8)
    ref.write_rows(view, s, ref.mla_fp8_rows(x[:, :512].to(torch.bfloat16), x[:, 512:].to(torch.bfloat16)))
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 1)], 64, 32)
    c = kvc.allocate(plan, fill=7)
    ops.concat_and_cache_mla(x[:, :512].to(torch.bfloat16), x[:, 512:].to(torch.bfloat16), c.view("mla", 0), s)
    assert torch.equal(c.view("mla", 0), view)
    assert (c.view("mla", 0) == 7).any()  # some slots were not written: the poison shows


@pytest.mark.skipif(not X86, reason="the rounding-mode constants are x86-64 glibc's")
@pytest.mark.parametrize("env", list(ENVS))
def test_ops_bytes_do_not_depend_on_float_environment(default_bytes, env):
    inp, want = default_bytes
    with ENVS[env]():
        got = _run_ops(inp)
    bad = [name for name in want if got[name] != want[name]]
    assert not bad, f"under {env}: {bad} differ from the default environment's bytes"


@pytest.mark.skipif(not X86, reason="the rounding-mode constants are x86-64 glibc's")
def test_caller_environment_is_restored(default_bytes):
    inp, _ = default_bytes
    tiny = torch.tensor([1e-39])
    with _flush_denormal():
        _run_ops(inp)
        assert (tiny * 1.0).item() == 0.0  # the caller's flush mode survives the ops
    assert (tiny * 1.0).item() != 0.0
    with _rounding(0x800):
        _run_ops(inp)
        one = torch.tensor([1.0])
        assert (one + 2.0 ** -30).item() > 1.0  # still rounding upward


@pytest.mark.skipif(not X86, reason="feenableexcept / FE_INVALID values are x86-64 glibc's")
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_trapping_callers_and_every_isa(isa):
    """In a fresh process per row-loop ISA: a caller that unmasked FE_INVALID (inf / inf, 0 * inf
    arise in the defined inf / NaN cases) is not killed by SIGFPE, every environment gives the
    default bytes, and a subnormal per-tensor scale is accepted under flush-to-zero."""
    code = ("import ctypes, sys, torch\n"
            "import test_float_env as t\n"
            "inp = t._inputs()\n"
            "inp['x'][::7] = float('inf'); inp['k'][::5, 3] = float('nan')\n"
            "want = t._run_ops(inp)\n"
            "for env in t.ENVS.values():\n"
            "    with env():\n"
            "        assert t._run_ops(inp) == want\n"
            "import kvcache_ext as kvc\n"
            "c = kvc.allocate(kvc.plan_cache([kvc.CacheSpec('k', 32, 1, 2)], 4, 16), fill=0)\n"
            "tiny = torch.tensor([1e-40])\n"  # made before flushing (torch would flush it)
            "with t._flush_denormal():\n"
            "    kvc.ops.reshape_and_cache(torch.ones(2, 2, 32), c.view('k', 0), torch.tensor([0, 1]), 'fp8', tiny)\n"
            "libm = ctypes.CDLL('libm.so.6')\n"
            "libm.feenableexcept(0x01)\n"  # FE_INVALID traps from here on
            "assert t._run_ops(inp) == want\n"
            "libm.fedisableexcept(0x01)\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, KVC_CPU_ISA=isa, PYTHONPATH=os.pathsep.join(
                           [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])
