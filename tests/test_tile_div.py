"""The write kernels' division-free x / scale (numerics.h tile_div) gives the IEEE quotient's
e4m3 code on every operand pair they can hand it (tests/tile_div_exhaustive.cpp, ~2^32 pairs,
built here with the host compiler; the CUDA path uses the same IEEE operations: __frcp_rn,
__fmul_rn, __fmaf_rn)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_tile_div_gives_the_quotients_codes_on_every_pair(tmp_path):
    exe = tmp_path / "tile_div_exhaustive"
    subprocess.run(["g++", "-O2", "-march=native", "-std=c++20", "-ffp-contract=off",
                    "-fno-trapping-math", "-fopenmp", f"-I{ROOT / 'csrc'}",
                    str(ROOT / "tests" / "tile_div_exhaustive.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "mismatches: 0" in r.stdout, r.stdout
    pairs = int(r.stdout.split("pairs: ")[1].split(",")[0])
    assert pairs > 6_000_000_000  # every (x, amax >= |x|) pair of both dtypes and all three rules
