"""Debug checks of op arguments that the CUDA kernels cannot make without a host synchronisation."""
from __future__ import annotations

import torch


def check_slot_mapping(slot_mapping: torch.Tensor, view: torch.Tensor) -> None:
    """Debug check of a write's slots on any device (CUDA writes cannot check without a host
    synchronisation): every slot < num_blocks x block_size of `view`, and no two tokens share
    a slot (negative slots are padding). Raises IndexError / ValueError naming the token."""
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dtype != torch.int64:
        raise TypeError("slot_mapping must be an int64 tensor")
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be 1-D [T], got shape {tuple(slot_mapping.shape)}")
    if view.dim() != 4:
        raise ValueError(f"view must be 4-D [num_blocks, H, block_size, C], got {tuple(view.shape)}")
    num_slots = view.shape[0] * view.shape[2]
    over = torch.nonzero(slot_mapping >= num_slots)
    if over.numel():
        t = int(over[0])
        raise IndexError(f"slot_mapping[{t}] = {int(slot_mapping[t])} is outside [-inf, "
                         f"num_blocks x block_size = {num_slots})")
    real = torch.nonzero(slot_mapping >= 0).squeeze(1)
    values, order = torch.sort(slot_mapping[real], stable=True)
    same = torch.nonzero(values[1:] == values[:-1]).squeeze(1)
    if same.numel():
        i = int(same[0])
        first, second = sorted((int(real[order[i]]), int(real[order[i + 1]])))
        raise ValueError(f"slot_mapping[{first}] and slot_mapping[{second}] are both slot "
                         f"{int(values[i])}: two tokens of one call must not share a slot")
