"""Moving one DeepSeek-V3.2-sized request between plans: spans per request and GB/s, locally and
through NIXL between two processes, next to two yardsticks measured in the same run.

    python benchmarks/bench_transfer.py [--out DIR] [--device cpu|cuda] [--tokens 8192]
                                        [--repeats 7] [--no-nixl] [--no-gloo]

The request: 61 layers of one MLA row (656 B) and one indexer row (132 B), 8192 tokens, its
blocks random and never consecutive (every other block id, shuffled) on both sides, so no span
can run across two blocks. Cases: BLHNC -> BLHNC, LBNHC -> LBNHC, BLHNC -> LBNHC (block 64) and
BLHNC/64 -> BLHNC/16. For each:

- spans per request (TransferPlan.token_spans) and the fewest the two plans allow for such a
  request (closed form, checked by tests/test_transfer.py against an independent count);
- local: kvc.copy_spans between two caches in this process (CPU; with --device cuda also
  GPU -> GPU and GPU -> pinned CPU), timed as the caller waits, next to a memcpy of the same
  number of bytes (one contiguous torch copy), the two interleaved, median of --repeats runs;
- NIXL: the request read by this process from a second process (spawn, 127.0.0.1) that only
  keeps its Endpoint open, next to one large NIXL read of the same bytes with the same agents;
- torch.distributed (gloo) send/recv of the same bytes between the same two processes.

NIXL reads take the Endpoint's own choice of path (kvcache_ext/nixl/paths.py: staged for many
small spans); each row says which path and how many pieces NIXL posted, and a new peer's first
read (handshake, registration, first transfer) is timed on its own.

Targets (shown, not asserted): spans == the minimum; every NIXL read >= 80 % of the one large
read timed interleaved with it (a yardstick whose spread is over 20 % is marked); local copy_spans
of cases whose spans are all >= 4 KiB >= 80 % of memcpy. Writes bench_transfer_<device>.md /
.json / .png under --out.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import torch

import kvcache_ext as kvc

from kvc_harness.engines import free_port
from bench_transfer_report import load_warning, markdown, meta, plot, targets

MLA, INDEXER = 656, 132
CASES = [("BLHNC", 64, "BLHNC", 64), ("LBNHC", 64, "LBNHC", 64), ("BLHNC", 64, "LBNHC", 64),
         ("BLHNC", 64, "BLHNC", 16)]
WAIT_S = 120


def specs(layers: int) -> list[kvc.CacheSpec]:
    return [kvc.CacheSpec("mla", MLA, layers), kvc.CacheSpec("indexer", INDEXER, layers)]


def case_name(c) -> str:
    return f"{c[0]}/{c[1]} -> {c[2]}/{c[3]}"


def plan_for(layout: str, block_size: int, tokens: int, layers: int) -> kvc.CachePlan:
    """Twice the blocks the request needs: room for every other block id."""
    return kvc.plan_cache(specs(layers), 2 * (tokens // block_size), block_size, layout)


def table(plan: kvc.CachePlan, tokens: int, seed: int) -> torch.Tensor:
    """Random, never consecutive block ids: every other id, shuffled."""
    g = torch.Generator().manual_seed(seed)
    n = tokens // plan.block_size
    return (2 * torch.randperm(plan.num_blocks // 2, generator=g)[:n]).to(torch.int32)


def minimum_spans(c, tokens: int, layers: int) -> int:
    """The fewest spans for a request on random, non-consecutive blocks: block-outer to
    block-outer with one block size moves one span per block; otherwise every (spec, layer)
    page breaks at every block boundary of either side."""
    sl, sn, dl, dn = c
    if sl[0] == "B" and dl[0] == "B" and sn == dn:
        return tokens // sn
    return tokens // min(sn, dn) * 2 * layers


def median_gbps(samples: list[float], nbytes: int) -> dict:
    s = sorted(samples)
    med = statistics.median(s)
    q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
    return {"median_s": med, "gbps": nbytes / med / 1e9, "samples_s": samples,
            "spread_pct": 100.0 * (q3 - q1) / med}


def interleaved(fns: dict, repeats: int, sync=lambda: None) -> dict[str, list[float]]:
    """Alternate the timed functions, one call each per round."""
    out = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
        sync()
    for _ in range(repeats):
        for k, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            out[k].append(time.perf_counter() - t0)
    return out


def fill(cache: kvc.KVCache, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randint(0, 256, ((1 << 20) + 7,), dtype=torch.uint8, generator=g)  # odd period
    buf = cache.buffer
    for off in range(0, buf.numel(), pattern.numel()):
        n = min(pattern.numel(), buf.numel() - off)
        buf[off:off + n].copy_(pattern[:n])


# ---- the owner process: holds the source caches, makes no call while they are read ---------
def owner(args: dict, commands, replies) -> None:
    import torch.distributed as dist
    import kvcache_ext.nixl as kn
    caches = {}
    for layout in sorted({c[0] for c in CASES}):
        cache = kvc.allocate(plan_for(layout, 64, args["tokens"], args["layers"]))
        fill(cache, 1)
        caches[layout] = cache
    eps = {lay: kn.Endpoint(f"owner-{lay}", c) for lay, c in caches.items()}
    replies.put(("ready", {lay: ep.metadata() for lay, ep in eps.items()}))
    while True:
        try:
            cmd, *rest = commands.get(timeout=600)
        except queue.Empty:
            cmd, rest = "exit", []
        if cmd == "gloo":
            port, nbytes, repeats = rest
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                    world_size=2)
            buf = caches["BLHNC"].buffer[:nbytes]
            for _ in range(repeats + 1):
                dist.barrier()
                dist.send(buf, dst=1)
            dist.barrier()
            dist.destroy_process_group()
        elif cmd == "exit":
            for ep in eps.values():
                ep.close()
            replies.put(("bye",))
            return


def reply(replies, proc, kind: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            msg = replies.get(timeout=0.5)
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the owner process died (exit code {proc.exitcode})")
            continue
        assert msg[0] == kind, msg
        return msg
    raise TimeoutError(f"no {kind!r} from the owner within {timeout_s} s")


# ---- measurements -----------------------------------------------------------------------------
def local_rows(cases, tokens, repeats, device: str, dst_caches, src_caches) -> list[dict]:
    """copy_spans and a memcpy of the same bytes for every case, all timed in alternating rounds
    (a load that comes and goes weighs on every case and yardstick alike)."""
    routes = [("cpu", "cpu")] if device == "cpu" else [("cuda", "cuda"), ("cuda", "pinned")]
    rows = []
    for src_dev, dst_dev in routes:
        runs, fns = [], {}
        for c in cases:
            src, dst = src_caches[(c[0], c[1])], dst_caches[(c[2], c[3])]
            if src_dev == "cuda":
                src = kvc.KVCache(src.plan, src.buffer.to("cuda"))
                dst = (kvc.KVCache(dst.plan, dst.buffer.to("cuda")) if dst_dev == "cuda" else
                       kvc.KVCache(dst.plan, dst.buffer.pin_memory()))
            spans = c_spans(c, src.plan, dst.plan, tokens)
            nbytes = int(spans[:, 2].sum())
            a, b = src.buffer[:nbytes], dst.buffer[:nbytes]
            fns[(c, "copy_spans")] = lambda src=src, dst=dst, spans=spans: kvc.copy_spans(
                src, dst, spans)
            fns[(c, "memcpy")] = lambda a=a, b=b: b.copy_(a, non_blocking=True)
            runs.append((c, src, dst, spans, nbytes))
        sync = torch.cuda.synchronize if src_dev == "cuda" else (lambda: None)
        t = interleaved(fns, repeats, sync)
        for c, src, dst, spans, nbytes in runs:
            local = median_gbps(t[(c, "copy_spans")], nbytes)
            memcpy = median_gbps(t[(c, "memcpy")], nbytes)
            kvc.copy_spans(src, dst, spans)  # the memcpy overwrote dst: copy, then check spans
            sync()
            check(src.buffer.cpu(), dst.buffer.cpu(), spans)
            rows.append({"case": case_name(c), "route": f"{src_dev}->{dst_dev}",
                         "spans": int(spans.shape[0]), "bytes": nbytes,
                         "min_span": int(spans[:, 2].min()), "local": local, "memcpy": memcpy,
                         "pct_memcpy": 100.0 * local["gbps"] / memcpy["gbps"]})
            print(f"local {rows[-1]['route']:<13} {case_name(c):<26} {spans.shape[0]:>6} spans "
                  f"{local['gbps']:6.2f} GB/s, memcpy {memcpy['gbps']:6.2f} GB/s "
                  f"({rows[-1]['pct_memcpy']:.0f} %)", flush=True)
        del runs, fns
    return rows


def check(src: torch.Tensor, dst: torch.Tensor, spans: torch.Tensor, sample: int = 300) -> None:
    """Sampled spans hold the source's bytes (the sources hold an odd-period random pattern)."""
    g = torch.Generator().manual_seed(0)
    for so, do, n in spans[torch.randperm(spans.shape[0], generator=g)[:sample]].tolist():
        if not torch.equal(src[so:so + n], dst[do:do + n]):
            raise AssertionError(f"span ({so}, {do}, {n}) moved the wrong bytes")


