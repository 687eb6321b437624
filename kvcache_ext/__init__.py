"""kvcache_ext: a paged KV cache in one flat uint8 buffer, six layouts, fused cache kernels."""
from . import capacity, ops, presets, reference
from .cache import KVCache, allocate
from .layout import (DEFAULT_LAYOUT, LAYOUTS, CachePlan, CacheSpec, KVCacheTensor, layout_order,
                     plan_cache, slot_mapping)
from .ops import check_slot_mapping
from .transfer import CopyStats, block_spans, copy_blocks

__all__ = [
    "DEFAULT_LAYOUT", "LAYOUTS", "CachePlan", "CacheSpec", "CopyStats", "KVCache", "KVCacheTensor",
    "allocate", "block_spans", "capacity", "check_slot_mapping", "copy_blocks", "layout_order", "ops", "plan_cache", "presets",
    "reference", "slot_mapping",
]
