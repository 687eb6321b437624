"""The software conversions (CPU kernels) against NVIDIA's (CUDA kernels), on every input. The
e4m3 encoder on all 2^32 floats needs nvcc (CI has it) but no GPU: cuda_fp8.h's host path
emulates the instruction. On a GPU, tests/convert_exhaustive_gpu.cu runs the instructions
themselves."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

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


@pytest.mark.gpu
@pytest.mark.skipif(nvcc() is None or not torch.cuda.is_available(), reason="needs nvcc and a GPU")
def test_the_gpu_instructions_convert_every_input_like_the_cpu_kernels(tmp_path):
    """The kernels' hardware conversions (e4m3 and bf16 encoding of every float, e4m3 decoding,
    fp16 widening, the tile division on __frcp_rn / __fmaf_rn) give the software's bytes."""
    exe = tmp_path / "convert_exhaustive_gpu"
    build = subprocess.run([nvcc(), "-O3", "--fmad=false", "-std=c++17", "-arch=native",
                            f"-I{ROOT / 'csrc'}", str(ROOT / "tests" / "convert_exhaustive_gpu.cu"),
                            "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(r.stdout)
    assert r.returncode == 0 and "mismatches: 0" in r.stdout, r.stdout
