"""Transfer plans: the (src_offset, dst_offset, length) spans that move a request between two
cache plans (SPEC 8).

Both plans enumerate the same logical bytes -- (spec, layer, token, head, bytes of the row) --
through their own strides. The planner cuts those bytes into pieces that are contiguous in both
buffers ("atoms"), sorts them by source offset and merges every piece that continues the
previous one in both buffers. The merge is exact: two pieces stay apart only where the source
or the destination jumps, so the spans are the fewest the two plans allow.

Atoms, per spec, for one chunk of tokens that lies inside one block on both sides:
- a split spec (split=(a, b)), per moved head: two pieces, the chunk's first-part bytes and its
  second-part bytes (each contiguous: the token stride of a part is a, resp. b); when the first
  part is channel-major (channel_major = e), one piece per channel of it instead (channel c of
  the chunk's rows: e bytes per row, contiguous);
- heads stored next to each other on both sides (head_stride == C, or one moved head): one
  row of count x C bytes per token; consecutive tokens continue when both token strides equal
  that row, then the chunk is one piece;
- else one piece per head, of C bytes per token, or of the whole chunk when both token
  strides are C.
token_spans is int64 torch arithmetic over [layers, heads, chunks] grids (no per-token loop):
the readable statement of the rule, which the tests hold the compiled planner to. token_runs is
that planner (csrc/ops/plan_runs.cpp): the same bytes as strided runs, from a table of the spec
moves computed once per pair of plans (`move_table`) and the two block tables, in one pass with
no list of pieces -- what a transfer of many requests between two engines calls per request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..plan import CachePlan
from ..ops.library import ops as _ops
from .checks import check_counts, check_pairs, check_table, table_form
from .scratch import TablePool
from .spans import merge_spans, runs_of_spans

Range = tuple[int, int, int]  # (src_first, dst_first, count)
RESERVE_BYTES = 64 << 20  # the most reserve_runs faults in (a 70B model's 128k prompt: GBs)


@dataclass(frozen=True)
class _Side:
    offset: int
    layer_stride: int
    block_stride: int
    head_stride: int
    token_stride: int


@dataclass(frozen=True)
class _SpecMove:
    name: str
    row_bytes: int
    split: tuple[int, int] | None
    channel_major: int | None
    layers: Range
    heads: Range
    src: _Side
    dst: _Side


_MOVE_FIELDS = 20  # csrc/ops/plan_runs.cpp's Move


def _move_row(m: _SpecMove) -> list[int]:
    a, b = m.split if m.split is not None else (-1, 0)
    return [m.row_bytes, a, b, m.channel_major or 0, *m.layers, *m.heads,
            m.src.offset, m.src.layer_stride, m.src.block_stride, m.src.head_stride,
            m.src.token_stride, m.dst.offset, m.dst.layer_stride, m.dst.block_stride,
            m.dst.head_stride, m.dst.token_stride]


def _side(plan: CachePlan, name: str) -> _Side:
    t = plan.tensor(name)
    return _Side(t.offset, t.layer_stride, t.block_stride, t.head_stride, t.token_stride)


def _range(arg: str, name: str, given: Mapping[str, object] | None, src_n: int, dst_n: int,
           what: str) -> Range:
    """(src_first, dst_first, count) of spec `name`, checked against both plans."""
    if given is None or name not in given:
        if src_n != dst_n:
            raise ValueError(f"spec {name!r} has {src_n} {what} in src_plan and {dst_n} in "
                             f"dst_plan: give {arg}={{{name!r}: (src_first, dst_first, count)}}")
        return (0, 0, src_n)
    r = given[name]
    if (not isinstance(r, (tuple, list)) or len(r) != 3
            or any(isinstance(v, bool) or not isinstance(v, int) for v in r)):
        raise ValueError(f"{arg}[{name!r}] must be (src_first, dst_first, count) ints, got {r!r}")
    s0, d0, n = (int(v) for v in r)
    if n <= 0 or s0 < 0 or d0 < 0:
        raise ValueError(f"{arg}[{name!r}] = {tuple(r)}: count must be > 0 and firsts >= 0")
    if s0 + n > src_n:
        raise ValueError(f"{arg}[{name!r}] = {tuple(r)} is outside src_plan: spec {name!r} has "
                         f"{src_n} {what} there")
    if d0 + n > dst_n:
        raise ValueError(f"{arg}[{name!r}] = {tuple(r)} is outside dst_plan: spec {name!r} has "
                         f"{dst_n} {what} there")
    return (s0, d0, n)


class TransferPlan:
    """The spans that move `specs` (their `layers` and `heads` ranges) from src_plan to dst_plan.

    specs:  names to move (default: every spec of dst_plan); each must be in both plans with
            the same row_bytes and split.
    layers: {name: (src_first, dst_first, count)}; default all layers (counts must match).
    heads:  {name: (src_first, dst_first, count)}; default all heads (counts must match).

    Plans of cache groups (plan_cache(groups=...)) move with GroupTransferPlan (one block table
    per group); kvc.plan_transfer picks the right one for any two plans.
    """

    def __init__(self, src_plan: CachePlan, dst_plan: CachePlan, specs=None,
                 layers: Mapping[str, Range] | None = None,
                 heads: Mapping[str, Range] | None = None) -> None:
        for arg, p in (("src_plan", src_plan), ("dst_plan", dst_plan)):
            if not isinstance(p, CachePlan):
                hint = (" (plans of cache groups move with kvc.GroupTransferPlan, one block "
                        "table per group; kvc.plan_transfer picks the plan class for any two "
                        "plans)" if type(p).__name__ == "GroupPlan" else "")
                raise TypeError(f"{arg} must be a CachePlan, got {type(p).__name__}{hint}")
        src_names = [s.name for s in src_plan.specs]
        dst_names = [s.name for s in dst_plan.specs]
        if specs is None:
            names = dst_names
        else:
            names = [specs] if isinstance(specs, str) else list(specs)
            if not names:
                raise ValueError("specs must name at least one spec")
            if len(set(names)) != len(names):
                raise ValueError(f"specs must not repeat a name, got {names}")
        for arg, given in (("layers", layers), ("heads", heads)):
            extra = sorted(set(given or {}) - set(names))
            if extra:
                raise ValueError(f"{arg} names specs that are not moved: {extra} (moved: {names})")
        moves = []
        for name in names:
            if name not in src_names:
                raise ValueError(f"spec {name!r} is not in src_plan (its specs: {src_names})")
            if name not in dst_names:
                raise ValueError(f"spec {name!r} is not in dst_plan (its specs: {dst_names})")
            s, d = src_plan.spec(name), dst_plan.spec(name)
            for field in ("row_bytes", "split", "channel_major"):
                if getattr(s, field) != getattr(d, field):
                    raise ValueError(f"spec {name!r} differs in {field}: {getattr(s, field)!r} in "
                                     f"src_plan, {getattr(d, field)!r} in dst_plan")
            moves.append(_SpecMove(
                name, s.row_bytes, s.split, s.channel_major,
                _range("layers", name, layers, s.num_layers, d.num_layers, "layers"),
                _range("heads", name, heads, s.num_heads, d.num_heads, "heads"),
                _side(src_plan, name), _side(dst_plan, name)))
        self.src_plan, self.dst_plan = src_plan, dst_plan
        self.moves: tuple[_SpecMove, ...] = tuple(moves)
        # what depends only on the two plans, for the compiled planner: one row per moved spec
        self.move_table = torch.tensor([_move_row(m) for m in moves], dtype=torch.int64).reshape(
            -1, _MOVE_FIELDS)
        # the runs tables of token_runs: memory one request returns, the next one reuses
        self.tables = TablePool()
        # the most pieces the planner adds per chunk of tokens (two per head of split rows)
        self._adds_per_chunk = sum(m.layers[2] * m.heads[2] * (1 if m.split is None else 2)
                                   for m in moves)

    @property
    def specs(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.moves)

    def bytes_per_token(self) -> int:
        """Bytes moved per token (every moved spec, layer and head)."""
        return sum(m.row_bytes * m.layers[2] * m.heads[2] for m in self.moves)

    # ---- public: spans ------------------------------------------------------------------------
    def block_spans(self, block_pairs: torch.Tensor, arg: str = "block_pairs") -> torch.Tensor:
        """int64 [S, 3] (src_offset, dst_offset, length) moving whole blocks: row i of
        `block_pairs` (int64 [M, 2]) copies src block [i, 0] into dst block [i, 1]. Needs equal
        block sizes (else use token_spans). Two rows with one destination raise ValueError."""
        if self.src_plan.block_size != self.dst_plan.block_size:
            raise ValueError(f"block_spans needs equal block sizes, got {self.src_plan.block_size} "
                             f"(src_plan) and {self.dst_plan.block_size} (dst_plan): use "
                             f"TransferPlan.token_spans(src_block_table, dst_block_table, "
                             f"num_tokens) for different block sizes")
        pairs = check_pairs(block_pairs, arg, self.src_plan.num_blocks, self.dst_plan.num_blocks)
        n = self.src_plan.block_size
        zeros = torch.zeros(pairs.shape[0], dtype=torch.int64)
        return self._spans(pairs[:, 0], pairs[:, 1], zeros, zeros,
                           torch.full_like(zeros, n))

    def token_spans(self, src_block_table: torch.Tensor, dst_block_table: torch.Tensor,
                    num_tokens: int, src_start: int = 0, dst_start: int = 0) -> torch.Tensor:
        """int64 [S, 3] moving tokens src_start .. src_start + num_tokens - 1 of a request (block
        table `src_block_table`, int32 [M]) to dst_start .. of `dst_block_table`. Any block
        sizes: the tokens move in runs that break at the block boundaries of either side."""
        check_counts(num_tokens=num_tokens, src_start=src_start, dst_start=dst_start)
        ns, nd = self.src_plan.block_size, self.dst_plan.block_size
        if num_tokens == 0:
            return torch.zeros(0, 3, dtype=torch.int64)
        src_table = check_table(src_block_table, "src_block_table", src_start, num_tokens, ns,
                                 self.src_plan.num_blocks)
        dst_table = check_table(dst_block_table, "dst_block_table", dst_start, num_tokens, nd,
                                 self.dst_plan.num_blocks)
        # chunk starts (token index i of the request): 0 and every block start of either side
        first_s = (-src_start) % ns
        first_d = (-dst_start) % nd
        cuts = torch.cat([torch.zeros(1, dtype=torch.int64),
                          torch.arange(first_s, max(first_s, num_tokens), ns, dtype=torch.int64),
                          torch.arange(first_d, max(first_d, num_tokens), nd, dtype=torch.int64)])
        cuts = torch.unique(cuts)  # sorted
        lens = torch.diff(cuts, append=torch.tensor([num_tokens]))
        sp, dp = cuts + src_start, cuts + dst_start
        return self._spans(src_table[sp // ns], dst_table[dp // nd], sp % ns, dp % nd, lens)

    def block_runs(self, block_pairs: torch.Tensor) -> torch.Tensor:
        """block_spans as strided runs, int64 [R, 6] (spans.py): one run per set of pieces that
        step evenly on both sides, e.g. one page per layer between block-outer plans."""
        return runs_of_spans(self.block_spans(block_pairs))

    def token_runs(self, src_block_table: torch.Tensor, dst_block_table: torch.Tensor,
                   num_tokens: int, src_start: int = 0, dst_start: int = 0) -> torch.Tensor:
        """The bytes of token_spans as strided runs, int64 [R, 6], planned in compiled code
        (csrc/ops/plan_runs.cpp) without a list of pieces: e.g. one run of the channels of a
        channel-major part per chunk of tokens. Any block sizes; the same checks as
        token_spans. merge_spans(spans_of_runs(runs)) == token_spans(...)."""
        check_counts(num_tokens=num_tokens, src_start=src_start, dst_start=dst_start)
        if num_tokens == 0:
            return torch.zeros(0, 6, dtype=torch.int64)
        # one pass, into a table of the most rows it can take, lent by self.tables: memory an
        # earlier request of this pair touched (a fresh table's first-touch page faults cost
        # more than the pass), of which the pass writes only the rows it keeps; the table goes
        # back when its last user (this view, its views) drops it
        runs = self.tables.int64(self._runs_bound(num_tokens, src_start, dst_start), 6)
        return runs[:self.plan_into(runs, src_block_table, dst_block_table, num_tokens,
                                    src_start, dst_start)]

    def plan_into(self, runs: torch.Tensor, src_block_table: torch.Tensor,
                  dst_block_table: torch.Tensor, num_tokens: int, src_start: int,
                  dst_start: int) -> int:
        """token_runs' planner writing into `runs` (int64 [R, 6], contiguous rows, R at least
        _runs_bound(num_tokens, src_start, dst_start)): the number of rows written. What a plan
        of several moves (GroupTransferPlan) plans its moves' runs into one table with."""
        sp, dp = self.src_plan, self.dst_plan
        ns, nd = sp.block_size, dp.block_size
        # the op checks the entries the tokens use (IndexError naming the entry): here only the
        # form, so a request's planning stays a few torch calls
        src_table = table_form(src_block_table, "src_block_table", src_start, num_tokens, ns)
        dst_table = table_form(dst_block_table, "dst_block_table", dst_start, num_tokens, nd)
        count = torch.zeros(1, dtype=torch.int64)
        _ops.plan_token_runs(self.move_table, src_table, dst_table, ns, nd, sp.num_blocks,
                             dp.num_blocks, num_tokens, src_start, dst_start, runs, count)
        return int(count)

    def _runs_bound(self, num_tokens: int, src_start: int | None = None,
                    dst_start: int | None = None, in_step: bool = False) -> int:
        """The most runs token_runs can give: a piece per chunk of tokens (a stretch inside one
        block on both sides: as many as the blocks each side touches, less one, or one a block
        where the block sizes and starts agree) per move, layer, head and part; merging only
        makes fewer. A start of None: whatever that start (inside a block); in_step: starts
        that agree within a block whatever they are (a packed read's)."""
        ns, nd = self.src_plan.block_size, self.dst_plan.block_size
        # the most blocks each side touches: from inside a block (its last token) when unknown
        src_blocks = -(-((ns - 1 if src_start is None else src_start % ns) + num_tokens) // ns)
        dst_blocks = -(-((nd - 1 if dst_start is None else dst_start % nd) + num_tokens) // nd)
        aligned = ns == nd and (in_step or (src_start is not None and dst_start is not None
                                            and src_start % ns == dst_start % nd))
        return (src_blocks if aligned else src_blocks + dst_blocks - 1) * self._adds_per_chunk

    def reserve_runs(self, num_tokens: int, in_step: bool = False) -> None:
        """Fault in now the table token_runs of up to num_tokens tokens needs, whatever their
        starts (in_step: see _runs_bound), and run the planner once, so the first request plans
        as fast as the next ones (its first call's costs too): what an engine calls once per
        producer. At most RESERVE_BYTES: a longer prompt's table is a fresh one, faulted in as it
        is written (about 0.25 ms a MiB on a 2-core EPYC), beside a transfer of far more bytes."""
        check_counts(num_tokens=num_tokens)
        sp, dp = self.src_plan, self.dst_plan
        ns, nd = sp.block_size, dp.block_size
        most = self._runs_bound(num_tokens, in_step=in_step) * 48 if num_tokens else 0
        if most > RESERVE_BYTES:  # the prompts whose table fits
            num_tokens = max(1, num_tokens * RESERVE_BYTES // most)
        if num_tokens == 0:
            return
        self.tables.reserve(self._runs_bound(num_tokens, in_step=in_step) * 48)
        if sp.num_blocks and dp.num_blocks:
            runs = self.tables.int64(self._runs_bound(num_tokens, 0, 0), 6)
            zeros_s = torch.zeros(-(-num_tokens // ns), dtype=torch.int64)
            zeros_d = torch.zeros(-(-num_tokens // nd), dtype=torch.int64)
            _ops.plan_token_runs(self.move_table, zeros_s, zeros_d, ns, nd, sp.num_blocks,
                                 dp.num_blocks, num_tokens, 0, 0, runs,
                                 torch.zeros(1, dtype=torch.int64))

    # ---- the span math -----------------------------------------------------------------------
    def _spans(self, sb: torch.Tensor, db: torch.Tensor, sn: torch.Tensor, dn: torch.Tensor,
               k: torch.Tensor) -> torch.Tensor:
        """Chunks: k tokens at position sn of src block sb -> position dn of dst block db."""
        if sb.numel() == 0:
            return torch.zeros(0, 3, dtype=torch.int64)
        pieces = [self._atoms(m, sb, db, sn, dn, k) for m in self.moves]
        src = torch.cat([p[0] for p in pieces])
        dst = torch.cat([p[1] for p in pieces])
        length = torch.cat([p[2] for p in pieces])
        return merge_spans(src, dst, length)

    def _atoms(self, m: _SpecMove, sb, db, sn, dn, k):
        ns, nd = self.src_plan.block_size, self.dst_plan.block_size
        (sl0, dl0, nl), (sh0, dh0, nh) = m.layers, m.heads
        s, d, c = m.src, m.dst, m.row_bytes
        li = torch.arange(nl, dtype=torch.int64)
        # [L, 1, K]: start of the chunk's page in each layer
        s_page = (s.offset + (sl0 + li) * s.layer_stride)[:, None, None] + (sb * s.block_stride)[None, None, :]
        d_page = (d.offset + (dl0 + li) * d.layer_stride)[:, None, None] + (db * d.block_stride)[None, None, :]
        kk = k[None, None, :]
        hi = torch.arange(nh, dtype=torch.int64)
        if m.split is not None:  # per moved head: the parts of the chunk's rows
            a, b = m.split
            s_pg = s_page + ((sh0 + hi) * s.head_stride)[None, :, None]  # [L, H, K]
            d_pg = d_page + ((dh0 + hi) * d.head_stride)[None, :, None]
            e = m.channel_major
            # a chunk that is one whole block on both sides holds its first part contiguous,
            # channel-major or not
            whole = (sn == 0) & (dn == 0) & (k == ns) & (k == nd) if e is not None else None
            if e is None or bool(whole.all()):
                parts = [torch.broadcast_tensors(s_pg + sn * a, d_pg + dn * a, kk * a)]
            else:  # channel c of the first part: rows sn .. sn + k at (c x rows + row) x e
                w, r = torch.nonzero(whole).squeeze(1), torch.nonzero(~whole).squeeze(1)
                ci = torch.arange(a // e, dtype=torch.int64)[None, None, None, :]
                parts = [torch.broadcast_tensors(s_pg[..., w], d_pg[..., w], kk[..., w] * a),
                         torch.broadcast_tensors(
                             s_pg[..., r, None] + (ci * ns + sn[r][None, None, :, None]) * e,
                             d_pg[..., r, None] + (ci * nd + dn[r][None, None, :, None]) * e,
                             (kk[..., r] * e)[..., None])]
            parts.append(torch.broadcast_tensors(s_pg + ns * a + sn * b, d_pg + nd * a + dn * b, kk * b))
            return tuple(torch.cat([p[i].reshape(-1) for p in parts]) for i in range(3))
        grouped = nh == 1 or (s.head_stride == c and d.head_stride == c)
        if grouped:  # the moved heads of one token are one row of nh x C bytes on both sides
            s_head = torch.tensor([sh0 * s.head_stride], dtype=torch.int64)
            d_head = torch.tensor([dh0 * d.head_stride], dtype=torch.int64)
            unit = nh * c
        else:  # one piece per head
            s_head, d_head, unit = (sh0 + hi) * s.head_stride, (dh0 + hi) * d.head_stride, c
        s_row = s_page + s_head[None, :, None] + (sn * s.token_stride)[None, None, :]
        d_row = d_page + d_head[None, :, None] + (dn * d.token_stride)[None, None, :]
        if s.token_stride == unit and d.token_stride == unit:  # tokens continue: one piece
            s_row, d_row = torch.broadcast_tensors(s_row, d_row)
            return s_row.reshape(-1), d_row.reshape(-1), (kk * unit).expand_as(s_row).reshape(-1)
        # one piece per token: expand every chunk into its k tokens
        chunk = torch.repeat_interleave(torch.arange(k.numel()), k)
        within = torch.arange(chunk.numel(), dtype=torch.int64) - torch.repeat_interleave(
            torch.cumsum(k, 0) - k, k)
        s_tok = s_row[:, :, chunk] + (within * s.token_stride)[None, None, :]
        d_tok = d_row[:, :, chunk] + (within * d.token_stride)[None, None, :]
        s_tok, d_tok = torch.broadcast_tensors(s_tok, d_tok)
        return s_tok.reshape(-1), d_tok.reshape(-1), torch.full((s_tok.numel(),), unit,
                                                                dtype=torch.int64)
