"""Which rows of a grouped (hybrid) cache a prompt's read moves, from vLLM's per-group block
lists: every group's rows of the tokens the consumer lacks; in a sliding-window group (SWA,
compressor states) the rows of the blocks vLLM keeps -- whole blocks, from the first that is
not vLLM's null block 0, as its SlidingWindowManager keeps them: the consumer recomputes the
prompt's last token, whose window reaches one token past the window vLLM keeps for the next.
A kept block that is null on either side is refused: nothing is written to block 0."""
from __future__ import annotations

from typing import Sequence

import torch

from ..plan import GroupPlan
from ..transfer import GroupTransferPlan

NULL_BLOCK = 0  # vLLM's BlockPool.null_block: a window group's blocks before its window


def group_tables(plan: GroupPlan, names: Sequence[str], src: Sequence[Sequence[int]],
                 dst: Sequence[Sequence[int]], num_tokens: int) -> tuple[dict, dict]:
    """({group: (src table, dst table)}, {windowed group: first token kept}) for a request of
    num_tokens tokens; ValueError when the lists do not fit the plan's groups."""
    if len(src) != len(names) or len(dst) != len(names):
        raise ValueError(f"{len(src)} producer and {len(dst)} local block lists for a cache of "
                         f"{len(names)} KV-cache groups")
    tables, firsts = {}, {}
    for name, s, d in zip(names, src, dst):
        g = plan.group(name)
        used = -(-num_tokens // g.block_size)  # blocks the request's tokens span
        if len(s) < used or len(d) < used:
            raise ValueError(f"group {name}: {num_tokens} tokens span {used} blocks of "
                             f"{g.block_size}; the producer lists {len(s)}, the consumer "
                             f"{len(d)}")
        first = 0
        if g.window is not None:
            first = next((i for i in range(used) if d[i] != NULL_BLOCK), used)
            firsts[name] = first * g.block_size
        hole = next((i for i in range(first, used) if NULL_BLOCK in (s[i], d[i])), None)
        if hole is not None:
            side = "producer" if s[hole] == NULL_BLOCK else "consumer"
            raise ValueError(f"group {name}: block {hole} of the request is vLLM's null block "
                             f"on the {side}, among the blocks the consumer keeps")
        tables[name] = (torch.tensor(list(s), dtype=torch.int64),
                        torch.tensor(list(d), dtype=torch.int64))
    return tables, firsts


def group_spans(src_plan: GroupPlan, dst_plan: GroupPlan, tables: dict, firsts: dict,
                num_tokens: int, start: int, spec: str | None = None) -> torch.Tensor:
    """The read's spans [S, 3]: every group's rows of tokens start .. num_tokens (only those
    of `spec`, a spec name, when given: tests corrupt one spec's rows at a time)."""
    if spec is None:
        return GroupTransferPlan(src_plan, dst_plan).token_spans(tables, num_tokens, start,
                                                                 firsts)
    group = dst_plan.group(spec).name
    xp = GroupTransferPlan(src_plan, dst_plan, [group])
    xp.moves[group] = [m for m in xp.moves[group] if m[0] == spec]
    return xp.token_spans({group: tables[group]}, num_tokens, start,
                          {k: v for k, v in firsts.items() if k == group})
