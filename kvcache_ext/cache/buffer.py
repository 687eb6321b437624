"""The flat cache buffer and the per-layer views handed to kernels."""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

import torch

from ..plan import CachePlan, GroupPlan


@dataclass
class KVCache:
    plan: CachePlan | GroupPlan
    buffer: torch.Tensor  # 1-D uint8, plan.total_bytes long

    def view(self, name: str, layer: int) -> torch.Tensor:
        """uint8 [num_blocks, H, block_size, C] strided view of one layer of one spec."""
        return self.plan.view(self.buffer, name, layer)

    def views(self, name: str) -> list[torch.Tensor]:
        return [self.view(name, i) for i in range(self.plan.spec(name).num_layers)]


_HUGE_PAGE = 2 << 20
_HUGE_PAGE_MIN = 4 * _HUGE_PAGE  # smaller caches take a plain allocation
_MADV_HUGEPAGE = 14  # linux/mman.h


def _huge_page_buffer(nbytes: int) -> torch.Tensor:
    """A host buffer on 2 MiB boundaries, marked for transparent huge pages before first touch
    (Linux madvise(MADV_HUGEPAGE); best effort, ignored elsewhere). Writes and reads land on
    random rows across the whole cache: with 4 KiB pages nearly every row is a TLB miss. The
    buffer is a view into a storage up to 2 MiB larger (storage_offset() > 0): views, ops and
    NIXL take data_ptr() and numel(); code that serialises the storage itself copies the slack."""
    raw = torch.empty(nbytes + _HUGE_PAGE, dtype=torch.uint8)
    start = (-raw.data_ptr()) % _HUGE_PAGE
    buffer = raw[start:start + nbytes]
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise(ctypes.c_void_p(buffer.data_ptr()),
                         ctypes.c_size_t(nbytes // _HUGE_PAGE * _HUGE_PAGE), _MADV_HUGEPAGE)
        except (OSError, AttributeError):
            pass
    return buffer


def host_buffer(nbytes: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """An uninitialised uint8 buffer of nbytes on device: on the host, from a few MiB up, on
    transparent huge pages (as allocate() makes caches) -- a NIXL read (UCX cma) of 4 KiB pages
    moved about a third fewer bytes a second (staging and pack buffers)."""
    device = torch.device(device)
    if device.type == "cpu" and nbytes >= _HUGE_PAGE_MIN:
        return _huge_page_buffer(nbytes)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def allocate(plan: CachePlan | GroupPlan, device: str | torch.device = "cpu", pin_memory: bool = False,
             fill: int | None = None) -> KVCache:
    """Allocate the one flat buffer of `plan`: uninitialised memory unless `fill` (a byte
    value) is given. pin_memory=True (CPU only, needs a GPU) makes host<->GPU copies async."""
    device = torch.device(device)
    if pin_memory and device.type != "cpu":
        raise ValueError(f"pin_memory=True needs device='cpu', got device={device}")
    if pin_memory and not torch.cuda.is_available():
        raise RuntimeError("pin_memory=True needs a CUDA GPU (page-locked memory is a CUDA "
                           "allocation), and none is available; allocate with pin_memory=False")
    if fill is not None and (isinstance(fill, bool) or not isinstance(fill, int)
                             or not 0 <= fill <= 255):
        raise ValueError(f"fill must be a byte value in [0, 255], got {fill!r}")
    try:
        if device.type == "cpu" and not pin_memory and plan.total_bytes >= _HUGE_PAGE_MIN:
            buffer = _huge_page_buffer(plan.total_bytes)
        else:
            buffer = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device,
                                 pin_memory=pin_memory)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        text = str(e).lower()
        oom = (isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in text
               or "can't allocate" in text or "cannot allocate" in text)
        err = MemoryError if oom else RuntimeError  # e.g. no driver for the device: not a size problem
        raise err(f"cannot allocate the plan's {plan.total_bytes} bytes "
                  f"({plan.total_bytes / 2**30:.2f} GiB) on {device}: {first}") from None
    if fill is not None:
        buffer.fill_(fill)
    return KVCache(plan=plan, buffer=buffer)
