"""Benchmark every write, gather and block-copy op against the memory system and the torch path.

    python benchmarks/bench_cache_ops.py [--quick] [--device cuda|cpu] [--out DIR] [--budget-s S]

For each op, layout (LBNHC and BLHNC by default, block size 64) and T in
{1, 8, 64, 512, 4096, 16384, 65536}: microseconds per call (median of many repeats after a
warm-up; CUDA events around device work only, see kvcache_ext/timing.py, with CUDA-graph replay
for T <= 512; inputs rotated through up to 64 copies and, on a GPU, the L2 cache flushed by a
256 MiB read before every sample, so calls find their data in DRAM), GB/s
counting bytes read + written once, that as a share of the device's copy bandwidth measured in
the same run (a 1 GiB copy) and against a torch copy of the same bytes timed the same way, and
the speed-up over the pure-torch reference (eager; torch.compile at T = 16384, measured last).
Writes a Markdown table and a JSON file (device, torch and CUDA versions, commit, date) as it
goes, and PNG plots at the end, under --out. With --budget-s the run stops measuring when the
time is spent and writes what it has, marked incomplete.
Every case runs inside an NVTX range; see README.md for the Nsight Systems recipe.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref
from kvcache_ext.timing import time_calls

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import Result, write  # noqa: E402

BLOCK = 64
ROTATE_BYTES = 256 << 20  # inputs rotated through at least this much memory (> L2 on any GPU)
MAX_SETS = 64             # ... or through this many input sets, whichever is fewer
MIN_BLOCKS = 2048         # a serving-sized cache (~0.5 GB here): rows land in cold memory
SIZES = [1, 8, 64, 512, 4096, 16384, 65536]
QUICK_SIZES = [1, 64, 4096, 16384]
COMPILE_T = 16384         # torch.compile is slow to compile: its yardstick is taken at one size


def nvtx(name: str):
    if torch.cuda.is_available():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()


def copy_bandwidth(device: torch.device, repeats: int) -> tuple[float, int]:
    """GB/s of a large device copy (bytes read + written), and the bytes copied."""
    n = (1 << 30) if device.type == "cuda" else (256 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    a.fill_(1)
    us = time_calls([lambda: b.copy_(a)], device, max(5, repeats // 4), use_graph=False)
    return 2 * n / us / 1e3, n


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    """On a GPU, a buffer larger than L2, read before every sample (see kvcache_ext/timing.py)."""
    return torch.ones(ROTATE_BYTES, dtype=torch.uint8, device=device) if device.type == "cuda" else None


class SameSizeCopy:
    """Microseconds of a torch copy moving `nbytes` (half read, half written), rotated through
    a pool larger than L2 and timed like the op (graph replay or not): the best a kernel moving
    that many bytes can hope for, launch and ramp-up included."""

    def __init__(self, device: torch.device, repeats: int, l2_flush: torch.Tensor | None):
        self.device, self.repeats, self.l2_flush = device, repeats, l2_flush
        self.measured: dict[tuple[int, bool], float] = {}

    def us(self, nbytes: int, graph: bool) -> float:
        half = max(1, nbytes // 2)
        if (half, graph) not in self.measured:
            sets = max(2, min(MAX_SETS, ROTATE_BYTES // half))
            src = torch.ones(sets, half, dtype=torch.uint8, device=self.device)
            dst = torch.empty_like(src)
            calls = [lambda i=i: dst[i].copy_(src[i]) for i in range(sets)]
            self.measured[(half, graph)] = time_calls(calls, self.device, self.repeats, graph,
                                                      l2_flush=self.l2_flush)
        return self.measured[(half, graph)]


@dataclass
class Case:
    name: str
    kernel: Callable[[int], object]      # call on input set i
    torch_path: Callable[[int], object] | None
    bytes: int


def build_cases(layout: str, tokens: int, device: torch.device,
                gen: torch.Generator) -> tuple[int, list[Case]]:
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
    """N random blocks device -> (pinned) host and back, block-outer vs layer-outer. Timed as
    the caller waits for it, the host's issue of every span included."""
    rows = []
    layers = 8 if quick else 61
    specs = [kvc.CacheSpec("mla", 656, layers), kvc.CacheSpec("indexer", 132, layers)]
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
                    us = time_calls([lambda: kvc.copy_blocks(a, b, mapping)], device, repeats,
                                    use_graph=False, hide_launch=False)
                rows.append({"layout": layout, "direction": direction, "blocks": n,
                             "spans": stats.spans, "bytes": stats.bytes, "us": us,
                             "gbps": stats.bytes / us / 1e3})
    return rows


