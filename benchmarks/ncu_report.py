"""Nsight Compute's counters for the kernels of `sanitize_case.py --ncu`, beside the static count.

    ncu --kernel-name-base demangled --kernel-name regex:"..." --clock-control none \
        --metrics <METRICS> -o prof python benchmarks/sanitize_case.py --ncu
    ncu --import prof.ncu-rep --page raw --csv --print-units base > ncu.csv
    python benchmarks/ncu_report.py ncu.csv --tokens 16384 --out DIR

For the last launch of each kernel: duration, DRAM throughput (GB/s and % of peak), issue-slot
utilisation, the top three warp stall reasons (% of active warps' cycles) and warp-instructions
executed per token (smsp__inst_executed.sum / T: sass_report.py's "per token", which divides a
warp's path by the tokens one warp handles), next to the static count in
benchmarks/results/sass_after.json, so the static method is checked against the hardware. Writes ncu_T<T>.json and
.md to DIR and prints one summary line per kernel.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STALL = re.compile(r"^smsp__warp_issue_stalled_(\w+?)_per_warp_active\.pct$")
METRICS = ",".join([
    "gpu__time_duration.sum", "dram__bytes.sum.per_second",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
    "regex:smsp__warp_issue_stalled_.*_per_warp_active\\.pct",
])
# Units as ncu prints them with --print-units base (2024.x: "ns", "byte/s"; older: "nsecond",
# "byte/second"), and scaled ones in case: factors to seconds and to bytes per second.
_SECONDS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
            "s": 1.0, "second": 1.0}
_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


@dataclass
class KernelCounters:
    kernel: str
    duration_us: float | None
    dram_gb_s: float | None
    dram_pct_of_peak: float | None
    issue_active_pct: float | None
    warps_active_pct: float | None
    registers: float | None
    inst_per_token: float | None
    static_per_token: float | None
    top_stalls: list[tuple[str, float]] = field(default_factory=list)

    @property
    def hw_over_static(self) -> float | None:
        if self.inst_per_token is None or not self.static_per_token:
            return None
        return self.inst_per_token / self.static_per_token


def _number(text: str) -> float | None:
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def _seconds(value: float | None, unit: str) -> float | None:
    """value in `unit` as seconds; None (with a warning) for a unit not known here."""
    if value is None:
        return None
    if unit.strip() not in _SECONDS:
        print(f"ncu_report: warning: unknown time unit {unit!r}, duration left out")
        return None
    return value * _SECONDS[unit.strip()]


def _bytes_per_second(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    m = re.fullmatch(r"([KkMGTP]?)(?:B|byte)/s(?:econd)?", unit.strip())
    if not m:
        print(f"ncu_report: warning: unknown bandwidth unit {unit!r}, DRAM GB/s left out")
        return None
    return value * _PREFIX[m.group(1)]


def read_rows(path: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The kernel rows of an `ncu --page raw --csv` export, and the units row."""
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("==")]
    start = next((i for i, ln in enumerate(lines) if '"Kernel Name"' in ln), None)
    if start is None:
        raise SystemExit(f"ncu_report: {path} is not an `ncu --page raw --csv` export (no Kernel Name)")
    rows = list(csv.DictReader(lines[start:]))
    units = rows[0] if rows and not rows[0].get("Kernel Name") else {}
    return [r for r in rows if r.get("Kernel Name")], units


def normalise(name: str) -> str:
    """A demangled kernel name without spaces, `void` and the function's qualifiers (the kernels
    live in kvc::cuda's anonymous namespace, which tools spell `(anonymous namespace)` or
    `<unnamed>`), template arguments spelt as cuobjdump spells them (ncu: `(bool)0` for false)."""
    name = re.sub(r"\s+", "", name)
    name = re.sub(r"^void", "", name)
    name = re.sub(r"^(?:(?:\w+|<unnamed>|\(anonymousnamespace\))::)+(?=\w+[<(])", "", name)
    name = name.replace("(bool)0", "false").replace("(bool)1", "true")
    return re.sub(r"\((?:unsigned)?int\)(\d+)", r"\1", name)


def static_counts(path: Path) -> tuple[dict[str, float], str]:
    data = json.loads(path.read_text())
    return {normalise(k["kernel"]): k["per_token"] for k in data["kernels"]}, data.get("commit", "?")


