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
    for isa, need in (("avx2", {"avx2", "f16c"}), ("avx512", {"avx512f", "avx512bw", "avx512vl", "f16c"}),
                      ("avx512+bf16", {"avx512f", "avx512bw", "avx512vl", "f16c", "avx512_bf16"})):
        if need <= flags:
            assert f"{isa}: compared, 0 mismatches" in r.stdout, r.stdout


def test_every_cpu_isa_gives_the_same_op_bytes():
    """KVC_CPU_ISA picks the row loops at load time: the ops' bytes do not depend on it (the
    exhaustive comparison above is of the loops; this is of whole ops, in fresh processes)."""
    import os
    import sys
    code = ("import hashlib, torch, kvcache_ext as kvc\n"
            "g = torch.Generator().manual_seed(0)\n"
            "plan = kvc.plan_cache([kvc.CacheSpec('mla', 656, 1), kvc.CacheSpec('idx', 132, 1)], 64, 16)\n"
            "c = kvc.allocate(plan, fill=7)\n"
            "x = (torch.randn(300, 576, generator=g) * 9).to(torch.bfloat16)\n"
            "k = torch.randn(300, 128, generator=g).to(torch.float16)\n"
            "s = torch.randperm(plan.num_slots, generator=g)[:300]\n"
            "kvc.ops.dsa_write(x[:, :512], x[:, 512:], c.view('mla', 0), k.to(torch.bfloat16), c.view('idx', 0), s)\n"
            "kvc.ops.indexer_k_quant_and_cache(k, c.view('idx', 0), s.flip(0))\n"
            "out = kvc.ops.gather_mla_slots(c.view('mla', 0), s, dtype=torch.float32)\n"
            "bf = kvc.ops.gather_mla_slots(c.view('mla', 0), s, dtype=torch.bfloat16).view(torch.int16)\n"
            "from kvcache_ext import ops_v4 as o4\n"  # DeepSeek-V4 rows: fp8 tiles, MXFP4 blocks
            "p4 = kvc.plan_cache([kvc.CacheSpec('v4', 584, 1, split=(576, 8)), kvc.CacheSpec('mx', 68, 1, split=(64, 4))], 64, 16)\n"
            "c4 = kvc.allocate(p4, fill=7)\n"
            "o4.v4_dsa_write(x[:, :512], c4.view('v4', 0), k.to(torch.bfloat16) * 40, c4.view('mx', 0), s)\n"
            "v4 = [o4.gather_v4_slots(c4.view(n, 0), s, f, dtype=d).view(torch.uint8) for n, f in (('v4', 'fp8_ds_mla_v4'), ('mx', 'mxfp4')) for d in (torch.bfloat16, torch.float32)]\n"
            "print(hashlib.sha256(c.buffer.numpy().tobytes() + out.numpy().tobytes() + bf.numpy().tobytes()\n"
            "                     + c4.buffer.numpy().tobytes() + b''.join(v.numpy().tobytes() for v in v4)).hexdigest())\n"
            "from kvcache_ext.ops.library import cpu_isa\n"
            "print(cpu_isa())\n")
    digests = {}
    for isa in ("scalar", "avx2", "avx512", "bogus"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, KVC_CPU_ISA=isa))
        assert r.returncode == 0, r.stderr
        digests[isa], ran = r.stdout.split()
        if isa in ("scalar", "avx2"):  # the loops the library says it runs are the ones asked for
            assert ran == isa or (isa == "avx2" and ran == "scalar"), (isa, ran)
        else:
            assert ran.split("+")[0] in ("avx512", "avx2", "scalar"), ran
        assert ("must be scalar, avx2 or avx512" in r.stderr) == (isa == "bogus")
    assert len(set(digests.values())) == 1, digests
