"""Output of bench_cache_ops.py: the Markdown table, the JSON record and the PNG plots, with
how sure each figure is: the spread of its samples, a flag on noisy rows, and the run's
warnings about its copy yardstick."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvcache_ext.cli.timing import Timing

# A row is noisy when the interquartile range of one of its timings' samples exceeds this share
# of their median. Repeats of the same call on an idle machine agree within a few per cent; a
# machine loaded on and off while it measured spreads them far wider. 20 % is wider than any
# margin the targets are judged on, so a noisy row can pass or fail a target by chance.
NOISY_SPREAD_PCT = 20.0

# The copy yardstick (the large copy's GB/s) is measured at the start, after every size and at
# the end. On an idle machine those agree within a few tens of per cent at worst; a slowest and
# fastest further apart than this factor mean something else used the memory system meanwhile.
COPY_DRIFT_FACTOR = 1.5
# A yardstick more than this factor below the machine's usual figure (the committed results file
# of the same device) makes every "% of copy" figure of the run look better than it is.
COPY_BELOW_USUAL_FACTOR = 1.5

# An op cannot move its bytes much faster than a copy of the same bytes: above these bounds a
# "% of copy" figure says the copy yardstick was slowed (a loaded machine gave "51274 % of
# same-size copy" and "359 % of copy BW"), not that the op is fast. On a GPU the L2 is flushed
# before every sample, so an op's data comes from DRAM like the 1 GiB copy's: 150 % leaves room
# for a kernel that beats torch's copy, and for noise. On a CPU an op's rows at small T stay in
# the caches while the 256 MiB copy streams from DRAM: the committed idle 2-core run peaks at
# 187 % of the copy bandwidth (gather_indexer, T = 4096) and 219 % of a same-size copy, hence
# the wider CPU bound.
MAX_PCT_COPY = {"cuda": 150.0, "cpu": 250.0}
MAX_PCT_SAME_COPY = 300.0

NOISY = "⚠"


@dataclass
class Result:
    op: str
    layout: str
    tokens: int
    us: float                  # median device time of one call
    bytes: int                 # read + written once
    gbps: float
    pct_copy: float            # of the large-copy bandwidth measured in the same run
    copy_us: float             # a torch copy moving the same bytes, timed the same way
    pct_same_copy: float       # copy_us / us: how close to a copy of this size
    torch_us: float | None     # the pure-torch reference, eager
    speedup: float | None
    compiled_us: float | None  # the reference under torch.compile (T = 16384 only)
    graph: bool                # timed as CUDA-graph replay
    # The op's samples (microseconds): how many, the fastest, p10 / quartiles / p90, and the
    # spread: interquartile range / median, in per cent.
    samples: int = 0
    min_us: float | None = None
    p10_us: float | None = None
    q1_us: float | None = None
    q3_us: float | None = None
    p90_us: float | None = None
    spread_pct: float | None = None
    copy_spread_pct: float | None = None      # of the same-size copy's samples
    torch_spread_pct: float | None = None     # of the eager reference's
    compiled_spread_pct: float | None = None  # of the torch.compile reference's
    noisy: bool = False                       # set by mark_noisy: a spread over NOISY_SPREAD_PCT
    noisy_in: list[str] = field(default_factory=list)  # ... of these timings

    def set_stats(self, stats: dict) -> None:
        """The op's sample statistics, from kvcache_ext.cli.timing.Timing.stats()."""
        self.samples = stats["n"]
        self.min_us, self.p10_us, self.q1_us = stats["min"], stats["p10"], stats["q1"]
        self.q3_us, self.p90_us, self.spread_pct = stats["q3"], stats["p90"], stats["spread_pct"]


def noisy_in(r: Result) -> list[str]:
    """The timings of a row whose spread exceeds NOISY_SPREAD_PCT."""
    spreads = {"op": r.spread_pct, "same-size copy": r.copy_spread_pct,
               "torch": r.torch_spread_pct, "torch.compile": r.compiled_spread_pct}
    return [k for k, v in spreads.items() if v is not None and v > NOISY_SPREAD_PCT]


