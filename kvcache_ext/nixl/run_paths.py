"""The paths a transfer given strided runs [R, 6] takes (a TransferPlan's token_runs; paths.py
has those of span lists): "strided" posts the runs as they are (one NIXL index per piece),
"plain" and "prepared" their pieces as spans, and "staged" (reads) does what this module is for.

A staged read of runs: the peer's bytes the runs read,
merged into extents, read into a registered staging buffer with one descriptor per extent, then
re-tiled into the cache by one copy_runs per part (csrc/ops/copy.cpp: one parallel loop over
the runs' pieces) on the unpack thread while the next part is read. What a block-size change
between channel-major pages needs: its pieces are short (a channel's tokens of one block), but
they lie side by side in the peer's buffer, so the read is a few large descriptors and the
regroup one pass over the staged bytes.

Parts are cut only where no run's source bytes straddle the cut (a run is unpacked whole, from
one part), at about STAGE_PART_BYTES; a run whose source pieces lie more than STAGE_GAP_BYTES
apart (one step per layer, say) is staged piece by piece, so no gap is read for it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..ops.library import ops as _ops
from .handle import Part
from ..transfer.pack import pieces_of
from . import paths
from .paths import AUTO_MIN_SPANS, DESC_S, READ_BYTES_PER_S, _lap

# Re-tiling staged bytes (copy_runs, beside the next part's read): about 1 / 6 GB/s, plus a few
# ns per piece (benchmarks/results/regroup_cpu.md); posting a piece costs DESC_S.
REGROUP_BYTES_PER_S = 6e9
REGROUP_PIECE_S = 2e-8


@dataclass
class RunStage:
    """Runs sorted by their first source byte, each with its place in the staging stream (the
    extents laid end to end) and its part."""

    runs: np.ndarray      # [n, 6] (remote offset, local offset, length, strides, count)
    stream: np.ndarray    # each run's first source byte in the stream
    e_start: np.ndarray   # extents: first remote byte, length, place in the stream
    e_len: np.ndarray
    e_stream: np.ndarray
    part: np.ndarray      # each run's part
    bounds: np.ndarray    # the parts' stream ranges: part p is [bounds[p], bounds[p + 1])

    @property
    def total(self) -> int:
        return int(self.e_len.sum())


def merged(src: np.ndarray, dst: np.ndarray, length: np.ndarray) -> np.ndarray:
    """transfer.merge_spans on int64 arrays: sorted by (src, dst), each piece that continues
    the previous one in both buffers joined to it. numpy, not torch, on a read's path: its
    small-array calls cost a fifth of torch's (the core package needs no numpy, so the torch
    statement stays there)."""
    if src.size == 0:
        return np.zeros((0, 3), np.int64)
    order = np.lexsort((dst, src))  # by src, then dst; stable, as two stable argsorts are
    src, dst, length = src[order], dst[order], length[order]
    cont = np.zeros(src.size, bool)
    cont[1:] = (src[1:] == src[:-1] + length[:-1]) & (dst[1:] == dst[:-1] + length[:-1])
    first = np.flatnonzero(~cont)
    return np.stack([src[first], dst[first], np.add.reduceat(length, first)], 1)


def _pieces_of_far_runs(r: np.ndarray, gap: int) -> np.ndarray:
    return _pieces_of(r, (r[:, 5] > 1) & (r[:, 3] - r[:, 2] > gap))


def _pieces_of(r: np.ndarray, far: np.ndarray) -> np.ndarray:
    """The runs r[far] as one run of count 1 per piece, after the others."""
    if not bool(far.any()):
        return r
    return np.concatenate([r[~far], pieces_of(r[far])])


def stage_runs(runs: np.ndarray, gap: int | None = None,
               part_bytes: int | None = None) -> RunStage:
    """Where each run's source bytes go in the staging stream and in which part (runs with a
    length > 0, checked); gap and part_bytes: paths.STAGE_GAP_BYTES, STAGE_PART_BYTES."""
    gap = paths.STAGE_GAP_BYTES if gap is None else gap
    part_bytes = paths.STAGE_PART_BYTES if part_bytes is None else part_bytes
    r = _pieces_of_far_runs(runs, gap)
    r = np.take(r, np.argsort(r[:, 0], kind="stable"), axis=0)  # take: a fifth of r[order]'s time
    begin = r[:, 0]
    end = begin + (r[:, 5] - 1) * r[:, 3] + r[:, 2]
    reach = np.maximum.accumulate(end)
    prev = np.concatenate([[begin[0]], reach[:-1]])
    free_cut = begin >= prev          # no earlier run's source reaches past this run's start
    new = begin > prev + gap
    new[0] = True
    eid = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    e_start = begin[first]
    e_len = np.maximum.reduceat(end, first) - e_start
    e_stream = np.cumsum(e_len) - e_len
    stream = e_stream[eid] + (begin - e_start[eid])
    cut_run = np.maximum.accumulate(np.where(free_cut, np.arange(r.shape[0]), 0))
    cut_at = stream[cut_run]          # the stream position of the last allowed cut so far
    q = cut_at // part_bytes          # nondecreasing: a new part wherever it steps
    starts = np.empty(q.size, bool)
    starts[0] = True
    np.not_equal(q[1:], q[:-1], out=starts[1:])
    part = np.cumsum(starts) - 1
    firsts = np.flatnonzero(starts)
    bounds = np.append(cut_at[firsts], int(e_len.sum()))
    return RunStage(r, stream, e_start, e_len, e_stream, part, bounds)


def staged_cost(st: RunStage, pieces: int, nbytes: int) -> float:
    """Seconds a staged read of these runs takes in the cost model (paths.py's, with the
    regroup in place of copy_spans' unpack)."""
    return (st.e_len.size * DESC_S + (st.total - nbytes) / READ_BYTES_PER_S
            + regroup_cost(pieces, nbytes))


def regroup_cost(pieces: int, nbytes: int) -> float:
    """The regroup's part of staged_cost: what a staged read costs at least, whatever its
    extents (they only add descriptors and gaps)."""
    return nbytes / REGROUP_BYTES_PER_S + pieces * REGROUP_PIECE_S


def staged_run_parts(ep, peer, st: RunStage, stats):
    """The parts of a staged read of st's runs: part p is one NIXL read of its extent pieces into
    staging half p % 2, then one copy_runs of its runs out of that half (on the unpack thread,
    beside the next part's read). -> (parts, the callable returning the staging buffer)."""
    t0 = time.perf_counter()
    stats.staged_bytes = total = st.total
    n_parts = st.bounds.size - 1
    sizes = np.diff(st.bounds)
    half = int(sizes.max())
    staging = ep._staging(half * (2 if n_parts > 1 else 1))
    # the stream cut at every extent start and part bound: NIXL's descriptors, one part each
    cuts = np.union1d(st.e_stream, st.bounds[:-1])
    seg_len = np.diff(np.append(cuts, total))
    e = np.searchsorted(st.e_stream, cuts, side="right") - 1
    seg_src = st.e_start[e] + (cuts - st.e_stream[e])
    seg_part = np.searchsorted(st.bounds, cuts, side="right") - 1
    seg_stage = (seg_part % 2) * half + (cuts - st.bounds[seg_part])
    seg_bounds = np.searchsorted(seg_part, np.arange(n_parts + 1))
    # the runs rebased onto the staging buffer
    r = st.runs.copy()
    r[:, 0] = (st.part % 2) * half + (st.stream - st.bounds[st.part])
    run_bounds = np.searchsorted(st.part, np.arange(n_parts + 1))
    _lap(stats, "lists_s", t0)
    base, cache = staging.data_ptr(), ep.cache.buffer
    parts = []
    for p in range(n_parts):
        e_sel = slice(int(seg_bounds[p]), int(seg_bounds[p + 1]))
        p_runs = torch.from_numpy(np.ascontiguousarray(r[run_bounds[p]:run_bounds[p + 1]]))

        make = paths.stage_read(ep, peer, base, seg_stage[e_sel], seg_src[e_sel],
                                seg_len[e_sel], stats)

        def regroup(p_runs=p_runs):
            _ops.copy_runs(staging, cache, p_runs)
        parts.append(Part(make, after=regroup, overlap=n_parts > 1))
    return parts, lambda: ep._return_staging(staging)


def run_parts(ep, peer, op: str, runs: np.ndarray, path: str, stats):
    """The parts of a transfer of checked runs (length > 0; remote first for reads): auto
    stages a read when the cost model says its extents, gaps and regroup cost clearly less than
    posting its pieces, else posts them. -> (path, parts, on_end)."""
    t = time.perf_counter()
    st = None
    if path == "auto":
        path = "plain"
        # what posting them would cost: a run whose pieces continue on both sides is one span
        n = runs[:, 2]
        posted = int(np.where((runs[:, 3] == n) & (runs[:, 4] == n), 1, runs[:, 5]).sum())
        budget = 0.8 * posted * DESC_S  # what staging must cost less than
        # the extents (stage_runs: a few numpy passes, 0.3 ms for 256 pieces) only where the
        # regroup alone leaves room, as a read of a few long pieces does not
        if (op == "READ" and posted >= AUTO_MIN_SPANS
                and regroup_cost(stats.spans, stats.bytes) < budget):
            st = stage_runs(runs)
            if staged_cost(st, stats.spans, stats.bytes) < budget:
                path = "staged"
    if path == "staged":
        if st is None:
            st = stage_runs(runs)
        _lap(stats, "lists_s", t)
        return (path, *staged_run_parts(ep, peer, st, stats))
    if path == "strided":  # NIXL's strided rows: strides >= the length on both sides
        runs = runs.copy()
        one = runs[:, 5] == 1
        runs[one, 3] = runs[one, 2]
        runs[one, 4] = runs[one, 2]
        runs = _pieces_of(runs, runs[:, 3] < runs[:, 2])  # overlapping source pieces, one by one
        _lap(stats, "lists_s", t)
        return path, paths.strided_parts(ep, peer, op, runs, stats), None
    p = pieces_of(runs)  # spans_of_runs in numpy: a new array, one row per piece
    s = merged(p[:, 0], p[:, 1], p[:, 2])
    remote_off, local_off = (s[:, 0], s[:, 1]) if op == "READ" else (s[:, 1], s[:, 0])
    _lap(stats, "lists_s", t)
    if path == "prepared":
        g = paths.granule(local_off, remote_off, s[:, 2])
        if not paths.prepared_fits(ep.cache.buffer.numel(), peer.nbytes, stats.bytes, g):
            raise ValueError(f"path='prepared': the runs' offsets and lengths share a granule of "
                             f"only {g} B: use 'strided' or 'staged'")
        return path, paths.prepared_parts(ep, peer, op, local_off, remote_off, s[:, 2], g,
                                          stats), None
    return path, paths.plain_parts(ep, peer, op, local_off, remote_off, s[:, 2], stats), None
