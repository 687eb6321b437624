"""The ways one transfer's spans can reach NIXL (the parts of a TransferHandle), and which one a
transfer takes. What each costs is measured in benchmarks/bench_nixl_paths.py (the table in
benchmarks/results/nixl_paths_cpu.md); the rule in choose() follows from it.

- plain: one descriptor per span, both lists built for this transfer (get_xfer_descs,
  initialize_xfer). NIXL posts every descriptor as it is.
- prepared: both buffers prepared once (per peer) as grids of g-byte granules (g: the largest
  size every span offset and length is a multiple of; one strided Nx5 row each, nixl >= 1.5),
  then per transfer only index arrays (make_prepped_xfer, which merges indices that continue on
  both sides). Saves building and creating lists, not posting.
- strided: the spans as strided runs (kvc.runs_of_spans, or the runs the caller gave),
  prepared for this transfer as Nx5 lists (nixl >= 1.5), one index per piece. Lists as long as
  the runs, not the pieces.
- staged (reads only): the peer's bytes the spans read, merged into extents wherever the gap
  between two is at most STAGE_GAP_BYTES, read into a registered staging buffer with one
  descriptor per extent, in parts of STAGE_PART_BYTES; each part is unpacked into the cache by
  the copy_spans op on a thread of its own while the next part is read. Posting cost per
  extent, not per span, plus the unpack. A read given strided runs (TransferPlan.token_runs)
  stages them the same way and re-tiles each part with one copy_runs (staged_runs.py).
"""
from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version
from math import gcd

import numpy as np

from ..ops.library import ops as _ops
from .handle import NixlError, Part

PATHS = ("auto", "plain", "prepared", "strided", "staged")
STAGE_GAP_BYTES = 16 << 10     # a gap this short is read through rather than posted around
STAGE_PART_BYTES = 32 << 20    # a staged read moves in parts of about this size (two buffered)
AUTO_MIN_SPANS = 256           # auto considers staging a read of at least this many spans
# The cost model of auto, from benchmarks/results/nixl_paths_cpu.md (2-core x86, UCX cma): NIXL
# posts a descriptor in about 3.5 us whatever its size; reading bytes costs about 1 / 7 GB/s;
# unpacking them from the staging buffer (copy_spans, beside the next part's read) about
# 1 / 6 GB/s plus 0.1 us per piece.
DESC_S = 3.5e-6
READ_BYTES_PER_S = 7e9
UNPACK_BYTES_PER_S = 6e9
UNPACK_PIECE_S = 1e-7
PREPARED_MAX_INDICES = 1 << 24  # prepared lists: at most this many granules in one transfer


def nixl_has_strided() -> bool:
    """Strided (Nx5) descriptor lists for prep_xfer_dlist: nixl >= 1.5 (NIXL PR #1978)."""
    try:
        v = version("nixl")
    except PackageNotFoundError:
        return False
    major, minor = (int(x) for x in (v.split(".") + ["0"])[:2])
    return (major, minor) >= (1, 5)


def granule(local_off: np.ndarray, remote_off: np.ndarray, lengths: np.ndarray) -> int:
    """The largest g dividing every offset and length (the prepared path's grid)."""
    g = 0
    for a in (local_off, remote_off, lengths):
        if a.size:
            g = gcd(g, int(np.gcd.reduce(a.astype(np.int64))))
    return max(g, 1)


def prepared_fits(ep_bytes: int, peer_bytes: int, nbytes: int, g: int) -> bool:
    return nbytes // g <= PREPARED_MAX_INDICES and max(ep_bytes, peer_bytes) // g < 2 ** 32


def extents(src: np.ndarray, lengths: np.ndarray, gap: int = STAGE_GAP_BYTES):
    """Sorted by source: (order, extent of each span, extent starts, extent lengths); two spans
    share an extent when the second starts at most `gap` bytes past the first's end."""
    order = np.argsort(src, kind="stable")
    s, n = src[order], lengths[order]
    ends = s + n
    reach = np.maximum.accumulate(ends)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1] + gap
    first = np.flatnonzero(new)
    e_start = s[first]
    e_len = np.maximum.reduceat(ends, first) - e_start if first.size else e_start
    return order, np.cumsum(new) - 1, e_start, e_len


