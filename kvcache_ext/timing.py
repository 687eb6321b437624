"""Timing of op calls: median microseconds, CUDA events on a GPU (optionally one CUDA graph
replayed), wall clock on the CPU. Used by the demo and by benchmarks/bench_cache_ops.py.

On a GPU, an event recorded on an idle device fires at once, so timing a single call between
two events would count the host's launch cost (Python, the dispatcher, argument checks) as
device time: at T = 16384 that is as long as the kernel itself. With `hide_launch` (the
default) a spin kernel is queued ahead of the start event, long enough to cover the host's
enqueue of the timed call, so the events bracket the device work alone. Pass
`hide_launch=False` to time what the caller waits for, host issue included (block copies,
whose cost is the number of spans the host issues).

`l2_flush`, a device buffer larger than the L2 cache, is read before every sample, so that each
call (every call of a replayed graph too) finds its inputs and cache rows in DRAM, not in L2.
A read leaves clean lines, which cost nothing to evict, where a write would leave dirty lines
to be written back during the timed call.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

_SPIN_MIN_US = 50.0
_CYCLES_PER_US = 2000  # an upper bound on GPU clocks (~2 GHz): a slower clock only spins longer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_us(run: Callable[[int], object], device: torch.device) -> float:
    """The host's time to enqueue one call (median of 3), with the device drained first."""
    samples = []
    for i in range(3):
        sync(device)
        t0 = time.perf_counter()
        run(i)
        samples.append((time.perf_counter() - t0) * 1e6)
    sync(device)
    return statistics.median(samples)


def time_calls(fns: list[Callable[[], object]], device: torch.device, repeats: int,
               use_graph: bool, hide_launch: bool = True,
               l2_flush: torch.Tensor | None = None) -> float:
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
    spin = 0
    if hide_launch:
        spin = int(max(_SPIN_MIN_US, 2 * _host_us(run, device)) * _CYCLES_PER_US)
    samples = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if l2_flush is not None:
            l2_flush.sum()
        if spin:
            torch.cuda._sleep(spin)  # device busy while the host enqueues what follows
        start.record()
        run(i)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / per_launch)
    return statistics.median(samples)
