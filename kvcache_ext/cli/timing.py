"""Timing of op calls: microseconds per call, CUDA events on a GPU (optionally one CUDA graph
replayed), wall clock on the CPU. Used by the demo and by benchmarks/bench_cache_ops.py.

`time_calls` returns the median; `time_samples` returns every sample (a `Timing`: median, min,
p10 / p90, quartiles and the spread), so a figure can say how sure it is; `time_interleaved`
times several things in alternating rounds (an op, then a copy of the same bytes, then the
op again, ...), so that a load that comes and goes during the run weighs on each of them alike
instead of on whichever happened to be measured at the wrong moment.

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
from dataclasses import dataclass, field
from typing import Callable

import torch

_SPIN_MIN_US = 50.0
_CYCLES_PER_US = 2000  # an upper bound on GPU clocks (~2 GHz): a slower clock only spins longer
INTERLEAVE_ROUNDS = 5  # time_interleaved: rounds each thing's samples are split into


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quantile(sorted_samples: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted samples, interpolated linearly between ranks."""
    if not sorted_samples:
        raise ValueError("no samples")
    pos = q * (len(sorted_samples) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


@dataclass
class Timing:
    """Microseconds of one call, per sample. `spread_pct` is the interquartile range as a share
    of the median: robust to one stray sample (a preempted call), large when many samples
    disagree (a machine loaded on and off while it measured)."""
    samples: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.samples)

    def q(self, q: float) -> float:
        return quantile(sorted(self.samples), q)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def spread_pct(self) -> float:
        med = self.median
        return 100 * (self.q(0.75) - self.q(0.25)) / med if med > 0 else 0.0

    def stats(self) -> dict:
        """n, median, min, p10, q1, q3, p90 (microseconds) and spread_pct, for a JSON record."""
        s = sorted(self.samples)
        return {"n": len(s), "median": self.median, "min": s[0], "p10": quantile(s, 0.1),
                "q1": quantile(s, 0.25), "q3": quantile(s, 0.75), "p90": quantile(s, 0.9),
                "spread_pct": self.spread_pct}


class Timer:
    """One thing to time, set up once (warm-up, graph capture, the launch-hiding spin); `take`
    adds samples to `timing`, and may be called several times (see time_interleaved). On a GPU,
    a `name` opens an NVTX range around each call of `take`."""

    def __init__(self, fns: list[Callable[[], object]], device: torch.device, use_graph: bool,
                 hide_launch: bool = True, l2_flush: torch.Tensor | None = None,
                 name: str | None = None):
        self.device, self.l2_flush, self.name = device, l2_flush, name
        self.timing = Timing()
        self.per_launch = 1
        self.spin = 0
        self.next = 0  # the input set of the next sample
        for f in fns:  # warm-up
            f()
        sync(device)
        run = lambda i: fns[i % len(fns)]()  # noqa: E731
        if device.type == "cuda" and use_graph:
            self.per_launch = len(fns)
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i in range(self.per_launch):  # warm-up on the capture stream
                    run(i)
                stream.synchronize()
                with torch.cuda.graph(graph, stream=stream):
                    for i in range(self.per_launch):
                        run(i)
            self.graph = graph  # keep it alive
            run = lambda i: graph.replay()  # noqa: E731
            run(0)
        self.run = run
        if device.type == "cuda" and hide_launch:
            self.spin = int(max(_SPIN_MIN_US, 2 * self._host_us()) * _CYCLES_PER_US)

    def _host_us(self) -> float:
        """The host's time to enqueue one call (median of 3), with the device drained first."""
        samples = []
        for i in range(3):
            sync(self.device)
            t0 = time.perf_counter()
            self.run(i)
            samples.append((time.perf_counter() - t0) * 1e6)
        sync(self.device)
        return statistics.median(samples)

    def take(self, n: int) -> Timing:
        if n > 0 and self.name and self.device.type == "cuda":
            with torch.cuda.nvtx.range(self.name):
                return self._take(n)
        return self._take(n)

    def _take(self, n: int) -> Timing:
        out = self.timing.samples
        for _ in range(n):
            i, self.next = self.next, self.next + 1
            if self.device.type != "cuda":
                t0 = time.perf_counter()
                self.run(i)
                out.append((time.perf_counter() - t0) * 1e6)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if self.l2_flush is not None:
                self.l2_flush.sum()
            if self.spin:
                torch.cuda._sleep(self.spin)  # device busy while the host enqueues what follows
            start.record()
            self.run(i)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / self.per_launch)
        return self.timing


def time_samples(fns: list[Callable[[], object]], device: torch.device, repeats: int,
                 use_graph: bool, hide_launch: bool = True,
                 l2_flush: torch.Tensor | None = None) -> Timing:
    """Every sample of one call (repeats of them); fns are rotated (each a call on other
    inputs). With use_graph on a GPU, one CUDA graph holds a call on every input set and is
    replayed (the sample is the replay's time over the number of calls)."""
    return Timer(fns, device, use_graph, hide_launch, l2_flush).take(repeats)


def time_calls(fns: list[Callable[[], object]], device: torch.device, repeats: int,
               use_graph: bool, hide_launch: bool = True,
               l2_flush: torch.Tensor | None = None) -> float:
    """Median microseconds of one call (see time_samples)."""
    return time_samples(fns, device, repeats, use_graph, hide_launch, l2_flush).median


def time_interleaved(timers: list[tuple[Timer, int]],
                     rounds: int = INTERLEAVE_ROUNDS) -> list[Timing]:
    """(timer, repeats) pairs timed in alternating rounds: each round takes its share of every
    timer's repeats, one timer after the other. Returns each timer's Timing."""
    for r in range(rounds):
        for timer, repeats in timers:
            # round r's share of `repeats`: the shares add up to exactly `repeats`
            timer.take(repeats * (r + 1) // rounds - repeats * r // rounds)
    return [t.timing for t, _ in timers]
