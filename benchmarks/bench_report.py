"""Output of bench_cache_ops.py: the Markdown table, the JSON record and the PNG plots."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


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


@dataclass
class Target:
    name: str
    met: bool | None  # None: nothing measured that it applies to
    detail: str       # the cases that miss it, or the closest case


def targets(results: list[Result], device_type: str) -> list[Target]:
    """The performance targets of the project (issue 5), checked on this run's figures."""
    def check(name: str, cases: list[Result], ok, show) -> Target:
        if not cases:
            return Target(name, None, "not measured in this run")
        misses = [r for r in cases if not ok(r)]
        worst = misses or [min(cases, key=lambda r: show(r)[0])]
        text = ", ".join(f"{r.op} {r.layout} T={r.tokens}: {show(r)[1]}" for r in worst[:12])
        more = f" (+{len(misses) - 12} more)" if len(misses) > 12 else ""
        return Target(name, not misses, ("misses: " if misses else "closest: ") + text + more)

    at_16k = [r for r in results if r.tokens == 16384 and r.speedup is not None]
    if device_type != "cuda":
        return [check("CPU: >= 5x the torch reference at T = 16384", at_16k,
                      lambda r: r.speedup >= 5, lambda r: (r.speedup, f"{r.speedup:.1f}x"))]
    return [
        check("CUDA: >= 85% of the copy bandwidth at T >= 16384",
              [r for r in results if r.tokens >= 16384], lambda r: r.pct_copy >= 85,
              lambda r: (r.pct_copy, f"{r.pct_copy:.0f}% ({r.pct_same_copy:.0f}% of a same-size copy)")),
        check("CUDA: <= 5 us per call at T <= 64 under graph replay",
              [r for r in results if r.tokens <= 64 and r.graph], lambda r: r.us <= 5,
              lambda r: (-r.us, f"{r.us:.2f} us")),
        check("CUDA: >= 10x the eager torch path at T = 16384", at_16k,
              lambda r: r.speedup >= 10, lambda r: (r.speedup, f"{r.speedup:.1f}x")),
    ]


def _fmt(v: float | None, f: str) -> str:
    return "-" if v is None else format(v, f)


def markdown(results: list[Result], copy_gbps: float, copies: list[dict], meta: dict,
             goals: list[Target]) -> str:
    lines = [f"# kvcache_ext benchmark: {meta['device_name']}", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}, commit {meta['commit'][:12]}, {meta['date']}",
             f"device copy bandwidth (read + write, {meta['copy_bytes'] >> 20} MiB copy): "
             f"{copy_gbps:.1f} GB/s", ""]
    if not meta.get("complete", True):
        lines += [f"**Incomplete run**: {meta.get('stopped', 'stopped early')}.", ""]
    lines += ["## Targets", ""]
    for t in goals:
        verdict = "n/a" if t.met is None else "met" if t.met else "**not met**"
        lines.append(f"- {t.name}: {verdict}; {t.detail}")
    lines += ["", "## Ops", ""]
    lines += ["| op | layout | T | us/call | GB/s | % of copy BW | % of same-size copy | "
              "torch eager us | speed-up | torch.compile us | graph |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        lines.append(f"| {r.op} | {r.layout} | {r.tokens} | {r.us:.2f} | {r.gbps:.1f} | "
                     f"{r.pct_copy:.0f} | {r.pct_same_copy:.0f} | {_fmt(r.torch_us, '.1f')} | "
                     f"{_fmt(r.speedup, '.1f')} | {_fmt(r.compiled_us, '.1f')} | "
                     f"{'yes' if r.graph else 'no'} |")
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


def write(out: Path, tag: str, results: list[Result], copy_gbps: float, copies: list[dict],
          meta: dict, with_plot: bool) -> None:
    """Markdown and JSON (rewritten as the run goes, so a stopped run leaves what it measured);
    the plot when with_plot."""
    goals = targets(results, "cuda" if meta["device"].startswith("cuda") else "cpu")
    (out / f"bench_{tag}.md").write_text(markdown(results, copy_gbps, copies, meta, goals))
    (out / f"bench_{tag}.json").write_text(json.dumps(
        {"meta": meta, "copy_gbps": copy_gbps, "targets": [asdict(t) for t in goals],
         "results": [asdict(r) for r in results], "block_copies": copies}, indent=1))
    if with_plot:
        plot(results, out / f"bench_{tag}.png")
