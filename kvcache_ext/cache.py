"""The flat cache buffer and the per-layer views handed to kernels."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import CachePlan


@dataclass
class KVCache:
    plan: CachePlan
    buffer: torch.Tensor  # 1-D uint8, plan.total_bytes long

    def view(self, name: str, layer: int) -> torch.Tensor:
        """uint8 [num_blocks, H, block_size, C] strided view of one layer of one spec."""
        return self.plan.view(self.buffer, name, layer)

    def views(self, name: str) -> list[torch.Tensor]:
        return [self.view(name, i) for i in range(self.plan.spec(name).num_layers)]


def allocate(plan: CachePlan, device: str | torch.device = "cpu", pin_memory: bool = False,
             fill: int | None = None) -> KVCache:
    """Allocate the one flat buffer of `plan` (uninitialised unless `fill` is given)."""
    device = torch.device(device)
    if pin_memory and device.type != "cpu":
        raise ValueError(f"pin_memory=True needs device='cpu', got device={device}")
    buffer = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device,
                         pin_memory=pin_memory)
    if fill is not None:
        buffer.fill_(fill)
    return KVCache(plan=plan, buffer=buffer)
