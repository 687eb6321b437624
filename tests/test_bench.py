"""The benchmark and profiler scripts run end to end on tiny settings and write what they claim.
(They are measured on real hardware by benchmarks/gpu_check.sh; nothing here asserts speed.)"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_cache_ops  # noqa: E402
import profile_ops  # noqa: E402

OPS = {"reshape_and_cache", "concat_and_cache_mla", "concat_and_cache_mla_auto",
       "indexer_k_quant_and_cache", "dsa_write", "gather_mla", "gather_mla_slots",
       "gather_indexer", "gather_indexer_slots"}


def run_bench(tmp_path: Path, *extra: str) -> dict:
    args = ["--device", "cpu", "--sizes", "1,8", "--layouts", "LBNHC,BLHNC", "--repeats", "2",
            "--no-compile", "--out", str(tmp_path), *extra]
    assert bench_cache_ops.main(args) == 0
    return json.loads((tmp_path / "bench_cpu.json").read_text())


def test_bench_writes_every_op_layout_and_size(tmp_path):
    data = run_bench(tmp_path)
    meta = data["meta"]
    assert meta["complete"] and meta["stopped"] == "finished"
    for key in ("device_name", "torch", "cuda", "commit", "date", "copy_bytes"):
        assert key in meta
    rows = data["results"]
    assert {(r["op"], r["layout"], r["tokens"]) for r in rows} == \
        {(op, lay, t) for op in OPS for lay in ("LBNHC", "BLHNC") for t in (1, 8)}
    for r in rows:
        assert r["us"] > 0 and r["copy_us"] > 0 and r["torch_us"] > 0
        assert r["gbps"] == pytest.approx(r["bytes"] / r["us"] / 1e3)
        assert r["pct_copy"] == pytest.approx(100 * r["gbps"] / data["copy_gbps"])
        assert r["pct_same_copy"] == pytest.approx(100 * r["copy_us"] / r["us"])
        assert r["speedup"] == pytest.approx(r["torch_us"] / r["us"])
    copies = data["block_copies"]
    assert {(c["layout"], c["direction"], c["blocks"]) for c in copies} == \
        {(lay, d, n) for lay in ("BLHNC", "LBNHC") for d in ("to_host", "to_device") for n in (1, 16, 64)}
    spans = {(c["layout"], c["blocks"]): c["spans"] for c in copies}
    assert all(spans[("BLHNC", n)] < spans[("LBNHC", n)] for n in (1, 16, 64))
    md = (tmp_path / "bench_cpu.md").read_text()
    assert md.count("| dsa_write |") == 4 and "Incomplete" not in md
    assert (tmp_path / "bench_cpu.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_budget_stops_and_says_so(tmp_path):
    data = run_bench(tmp_path, "--budget-s", "0", "--no-block-copies")
    assert not data["meta"]["complete"] and "budget ran out" in data["meta"]["stopped"]
    assert data["results"] == []
    assert "Incomplete run" in (tmp_path / "bench_cpu.md").read_text()


def test_profile_reports_each_op(tmp_path):
    assert profile_ops.main(["--device", "cpu", "--sizes", "8", "--calls", "3",
                             "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "profile_cpu.json").read_text())
    assert {c["op"] for c in data["cases"]} == OPS
    for c in data["cases"]:
        assert c["event_us"] > 0
        assert c["kernels"] and c["kernels"][0]["name"].startswith("kvcache_ext::")
        assert c["kernels"][0]["count"] == 3


def test_targets_name_the_cases_that_miss():
    from bench_report import Result, targets

    def result(op, tokens, us, pct, speedup, graph):
        return Result(op, "BLHNC", tokens, us, 1000, 1.0, pct, us, 100.0, speedup * us, speedup,
                      None, graph)

    good = [result("a", 16384, 10, 90, 12, False), result("c", 64, 4, 5, 20, True)]
    assert [t.met for t in targets(good, "cuda")] == [True, True, True]
    bad = good + [result("b", 65536, 10, 80, 9, False), result("d", 16384, 10, 95, 9.5, False),
                  result("e", 8, 6.5, 1, 30, True)]
    bandwidth, latency, speedup = targets(bad, "cuda")
    assert not bandwidth.met and "b BLHNC T=65536: 80%" in bandwidth.detail and "a BLHNC" not in bandwidth.detail
    assert not latency.met and "e BLHNC T=8: 6.50 us" in latency.detail and "c BLHNC" not in latency.detail
    assert not speedup.met and "d BLHNC T=16384: 9.5x" in speedup.detail
    (cpu,) = targets(bad, "cpu")
    assert cpu.met and "d BLHNC T=16384: 9.5x" in cpu.detail  # the closest case
    assert [t.met for t in targets([], "cuda")] == [None, None, None]
