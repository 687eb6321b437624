"""Loads the compiled library, which registers the ops under torch.ops.kvcache_ext."""
from __future__ import annotations

import torch  # noqa: F401  (the library links against torch's shared libraries)

from .. import _C  # noqa: F401
from . import fake

fake.register()
ops = torch.ops.kvcache_ext


def cpu_isa() -> str:
    """The row loops the CPU kernels run: "scalar", "avx2", "avx512" or "avx512+bf16" (the widest
    this CPU has, capped by the environment variable KVC_CPU_ISA when the library loads)."""
    return _C.cpu_isa()


def has_cuda_kernels() -> bool:
    """True when the library was built with its CUDA kernels."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("kvcache_ext::gather_mla", "CUDA")
