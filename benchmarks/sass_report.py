"""Instructions per token of the CUDA kernels, read from their SASS (sm_90), without a GPU.

    python benchmarks/sass_report.py --out benchmarks/results --tag after

Builds csrc/cuda/*.cu to cubins with nvcc (the flags of CMakeLists.txt), disassembles them with
cuobjdump (the toolkit's, or the one in the Triton wheel under triton/backends/nvidia/bin/), and
reports per kernel: registers, stack / local memory (spills), and the warp-instructions one token
executes on the aligned fast path.

Counting method. The SASS of a kernel is cut into basic blocks (at branch targets and after
branches, EXIT and RET); back edges (a branch to an address at or before itself) are dropped,
so each loop body counts once — the loops on these fast paths run 1 or 2 trips (row sizes of
576-1152 bytes over 32 lanes of 16 bytes), and the report lists how many loops each path
holds. The fast path is the entry-to-EXIT path that loads the most bytes from global memory per lane
(LDG widths: .128 = 16, .64 = 8, plain = 4, .U16/.S16 = 2, .U8/.S8 = 1), then stores the most,
then executes the fewest instructions: a row that is read and written beats an early exit, a
skipped row or a zero row (which load nothing), and alignment fallbacks move the same bytes
with more instructions; the IEEE-division and 64-bit-division slow paths (CALL.REL.NOINC
subroutines, entered only for special operands) are never taken.
Every instruction counts once whatever its predicate (a predicated-off instruction still
issues). Where a run-time flag picks between paths that move the same bytes, the cheaper one is
counted: the indexer's ue8m0 scales (multiplication by an exact power-of-two reciprocal, what
DeepSeek-V3.2 uses) rather than fp32 scales (IEEE division, about 33 more instructions per
indexer token), and for plain and K/V rows the copy ("auto") rather than the fp8 path. Loops
that run per element (plain and K/V fp8 rows: D / 32 trips) count once, so those kernels'
figures are lower bounds. Instructions per token = path length / tokens handled by one warp (TOKENS_PER_WARP).
On a GPU, ncu's `smsp__inst_executed.sum` / T checks the method.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["write.cu", "gather.cu", "copy.cu", "v4.cu"]
NVCC_FLAGS = ["-cubin", "-arch=sm_90", "-O3", "--fmad=false", "-std=c++17", "-lineinfo"]

# Tokens one warp handles, by kernel name (first match). Default: one token (or row) per warp.
TOKENS_PER_WARP: list[tuple[str, int]] = [(r"\bindexer_kernel", 4), (r"\bindexer_gather_kernel", 4),
                                        (r"\bmxfp4_(write|gather)_kernel", 4)]

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
WIDTH = re.compile(r"\b(LDG|STG)(\.E)?((?:\.[A-Z0-9]+)*)")


@dataclass
class KernelReport:
    kernel: str
    registers: int
    stack: int
    local: int
    path_instructions: int
    loops_on_path: int
    tokens_per_warp: int
    per_token: float
    static_instructions: int


def tool(name: str) -> str:
    for cand in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name,):
        if cand.exists():
            return str(cand)
    try:
        import triton  # noqa: PLC0415
        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"sass_report: {name} not found (CUDA toolkit or the Triton wheel)")
    return found


def demangle(names: list[str]) -> dict[str, str]:
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    pretty = [re.sub(r"kvc::cuda::\(anonymous namespace\)::", "", line) for line in out.splitlines()]
    return dict(zip(names, pretty))


def mem_bytes(op: str) -> tuple[int, int]:
    """(bytes loaded, bytes stored) per lane by one instruction."""
    m = WIDTH.search(op)
    if not m:
        return 0, 0
    width = access_width(m.group(3))
    return (width, 0) if m.group(1) == "LDG" else (0, width)


def access_width(mods: str) -> int:
    for suffix, width in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if suffix in mods:
            return width
    return 4


def parse_functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    funcs: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        head = re.match(r"\s*Function : (\S+)", line)
        if head:
            current = head.group(1)
            funcs[current] = []
            continue
        m = INSN.search(line)
        if current and m:
            funcs[current].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def fast_path(insns: list[tuple[int, str]]) -> tuple[int, int]:
    """(instructions, loops) of the fast path, as the module docstring defines it."""
    index = {addr: i for i, (addr, _) in enumerate(insns)}
    n = len(insns)

    def succ(i: int) -> list[int]:
        addr, text = insns[i]
        op = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
        conditional = text.startswith("@")
        nxt = [i + 1] if i + 1 < n else []
        if op.startswith("EXIT") or op.startswith("RET"):
            return nxt if conditional else []
        if op.startswith("BRA"):
            target = re.search(r"0x([0-9a-f]+)", op)
            t = index.get(int(target.group(1), 16)) if target else None
            out = [] if t is None or insns[t][0] <= addr else [t]  # drop back edges
            return out + (nxt if conditional else [])
        return nxt

    # Every edge goes forward once back edges are dropped, so the best path from each
    # instruction follows from those after it: one pass from the end, no recursion (whose depth,
    # the path's length, outgrows Python 3.12's C stack limit).
    best: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * n  # (loaded, stored, -insns, loops)
    for i in range(n - 1, -1, -1):
        text = insns[i][1]
        loaded, stored = mem_bytes(text)
        op = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
        if op.startswith("CALL"):
            loaded -= 1 << 20  # a slow-path subroutine: never on the fast path
        nexts = succ(i)
        loop_here = 1 if ("BRA" in text and (m := re.search(r"0x([0-9a-f]+)", op))
                          and int(m.group(1), 16) <= insns[i][0]) else 0
        if not nexts:
            best[i] = (loaded, stored, -1, loop_here) if op.startswith("EXIT") else (-(1 << 30), 0, -1, 0)
            continue
        ld, st, neg_len, lp = max((best[j] for j in nexts), key=lambda c: c[:3])
        best[i] = (ld + loaded, st + stored, neg_len - 1, lp + loop_here)
    _, _, neg_len, lp = best[0]
    return -neg_len, lp


def resources(text: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"\s*Function (\S+):", line)
        if head:
            current = head.group(1)
            continue
        if current and "REG:" in line:
            out[current] = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", line)}
    return out


def report(build: Path) -> list[KernelReport]:
    nvcc = tool("nvcc")
    cuobjdump = tool("cuobjdump")
    rows: list[KernelReport] = []
    for src in SOURCES:
        cubin = build / (Path(src).stem + ".cubin")
        subprocess.run([nvcc, *NVCC_FLAGS, f"-I{ROOT / 'csrc'}", str(ROOT / "csrc" / "cuda" / src),
                        "-o", str(cubin)], check=True, capture_output=True)
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True,
                              text=True).stdout
        res = resources(subprocess.run([cuobjdump, "-res-usage", str(cubin)], check=True,
                                       capture_output=True, text=True).stdout)
        funcs = parse_functions(sass)
        names = demangle(list(funcs))
        for mangled, insns in funcs.items():
            length, loops = fast_path(insns)
            name = names[mangled]
            tpw = next((k for pat, k in TOKENS_PER_WARP if re.search(pat, name)), 1)
            r = res.get(mangled, {})
            rows.append(KernelReport(name, r.get("REG", 0), r.get("STACK", 0), r.get("LOCAL", 0),
                                     length, loops, tpw, round(length / tpw, 1), len(insns)))
    return sorted(rows, key=lambda r: r.kernel)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def write(rows: list[KernelReport], out: Path, tag: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "arch": "sm_90", "nvcc_flags": NVCC_FLAGS, "method": __doc__.split("Counting method.")[1].strip()}
    (out / f"sass_{tag}.json").write_text(json.dumps(meta | {"kernels": [asdict(r) for r in rows]}, indent=1))
    lines = [f"# SASS instructions per token ({tag}, commit {meta['commit']}, sm_90)", "",
             "Method: see benchmarks/sass_report.py (fast path, loops counted once).", "",
             "| kernel | regs | stack | local | fast-path instructions | loops | tokens/warp | per token | static |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| `{r.kernel}` | {r.registers} | {r.stack} | {r.local} | {r.path_instructions} | "
              f"{r.loops_on_path} | {r.tokens_per_warp} | {r.per_token:g} | {r.static_instructions} |"
              for r in rows]
    path = out / f"sass_{tag}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out",
                    help="folder for sass_<tag>.md/.json (default: %(default)s)")
    ap.add_argument("--tag", default="now", help="name of this measurement (default: %(default)s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = report(Path(tmp))
    path = write(rows, args.out, args.tag)
    print(path.read_text())


if __name__ == "__main__":
    main()
