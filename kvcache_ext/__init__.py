"""kvcache_ext: a paged KV cache in one flat uint8 buffer, six layouts, fused cache kernels.

The package is built in layers, each importing only from the ones below it:
  _C          the compiled library (C++ / CUDA kernels and the op layer, csrc/)
  plan/       specs, layouts, cache groups, slot math, capacity, presets, plans as data
  cache/      the flat buffer and its views, the block allocator
  reference/  the pure-torch reference of every op (reference_v4: its DeepSeek-V4 part)
  ops/        the compiled library's loading, fakes and typed wrappers (ops_v4: DeepSeek-V4)
  transfer/   span lists between plans, their planners and their copies
  nixl/, hf/, models/, vllm/   integrations: NIXL, transformers, model code, vLLM
  viz/        plans as text and pictures
  cli/        python -m kvcache_ext
tests/test_layers.py walks every import and holds the package to this order.

`kvcache_ext.nixl` (moving caches between processes with NIXL) is imported on first use of
`kvc.nixl` or by `import kvcache_ext.nixl`; `import kvcache_ext` alone never imports nixl,
transformers or vllm.
"""
from . import ops, ops_v4, reference
from .cache import KVCache, allocate
from .ops import check_slot_mapping
from .plan import (DEFAULT_LAYOUT, LAYOUTS, CacheGroup, CachePlan, CacheSpec, GroupPlan,
                   KVCacheTensor, capacity, layout_order, plan_cache, presets, slot_mapping)
from .transfer import (CopyStats, GroupTransferPlan, TransferPlan, block_spans, check_runs,
                       check_spans, copy_blocks, copy_runs, copy_spans, merge_spans,
                       plan_transfer, runs_of_spans, spans_of_runs)

__all__ = [
    "DEFAULT_LAYOUT", "LAYOUTS", "CacheGroup", "CachePlan", "CacheSpec", "CopyStats", "GroupPlan",
    "GroupTransferPlan", "KVCache", "KVCacheTensor", "TransferPlan", "allocate", "block_spans",
    "capacity", "check_runs", "check_slot_mapping", "check_spans", "copy_blocks", "copy_runs",
    "copy_spans", "layout_order", "merge_spans", "ops", "ops_v4", "plan_cache", "plan_transfer",
    "presets", "reference", "runs_of_spans", "slot_mapping", "spans_of_runs",
]


def __getattr__(name: str):
    if name == "nixl":  # lazy: importing nixl starts UCX, which `import kvcache_ext` never does
        import importlib
        return importlib.import_module(".nixl", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