def c_spans(c, src_plan, dst_plan, tokens) -> torch.Tensor:
    return kvc.TransferPlan(src_plan, dst_plan).token_spans(
        table(src_plan, tokens, 10), table(dst_plan, tokens, 20), tokens)


def nixl_rows(cases, tokens, layers, repeats, dst_caches, gloo: bool) -> tuple[list[dict], dict]:
    import kvcache_ext.nixl as kn
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=owner, args=({"tokens": tokens, "layers": layers}, commands,
                                           replies), daemon=True)
    proc.start()
    rows, gloo_row = [], {}
    eps = {}
    try:
        blobs = reply(replies, proc, "ready", 600)[1]
        for key, cache in dst_caches.items():
            eps[key] = kn.Endpoint(f"reader-{key[0]}-{key[1]}", cache)
        fns, runs = {}, []
        for c in cases:
            ep = eps[(c[2], c[3])]
            peer = next((p for p in ep.peers.values() if p.plan.layout == c[0]), None)
            peer = peer or ep.add_peer(blobs[c[0]])
            spans = c_spans(c, peer.plan, ep.plan, tokens)
            nbytes = int(spans[:, 2].sum())
            big = torch.tensor([[0, 0, nbytes]])
            last = {}

            def read_spans(ep=ep, peer=peer, spans=spans, last=last):
                h = ep.read(peer, spans)
                h.wait(WAIT_S)
                last["stats"] = h.stats
            fns[(c, "spans")] = read_spans
            fns[(c, "big")] = lambda ep=ep, peer=peer, big=big: ep.read(peer, big).wait(WAIT_S)
            fns[(c, "plan")] = lambda c=c, peer=peer, ep=ep: c_spans(c, peer.plan, ep.plan, tokens)
            runs.append((c, spans, nbytes, last))
        first = {}
        for c, spans, _, _ in runs:  # a new peer's first read: handshake and first transfer
            t0 = time.perf_counter()
            with kn.Endpoint(f"first-{c[2]}-{c[3]}", dst_caches[(c[2], c[3])]) as fresh:
                fresh.read(fresh.add_peer(blobs[c[0]]), spans).wait(WAIT_S)
                first[c] = time.perf_counter() - t0
        t = interleaved(fns, repeats)
        for c, spans, nbytes, last in runs:
            r, b = median_gbps(t[(c, "spans")], nbytes), median_gbps(t[(c, "big")], nbytes)
            st = last["stats"]
            rows.append({"case": case_name(c), "spans": int(spans.shape[0]), "bytes": nbytes,
                         "nixl": r, "nixl_big": b, "pct_big": 100.0 * r["gbps"] / b["gbps"],
                         "plan_ms": 1e3 * statistics.median(t[(c, "plan")]),
                         "path": st.path, "pieces": st.pieces, "first_read_ms": 1e3 * first[c],
                         "stats": st.as_dict()})
            print(f"nixl  {case_name(c):<26} {spans.shape[0]:>6} spans {r['gbps']:6.2f} GB/s "
                  f"({st.path}, {st.pieces} pieces), one large read {b['gbps']:6.2f} GB/s "
                  f"({rows[-1]['pct_big']:.0f} %), spans planned in {rows[-1]['plan_ms']:.1f} ms, "
                  f"first read of a new peer {rows[-1]['first_read_ms']:.0f} ms", flush=True)
        if gloo:
            import torch.distributed as dist
            nbytes = rows[0]["bytes"]
            port = free_port()
            commands.put(("gloo", port, nbytes, repeats))
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1,
                                    world_size=2)
            buf = torch.empty(nbytes, dtype=torch.uint8)
            samples = []
            for i in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                dist.recv(buf, src=0)
                if i:
                    samples.append(time.perf_counter() - t0)
            dist.barrier()
            dist.destroy_process_group()
            gloo_row = {"bytes": nbytes, **median_gbps(samples, nbytes)}
            print(f"gloo  send/recv of {nbytes} bytes: {gloo_row['gbps']:.2f} GB/s", flush=True)
    finally:
        for ep in eps.values():
            ep.close()
        if proc.is_alive():
            commands.put(("exit",))
            proc.join(30)
        if proc.is_alive():
            proc.kill()
    return rows, gloo_row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/out", help="output folder (default: %(default)s)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="local copies on this device (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens (default: %(default)s)")
    p.add_argument("--layers", type=int, default=61, help="layers (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=7, help="runs per figure (default: %(default)s)")
    p.add_argument("--no-nixl", action="store_true", help="skip NIXL (default: run it)")
    p.add_argument("--no-gloo", action="store_true", help="skip gloo (default: run it)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no GPU")
    tokens, layers = args.tokens, args.layers
    src_caches, dst_caches, counts = {}, {}, {}
    for c in CASES:
        if (c[0], c[1]) not in src_caches:
            src_caches[(c[0], c[1])] = kvc.allocate(plan_for(c[0], c[1], tokens, layers))
            fill(src_caches[(c[0], c[1])], 1)
        if (c[2], c[3]) not in dst_caches:
            dst_caches[(c[2], c[3])] = kvc.allocate(plan_for(c[2], c[3], tokens, layers), fill=0)
        spans = c_spans(c, src_caches[(c[0], c[1])].plan, dst_caches[(c[2], c[3])].plan, tokens)
        counts[case_name(c)] = {"spans": int(spans.shape[0]),
                                "minimum": minimum_spans(c, tokens, layers)}
    result = {"meta": meta(args.device),
              "config": {"tokens": tokens, "layers": layers, "repeats": args.repeats,
                         "bytes": tokens * layers * (MLA + INDEXER), "mla": MLA,
                         "indexer": INDEXER},
              "cases": [case_name(c) for c in CASES], "block_outer_case": case_name(CASES[0]),
              "span_counts": counts, "local": [], "nixl": [], "gloo": {}}
    result["local"] = local_rows(CASES, tokens, args.repeats, args.device, dst_caches,
                                 src_caches)
    del src_caches
    if not args.no_nixl:
        result["nixl"], result["gloo"] = nixl_rows(CASES, tokens, layers, args.repeats,
                                                   dst_caches, not args.no_gloo)
    result["meta"]["loadavg_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench_transfer_{args.device}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    plot(result, stem.with_suffix(".png"))
    print("\n".join(targets(result)))
    if load_warning(result["meta"]):
        print(load_warning(result["meta"]), file=sys.stderr)
    print(f"wrote {stem}.md, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
