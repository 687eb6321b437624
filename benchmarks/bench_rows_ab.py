"""The CPU row loops of this tree against another revision's, timed interleaved in one process per
KVC_CPU_ISA (this machine's copy speed swings by a third between runs, so only interleaved
figures compare). Builds benchmarks/rows_ab.cpp with the library's compile flags.

    python benchmarks/bench_rows_ab.py --old a824c04 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["-O3", "-std=c++20", "-ffp-contract=off", "-fno-trapping-math", "-Wno-psabi"]


def build(old: str, work: Path) -> Path:
    old_tree = work / "old"
    old_tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", old, "csrc"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
    objs = []
    for src in sorted((old_tree / "csrc" / "cpu").glob("rows*.cpp")) + [ROOT / "benchmarks" / "rows_ab_old.cpp"]:
        obj = work / f"old_{src.stem}.o"
        subprocess.run(["g++", *FLAGS, "-Dkvc=kvc_old", f"-I{old_tree / 'csrc'}", "-c", str(src), "-o", str(obj)],
                       check=True)
        objs.append(obj)
    news = sorted((ROOT / "csrc" / "cpu").glob("rows*.cpp")) + [ROOT / "benchmarks" / "rows_ab.cpp"]
    exe = work / "rows_ab"
    subprocess.run(["g++", *FLAGS, f"-I{ROOT / 'csrc'}", *map(str, news), *map(str, objs), "-o", str(exe)], check=True)
    return exe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="git revision whose csrc/cpu/rows*.cpp are the baseline")
    p.add_argument("--isas", default="scalar,avx2,avx512")
    p.add_argument("--repeats", type=int, default=31)
    p.add_argument("--runs", type=int, default=3, help="processes per ISA; the table gives the median run")
    p.add_argument("--out", default="benchmarks/out")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(args.old, Path(tmp))
        rows = []
        for isa in args.isas.split(","):
            runs = []
            for _ in range(args.runs):
                r = subprocess.run([str(exe), str(args.repeats)], check=True, capture_output=True, text=True,
                                   env={**os.environ, "KVC_CPU_ISA": isa})
                runs.append([json.loads(x) for x in r.stdout.splitlines()])
            for j, w in enumerate(runs[0][1:], start=1):
                ratios = sorted(run[j]["new_ns_per_row"] / run[j]["old_ns_per_row"] for run in runs)
                mid = min(runs, key=lambda run: abs(run[j]["new_ns_per_row"] / run[j]["old_ns_per_row"]
                                                    - ratios[len(ratios) // 2]))[j]
                w = mid | {"KVC_CPU_ISA": isa, "loops": runs[0][0]["isa_new"], "new_over_old": ratios[len(ratios) // 2],
                           "new_over_old_runs": ratios,
                           "same_bytes": all(run[j]["same_bytes"] for run in runs)}
                rows.append(w)
                print(f"{isa:7s} {w['workload']:24s} old {w['old_ns_per_row']:8.1f} new {w['new_ns_per_row']:8.1f} "
                      f"ns/row  {100 * (w['new_over_old'] - 1):+5.1f} % (runs "
                      + " ".join(f"{100 * (x - 1):+.1f}" for x in ratios) + f")  same bytes {w['same_bytes']}")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "csrc", "benchmarks/rows_ab.cpp",
                                "benchmarks/rows_ab_old.cpp"], capture_output=True,
                                text=True).stdout.strip())
    meta = {"old": args.old, "new": head + ("+dirty" if dirty else ""), "repeats": args.repeats, "runs": args.runs,
            "date": datetime.date.today().isoformat(), "rows": 1024, "values_per_row": 512,
            "cpu": next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                         if x.startswith("model name")), "?")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows_ab_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    md = [f"Row loops, {meta['old']} (old) vs {meta['new']} (new), interleaved medians of {args.repeats} in each of "
          f"{args.runs} processes per ISA (the median process shown), {meta['cpu']}, {meta['date']}", "",
          "| KVC_CPU_ISA | loops | workload | old ns/row | new ns/row | new vs old | every process |",
          "|---|---|---|---:|---:|---:|---|"]
    md += [f"| {w['KVC_CPU_ISA']} | {w['loops']} | {w['workload']} | {w['old_ns_per_row']:.1f} | "
           f"{w['new_ns_per_row']:.1f} | {100 * (w['new_over_old'] - 1):+.1f} % | "
           + " ".join(f"{100 * (x - 1):+.1f}" for x in w["new_over_old_runs"])
           + (" |" if w["same_bytes"] else " (bytes differ!) |") for w in rows]
    (out / "rows_ab_cpu.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
