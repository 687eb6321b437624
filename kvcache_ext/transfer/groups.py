"""Transfers between plans made of cache groups (SPEC 10 plans, plan_cache(groups=...)).

Every group has its own block tables, so a transfer takes one block table pair (or one list of
block pairs) per group. Every spec of a group moves in its own row space: a spec with
compress_ratio r in a group of block size B holds B / r rows per block, and a request of T
tokens has rows 0 .. T // r - 1 (row k is written by token k·r + r - 1, SPEC 10). A windowed
group (CacheGroup.window = w: SWA, compressor states) moves only the rows of its last w tokens,
so only the blocks that hold live rows appear in the spans.

The span math is TransferPlan's, applied to one-spec plans in row space: token_spans merges
the spans of every spec and group once more at the end; token_runs plans every move's runs in
compiled code into one table (no merge: the moves' bytes are disjoint).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import torch

from ..plan import CachePlan, GroupPlan
from .checks import check_counts
from .plan import RESERVE_BYTES, TransferPlan
from .scratch import TablePool
from .spans import merge_spans, runs_of_spans


def _row_plan(plan: GroupPlan, name: str) -> CachePlan:
    """Spec `name` of a group plan as a one-spec CachePlan whose "tokens" are the spec's rows."""
    s = plan.spec(name)
    return CachePlan(specs=(replace(s, compress_ratio=1, page_align=1),),
                     num_blocks=plan.num_blocks, block_size=plan.rows_per_block(name),
                     layout=plan.layout, tensors={name: plan.tensor(name)},
                     total_bytes=plan.total_bytes)


