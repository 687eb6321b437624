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
The op, its same-size copy and its torch reference are timed in alternating rounds, so a load
that comes and goes weighs on all three alike; every row reports the spread of the op's samples
(interquartile range / median) and is flagged noisy when that of the op or of a yardstick
exceeds bench_report.NOISY_SPREAD_PCT. The large copy is measured at the start, after every
size and at the end, and the run warns (Markdown header, JSON "warnings", stderr) when it
drifts, when it is far below the machine's usual figure (--usual-copy, by default the committed
benchmarks/results/bench_<device>.json) or when a "% of copy" figure is beyond what an op can
reach (see the bounds in bench_report.py).
Writes a Markdown table and a JSON file (device, torch and CUDA versions, commit, date) as it
goes, and PNG plots at the end, under --out. With --budget-s the run stops measuring when the
time is spent and writes what it has, marked incomplete.
Every case runs inside an NVTX range; see docs/benchmarks.md for the Nsight Systems recipe.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import kvcache_ext as kvc
from kvcache_ext.ops.library import cpu_isa
from kvcache_ext.cli.timing import Timer, Timing, time_interleaved, time_samples

from bench_report import (COPY_BELOW_USUAL_FACTOR, NOISY, NOISY_SPREAD_PCT, Result,
                          copy_summary, other_host, usual_copy, write)
from bench_cases import BLOCK, MAX_SETS, ROTATE_BYTES, build_cases

SIZES = [1, 8, 64, 512, 4096, 16384, 65536]
QUICK_SIZES = [1, 64, 4096, 16384]
COMPILE_T = 16384         # torch.compile is slow to compile: its yardstick is taken at one size


def nvtx(name: str):
    if torch.cuda.is_available():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()


def copy_bytes(device: torch.device) -> int:
    """The size of the large copy whose bandwidth is the run's yardstick."""
    return (1 << 30) if device.type == "cuda" else (256 << 20)


