"""The report of benchmarks/bench_transfer.py: the targets checked on the run's own figures, a
Markdown page, a PNG (GB/s per case, every measurement and yardstick side by side) and the run's
metadata."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

NIXL_TARGET_PCT = 80.0    # every NIXL read vs one large read of its bytes, timed interleaved
SPREAD_MARK_PCT = 20.0    # a yardstick this unsteady (IQR / median) is marked
LOCAL_TARGET_PCT = 80.0   # local copy_spans vs memcpy of the same bytes ...
LOCAL_MIN_SPAN = 4096     # ... for cases whose spans are all at least this long


def targets(result: dict) -> list[str]:
    lines = []
    counts = result["span_counts"]
    ok = all(v["spans"] == v["minimum"] for v in counts.values())
    lines.append(f"- spans per request == the minimum the two plans allow: "
                 f"{'met' if ok else 'MISSED'} (" + ", ".join(
                     f"{k}: {v['spans']} / {v['minimum']}" for k, v in counts.items()) + ")")
    for r in result["nixl"]:
        met = r["pct_big"] >= NIXL_TARGET_PCT
        lines.append(f"- NIXL read of {r['case']} ({r.get('path', 'plain')}) >= "
                     f"{NIXL_TARGET_PCT:.0f} % of the one large read beside it: "
                     f"{'met' if met else 'MISSED'} ({r['pct_big']:.0f} %)")
    for r in result["local"]:
        if r["min_span"] >= LOCAL_MIN_SPAN:
            met = r["pct_memcpy"] >= LOCAL_TARGET_PCT
            lines.append(f"- local copy_spans ({r['route']}, {r['case']}, spans >= 4 KiB) >= "
                         f"{LOCAL_TARGET_PCT:.0f} % of memcpy: {'met' if met else 'MISSED'} "
                         f"({r['pct_memcpy']:.0f} %)")
        else:
            lines.append(f"- local copy_spans ({r['route']}, {r['case']}): spans down to "
                         f"{r['min_span']} B, outside the >= 4 KiB target ({r['pct_memcpy']:.0f} % "
                         f"of memcpy)")
    return lines


def markdown(result: dict) -> str:
    m, cfg = result["meta"], result["config"]
    warning = load_warning(m)
    out = [f"# Moving one request between plans ({m['device']})", "",
           f"{m['host']}, torch {m['torch']}, nixl {m['nixl']}, commit {m['commit'][:10]}, "
           f"{m['date'][:19]} UTC.", ""]
    if warning:
        out += [warning, ""]
    out += [f"Request: {cfg['tokens']} tokens x {cfg['layers']} layers x (MLA {cfg['mla']} B + "
            f"indexer {cfg['indexer']} B) = {cfg['bytes']} bytes, blocks random and never "
            f"consecutive. Median of {cfg['repeats']} runs, every case and yardstick timed in "
            f"alternating rounds; spread = IQR / median.", "", "## Targets", ""]
    out += targets(result)
    out += ["", "## Spans and local copies", "",
            "| case | route | spans | minimum | smallest span | copy_spans GB/s | spread % | "
            "memcpy GB/s | % of memcpy |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["local"]:
        out.append(f"| {r['case']} | {r['route']} | {r['spans']} | "
                   f"{result['span_counts'][r['case']]['minimum']} | {r['min_span']} | "
                   f"{r['local']['gbps']:.2f} | {r['local']['spread_pct']:.0f} | "
                   f"{r['memcpy']['gbps']:.2f} | {r['pct_memcpy']:.0f} |")
    if result["nixl"]:
        out += ["", "## NIXL between two processes (UCX over loopback, 127.0.0.1)", "",
                "| case | spans | path | pieces NIXL posted | spans planned (ms) | NIXL read GB/s "
                "| spread % | one large read GB/s | % of large read | first read, new peer (ms) "
                "| gloo send/recv GB/s |",
                "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        g = result["gloo"]
        gloo = f"{g['gbps']:.2f}" if g else "-"
        for r in result["nixl"]:
            mark = " (unsteady)" if r["nixl_big"]["spread_pct"] > SPREAD_MARK_PCT else ""
            out.append(f"| {r['case']} | {r['spans']} | {r.get('path', 'plain')} | "
                       f"{r.get('pieces', r['spans'])} | {r['plan_ms']:.1f} | "
                       f"{r['nixl']['gbps']:.2f} | {r['nixl']['spread_pct']:.0f} | "
                       f"{r['nixl_big']['gbps']:.2f}{mark} | {r['pct_big']:.0f} | "
                       f"{r.get('first_read_ms', 0):.0f} | {gloo} |")
        out += ["", "NIXL reads are timed as the caller waits: descriptor lists built, the "
                "transfer posted and waited for (`Endpoint.read(...).wait()`); the owner process "
                "makes no call meanwhile (its Endpoint's poller drives progress). gloo moves the "
                "same bytes as one tensor (send/recv between the same two processes)."]
    return "\n".join(out) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = result["cases"]
    series = {"copy_spans (local)": [], "memcpy (local)": [], "NIXL read (spans)": [],
              "NIXL one large read": [], "gloo send/recv": []}
    local = {r["case"]: r for r in result["local"] if r["route"] == result["local"][0]["route"]}
    nixl = {r["case"]: r for r in result["nixl"]}
    for c in cases:
        series["copy_spans (local)"].append(local[c]["local"]["gbps"] if c in local else 0)
        series["memcpy (local)"].append(local[c]["memcpy"]["gbps"] if c in local else 0)
        series["NIXL read (spans)"].append(nixl[c]["nixl"]["gbps"] if c in nixl else 0)
        series["NIXL one large read"].append(nixl[c]["nixl_big"]["gbps"] if c in nixl else 0)
        series["gloo send/recv"].append(result["gloo"].get("gbps", 0))
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.16
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + (i - 2) * width for x in range(len(cases))], values, width, label=label)
    counts = result["span_counts"]
    ax.set_xticks(range(len(cases)), [f"{c}\n{counts[c]['spans']} spans" for c in cases])
    ax.set_ylabel("GB/s")
    ax.set_title(f"One {result['config']['bytes'] / 2**20:.0f} MiB request "
                 f"({result['config']['tokens']} tokens, {result['config']['layers']} layers), "
                 f"{result['meta']['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def meta(device: str) -> dict:
    try:
        from importlib.metadata import version
        nixl_version = version("nixl")
    except Exception:
        nixl_version = "not installed"
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                         cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    model = platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "host": f"{model} x{os.cpu_count()}", "torch": torch.__version__, "nixl": nixl_version,
            "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "cores": os.cpu_count(), "loadavg_start": os.getloadavg()[0]}


def load_warning(m: dict) -> str | None:
    """Other work on the host when the run started (1-minute load average above half the cores;
    the load at the end counts this run's own two processes, so it is shown, not judged)."""
    cores = m.get("cores") or 1
    if m.get("loadavg_start", 0.0) > cores / 2:
        return (f"Warning: the host was busy with other work when this run started (1-minute load "
                f"average {m['loadavg_start']:.1f}, {m.get('loadavg_end', 0):.1f} at the end, "
                f"{cores} cores): figures are perturbed.")
    return None
