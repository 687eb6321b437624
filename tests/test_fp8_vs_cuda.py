"""The software e4m3 encoder (CPU kernels) against NVIDIA's conversion (CUDA kernels), on all
2^32 floats. Needs nvcc (CI has it) but no GPU: cuda_fp8.h's host path emulates the instruction."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    path = Path(home) / "bin" / "nvcc"
    return str(path) if path.exists() else shutil.which("nvcc")


@pytest.mark.skipif(nvcc() is None, reason="needs nvcc")
def test_every_float_encodes_like_the_cuda_instruction(tmp_path):
    exe = tmp_path / "fp8_exhaustive"
    subprocess.run([nvcc(), "-O2", "-std=c++17", f"-I{ROOT / 'csrc'}", str(ROOT / "tests" / "fp8_exhaustive.cu"),
                    "-o", str(exe)], check=True, capture_output=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "mismatches: 0" in r.stdout, r.stdout
