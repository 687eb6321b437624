"""The torch.profiler route, for machines without Nsight Systems: every op of the benchmark at a
few sizes under torch.profiler, reporting each kernel's device time as CUPTI measured it next
to the CUDA-event time the benchmark reports. The two should agree; a gap means the event
timing counts something besides the kernel.

    python benchmarks/profile_ops.py [--sizes 64,16384] [--layout BLHNC] [--out DIR]

Writes profile_<device>.md and profile_<device>.json under --out, and a Chrome trace
(profile_<device>_trace.json) with --trace. On a CPU the table holds the ops' CPU time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kvcache_ext.cli.timing import sync, time_calls

from bench_cache_ops import build_cases, l2_flush_buffer


def device_us(evt) -> float:
    """Total device time of a profiler event, across torch versions."""
    for name in ("device_time_total", "cuda_time_total"):
        if hasattr(evt, name):
            return float(getattr(evt, name))
    return 0.0


def is_kernel(evt) -> bool:
    """A device-side event (a kernel or a copy), not a CPU op that launched one."""
    kind = getattr(evt, "device_type", None)
    if kind is not None:
        return kind == torch.autograd.DeviceType.CUDA
    return evt.cpu_time_total == 0


def profile_case(fns: list, device: torch.device, calls: int,
                 l2_flush: torch.Tensor | None) -> list[dict]:
    """Kernels (or, on a CPU, ops) run by `calls` calls rotated over fns (as the benchmark
    rotates its input sets, and with its L2 flush between calls), with average microseconds."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        for i in range(calls):
            if l2_flush is not None:
                l2_flush.sum()
            fns[i % len(fns)]()
        sync(device)
    rows = []
    for evt in prof.key_averages():
        if device.type == "cuda":
            if device_us(evt) <= 0 or not is_kernel(evt):
                continue
            rows.append({"name": evt.key, "count": evt.count, "avg_us": device_us(evt) / evt.count})
        elif evt.key.startswith("kvcache_ext::"):
            rows.append({"name": evt.key, "count": evt.count, "avg_us": evt.cpu_time_total / evt.count})
    return sorted(rows, key=lambda r: -r["avg_us"] * r["count"])


def ours(kernels: list[dict]) -> dict | None:
    """The op's own kernel (not the L2 flush's reduction)."""
    return next((k for k in kernels if "kvc" in k["name"]), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", default="64,16384")
    p.add_argument("--layout", default="BLHNC")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--trace", action="store_true", help="also write a Chrome trace of one case set")
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/out")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tag = device.type
    l2_flush = l2_flush_buffer(device)
    record = []
    lines = [f"# kvcache_ext under torch.profiler: "
             f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}", "",
             f"torch {torch.__version__}, layout {args.layout}, {args.calls} calls per case; "
             "event us: the benchmark's median (CUDA events around device work; wall clock on a CPU)", "",
             "| op | T | event us | kernel / op | calls | profiler avg us |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    for tokens in (int(s) for s in args.sizes.split(",")):
        sets, cases = build_cases(args.layout, tokens, device, gen)
        for case in cases:
            fns = [lambda i=i: case.kernel(i) for i in range(sets)]
            event_us = time_calls(fns, device, args.calls, use_graph=False, l2_flush=l2_flush)
            kernels = profile_case(fns, device, args.calls, l2_flush)
            record.append({"op": case.name, "tokens": tokens, "event_us": event_us, "kernels": kernels})
            for k in kernels or [{"name": "(none recorded)", "count": 0, "avg_us": 0.0}]:
                name = k["name"] if len(k["name"]) < 70 else k["name"][:67] + "..."
                lines.append(f"| {case.name} | {tokens} | {event_us:.2f} | `{name}` | {k['count']} | "
                             f"{k['avg_us']:.2f} |")
            top = ours(kernels)["avg_us"] if ours(kernels) else float("nan")
            print(f"{case.name:<28}{tokens:>7}  event {event_us:9.2f} us  profiler {top:9.2f} us",
                  flush=True)
        if args.trace:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities) as prof:
                for case in cases:
                    case.kernel(0)
                sync(device)
            prof.export_chrome_trace(str(out / f"profile_{tag}_trace.json"))
        del cases
    ratios = [r["event_us"] / ours(r["kernels"])["avg_us"] for r in record
              if ours(r["kernels"]) and ours(r["kernels"])["avg_us"] > 0]
    if ratios:
        lines += ["", f"event / profiler time: median {statistics.median(ratios):.2f}, "
                      f"range {min(ratios):.2f} to {max(ratios):.2f}"]
    (out / f"profile_{tag}.md").write_text("\n".join(lines) + "\n")
    (out / f"profile_{tag}.json").write_text(json.dumps(
        {"torch": torch.__version__, "layout": args.layout, "cases": record}, indent=1))
    print(f"wrote {out}/profile_{tag}.md, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
