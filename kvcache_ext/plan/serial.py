"""Plans as JSON-able data (a peer's metadata carries its plan: kvcache_ext.nixl)."""
from __future__ import annotations

from .groups import CacheGroup, GroupPlan
from .layout import CachePlan
from .planner import plan_cache
from .spec import CacheSpec


def _spec_to_dict(s: CacheSpec) -> dict:
    return {"name": s.name, "row_bytes": s.row_bytes, "num_layers": s.num_layers,
            "num_heads": s.num_heads, "split": list(s.split) if s.split else None,
            "compress_ratio": s.compress_ratio, "page_align": s.page_align,
            "channel_major": s.channel_major}


def _spec_from_dict(s: dict) -> CacheSpec:
    return CacheSpec(s["name"], s["row_bytes"], s["num_layers"], s["num_heads"],
                     split=tuple(s["split"]) if s["split"] else None,
                     compress_ratio=s.get("compress_ratio", 1), page_align=s.get("page_align", 1),
                     channel_major=s.get("channel_major"))


def plan_to_dict(plan: CachePlan | GroupPlan) -> dict:
    """A plan as JSON-able data; a group plan keeps each group's block size and window (a peer
    needs them to address its per-group block tables)."""
    if isinstance(plan, GroupPlan):
        return {"groups": [{"name": g.name, "block_size": g.block_size, "window": g.window,
                            "specs": [_spec_to_dict(s) for s in g.specs]} for g in plan.groups],
                "num_blocks": plan.num_blocks, "layout": plan.layout, "packing": plan.packing}
    return {"specs": [_spec_to_dict(s) for s in plan.specs],
            "num_blocks": plan.num_blocks, "block_size": plan.block_size, "layout": plan.layout}


def plan_from_dict(d: dict) -> CachePlan | GroupPlan:
    if "groups" in d:
        groups = [CacheGroup(g["name"], tuple(_spec_from_dict(s) for s in g["specs"]),
                             g["block_size"], g["window"]) for g in d["groups"]]
        return plan_cache(groups=groups, num_blocks=d["num_blocks"], layout=d["layout"],
                          packing=d["packing"])
    return plan_cache([_spec_from_dict(s) for s in d["specs"]], d["num_blocks"], d["block_size"],
                      d["layout"])