def counters(row: dict[str, str], units: dict[str, str], tokens: int,
             static: dict[str, float]) -> KernelCounters:
    def get(metric: str) -> float | None:
        return _number(row.get(metric, ""))

    stalls = []
    for key, text in row.items():
        m = STALL.match(key or "")
        value = _number(text or "")
        if m and value is not None and m.group(1) != "selected":
            stalls.append((m.group(1), round(value, 1)))
    stalls.sort(key=lambda s: -s[1])
    name = row["Kernel Name"]
    inst = get("smsp__inst_executed.sum")
    return KernelCounters(
        kernel=name,
        duration_us=_round(_seconds(get("gpu__time_duration.sum"),
                                    units.get("gpu__time_duration.sum") or "ns"), 1e6),
        dram_gb_s=_round(_bytes_per_second(get("dram__bytes.sum.per_second"),
                                           units.get("dram__bytes.sum.per_second") or "byte/s"), 1e-9),
        dram_pct_of_peak=get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        issue_active_pct=get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
        warps_active_pct=get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        registers=get("launch__registers_per_thread"),
        inst_per_token=None if inst is None else round(inst / tokens, 1),
        static_per_token=static.get(normalise(name)),
        top_stalls=stalls[:3],
    )


def _round(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 2)


def report(rows: list[dict[str, str]], units: dict[str, str], tokens: int,
           static: dict[str, float]) -> list[KernelCounters]:
    last: dict[str, dict[str, str]] = {}
    for row in rows:  # later launches replace earlier ones: the warm second launch is read
        last[row["Kernel Name"]] = row
    return [counters(r, units, tokens, static) for r in last.values()]


def summary_line(k: KernelCounters) -> str:
    def f(v, unit=""):
        return "n/a" if v is None else f"{v:g}{unit}"
    stalls = ", ".join(f"{n} {v:g} %" for n, v in k.top_stalls) or "n/a"
    ratio = k.hw_over_static
    return (f"{normalise(k.kernel)}: {f(k.duration_us, ' us')}, DRAM {f(k.dram_gb_s, ' GB/s')} "
            f"({f(k.dram_pct_of_peak, ' %')} of peak), issue slots {f(k.issue_active_pct, ' %')}, "
            f"stalls: {stalls}; inst/token {f(k.inst_per_token)} vs static {f(k.static_per_token)}"
            + ("" if ratio is None else f" (x{ratio:.2f})"))


def markdown(kernels: list[KernelCounters], meta: dict) -> str:
    out = [f"# ncu at T = {meta['tokens']} ({meta['gpu']}, commit {meta['commit']})", "",
           f"Static counts: {meta['sass_file']} (commit {meta['sass_commit']}). Clocks not locked "
           "(`--clock-control none`): read the percentages and counts, not the times.", "",
           "| kernel | µs | DRAM GB/s | % of peak | issue slots % | warps active % | regs "
           "| top stalls (% of active cycles) | inst / token | static | hw / static |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for k in kernels:
        stalls = ", ".join(f"{n} {v:g}" for n, v in k.top_stalls)
        ratio = k.hw_over_static
        cells = [f"`{normalise(k.kernel)}`", k.duration_us, k.dram_gb_s, k.dram_pct_of_peak,
                 k.issue_active_pct, k.warps_active_pct, k.registers, stalls, k.inst_per_token,
                 k.static_per_token, None if ratio is None else round(ratio, 2)]
        out.append("| " + " | ".join("n/a" if c is None else str(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, nargs="?",
                    help="`ncu --import R --page raw --csv --print-units base` output")
    ap.add_argument("--print-metrics", action="store_true", help="print the --metrics list for ncu")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--sass", type=Path, default=ROOT / "benchmarks" / "results" / "sass_after.json")
    ap.add_argument("--gpu", default="?")
    ap.add_argument("--commit", default="?")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.print_metrics:
        print(METRICS)
        return
    if args.csv is None or args.out is None:
        ap.error("give the CSV export and --out (or --print-metrics)")
    rows, units = read_rows(args.csv)
    if not rows:
        raise SystemExit(f"ncu_report: {args.csv} holds no kernel rows")
    static, sass_commit = static_counts(args.sass)
    kernels = report(rows, units, args.tokens, static)
    meta = {"tokens": args.tokens, "gpu": args.gpu, "commit": args.commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "sass_file": str(args.sass.relative_to(ROOT) if args.sass.is_relative_to(ROOT) else args.sass),
            "sass_commit": sass_commit}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"ncu_T{args.tokens}"
    stem.with_suffix(".json").write_text(json.dumps(
        {**meta, "kernels": [{**asdict(k), "hw_over_static": k.hw_over_static} for k in kernels]},
        indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(kernels, meta))
    for k in kernels:
        print("ncu_report:", summary_line(k))


if __name__ == "__main__":
    main()
