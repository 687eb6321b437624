"""Layer 5, moving cache bytes between plans in one process: span lists (spans.py), the planners
that make them (TransferPlan between CachePlans, GroupTransferPlan between group plans,
plan_transfer for either) and their execution by the copy_spans and copy_runs ops (copy.py)."""
from .copy import CopyStats, block_spans, copy_blocks, copy_runs, copy_spans
from .dispatch import plan_transfer
from .groups import GroupTransferPlan
from .plan import TransferPlan
from .spans import (as_runs, as_spans, check_runs, check_spans, merge_spans, runs_of_spans,
                    spans_of_runs)

__all__ = ["CopyStats", "GroupTransferPlan", "TransferPlan", "as_runs", "as_spans", "block_spans",
           "check_runs", "check_spans", "copy_blocks", "copy_runs",
           "copy_spans", "merge_spans",
           "plan_transfer", "runs_of_spans", "spans_of_runs"]