def choose(op: str, lengths: np.ndarray, n_extents: int, staged_bytes: int) -> str:
    """auto: stage a read when posting its spans would cost clearly more than posting its
    extents, reading their gaps and unpacking (the cost model above); else post the spans."""
    n, nbytes = lengths.size, int(lengths.sum())
    if op != "READ" or n < AUTO_MIN_SPANS:
        return "plain"
    plain = n * DESC_S
    staged = (n_extents * DESC_S + (staged_bytes - nbytes) / READ_BYTES_PER_S
              + nbytes / UNPACK_BYTES_PER_S + n * UNPACK_PIECE_S)
    return "staged" if staged < 0.8 * plain else "plain"


def _lap(stats, field: str, since: float) -> float:
    now = time.perf_counter()
    setattr(stats, field, getattr(stats, field) + now - since)
    return now


def _descs(base: int, off: np.ndarray, lengths: np.ndarray, device: int) -> np.ndarray:
    return np.stack([off.astype(np.uint64) + np.uint64(base), lengths.astype(np.uint64),
                     np.full(off.size, device, np.uint64)], 1)


def _indices(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    total = int(counts.sum())
    starts = np.repeat(first - (np.cumsum(counts) - counts), counts)
    return (starts + np.arange(total, dtype=np.int64)).astype(np.uint32)


def plain_parts(ep, peer, op: str, local_off, remote_off, lengths, stats,
                before=None) -> list[Part]:
    """One part of one descriptor per span; before(): called first when the part is made (a
    packed read's wait for the peer to fill the range)."""
    def make():
        if before is not None:
            before()
        t = time.perf_counter()
        local = _descs(ep.cache.buffer.data_ptr(), local_off, lengths, ep._device_id)
        remote = _descs(peer.address, remote_off, lengths, peer.device_id)
        t = _lap(stats, "lists_s", t)
        with ep._lock:
            a = ep._agent
            xfer = a.initialize_xfer(op, a.get_xfer_descs(local, ep._mem_type),
                                     a.get_xfer_descs(remote, peer.mem_type), peer.name)
        _lap(stats, "prep_s", t)
        return xfer, int(lengths.size)
    return [Part(make)]


def prepared_parts(ep, peer, op: str, local_off, remote_off, lengths, g: int,
                   stats) -> list[Part]:
    def make():
        t = time.perf_counter()
        local_h, remote_h, first = ep._grids(peer, g)
        stats.prepared = first
        t = _lap(stats, "prep_s", t)
        li = _indices(local_off // g, lengths // g)
        ri = _indices(remote_off // g, lengths // g)
        breaks = int(np.count_nonzero((np.diff(li.astype(np.int64)) != 1)
                                      | (np.diff(ri.astype(np.int64)) != 1)))
        t = _lap(stats, "lists_s", t)
        with ep._lock:
            xfer = ep._agent.make_prepped_xfer(op, local_h, li, remote_h, ri)
        _lap(stats, "prep_s", t)
        return xfer, breaks + 1 if li.size else 0
    return [Part(make)]


def strided_parts(ep, peer, op: str, runs: np.ndarray, stats) -> list[Part]:
    """runs: [R, 6] (src, dst, length, strides, count) as the transfer gives them."""
    src, dst, length, s_stride, d_stride, count = (runs[:, i] for i in range(6))
    local_off, local_stride, remote_off, remote_stride = (
        (dst, d_stride, src, s_stride) if op == "READ" else (src, s_stride, dst, d_stride))
    handles = []

    def rows(base, off, stride, device):
        return np.stack([off + base, length, np.full(off.size, device, np.int64), stride, count],
                        1).astype(np.uint64)

    def make():
        t = time.perf_counter()
        local = rows(ep.cache.buffer.data_ptr(), local_off, local_stride, ep._device_id)
        remote = rows(peer.address, remote_off, remote_stride, peer.device_id)
        idx = np.arange(int(count.sum()), dtype=np.uint32)
        t = _lap(stats, "lists_s", t)
        with ep._lock:
            a = ep._agent
            handles.append(a.prep_xfer_dlist("NIXL_INIT_AGENT", local, ep._mem_type))
            handles.append(a.prep_xfer_dlist(peer.name, remote, peer.mem_type))
            xfer = a.make_prepped_xfer(op, handles[0], idx, handles[1], idx)
        _lap(stats, "prep_s", t)
        return xfer, int(count.sum())

    def cleanup():
        ep._release_dlists(handles)
        handles.clear()
    return [Part(make, cleanup=cleanup)]


def stage_read(ep, peer, base: int, stage_off, remote_off, lengths, stats):
    """make() of a staged part: one NIXL read of the peer's pieces into the staging buffer at
    `base`, one descriptor each."""
    def make():
        t = time.perf_counter()
        local = _descs(base, stage_off, lengths, ep._device_id)
        remote = _descs(peer.address, remote_off, lengths, peer.device_id)
        t = _lap(stats, "lists_s", t)
        with ep._lock:
            a = ep._agent
            xfer = a.initialize_xfer("READ", a.get_xfer_descs(local, ep._mem_type),
                                     a.get_xfer_descs(remote, peer.mem_type), peer.name)
        _lap(stats, "prep_s", t)
        return xfer, int(lengths.size)
    return make


def _cut(stream: np.ndarray, lengths: np.ndarray, part: int):
    """Ranges [stream, stream + length) of the staging stream cut at every multiple of `part`:
    (which range, offset into it, length, part) of each piece."""
    first = stream // part
    n = (stream + lengths - 1) // part - first + 1
    if not bool((n > 1).any()):  # nothing crosses a part boundary: the ranges as they are
        return np.arange(stream.size), np.zeros_like(stream), lengths, first
    which = np.repeat(np.arange(stream.size), n)
    k = first[which] + (np.arange(which.size) - np.repeat(np.cumsum(n) - n, n))
    lo = np.maximum(stream[which], k * part)
    hi = np.minimum(stream[which] + lengths[which], (k + 1) * part)
    return which, lo - stream[which], hi - lo, k


def staged_parts(ep, peer, remote_off, local_off, lengths, stats):
    """A read through a staging buffer: the extents laid end to end (the staging stream), cut
    into parts of STAGE_PART_BYTES that fill two staging halves in turn; each part is one NIXL
    read (one descriptor per extent piece), then one copy_spans out of its half.
    -> (parts, the callable that returns the staging buffer when the transfer ends)."""
    t0 = time.perf_counter()
    order, eid, e_start, e_len = extents(remote_off, lengths)
    stats.staged_bytes = total = int(e_len.sum())
    part = STAGE_PART_BYTES
    n_parts = -(-total // part)
    half = part if n_parts > 1 else total
    staging = ep._staging(half * (2 if n_parts > 1 else 1))
    e_stream = np.cumsum(e_len) - e_len
    # the extents' pieces: remote source, staging offset, part
    w, off, seg_len, seg_part = _cut(e_stream, e_len, part)
    seg_src = e_start[w] + off
    seg_stage = (seg_part % 2) * half + (e_stream[w] + off - seg_part * part)
    # the spans' pieces: staging source, cache destination, part
    s_sorted, d_sorted, n_sorted = remote_off[order], local_off[order], lengths[order]
    span_stream = e_stream[eid] + (s_sorted - e_start[eid])
    v, voff, v_len, v_part = _cut(span_stream, n_sorted, part)
    v_src = (v_part % 2) * half + (span_stream[v] + voff - v_part * part)
    v_dst = d_sorted[v] + voff
    seg_bounds = np.searchsorted(seg_part, np.arange(n_parts + 1))
    v_order = np.argsort(v_part, kind="stable")
    v_bounds = np.searchsorted(v_part[v_order], np.arange(n_parts + 1))
    _lap(stats, "lists_s", t0)
    base, cache = staging.data_ptr(), ep.cache.buffer
    parts = []
    for p in range(n_parts):
        e_sel = np.arange(seg_bounds[p], seg_bounds[p + 1])
        s_sel = v_order[v_bounds[p]:v_bounds[p + 1]]

        make = stage_read(ep, peer, base, seg_stage[e_sel], seg_src[e_sel], seg_len[e_sel], stats)

        def unpack(s_sel=s_sel):
            import torch
            spans = torch.from_numpy(np.stack([v_src[s_sel], v_dst[s_sel], v_len[s_sel]],
                                              1).astype(np.int64))
            _ops.copy_spans(staging, cache, spans)
        parts.append(Part(make, after=unpack, overlap=n_parts > 1))
    return parts, lambda: ep._return_staging(staging)


def check_path(path: str, op: str, strided_ok: bool) -> None:
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "staged" and op != "READ":
        raise ValueError("path='staged' is for reads only (a write would need the peer to "
                         "unpack its staging bytes)")
    if path in ("prepared", "strided") and not strided_ok:
        raise NixlError(f"path={path!r} needs strided descriptor lists (nixl >= 1.5); this "
                        f"NIXL has none: use 'plain' or 'auto'")
