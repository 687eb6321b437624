"""benchmarks/sass_report.py: the SASS of every CUDA kernel is read and its fast path counted
(needs nvcc and cuobjdump, which CI has; no GPU)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("sass_report", ROOT / "benchmarks" / "sass_report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sass_report"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_fast_path_rule_on_a_hand_made_kernel():
    """A row read and written beats an early exit and a zero row; an aligned 16-byte access
    beats its byte fallback; a slow-path CALL is never taken; a loop body counts once."""
    sr = load()
    insns = [(0x00, "ISETP.GE.AND P0, PT, R0, R1, PT"), (0x10, "@P0 EXIT"),
             (0x20, "@P1 BRA 0x90"),                                  # invalid slot -> zero row
             (0x30, "@P2 BRA 0x60"),                                  # aligned?
             (0x40, "LDG.E.U8 R4, desc[UR4][R2.64]"), (0x50, "BRA 0x70"),
             (0x60, "LDG.E.128 R4, desc[UR4][R2.64]"),
             (0x70, "@!P3 BRA 0x80"), (0x78, "CALL.REL.NOINC 0x200"),
             (0x80, "STG.E.128 desc[UR4][R6.64], R4"), (0x88, "@P4 BRA 0x80"), (0x8c, "EXIT"),
             (0x90, "STG.E.128 desc[UR4][R6.64], RZ"), (0x98, "STG.E.128 desc[UR4][R6.64+0x10], RZ"),
             (0xa0, "EXIT")]
    length, loops = sr.fast_path(insns)
    # 0x00 0x10 0x20 0x30 0x60 0x70 0x80 0x88 0x8c: the aligned read-and-write path, no CALL.
    assert (length, loops) == (9, 1)


def test_report_covers_every_kernel(tmp_path):
    sr = load()
    rows = sr.report(tmp_path)
    names = " ".join(r.kernel for r in rows)
    for kernel in ("dsa_kernel", "mla_fp8_kernel", "indexer_kernel", "mla_gather_kernel",
                   "indexer_gather_kernel", "kv_kernel", "kv_gather_kernel", "copy_chunks_kernel"):
        assert kernel in names
    for r in rows:
        assert 20 < r.path_instructions < r.static_instructions and r.registers > 0
    path = sr.write(rows, tmp_path, "t")
    data = json.loads((tmp_path / "sass_t.json").read_text())
    assert len(data["kernels"]) == len(rows) and "fast path" in data["method"]
    assert "dsa_kernel" in path.read_text()
