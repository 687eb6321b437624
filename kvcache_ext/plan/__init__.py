"""Layer 1, plan math: cache specs, the six layouts, cache groups, slot math, capacity, model
presets and plans as data. Pure Python ints and torch index arithmetic; nothing here touches a
cache buffer or a kernel."""
from . import capacity, presets
from .groups import CacheGroup, GroupPlan, plan_groups
from .layout import DEFAULT_LAYOUT, LAYOUTS, CachePlan, layout_order, plan_specs
from .planner import plan_cache
from .serial import plan_from_dict, plan_to_dict
from .slots import slot_mapping
from .spec import BlockPage, CacheSpec, KVCacheTensor, SpecLookup, split_address

__all__ = ["DEFAULT_LAYOUT", "LAYOUTS", "BlockPage", "CacheGroup", "CachePlan", "CacheSpec",
           "GroupPlan", "KVCacheTensor", "SpecLookup", "capacity", "layout_order", "plan_cache",
           "plan_from_dict", "plan_groups", "plan_specs", "plan_to_dict", "presets",
           "slot_mapping", "split_address"]