def mark_noisy(results: list[Result], copies: list[dict]) -> None:
    for r in results:
        r.noisy_in = noisy_in(r)
        r.noisy = bool(r.noisy_in)
    for c in copies:
        c["noisy"] = c.get("spread_pct") is not None and c["spread_pct"] > NOISY_SPREAD_PCT


@dataclass
class Target:
    name: str
    met: bool | None  # None: nothing measured that it applies to
    detail: str       # the cases that miss it, or the closest case; noisy ones say so
    noisy_passes: list[str] = field(default_factory=list)  # noisy cases counted as meeting it


# Ops whose rows are fp8 (quantizing writes, dequantizing gathers), and the indexer's 132-byte ops.
FP8_OPS = ("reshape_and_cache_fp8", "concat_and_cache_mla_fp8", "concat_and_cache_mla",
           "indexer_k_quant_and_cache", "dsa_write", "gather_mla", "gather_mla_slots")
INDEXER_OPS = ("indexer_k_quant_and_cache", "gather_indexer", "gather_indexer_slots",
               "mxfp4_quant_and_cache", "gather_v4_slots_mxfp4")  # short rows: 132 and 68 B


def targets(results: list[Result], device_type: str) -> list[Target]:
    """The performance targets of the project (issue 5), checked on this run's figures. A noisy
    case is named "(noisy)" wherever it is mentioned, and the noisy cases counted as meeting a
    target are listed, so that no target is met on noisy figures without saying so."""
    def label(r: Result) -> str:
        return f"{r.op} {r.layout} T={r.tokens}"

    def check(name: str, cases: list[Result], ok, show) -> Target:
        if not cases:
            return Target(name, None, "not measured in this run")
        mark = lambda r: " (noisy)" if noisy_in(r) else ""  # noqa: E731
        misses = [r for r in cases if not ok(r)]
        worst = misses or [min(cases, key=lambda r: show(r)[0])]
        text = ", ".join(f"{label(r)}: {show(r)[1]}{mark(r)}" for r in worst[:12])
        more = f" (+{len(misses) - 12} more)" if len(misses) > 12 else ""
        noisy_passes = [label(r) for r in cases if ok(r) and noisy_in(r)]
        detail = ("misses: " if misses else "closest: ") + text + more
        if noisy_passes:
            detail += (f"; {len(noisy_passes)} of the cases counted as meeting it are noisy: "
                       + ", ".join(f"{n} (noisy)" for n in noisy_passes[:12])
                       + (f" (+{len(noisy_passes) - 12} more)" if len(noisy_passes) > 12 else ""))
        return Target(name, not misses, detail, noisy_passes)

    at_16k = [r for r in results if r.tokens == 16384 and r.speedup is not None]
    pct = lambda r: (r.pct_copy, f"{r.pct_copy:.0f}% ({r.pct_same_copy:.0f}% of a same-size copy)")  # noqa: E731
    if device_type != "cuda":
        fp8 = [r for r in results if r.tokens == 16384 and r.op in FP8_OPS]
        return [check("CPU: >= 5x the torch reference at T = 16384", at_16k,
                      lambda r: r.speedup >= 5, lambda r: (r.speedup, f"{r.speedup:.1f}x")),
                check("CPU: fp8 writes and dequantizing gathers >= 50% of the copy bandwidth at "
                      "T = 16384", fp8, lambda r: r.pct_copy >= 50, pct)]
    big = [r for r in results if r.tokens >= 16384 and r.pct_copy is not None]
    return [
        check("CUDA: MLA-row writes and gathers >= 85% of the copy bandwidth at T >= 16384",
              [r for r in big if r.op not in INDEXER_OPS], lambda r: r.pct_copy >= 85, pct),
        check("CUDA: indexer (132 / 68-byte) writes and gathers >= 70% of the copy bandwidth at "
              "T >= 16384",
              [r for r in big if r.op in INDEXER_OPS], lambda r: r.pct_copy >= 70, pct),
        check("CUDA: <= 5 us per call at T <= 64 under graph replay",
              [r for r in results if r.tokens <= 64 and r.graph], lambda r: r.us <= 5,
              lambda r: (-r.us, f"{r.us:.2f} us")),
        check("CUDA: >= 10x the eager torch path at T = 16384", at_16k,
              lambda r: r.speedup >= 10, lambda r: (r.speedup, f"{r.speedup:.1f}x")),
    ]