class GroupTransferPlan:
    """Spans moving the groups `groups` (default: every group of dst_plan) between two group
    plans. Each moved group must be in both plans with the same specs (names, row_bytes, split,
    compress_ratio, layers, heads); layouts, numbers of blocks, packings and block sizes may
    differ (token_spans; block_spans needs equal block sizes)."""

    def __init__(self, src_plan: GroupPlan, dst_plan: GroupPlan, groups=None) -> None:
        for arg, p in (("src_plan", src_plan), ("dst_plan", dst_plan)):
            if not isinstance(p, GroupPlan):
                raise TypeError(f"{arg} must be a GroupPlan (plan_cache(groups=...)), got "
                                f"{type(p).__name__}; use TransferPlan for CachePlans")
        if groups is None:
            names = [g.name for g in dst_plan.groups]
        else:  # one name, or names (as TransferPlan's specs=); none moves nothing
            names = [groups] if isinstance(groups, str) else list(groups)
            if len(set(names)) != len(names):
                raise ValueError(f"groups must name each group once, got {names}")
        self.src_plan, self.dst_plan = src_plan, dst_plan
        self.moves: dict[str, list[tuple[str, int, TransferPlan]]] = {}
        src_groups = {g.name: g for g in src_plan.groups}
        for gname in names:
            d = next((g for g in dst_plan.groups if g.name == gname), None)
            if d is None or gname not in src_groups:
                side = "dst_plan" if d is None else "src_plan"
                raise ValueError(f"group {gname!r} is not in {side}")
            s = src_groups[gname]
            if s.window != d.window:  # a window decides which rows are live: both must agree
                raise ValueError(f"group {gname!r} keeps the last {s.window} tokens in src_plan "
                                 f"and the last {d.window} in dst_plan")
            for field in ("name", "row_bytes", "split", "channel_major", "compress_ratio",
                          "num_layers", "num_heads"):
                sv, dv = ([getattr(x, field) for x in g.specs] for g in (s, d))
                if sv != dv:
                    raise ValueError(f"group {gname!r} differs in its specs' {field}: {sv} in "
                                     f"src_plan, {dv} in dst_plan")
            self.moves[gname] = [
                (sp.name, sp.compress_ratio,
                 TransferPlan(_row_plan(src_plan, sp.name), _row_plan(dst_plan, sp.name)))
                for sp in d.specs]
        # token_runs' tables: memory one request returns, the next one reuses
        self.tables = TablePool()

    def live_rows(self, group: str, spec_ratio: int, num_tokens: int, start: int = 0,
                  first: int | None = None) -> tuple[int, int]:
        """[first, end) rows of a spec with `spec_ratio` that a request of `num_tokens` tokens
        holds in `group` (a windowed group: only the rows of its last `window` tokens, or from
        token `first` when given), past the rows its first `start` tokens wrote (row k is
        written by token k·r + r - 1)."""
        g = self.dst_plan.group(group)
        if first is None:
            first = 0 if g.window is None else max(num_tokens - g.window, 0)
        return max(first, start) // spec_ratio, num_tokens // spec_ratio

    def _live(self, block_tables: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
              num_tokens: int, start: int, firsts: Mapping[str, int] | None) -> list[tuple]:
        """(group, row plan pair, src table, dst table, first row, end row) of every move that
        has rows to move, after checking the arguments (each error names one)."""
        missing = sorted(set(self.moves) - set(block_tables))
        if missing:
            raise ValueError(f"block_tables has no (src, dst) tables for groups {missing}")
        unknown = sorted(set(block_tables) - set(self.moves))
        if unknown:
            raise ValueError(f"block_tables names groups that are not moved: {unknown} "
                             f"(moved: {list(self.moves)})")
        check_counts(num_tokens=num_tokens)
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= num_tokens:
            raise ValueError(f"start must be an int in [0, num_tokens = {num_tokens}], got "
                             f"{start!r}")
        firsts = dict(firsts or {})
        unknown = sorted(set(firsts) - set(self.moves))
        if unknown:
            raise ValueError(f"firsts names groups that are not moved: {unknown}")
        for g, v in firsts.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"firsts[{g!r}] must be an int >= 0 (a token), got {v!r}")
        live = []
        for gname, moves in self.moves.items():
            pair = block_tables[gname]
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"block_tables[{gname!r}] must be a (src_block_table, "
                                f"dst_block_table) pair, got {type(pair).__name__}")
            src_table, dst_table = pair
            for i, (side, t, plan) in enumerate((("src", src_table, self.src_plan),
                                                 ("dst", dst_table, self.dst_plan))):
                bs = plan.group(gname).block_size
                used = -(-num_tokens // bs)
                if isinstance(t, torch.Tensor) and t.dim() == 1 and t.numel() < used:
                    raise IndexError(f"block_tables[{gname!r}][{i}] ({side}) has {t.numel()} "
                                     f"entries, but {num_tokens} tokens span {used} blocks of "
                                     f"{bs}")
            for _, ratio, xp in moves:
                first, end = self.live_rows(gname, ratio, num_tokens, start, firsts.get(gname))
                if end > first:
                    live.append((gname, xp, src_table, dst_table, first, end))
        return live

    def token_spans(self, block_tables: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                    num_tokens: int, start: int = 0,
                    firsts: Mapping[str, int] | None = None) -> torch.Tensor:
        """int64 [S, 3] moving a request of `num_tokens` tokens: block_tables[group] =
        (src_block_table, dst_block_table), int32 [M] in that group's block size. start: the
        tokens the destination already holds (a prefix hit): only the rows past them move.
        firsts[group]: the first token a windowed group holds, in place of its window rule
        (an engine that keeps whole blocks: the first token of the first block it keeps)."""
        return _merge([xp.token_spans(s, d, end - first, first, first)
                       for _, xp, s, d, first, end in self._live(block_tables, num_tokens, start,
                                                                 firsts)])

    def reserve_runs(self, num_tokens: int) -> None:
        """Fault in now the runs table token_runs of a request of up to num_tokens tokens needs
        (a windowed group's rows: its window's and one block's more), at most RESERVE_BYTES, and
        run the planner once (its first call's costs): what a consumer calls once per producer,
        so its first request plans as fast as the next. A longer request's table is a fresh
        one, faulted in as it is written."""
        check_counts(num_tokens=num_tokens)
        bound = 0
        for gname, moves in self.moves.items():
            g = self.dst_plan.group(gname)
            tokens = num_tokens if g.window is None else min(num_tokens, g.window + g.block_size)
            bound += sum(xp._runs_bound(-(-tokens // ratio)) for _, ratio, xp in moves
                         if tokens >= ratio)
        if bound:
            self.tables.reserve(min(bound * 48, RESERVE_BYTES))
            next(xp for ms in self.moves.values() for _, _, xp in ms).reserve_runs(1)

    def block_spans(self, block_pairs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """int64 [S, 3] moving whole blocks: block_pairs[group] = int64 [M, 2] (src, dst) blocks
        of that group (its block size must be equal on both sides)."""
        unknown = sorted(set(block_pairs) - set(self.moves))
        if unknown:
            raise ValueError(f"block_pairs names groups that are not moved: {unknown}")
        for g in block_pairs:
            sb, db = self.src_plan.group(g).block_size, self.dst_plan.group(g).block_size
            if sb != db:
                raise ValueError(f"block_pairs[{g!r}]: whole blocks move only between equal block "
                                 f"sizes, group {g!r} has {sb} tokens per block in src_plan and "
                                 f"{db} in dst_plan: move tokens with GroupTransferPlan.token_spans("
                                 f"{{{g!r}: (src_block_table, dst_block_table)}}, num_tokens)")
        return _merge([xp.block_spans(pairs, f"block_pairs[{g!r}]")
                       for g, pairs in block_pairs.items() for _, _, xp in self.moves[g]])

    def token_runs(self, block_tables: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                   num_tokens: int, start: int = 0,
                   firsts: Mapping[str, int] | None = None) -> torch.Tensor:
        """The bytes of token_spans as strided runs, int64 [R, 6], planned in compiled code:
        each move's rows by its row plan pair's planner (TransferPlan.plan_into), one after
        another in one table lent by self.tables (memory an earlier request touched);
        merge_spans(spans_of_runs(runs)) == token_spans(...). What a consumer calls per
        request, with this plan kept per producer (Endpoint.transfer_plan)."""
        live = self._live(block_tables, num_tokens, start, firsts)
        bounds = [xp._runs_bound(end - first, first, first) for _, xp, _, _, first, end in live]
        runs = self.tables.int64(sum(bounds), 6)
        n = 0  # rows written; each move writes at most its bound, so the next one's fits
        for (g, xp, s, d, first, end), b in zip(live, bounds):
            try:
                n += xp.plan_into(runs[n:n + b], s, d, end - first, first, first)
            except (IndexError, TypeError, ValueError) as e:  # the op names a table, not whose
                raise type(e)(f"block_tables[{g!r}]: {e}") from e
        return runs[:n]

    def block_runs(self, block_pairs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """block_spans as strided runs, int64 [R, 6]."""
        return runs_of_spans(self.block_spans(block_pairs))


def _merge(parts: list[torch.Tensor]) -> torch.Tensor:
    if not parts:
        return torch.zeros(0, 3, dtype=torch.int64)
    spans = torch.cat(parts)
    return merge_spans(spans[:, 0], spans[:, 1], spans[:, 2])
