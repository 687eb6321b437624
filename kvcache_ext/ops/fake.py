"""Fake (meta) implementations of the ops, for torch.compile, FakeTensor and CUDA-graph tracing.

Every op writes into tensors it is given and returns nothing, so a fake only checks what can
be checked without data: that every tensor sits on the view's device. Registered in Python
because fakes must accept symbolic shapes.
"""
from __future__ import annotations

import torch

# Tensors that must sit on the anchor's device. A per-tensor fp8 `scale` may also be a CPU
# tensor (its value is then passed to the kernel), so it is not listed.
_DEVICE_ARGS = {
    "reshape_and_cache": ("view", ("key", "slot_mapping")),
    "reshape_and_cache_kv": ("k_view", ("key", "value", "v_view", "slot_mapping")),
    "concat_and_cache_mla": ("view", ("kv_c", "k_pe", "slot_mapping")),
    "indexer_k_quant_and_cache": ("view", ("k", "slot_mapping")),
    "dsa_write": ("mla_view", ("kv_c", "k_pe", "k_idx", "indexer_view", "slot_mapping")),
    "gather_mla": ("view", ("block_table", "cu_seq_lens", "seq_starts", "out")),
    "gather_mla_slots": ("view", ("slots", "out")),
    "gather_kv": ("view", ("block_table", "cu_seq_lens", "seq_starts", "out")),
    "gather_kv_slots": ("view", ("slots", "out")),
    "gather_indexer": ("view", ("block_table", "cu_seq_lens", "seq_starts", "codes", "scales")),
    "gather_indexer_slots": ("view", ("slots", "codes", "scales")),
    "v4_quant_and_cache": ("view", ("x", "slot_mapping")),
    "v4_dsa_write": ("mla_view", ("kv", "k_idx", "indexer_view", "slot_mapping")),
    "gather_v4": ("view", ("block_table", "cu_seq_lens", "seq_starts", "out")),
    "gather_v4_slots": ("view", ("slots", "out")),
    "gather_v4_window": ("c_view", ("c_block_table", "swa_view", "swa_block_table", "seq_lens",
                                    "cu_out", "out")),
}


def _make_fake(op: str, anchor: str, others: tuple[str, ...]):
    schema = getattr(torch.ops.kvcache_ext, op).default._schema
    names = [a.name for a in schema.arguments]

    def fake(*args, **kwargs) -> None:
        bound = dict(zip(names, args)) | kwargs
        device = bound[anchor].device
        for name in others:
            t = bound.get(name)
            if isinstance(t, torch.Tensor) and t.device != device:
                raise ValueError(f"{name} must be on the device of {anchor} ({device}), "
                                 f"got {t.device}")

    return fake


def _copy_spans_fake(src: torch.Tensor, dst: torch.Tensor, spans: torch.Tensor) -> None:
    if spans.device.type != "cpu":
        raise ValueError(f"spans must be a CPU tensor, got {spans.device}")


def register() -> None:
    for op, (anchor, others) in _DEVICE_ARGS.items():
        torch.library.register_fake(f"kvcache_ext::{op}")(_make_fake(op, anchor, others))
    torch.library.register_fake("kvcache_ext::copy_spans")(_copy_spans_fake)