def copy_bandwidth(device: torch.device, repeats: int) -> Timing:
    """Samples (microseconds) of a large device copy of copy_bytes(device); the GB/s count the
    bytes read + written. Taken at several points of a run (see main)."""
    n = copy_bytes(device)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    a.fill_(1)
    return time_samples([lambda: b.copy_(a)], device, max(5, repeats // 4), use_graph=False)


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    """On a GPU, a buffer larger than L2, read before every sample (see kvcache_ext/timing.py)."""
    return torch.ones(ROTATE_BYTES, dtype=torch.uint8, device=device) if device.type == "cuda" else None


def same_size_copy(nbytes: int, graph: bool, device: torch.device,
                   l2_flush: torch.Tensor | None) -> Timer:
    """A timer of a torch copy moving `nbytes` (half read, half written), rotated through a pool
    larger than L2 and timed like the op (graph replay or not): the best a kernel moving that
    many bytes can hope for, launch and ramp-up included. Timed interleaved with the op."""
    half = max(1, nbytes // 2)
    sets = max(2, min(MAX_SETS, ROTATE_BYTES // half))
    src = torch.ones(sets, half, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    calls = [lambda i=i: dst[i].copy_(src[i]) for i in range(sets)]
    return Timer(calls, device, graph, l2_flush=l2_flush, name=f"same-size copy {nbytes} B")


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
                    t = time_samples([lambda: kvc.copy_blocks(a, b, mapping)], device, repeats,
                                     use_graph=False, hide_launch=False).stats()
                rows.append({"layout": layout, "direction": direction, "blocks": n,
                             "spans": stats.spans, "bytes": stats.bytes, "us": t["median"],
                             "gbps": stats.bytes / t["median"] / 1e3, "samples": t["n"],
                             "min_us": t["min"], "q1_us": t["q1"], "q3_us": t["q3"],
                             "spread_pct": t["spread_pct"]})
    return rows


def try_compile(fn: Callable[[int], object], device: torch.device, repeats: int,
                l2_flush: torch.Tensor | None) -> Timing | None:
    try:
        compiled = torch.compile(lambda: fn(0))
        return time_samples([compiled], device, max(3, repeats // 4), use_graph=False,
                            l2_flush=l2_flush)
    except Exception as e:  # noqa: BLE001  (report and continue: not every path compiles)
        print(f"  torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        return None


def git_commit() -> str:
    """HEAD, or KVC_COMMIT where the tree is a copy without .git (the device machine's)."""
    if os.environ.get("KVC_COMMIT"):
        return os.environ["KVC_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def host_name() -> str:
    """The CPU model and core count, so that a CPU run is compared with its own machine's."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


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
    p.add_argument("--usual-copy", default=None, metavar="JSON",
                   help="a previous results file whose copy bandwidth is this machine's usual "
                        "figure (default: benchmarks/results/bench_<device>.json; 'none': no "
                        "comparison)")
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
    # a CPU run capped below the widest row loops (KVC_CPU_ISA=avx2) gets its own files
    isa = cpu_isa() if device.type == "cpu" else None
    capped = f"_{isa}" if isa and os.environ.get("KVC_CPU_ISA") in ("scalar", "avx2") else ""
    tag = f"{'cuda' if device.type == 'cuda' else 'cpu'}{capped}{'_quick' if quick else ''}"

    meta = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
        "commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "threads": torch.get_num_threads(), "quick": quick, "block_size": BLOCK,
        "repeats": repeats, "complete": False, "stopped": "running",
        "host": host_name(), "copy_bytes": copy_bytes(device), "cpu_isa": isa,
    }
    # The machine's usual copy bandwidth, read before this run may overwrite the file.
    usual_path = (Path(__file__).resolve().parent / "results" / f"bench_{device.type}.json"
                  if args.usual_copy is None else None if args.usual_copy == "none"
                  else Path(args.usual_copy))
    usual = usual_copy(usual_path, meta) if usual_path else None
    meta["usual_copy_other_host"] = other_host(usual_path, meta) if usual_path else None
    checkpoints: list[tuple[str, list[float]]] = []  # the large copy's samples, through the run

    def copy_checkpoint(at: str) -> dict:
        with nvtx(f"copy bandwidth ({at})"):
            checkpoints.append((at, copy_bandwidth(device, repeats).samples))
        return copy_summary(checkpoints, meta["copy_bytes"])

    copy = copy_checkpoint("start")
    print(f"{meta['device_name']}: copy bandwidth {copy['gbps']:.1f} GB/s (read + write), "
          f"spread {copy['spread_pct']:.0f} %"
          + (f"; usual {usual['gbps']:.1f} GB/s ({usual['source']})" if usual else ""))
    if usual and copy["gbps"] * COPY_BELOW_USUAL_FACTOR < usual["gbps"]:
        print("warning: the copy bandwidth is far below this machine's usual figure: is the "
              "machine loaded? (see the warnings at the end)", file=sys.stderr)
    l2_flush = l2_flush_buffer(device)  # calls find their data in DRAM, not in L2
    results: list[Result] = []
    copies: list[dict] = []

    def save(with_plot: bool = False) -> list[str]:
        return write(out, tag, results, copy, copies, meta, with_plot, usual)

    for layout in args.layouts.split(","):
        for tokens in sizes:
            if budget.spent():
                break
            graph = device.type == "cuda" and tokens <= 512
            sets, cases = build_cases(layout, tokens, device, gen)
            for case in cases:
                name = f"{case.name} {layout} T={tokens}"
                calls = [lambda i=i: case.kernel(i) for i in range(sets)]
                # The op, a copy of the same bytes and the torch reference, in alternating
                # rounds: a passing load weighs on all three, not on one of them.
                timers = [(Timer(calls, device, graph, l2_flush=l2_flush, name=name), repeats),
                          (same_size_copy(case.bytes, graph, device, l2_flush), repeats)]
                if case.torch_path is not None and (tokens <= 16384 or not quick):
                    timers.append((Timer([lambda: case.torch_path(0)], device, False,
                                         l2_flush=l2_flush, name=f"torch {name}"),
                                   max(3, repeats // 5)))
                with nvtx(name):
                    op_t, copy_t, *torch_t = time_interleaved(timers)
                del timers
                us, copy_us = op_t.median, copy_t.median
                torch_us = torch_t[0].median if torch_t else None
                gbps = case.bytes / us / 1e3
                r = Result(case.name, layout, tokens, us, case.bytes, gbps,
                           100 * gbps / copy["gbps"], copy_us, 100 * copy_us / us, torch_us,
                           torch_us / us if torch_us else None, None, graph,
                           copy_spread_pct=copy_t.spread_pct,
                           torch_spread_pct=torch_t[0].spread_pct if torch_t else None)
                r.set_stats(op_t.stats())
                results.append(r)
                spreads = [op_t.spread_pct, copy_t.spread_pct] + [t.spread_pct for t in torch_t]
                print(f"{r.op:<28}{layout:>7}{tokens:>7}  {us:9.2f} us "
                      f"±{r.spread_pct:3.0f}%{' ' + NOISY if max(spreads) > NOISY_SPREAD_PCT else '  '}"
                      f"  {gbps:8.1f} GB/s  {r.pct_copy:5.1f}% of copy BW  "
                      f"{r.pct_same_copy:5.1f}% of same-size copy  "
                      f"x{r.speedup or 0:6.1f} vs torch", flush=True)
            del cases
            copy = copy_checkpoint(f"{layout} T={tokens}")
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
                    compiled = try_compile(case.torch_path, device, repeats, l2_flush)
                compiled_us = compiled.median if compiled else None
                for r in results:
                    if (r.op, r.layout, r.tokens) == (case.name, layout, COMPILE_T):
                        r.compiled_us = compiled_us
                        r.compiled_spread_pct = compiled.spread_pct if compiled else None
                print(f"torch.compile {case.name:<28}{layout:>7}  "
                      f"{'-' if compiled_us is None else f'{compiled_us:.2f} us'}", flush=True)
                save()

    meta["complete"] = not budget.hit
    meta["stopped"] = ("finished" if meta["complete"] else
                       f"the {args.budget_s:.0f} s budget ran out after {len(results)} cases")
    copy = copy_checkpoint("end")
    warnings = save(with_plot=True)
    noisy = sum(r.noisy for r in results) + sum(c["noisy"] for c in copies)
    if noisy:
        print(f"{noisy} noisy row(s) (spread over {NOISY_SPREAD_PCT:.0f} %), flagged {NOISY} in "
              f"the table", file=sys.stderr)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {out}/bench_{tag}.md, .json, .png ({meta['stopped']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
