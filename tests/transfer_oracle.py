"""An independent model of a transfer, for the tests: a per-token loop over (spec, layer, head,
token) that finds each row's bytes with CachePlan.address (and the split formula of SPEC 3),
and the fewest spans those bytes allow, counted byte by byte."""
from __future__ import annotations

import torch

import kvcache_ext as kvc


def _row_pieces(plan: kvc.CachePlan, name: str, layer: int, block: int, pos: int,
                head: int) -> list[tuple[int, int, int]]:
    """(address, byte of the row, length) of the row of (spec, layer, block, pos, head)."""
    spec = plan.spec(name)
    slot = block * plan.block_size + pos
    if spec.split is None:
        return [(plan.address(name, layer, slot, head, 0), 0, spec.row_bytes)]
    a, b, n = *spec.split, plan.block_size
    page = plan.address(name, layer, block * n, head, 0)  # token 0 of the head's page
    second = (page + n * a + pos * b, a, b)
    e = spec.channel_major
    if e is None:
        return [(page + pos * a, 0, a), second]
    # channel-major first part: element c of token pos at (c x n + pos) x e
    return [(page + (c * n + pos) * e, c * e, e) for c in range(a // e)] + [second]


def moved_rows(src_plan, dst_plan, specs, layers, heads, token_pairs):
    """[(src_addr, dst_addr, length)] for every moved row piece. token_pairs: [(src_block,
    src_pos, dst_block, dst_pos)]."""
    rows = []
    for name in specs:
        s_spec = src_plan.spec(name)
        sl0, dl0, nl = layers.get(name, (0, 0, s_spec.num_layers))
        sh0, dh0, nh = heads.get(name, (0, 0, s_spec.num_heads))
        for i in range(nl):
            for j in range(nh):
                for sb, sp, db, dp in token_pairs:
                    src = _row_pieces(src_plan, name, sl0 + i, sb, sp, sh0 + j)
                    dst = _row_pieces(dst_plan, name, dl0 + i, db, dp, dh0 + j)
                    for (sa, sbyte, n), (da, dbyte, m) in zip(src, dst):
                        assert sbyte == dbyte and n == m
                        rows.append((sa, da, n))
    return rows


def token_pairs_of_blocks(pairs: list[tuple[int, int]], block_size: int):
    return [(s, n, d, n) for s, d in pairs for n in range(block_size)]


def token_pairs_of_tables(src_table, dst_table, num_tokens, src_start, dst_start, ns, nd):
    out = []
    for i in range(num_tokens):
        sp, dp = src_start + i, dst_start + i
        out.append((int(src_table[sp // ns]), sp % ns, int(dst_table[dp // nd]), dp % nd))
    return out


def expected_dst(src_buf: torch.Tensor, dst_buf: torch.Tensor, rows) -> torch.Tensor:
    out = dst_buf.clone()
    for s, d, n in rows:
        out[d:d + n] = src_buf[s:s + n]
    return out


def min_spans(rows) -> int:
    """The fewest spans that move these bytes: sort every moved byte by its source address and
    count where the source or the destination stops continuing (sources are distinct here)."""
    if not rows:
        return 0
    src = torch.cat([torch.arange(s, s + n) for s, d, n in rows])
    dst = torch.cat([torch.arange(d, d + n) for s, d, n in rows])
    order = torch.argsort(src)
    src, dst = src[order], dst[order]
    assert bool((src[1:] != src[:-1]).all()), "the oracle's count needs distinct source bytes"
    breaks = (src[1:] != src[:-1] + 1) | (dst[1:] != dst[:-1] + 1)
    return int(breaks.sum()) + 1


def min_spans_rows(rows) -> int:
    """The same count from row pieces (faster, for larger requests): sort the pieces by source
    and count the pieces that do not continue the previous one in both buffers."""
    rows = sorted(rows)
    count, prev = 0, None
    for s, d, n in rows:
        if prev is None or s != prev[0] + prev[2] or d != prev[1] + prev[2]:
            count += 1
        prev = (s, d, n)
    return count
