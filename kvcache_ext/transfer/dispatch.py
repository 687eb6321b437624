"""plan_transfer: the one entry point for transfer plans, above both kinds (as plan_cache is for
cache plans): two CachePlans move with a TransferPlan, two GroupPlans with a GroupTransferPlan."""
from __future__ import annotations

from typing import Mapping

from ..plan import CachePlan, GroupPlan
from .groups import GroupTransferPlan
from .plan import Range, TransferPlan


def plan_transfer(src_plan: CachePlan | GroupPlan, dst_plan: CachePlan | GroupPlan, specs=None,
                  layers: Mapping[str, Range] | None = None,
                  heads: Mapping[str, Range] | None = None) -> TransferPlan | GroupTransferPlan:
    """The spans' planner for any two plans of one kind. specs= names what moves: specs of
    CachePlans (with their layers= and heads= ranges), groups of GroupPlans."""
    if isinstance(src_plan, GroupPlan) and isinstance(dst_plan, GroupPlan):
        if layers or heads:
            raise ValueError("layers= and heads= apply to CachePlans; group plans move whole "
                             "groups (specs= names the groups)")
        return GroupTransferPlan(src_plan, dst_plan, groups=specs)
    return TransferPlan(src_plan, dst_plan, specs=specs, layers=layers, heads=heads)