def try_compile(fn: Callable[[int], object], device: torch.device, repeats: int,
                l2_flush: torch.Tensor | None) -> float | None:
    try:
        compiled = torch.compile(lambda: fn(0))
        return time_calls([compiled], device, max(3, repeats // 4), use_graph=False,
                          l2_flush=l2_flush)
    except Exception as e:  # noqa: BLE001  (report and continue: not every path compiles)
        print(f"  torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        return None


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@dataclass
class Budget:
    seconds: float | None
    start: float
    hit: bool = False  # a step was skipped for want of time

    def spent(self) -> bool:
        if self.seconds is not None and time.monotonic() - self.start > self.seconds:
            self.hit = True
        return self.hit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="few sizes and repeats (under a minute)")
    p.add_argument("--layouts", default="LBNHC,BLHNC")
    p.add_argument("--sizes", default=None, help="comma-separated T values")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile yardstick")
    p.add_argument("--no-block-copies", action="store_true", help="skip the block-copy benchmark")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop measuring after this many seconds and write what was measured")
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/out")
    args = p.parse_args(argv)

    budget = Budget(args.budget_s, time.monotonic())
    device = torch.device(args.device)
    quick = args.quick
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else QUICK_SIZES if quick else SIZES
    repeats = args.repeats or (10 if quick else 50)
    compile_ref = not (quick or args.no_compile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tag = f"{'cuda' if device.type == 'cuda' else 'cpu'}{'_quick' if quick else ''}"

    meta = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
        "commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "threads": torch.get_num_threads(), "quick": quick, "block_size": BLOCK,
        "repeats": repeats, "complete": False, "stopped": "running",
    }
    with nvtx("copy bandwidth"):
        copy_gbps, meta["copy_bytes"] = copy_bandwidth(device, repeats)
    print(f"{meta['device_name']}: copy bandwidth {copy_gbps:.1f} GB/s (read + write)")
    l2_flush = l2_flush_buffer(device)  # calls find their data in DRAM, not in L2
    same_size = SameSizeCopy(device, repeats, l2_flush)
    results: list[Result] = []
    copies: list[dict] = []

    def save(with_plot: bool = False) -> None:
        write(out, tag, results, copy_gbps, copies, meta, with_plot)

    for layout in args.layouts.split(","):
        for tokens in sizes:
            if budget.spent():
                break
            graph = device.type == "cuda" and tokens <= 512
            sets, cases = build_cases(layout, tokens, device, gen)
            for case in cases:
                with nvtx(f"{case.name} {layout} T={tokens}"):
                    calls = [lambda i=i: case.kernel(i) for i in range(sets)]
                    us = time_calls(calls, device, repeats, graph, l2_flush=l2_flush)
                    torch_us = None
                    if case.torch_path is not None and (tokens <= 16384 or not quick):
                        torch_us = time_calls([lambda: case.torch_path(0)], device,
                                              max(3, repeats // 5), use_graph=False,
                                              l2_flush=l2_flush)
                with nvtx(f"same-size copy {case.bytes} B"):
                    copy_us = same_size.us(case.bytes, graph)
                gbps = case.bytes / us / 1e3
                r = Result(case.name, layout, tokens, us, case.bytes, gbps, 100 * gbps / copy_gbps,
                           copy_us, 100 * copy_us / us, torch_us,
                           torch_us / us if torch_us else None, None, graph)
                results.append(r)
                print(f"{r.op:<28}{layout:>7}{tokens:>7}  {us:9.2f} us  {gbps:8.1f} GB/s  "
                      f"{r.pct_copy:5.1f}% of copy BW  {r.pct_same_copy:5.1f}% of same-size copy  "
                      f"x{r.speedup or 0:6.1f} vs torch", flush=True)
            del cases
            save()

    if not args.no_block_copies and not budget.spent():
        copies = block_copy_results(device, repeats, quick)
        for c in copies:
            print(f"copy_blocks {c['layout']} {c['direction']:<9} n={c['blocks']:<3} "
                  f"spans={c['spans']:<5} {c['us']:9.1f} us {c['gbps']:7.2f} GB/s")
        save()

    if compile_ref and COMPILE_T in sizes:  # last: the slowest yardstick to set up
        for layout in args.layouts.split(","):
            if budget.spent():
                break
            _, cases = build_cases(layout, COMPILE_T, device, gen)
            for case in cases:
                if budget.spent() or case.torch_path is None:
                    continue
                with nvtx(f"torch.compile {case.name} {layout} T={COMPILE_T}"):
                    compiled_us = try_compile(case.torch_path, device, repeats, l2_flush)
                for r in results:
                    if (r.op, r.layout, r.tokens) == (case.name, layout, COMPILE_T):
                        r.compiled_us = compiled_us
                print(f"torch.compile {case.name:<28}{layout:>7}  "
                      f"{'-' if compiled_us is None else f'{compiled_us:.2f} us'}", flush=True)
                save()

    meta["complete"] = not budget.hit
    meta["stopped"] = ("finished" if meta["complete"] else
                       f"the {args.budget_s:.0f} s budget ran out after {len(results)} cases")
    save(with_plot=True)
    print(f"wrote {out}/bench_{tag}.md, .json, .png ({meta['stopped']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
