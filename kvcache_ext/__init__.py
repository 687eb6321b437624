"""kvcache_ext: a paged KV cache in one flat uint8 buffer, six layouts, fused cache kernels.

`kvcache_ext.nixl` (moving caches between processes with NIXL) is imported on first use of
`kvc.nixl` or by `import kvcache_ext.nixl`; `import kvcache_ext` alone never imports nixl.
"""
from . import capacity, ops, ops_v4, presets, reference
from .cache import KVCache, allocate
from .groups import CacheGroup, GroupPlan
from .layout import (DEFAULT_LAYOUT, LAYOUTS, CachePlan, CacheSpec, KVCacheTensor, layout_order,
                     plan_cache, slot_mapping)
from .ops import check_slot_mapping
from .transfer import CopyStats, block_spans, check_spans, copy_blocks, copy_spans
from .transfer_groups import GroupTransferPlan
from .transfer_plan import TransferPlan, merge_spans

__all__ = [
    "DEFAULT_LAYOUT", "LAYOUTS", "CacheGroup", "CachePlan", "CacheSpec", "CopyStats", "GroupPlan",
    "GroupTransferPlan",
    "KVCache", "KVCacheTensor",
    "TransferPlan", "allocate", "block_spans", "capacity", "check_slot_mapping", "check_spans",
    "copy_blocks", "copy_spans", "layout_order", "merge_spans", "ops", "ops_v4", "plan_cache", "presets",
    "reference", "slot_mapping",
]


def __getattr__(name: str):
    if name == "nixl":  # lazy: importing nixl starts UCX, which `import kvcache_ext` never does
        import importlib
        return importlib.import_module(".nixl", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
