"""The CPU kernels' AVX2 and AVX-512 row loops give the scalar loops' bytes: every float, every bf16 and
fp16 pattern, every fp8 code (tests/rows_exhaustive.cpp, built here with the host compiler)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_avx2_rows_match_scalar_rows(tmp_path):
    exe = tmp_path / "rows_exhaustive"
    subprocess.run(["g++", "-O2", "-std=c++20", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp",
                    "-Wno-psabi", f"-I{ROOT / 'csrc'}", str(ROOT / "tests" / "rows_exhaustive.cpp"),
                    str(ROOT / "csrc" / "cpu" / "rows.cpp"), str(ROOT / "csrc" / "cpu" / "rows_avx2.cpp"),
                    str(ROOT / "csrc" / "cpu" / "rows_avx512.cpp"),
                    "-o", str(exe)], check=True, capture_output=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "mismatches: 0" in r.stdout, r.stdout
    # each ISA this CPU has was compared, not skipped
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    for isa, need in (("avx2", {"avx2", "f16c"}), ("avx512", {"avx512f", "avx512bw", "avx512vl", "f16c"})):
        if need <= flags:
            assert f"{isa}: compared, 0 mismatches" in r.stdout, r.stdout