def copy_summary(checkpoints: list[tuple[str, list[float]]], nbytes: int) -> dict:
    """The copy yardstick of a run from its checkpoints: (where in the run, the large copy's
    samples there in microseconds). GB/s count read + write; the run's figure is that of the
    median of all samples, the spread theirs too."""
    gbps = lambda us: 2 * nbytes / us / 1e3  # noqa: E731
    points = []
    for at, samples in checkpoints:
        t = Timing(list(samples))
        points.append({"at": at, "gbps": gbps(t.median), "n": t.n, "spread_pct": t.spread_pct})
    pooled = Timing([s for _, samples in checkpoints for s in samples])
    return {"bytes": nbytes, "gbps": gbps(pooled.median) if pooled.n else None,
            "samples": pooled.n, "spread_pct": pooled.spread_pct if pooled.n else None,
            "checkpoints": points}


def usual_copy(path: Path, meta: dict) -> dict | None:
    """The machine's usual copy bandwidth: that of a previous results file (normally the
    committed benchmarks/results/bench_<device>.json) of the same device, copy size and, where
    both record it, host. None when there is none to compare with."""
    try:
        old = json.loads(Path(path).read_text())
        om = old["meta"]
        gbps = float(old["copy_gbps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if om.get("device_name") != meta.get("device_name") or om.get("copy_bytes") != meta.get("copy_bytes"):
        return None
    if om.get("host") and meta.get("host") and om["host"] != meta["host"]:
        return None
    try:  # named from the repository's root where it lies inside it
        source = str(Path(path).resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        source = str(path)
    return {"gbps": gbps, "source": source, "commit": om.get("commit", "unknown"),
            "date": om.get("date", "unknown")}


def other_host(path: Path | None, meta: dict) -> dict | None:
    """A previous results file of the same device and copy size measured on another host: its
    host and figure, reported as such and never compared (None when there is none)."""
    try:
        old = json.loads(Path(path).read_text())
        om = old["meta"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (om.get("device_name") != meta.get("device_name") or om.get("copy_bytes") != meta.get("copy_bytes")
            or not om.get("host") or not meta.get("host") or om["host"] == meta["host"]):
        return None
    return {"host": om["host"], "gbps": old.get("copy_gbps"), "source": str(path)}


def run_warnings(results: list[Result], copy: dict, usual: dict | None,
                 device_type: str) -> list[str]:
    """What makes this run's figures doubtful, each warning named by the check that raised it:
    the copy yardstick drifting during the run, far below the machine's usual figure, or noisy,
    and "% of copy" figures no op could reach against an honest yardstick."""
    out = []
    points = [p for p in copy.get("checkpoints", []) if p["gbps"]]
    if len(points) >= 2:
        lo = min(points, key=lambda p: p["gbps"])
        hi = max(points, key=lambda p: p["gbps"])
        if hi["gbps"] > COPY_DRIFT_FACTOR * lo["gbps"]:
            out.append(
                f"copy yardstick drift: the large copy ran at {points[0]['gbps']:.1f} GB/s at the "
                f"start and {points[-1]['gbps']:.1f} GB/s at the {points[-1]['at']}, "
                f"{lo['gbps']:.1f} GB/s at its slowest ({lo['at']}) and {hi['gbps']:.1f} GB/s at "
                f"its fastest ({hi['at']}): {hi['gbps'] / lo['gbps']:.1f}x apart, over the "
                f"{COPY_DRIFT_FACTOR}x bound; the machine's load changed during the run")
    if usual and copy.get("gbps") and copy["gbps"] * COPY_BELOW_USUAL_FACTOR < usual["gbps"]:
        out.append(
            f"copy yardstick far below usual: {copy['gbps']:.1f} GB/s in this run against "
            f"{usual['gbps']:.1f} GB/s in {usual['source']} (commit {usual['commit'][:12]}, "
            f"{usual['date'][:10]}), over {COPY_BELOW_USUAL_FACTOR}x less; the machine is "
            f"probably loaded, and every '% of copy' figure of this run is too high")
    shaky = [p for p in points if p["spread_pct"] > NOISY_SPREAD_PCT]
    if shaky:  # samples taken together that disagree (a drift between points is the above)
        out.append(
            "noisy copy yardstick: the large copy's samples spread "
            + ", ".join(f"{p['spread_pct']:.0f} % at {'the ' * (p['at'] in ('start', 'end'))}{p['at']}"
                        for p in shaky)
            + f" (interquartile range / median), over {NOISY_SPREAD_PCT:.0f} %")
    for key, bound, what in (
            ("pct_copy", MAX_PCT_COPY.get(device_type, MAX_PCT_COPY["cuda"]), "of the copy bandwidth"),
            ("pct_same_copy", MAX_PCT_SAME_COPY, "of a same-size copy")):
        over = [r for r in results if getattr(r, key) > bound]
        if over:
            worst = max(over, key=lambda r: getattr(r, key))
            out.append(
                f"implausible % {what}: {len(over)} row(s) above {bound:.0f} % (highest: "
                f"{worst.op} {worst.layout} T={worst.tokens}, {getattr(worst, key):.0f} %); an op "
                f"cannot move its bytes much faster than a copy of them, so the copy yardstick "
                f"was slowed (a loaded machine) and these rows' '% of copy' figures are wrong")
    return out


def _fmt(v: float | None, f: str) -> str:
    return "-" if v is None else format(v, f)


def _spread_cell(r: Result) -> str:
    cell = _fmt(r.spread_pct, ".0f")
    if r.noisy:
        others = {"same-size copy": r.copy_spread_pct, "torch": r.torch_spread_pct,
                  "torch.compile": r.compiled_spread_pct}
        why = ", ".join(f"{k} {others[k]:.0f}" for k in r.noisy_in if k != "op")
        cell += f" {NOISY}" + (f" ({why})" if why else "")
    return cell


def markdown(results: list[Result], copy: dict, copies: list[dict], meta: dict,
             goals: list[Target], warnings: list[str], usual: dict | None = None) -> str:
    lines = [f"# kvcache_ext benchmark: {meta['device_name']}", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}, commit {meta['commit'][:12]}, {meta['date']}"
             + (f", CPU row loops: {meta['cpu_isa']}" if meta.get("cpu_isa") else ""), ""]
    pts = copy.get("checkpoints", [])
    if copy.get("gbps"):
        where = (f", {pts[0]['gbps']:.1f} at the start, {pts[-1]['gbps']:.1f} at the {pts[-1]['at']}, "
                 f"{min(p['gbps'] for p in pts):.1f}-{max(p['gbps'] for p in pts):.1f} in all"
                 if len(pts) >= 2 else "")
        lines.append(f"device copy bandwidth (read + write, {copy['bytes'] >> 20} MiB copy): "
                     f"{copy['gbps']:.1f} GB/s, median of {copy['samples']} samples taken at "
                     f"{len(pts)} points of the run{where}; spread {copy['spread_pct']:.0f} %")
    elsewhere = meta.get("usual_copy_other_host")
    lines.append(f"usual copy bandwidth: {usual['gbps']:.1f} GB/s ({usual['source']}, commit "
                 f"{usual['commit'][:12]})" if usual else
                 f"usual copy bandwidth: none for this host (the file on record was measured on "
                 f"{elsewhere['host']}: not compared)" if elsewhere else
                 "usual copy bandwidth: none on record for this device")
    lines.append("")
    if warnings:
        lines += ["**Warnings**:", ""] + [f"- {NOISY} {w}" for w in warnings] + [""]
    if not meta.get("complete", True):
        lines += [f"**Incomplete run**: {meta.get('stopped', 'stopped early')}.", ""]
    lines += ["## Targets", ""]
    for t in goals:
        verdict = "n/a" if t.met is None else "met" if t.met else "**not met**"
        if t.met and t.noisy_passes:
            verdict += f" ({len(t.noisy_passes)} noisy)"
        lines.append(f"- {t.name}: {verdict}; {t.detail}")
    lines += ["", "## Ops", ""]
    lines += ["| op | layout | T | us/call | spread % | GB/s | % of copy BW | % of same-size copy | "
              "torch eager us | speed-up | torch.compile us | graph |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        lines.append(f"| {r.op} | {r.layout} | {r.tokens} | {r.us:.2f} | {_spread_cell(r)} | "
                     f"{r.gbps:.1f} | {r.pct_copy:.0f} | {r.pct_same_copy:.0f} | "
                     f"{_fmt(r.torch_us, '.1f')} | {_fmt(r.speedup, '.1f')} | "
                     f"{_fmt(r.compiled_us, '.1f')} | {'yes' if r.graph else 'no'} |")
    noisy = sum(r.noisy for r in results)
    lines += ["", f"spread %: interquartile range / median of the op's samples. {NOISY} noisy "
              f"({noisy} of {len(results)} rows): the spread of the op's samples, or of the "
              f"yardstick named in brackets (its same-size copy, the eager or compiled torch "
              f"reference), exceeds "
              f"{NOISY_SPREAD_PCT:.0f} %; its figures are less sure than the others'."]
    lines += ["", "## Block copies (random blocks)", "",
              "| layout | direction | blocks | spans | MB | us | spread % | GB/s |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in copies:
        spread = _fmt(c.get("spread_pct"), ".0f") + (f" {NOISY}" if c.get("noisy") else "")
        lines.append(f"| {c['layout']} | {c['direction']} | {c['blocks']} | {c['spans']} | "
                     f"{c['bytes'] / 1e6:.2f} | {c['us']:.1f} | {spread} | {c['gbps']:.2f} |")
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
    if not ops:
        return False
    cols = 3
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
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
    plt.close(fig)
    return True


def write(out: Path, tag: str, results: list[Result], copy: dict, copies: list[dict],
          meta: dict, with_plot: bool, usual: dict | None = None) -> list[str]:
    """Markdown and JSON (rewritten as the run goes, so a stopped run leaves what it measured);
    the plot when with_plot. `copy` is copy_summary()'s; every row's pct_copy is taken against
    its GB/s. Returns the run's warnings."""
    device_type = "cuda" if meta["device"].startswith("cuda") else "cpu"
    if copy.get("gbps"):
        for r in results:
            r.pct_copy = 100 * r.gbps / copy["gbps"]
    mark_noisy(results, copies)
    goals = targets(results, device_type)
    warnings = run_warnings(results, copy, usual, device_type)
    (out / f"bench_{tag}.md").write_text(markdown(results, copy, copies, meta, goals, warnings, usual))
    (out / f"bench_{tag}.json").write_text(json.dumps(
        {"meta": meta, "copy_gbps": copy.get("gbps"), "copy": copy, "usual_copy": usual,
         "warnings": warnings, "noisy_spread_pct": NOISY_SPREAD_PCT,
         "targets": [asdict(t) for t in goals], "results": [asdict(r) for r in results],
         "block_copies": copies}, indent=1))
    if with_plot:
        plot(results, out / f"bench_{tag}.png")
    return warnings
