"""Fake (meta) implementations of the ops, for torch.compile, FakeTensor and CUDA-graph tracing.

Every op writes into tensors it is given and returns nothing, so a fake only checks what can
be checked without data: the op's device rules (devices.py, from csrc/ops/op_list.h). Registered
in Python because fakes must accept symbolic shapes; one per op of the list.
"""
from __future__ import annotations

import torch

from . import devices


def _make_fake(op: str):
    names = [a.name for a in getattr(torch.ops.kvcache_ext, op).default._schema.arguments]

    def fake(*args, **kwargs) -> None:
        devices.check(op, dict(zip(names, args)) | kwargs)

    return fake


def register() -> None:
    for op in devices.RULES:
        torch.library.register_fake(f"kvcache_ext::{op}")(_make_fake(op))
