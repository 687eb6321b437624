"""Timing of op calls: median microseconds, CUDA events on a GPU (optionally one CUDA graph
replayed), wall clock on the CPU. Used by the demo and by benchmarks/bench_cache_ops.py."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fns: list[Callable[[], object]], device: torch.device, repeats: int,
               use_graph: bool) -> float:
    """Median microseconds of one call; fns are rotated (each a call on other inputs). With
    use_graph, one CUDA graph holds a call on every input set and is replayed."""
    for f in fns:  # warm-up
        f()
    sync(device)
    if device.type != "cuda":
        samples = []
        for i in range(repeats):
            t0 = time.perf_counter()
            fns[i % len(fns)]()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    per_launch = 1
    run = lambda i: fns[i % len(fns)]()  # noqa: E731
    if use_graph:
        per_launch = len(fns)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for i in range(per_launch):  # warm-up on the capture stream
                run(i)
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for i in range(per_launch):
                    run(i)
        run = lambda i: graph.replay()  # noqa: E731
        run(0)
    samples = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(i)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / per_launch)
    return statistics.median(samples)
