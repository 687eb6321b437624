"""Debug checks of op arguments that the CUDA kernels cannot make without a host synchronisation."""
from __future__ import annotations

import torch

from .library import ops as _ops


def check_slot_mapping(slot_mapping: torch.Tensor, view: torch.Tensor) -> None:
    """Debug check of a write's slots on any device (CUDA writes cannot check without a host
    synchronisation): every slot < num_blocks x block_size of `view`, and no two tokens share
    a slot (negative slots are padding). Raises IndexError / ValueError naming the token: the
    rules every CPU write checks (csrc/ops/host_checks.cpp), run on a host copy."""
    _ops.check_slot_mapping(slot_mapping, view)
