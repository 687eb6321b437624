"""Where a NIXL transfer's time goes, per way of handing its spans to NIXL (kvcache_ext/nixl/
paths.py), on requests at the descriptor limit, read by this process from a second one:

    python benchmarks/bench_nixl_paths.py [--out DIR] [--repeats 5] [--tokens 8192]

Cases (blocks random and never consecutive on both sides, as in bench_transfer.py):
- "dsa 64->16": DeepSeek-V3.2's request (61 layers of MLA 656 B + indexer 132 B), BLHNC/64 ->
  BLHNC/16: 62,464 spans of 2-10 KiB;
- "vllm 32->64": vLLM CPU's page (8 layers, 4 KV heads, K channel-major | V, head_dim 64 fp32),
  LBHNC/32 -> LBHNC/64: about 530,000 spans of 128 B (one per K channel per token run) and 8 KiB;
- "vllm 32->32": the same page between equal plans, 2,048 spans of 64 KiB (a like read whose
  blocks are scattered on both sides, as a decode engine's become once it has freed blocks).
For each path (plain, prepared, strided, staged) and two yardsticks timed in the same
alternating rounds -- one large read of the same number of bytes, and the same spans copied in
this process by copy_spans (what a staged read's unpack costs alone) -- the median of --repeats of: the
whole transfer as the caller waits for it, and its stats (handle.stats): lists (numpy), NIXL's
preparation (get_xfer_descs / prep_xfer_dlist / initialize_xfer / make_prepped_xfer), posting,
moving (first post to last completion, unpacks included), unpacking, and the pieces NIXL
posted (its telemetry). Also each path's first transfer with a new peer (a fresh Endpoint: its
handshake, prepared lists or staging registration). Every read is checked against the source's
bytes. Writes nixl_paths_cpu.json and .md under --out.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import torch

import kvcache_ext as kvc
from kvcache_ext.ops.library import ops as library_ops

from bench_transfer import check, fill, reply
from bench_transfer_report import meta

PATHS = ("plain", "prepared", "strided", "staged")
WAIT_S = 300


def case_plans(tokens: int) -> dict[str, tuple[kvc.CachePlan, kvc.CachePlan]]:
    dsa = [kvc.CacheSpec("mla", 656, 61), kvc.CacheSpec("indexer", 132, 61)]
    d = 64 * 4
    kv = [kvc.CacheSpec("kv", 2 * d, 8, 4, split=(d, d), channel_major=4)]
    return {"dsa 64->16": (kvc.plan_cache(dsa, 2 * tokens // 64, 64, "BLHNC"),
                           kvc.plan_cache(dsa, 2 * tokens // 16, 16, "BLHNC")),
            "vllm 32->64": (kvc.plan_cache(kv, 2 * tokens // 32, 32, "LBHNC"),
                            kvc.plan_cache(kv, 2 * tokens // 64, 64, "LBHNC")),
            "vllm 32->32": (kvc.plan_cache(kv, 2 * tokens // 32, 32, "LBHNC"),
                            kvc.plan_cache(kv, 2 * tokens // 32, 32, "LBHNC"))}


def tag(case: str) -> str:
    """An agent name's part for a case ("vllm 32->64" -> "vllm-32to64"): unique per case."""
    return case.replace("->", "to").replace(" ", "-")


def table(plan: kvc.CachePlan, tokens: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randperm(plan.num_blocks // 2, generator=g)[:tokens // plan.block_size]
            ).to(torch.int32)


def owner(tokens: int, commands, replies) -> None:
    import kvcache_ext.nixl as kn
    eps = {}
    for name, (src, _) in case_plans(tokens).items():
        cache = kvc.allocate(src)
        fill(cache, 1)
        eps[name] = kn.Endpoint(f"owner-{tag(name)}", cache)
    replies.put(("ready", {k: ep.metadata() for k, ep in eps.items()}))
    commands.get(timeout=3600)
    for ep in eps.values():
        ep.close()
    replies.put(("bye",))


def summary(rows: list[dict], nbytes: int) -> dict:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "path"}
    med["gbps"] = nbytes / med["wall_s"] / 1e9
    return med


