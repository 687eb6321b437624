"""plan_cache: the one entry point for plans, above both kinds. Specs that share one block table
give a CachePlan (layout.plan_specs); cache groups, each with its own block size (SPEC 10), give
a GroupPlan (groups.plan_groups)."""
from __future__ import annotations

from typing import Iterable

from .groups import CacheGroup, GroupPlan, plan_groups
from .layout import DEFAULT_LAYOUT, CachePlan, plan_specs
from .spec import CacheSpec


def plan_cache(specs: Iterable[CacheSpec] | None = None, num_blocks: int | None = None,
               block_size: int | None = None, layout: str = DEFAULT_LAYOUT, *,
               groups: Iterable[CacheGroup] | None = None,
               packing: str = "overlay") -> CachePlan | GroupPlan:
    """Lay out `specs` (sharing one block table) in one flat buffer -> CachePlan.

    With `groups=[CacheGroup, ...]` instead (each group its own block size and block tables,
    SPEC 10) -> GroupPlan; `packing` ("overlay" or "stack") places the groups in a block."""
    if groups is not None:
        if specs is not None or block_size is not None:
            raise ValueError("plan_cache takes either specs and block_size or groups=, not both "
                             "(each CacheGroup has its own block_size)")
        return plan_groups(groups, num_blocks=num_blocks, layout=layout, packing=packing)
    if specs is None or block_size is None or num_blocks is None:
        raise ValueError("plan_cache needs specs, num_blocks and block_size (or groups= and "
                         "num_blocks)")
    return plan_specs(specs, num_blocks, block_size, layout)
