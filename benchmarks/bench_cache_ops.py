"""Benchmark every write, gather and block-copy op against the memory system and the torch path.

    python benchmarks/bench_cache_ops.py [--quick] [--device cuda|cpu] [--out DIR]

For each op, layout (LBNHC and BLHNC by default, block size 64) and T in
{1, 8, 64, 512, 4096, 16384, 65536}: microseconds per call (median of many repeats after a
warm-up; CUDA events on a GPU, with CUDA-graph replay for T <= 512; inputs rotated through
enough copies that the L2 cache cannot hold them), GB/s counting bytes read + written once,
that as a share of the device's copy bandwidth measured in the same run, and the speed-up over
the pure-torch reference (eager, and torch.compile where it compiles). Writes a Markdown table,
a JSON file (device, torch and CUDA versions, commit, date) and PNG plots under --out.
Every case runs inside an NVTX range; see README.md for the Nsight Systems recipe.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref
from kvcache_ext.timing import time_calls

BLOCK = 64
ROTATE_BYTES = 256 << 20  # inputs rotated through at least this much memory (> L2 on any GPU)
MAX_SETS = 64             # ... or through this many input sets, whichever is fewer
MIN_BLOCKS = 2048         # a serving-sized cache (~0.5 GB here): rows land in cold memory


@dataclass
class Result:
    op: str
    layout: str
    tokens: int
    us: float
    gbps: float
    pct_copy: float
    torch_us: float | None
    speedup: float | None
    compiled_us: float | None
    graph: bool


def nvtx(name: str):
    if torch.cuda.is_available():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()


def copy_bandwidth(device: torch.device, repeats: int) -> float:
    """GB/s of a large device copy, bytes read + written."""
    n = (1 << 30) if device.type == "cuda" else (256 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    a.fill_(1)
    us = time_calls([lambda: b.copy_(a)], device, max(5, repeats // 4), use_graph=False)
    return 2 * n / us / 1e3


@dataclass
class Case:
    name: str
    kernel: Callable[[int], object]      # call on input set i
    torch_path: Callable[[int], object] | None
    bytes: int


def build_cases(layout: str, tokens: int, device: torch.device,
                gen: torch.Generator) -> tuple[list[Case], int]:
    """The cases at one size, and how many input sets their calls rotate through."""
    num_blocks = max(-(-tokens // BLOCK) + 4, MIN_BLOCKS)
    specs = [kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("indexer", 132, 1),
             kvc.CacheSpec("mla_auto", 1152, 1), kvc.CacheSpec("kv", 128 * 2, 1, 8)]
    plan = kvc.plan_cache(specs, num_blocks, BLOCK, layout)
    cache = kvc.allocate(plan, device, fill=0)
    mla, idx, auto, kvv = (cache.view(s.name, 0) for s in specs)
    per_call_in = tokens * (1152 + 256 + 2048 + 16)
    sets = max(2, min(MAX_SETS, ROTATE_BYTES // max(per_call_in, 1)))
    xs = [(torch.randn(tokens, 576, generator=gen) * 2).to(torch.bfloat16).to(device) for _ in range(sets)]
    ks = [torch.randn(tokens, 128, generator=gen).to(torch.bfloat16).to(device) for _ in range(sets)]
    keys = [torch.randn(tokens, 8, 128, generator=gen).to(torch.bfloat16).to(device) for _ in range(sets)]
    slots = [torch.randperm(plan.num_slots, generator=gen)[:tokens].to(device) for _ in range(sets)]
    # Reads: one request per 1024 tokens through a shuffled block table.
    lens = [min(1024, tokens - s) for s in range(0, tokens, 1024)]
    width = max(-(-n // BLOCK) for n in lens)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.stack([perm[(r * width + torch.arange(width)) % num_blocks] for r in range(len(lens))]).to(device)
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    out_bf = torch.empty(tokens, 576, dtype=torch.bfloat16, device=device)
    codes = torch.empty(tokens, 128, dtype=torch.uint8, device=device)
    scl = torch.empty(tokens, dtype=torch.float32, device=device)
    for i in range(sets):  # fill the caches so reads see real rows
        kvc.ops.dsa_write(xs[i][:, :512], xs[i][:, 512:], mla, ks[i], idx, slots[i])
    s = lambda i: slots[i % sets]  # noqa: E731
    x = lambda i: xs[i % sets]  # noqa: E731
    k = lambda i: ks[i % sets]  # noqa: E731
    t = tokens
    ops = kvc.ops
    return sets, [
        Case("reshape_and_cache", lambda i: ops.reshape_and_cache(keys[i % sets], kvv, s(i)),
             lambda i: ref.reshape_and_cache(keys[i % sets], kvv, s(i)), t * (2048 * 2 + 8)),
        Case("concat_and_cache_mla", lambda i: ops.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], mla, s(i)),
             lambda i: ref.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], mla, s(i)), t * (1152 + 656 + 8)),
        Case("concat_and_cache_mla_auto", lambda i: ops.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], auto, s(i), "auto"),
             lambda i: ref.concat_and_cache_mla(x(i)[:, :512], x(i)[:, 512:], auto, s(i), "auto"), t * (1152 * 2 + 8)),
        Case("indexer_k_quant_and_cache", lambda i: ops.indexer_k_quant_and_cache(k(i), idx, s(i), "ue8m0", "split"),
             lambda i: ref.indexer_k_quant_and_cache(k(i), idx, s(i), "ue8m0", "split"), t * (256 + 132 + 8)),
        Case("dsa_write", lambda i: ops.dsa_write(x(i)[:, :512], x(i)[:, 512:], mla, k(i), idx, s(i)),
             lambda i: ref.dsa_write(x(i)[:, :512], x(i)[:, 512:], mla, k(i), idx, s(i)),
             t * (1152 + 656 + 256 + 132 + 8)),
        Case("gather_mla", lambda i: ops.gather_mla(mla, table, cu, out=out_bf, validate=False),
             lambda i: ref.gather_mla(mla, table, cu), t * (656 + 1152)),
        Case("gather_mla_slots", lambda i: ops.gather_mla_slots(mla, s(i), out=out_bf, validate=False),
             lambda i: ref.gather_mla_slots(mla, s(i)), t * (656 + 1152 + 8)),
        Case("gather_indexer", lambda i: ops.gather_indexer(idx, table, cu, "split", out=(codes, scl), validate=False),
             lambda i: ref.gather_indexer(idx, table, cu, "split"), t * 2 * 132),
        Case("gather_indexer_slots", lambda i: ops.gather_indexer_slots(idx, s(i), "split", out=(codes, scl), validate=False),
             lambda i: ref.gather_indexer_slots(idx, s(i), "split"), t * (2 * 132 + 8)),
    ]


def block_copy_results(device: torch.device, repeats: int, quick: bool) -> list[dict]:
    """N random blocks device -> (pinned) host and back, block-outer vs layer-outer."""
    rows = []
    specs = [kvc.CacheSpec("mla", 656, 61 if not quick else 8), kvc.CacheSpec("indexer", 132, 61 if not quick else 8)]
    host = torch.device("cpu")
    for layout in ("BLHNC", "LBNHC"):
        plan = kvc.plan_cache(specs, 256, BLOCK, layout)
        gpu = kvc.allocate(plan, device, fill=1)
        cpu = kvc.allocate(plan, host, pin_memory=device.type == "cuda", fill=0)
        for n in (1, 16, 64):
            g = torch.Generator().manual_seed(n)
            mapping = torch.stack([torch.randperm(256, generator=g)[:n],
                                   torch.randperm(256, generator=g)[:n]], 1)
            for direction, (a, b) in (("to_host", (gpu, cpu)), ("to_device", (cpu, gpu))):
                with nvtx(f"copy_blocks {layout} {direction} n={n}"):
                    stats = kvc.copy_blocks(a, b, mapping)
                    us = time_calls([lambda: kvc.copy_blocks(a, b, mapping)], device, repeats, False)
                rows.append({"layout": layout, "direction": direction, "blocks": n,
                             "spans": stats.spans, "bytes": stats.bytes, "us": us,
                             "gbps": stats.bytes / us / 1e3})
    return rows


def try_compile(fn: Callable[[int], object], device: torch.device, repeats: int) -> float | None:
    try:
        compiled = torch.compile(lambda: fn(0))
        return time_calls([compiled], device, max(3, repeats // 4), use_graph=False)
    except Exception as e:  # noqa: BLE001  (report and continue: not every path compiles)
        print(f"  torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        return None


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(results: list[Result], copy_gbps: float, copies: list[dict], meta: dict) -> str:
    lines = [f"# kvcache_ext benchmark: {meta['device_name']}", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}, commit {meta['commit'][:12]}, {meta['date']}",
             f"device copy bandwidth (read + write): {copy_gbps:.1f} GB/s", "",
             "| op | layout | T | us/call | GB/s | % of copy | torch eager us | speed-up | torch.compile us | graph |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in results:
        lines.append(f"| {r.op} | {r.layout} | {r.tokens} | {r.us:.2f} | {r.gbps:.1f} | "
                     f"{r.pct_copy:.0f} | {fmt(r.torch_us, '.1f')} | {fmt(r.speedup, '.1f')} | "
                     f"{fmt(r.compiled_us, '.1f')} | {'yes' if r.graph else 'no'} |")
    lines += ["", "## Block copies (random blocks)", "",
              "| layout | direction | blocks | spans | MB | us | GB/s |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in copies:
        lines.append(f"| {c['layout']} | {c['direction']} | {c['blocks']} | {c['spans']} | "
                     f"{c['bytes'] / 1e6:.2f} | {c['us']:.1f} | {c['gbps']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[Result], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:  # e.g. a GPU machine without it: the table and JSON still get written
        print("matplotlib not installed: no plot")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = sorted({r.op for r in results})
    cols = 3
    fig, axes = plt.subplots(-(-len(ops) // cols), cols, figsize=(5 * cols, 3.2 * -(-len(ops) // cols)),
                             squeeze=False)
    for ax, op in zip(axes.flat, ops):
        for layout in sorted({r.layout for r in results}):
            pts = sorted((r.tokens, r.gbps) for r in results if r.op == op and r.layout == layout)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=layout)
        ax.set_xscale("log", base=2)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="few sizes and repeats (under a minute)")
    p.add_argument("--layouts", default="LBNHC,BLHNC")
    p.add_argument("--sizes", default=None, help="comma-separated T values")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile yardstick")
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/out")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    quick = args.quick
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes else
             [1, 64, 4096, 16384] if quick else [1, 8, 64, 512, 4096, 16384, 65536])
    repeats = args.repeats or (10 if quick else 50)
    compile_ref = not (quick or args.no_compile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)

    meta = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
        "commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "threads": torch.get_num_threads(), "quick": quick, "block_size": BLOCK,
    }
    with nvtx("copy bandwidth"):
        copy_gbps = copy_bandwidth(device, repeats)
    print(f"{meta['device_name']}: copy bandwidth {copy_gbps:.1f} GB/s (read + write)")

    results: list[Result] = []
    for layout in args.layouts.split(","):
        for tokens in sizes:
            graph = device.type == "cuda" and tokens <= 512
            sets, cases = build_cases(layout, tokens, device, gen)
            for case in cases:
                with nvtx(f"{case.name} {layout} T={tokens}"):
                    calls = [lambda i=i: case.kernel(i) for i in range(sets)]
                    us = time_calls(calls, device, repeats, graph)
                    torch_us = compiled_us = None
                    if case.torch_path is not None and (tokens <= 16384 or not quick):
                        torch_us = time_calls([lambda: case.torch_path(0)], device,
                                              max(3, repeats // 5), use_graph=False)
                        if compile_ref and tokens == 16384:  # compiles are slow: one size
                            compiled_us = try_compile(case.torch_path, device, repeats)
                gbps = case.bytes / us / 1e3
                r = Result(case.name, layout, tokens, us, gbps, 100 * gbps / copy_gbps, torch_us,
                           torch_us / us if torch_us else None, compiled_us, graph)
                results.append(r)
                print(f"{r.op:<28}{layout:>7}{tokens:>7}  {us:9.2f} us  {gbps:8.1f} GB/s  "
                      f"{r.pct_copy:5.1f}%  x{r.speedup or 0:6.1f} vs torch")
    copies = block_copy_results(device, repeats, quick)
    for c in copies:
        print(f"copy_blocks {c['layout']} {c['direction']:<9} n={c['blocks']:<3} spans={c['spans']:<5} "
              f"{c['us']:9.1f} us {c['gbps']:7.2f} GB/s")

    tag = f"{'cuda' if device.type == 'cuda' else 'cpu'}{'_quick' if quick else ''}"
    (out / f"bench_{tag}.md").write_text(markdown(results, copy_gbps, copies, meta))
    (out / f"bench_{tag}.json").write_text(json.dumps(
        {"meta": meta, "copy_gbps": copy_gbps, "results": [asdict(r) for r in results],
         "block_copies": copies}, indent=1))
    plot(results, out / f"bench_{tag}.png")
    print(f"wrote {out}/bench_{tag}.md, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