def run_case(name, src_plan, dst_plan, blob, tokens, repeats) -> dict:
    import kvcache_ext.nixl as kn
    dst = kvc.allocate(dst_plan, fill=0)
    out = {"case": name, "paths": {}, "first": {}}
    with kn.Endpoint(f"reader-{tag(name)}", dst) as ep:
        peer = ep.add_peer(blob)
        spans = kvc.TransferPlan(peer.plan, ep.plan).token_spans(
            table(src_plan, tokens, 10), table(dst_plan, tokens, 20), tokens)
        nbytes = int(spans[:, 2].sum())
        out.update(spans=int(spans.shape[0]), bytes=nbytes,
                   runs=int(kvc.runs_of_spans(spans).shape[0]))
        big = torch.tensor([[0, 0, nbytes]])
        local = src_bytes(peer, ep, spans)  # the same spans copied in this process: no NIXL
        samples = {p: [] for p in PATHS + ("one large read", "local copy_spans")}
        for i in range(repeats + 1):  # round 0 warms up (and prepares the lists)
            for p in list(samples):
                t = time.perf_counter()
                if p == "local copy_spans":
                    library_ops.copy_spans(local, dst.buffer, spans)
                    if i:
                        samples[p].append({"wall_s": time.perf_counter() - t, "pieces": 0,
                                           "lists_s": 0, "prep_s": 0, "post_s": 0, "move_s": 0,
                                           "unpack_s": time.perf_counter() - t})
                    continue
                try:
                    h = ep.read(peer, big if p == "one large read" else spans,
                                path="plain" if p == "one large read" else p)
                except ValueError as e:  # this path cannot take these spans: say why
                    out["paths"][p] = {"error": str(e)}
                    del samples[p]
                    continue
                h.wait(WAIT_S)
                wall = time.perf_counter() - t
                if i:
                    samples[p].append({"wall_s": wall, **{k: v for k, v in h.stats.as_dict().items()
                                                          if isinstance(v, (int, float))
                                                          and not isinstance(v, bool)}})
                if p != "one large read" and i == repeats:
                    check(src_bytes(peer, ep, spans), dst.buffer, spans)
        for p, rows in samples.items():
            out["paths"][p] = summary(rows, nbytes)
        big_gbps = out["paths"]["one large read"]["gbps"]
        for p in samples:
            out["paths"][p]["pct_big"] = 100.0 * out["paths"][p]["gbps"] / big_gbps
        out["paths"]["local copy_spans"]["note"] = "the unpack alone: no NIXL, nothing beside it"
    for p in [p for p in PATHS if p in samples]:  # a new peer's first transfer: handshake, prep
        dst.buffer.zero_()
        with kn.Endpoint(f"first-{tag(name)}-{p}", dst) as ep:
            t = time.perf_counter()
            peer = ep.add_peer(blob)
            ep.read(peer, spans, path=p).wait(WAIT_S)
            out["first"][p] = time.perf_counter() - t
    return out


_SRC = {}


def src_bytes(peer, ep, spans) -> torch.Tensor:
    """The owner's bytes as this process can rebuild them (fill() is deterministic)."""
    key = peer.name
    if key not in _SRC:
        c = kvc.allocate(peer.plan)
        fill(c, 1)
        _SRC[key] = c.buffer
    return _SRC[key]


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = ["# Where a NIXL transfer's time goes, per path", "",
             f"{m['host']}, torch {m['torch']}, nixl {m['nixl']}, commit {m['commit'][:10]}, "
             f"{m['date'][:19]} UTC; loopback (UCX cma) between two processes; median of "
             f"{res['repeats']} reads, every path and the one-large-read yardstick in alternating "
             f"rounds. Times in ms.", ""]
    for c in res["cases"]:
        lines += [f"## {c['case']}: {c['spans']:,} spans ({c['runs']:,} strided runs), "
                  f"{c['bytes'] / 2**20:.0f} MiB", "",
                  "| path | pieces NIXL posted | lists | NIXL prep | post | move | unpack | "
                  "whole read | GB/s | % of one large read | first read, new peer |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p, r in c["paths"].items():
            if "error" in r:
                lines.append(f"| {p} | refused: {r['error']} |" + " |" * 9)
                continue
            first = c["first"].get(p)
            lines.append(
                f"| {p} | {r['pieces']:,.0f} | {1e3 * r['lists_s']:.1f} | {1e3 * r['prep_s']:.1f} | "
                f"{1e3 * r['post_s']:.1f} | {1e3 * r['move_s']:.1f} | {1e3 * r['unpack_s']:.1f} | "
                f"{1e3 * r['wall_s']:.1f} | {r['gbps']:.2f} | "
                f"{r.get('pct_big', 100.0):.0f} % | "
                f"{'-' if first is None else f'{1e3 * first:.0f}'} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=owner, args=(args.tokens, commands, replies), daemon=True)
    proc.start()
    res = {"meta": meta("cpu"), "repeats": args.repeats, "tokens": args.tokens, "cases": []}
    try:
        blobs = reply(replies, proc, "ready", 600)[1]
        for name, (src, dst) in case_plans(args.tokens).items():
            res["cases"].append(run_case(name, src, dst, blobs[name], args.tokens, args.repeats))
            _SRC.clear()
            print(markdown({**res, "cases": res["cases"][-1:]}), flush=True)
    finally:
        commands.put(("exit",))
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    res["meta"]["loadavg_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nixl_paths_cpu.json").write_text(json.dumps(res, indent=1))
    (out / "nixl_paths_cpu.md").write_text(markdown(res))
    print(f"wrote {out / 'nixl_paths_cpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
