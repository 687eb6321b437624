"""The benchmark and profiler scripts run end to end on tiny settings and write what they claim.
(They are measured on real hardware by benchmarks/gpu_check.sh; nothing here asserts speed.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bench_cache_ops  # benchmarks/ (pyproject.toml's pytest pythonpath)
import profile_ops
from bench_report import (MAX_PCT_COPY, MAX_PCT_SAME_COPY, NOISY_SPREAD_PCT, Result,
                          copy_summary, run_warnings, targets, usual_copy, write)

from kvcache_ext.cli.timing import Timer, Timing, time_interleaved

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

OPS = {"reshape_and_cache", "reshape_and_cache_fp8", "concat_and_cache_mla_fp8", "gather_kv",
       "concat_and_cache_mla", "concat_and_cache_mla_auto",
       "indexer_k_quant_and_cache", "dsa_write", "gather_mla", "gather_mla_slots",
       "gather_indexer", "gather_indexer_slots", "v4_mla_quant_and_cache", "mxfp4_quant_and_cache",
       "gather_v4", "gather_v4_slots", "gather_v4_slots_mxfp4", "v4_dsa_write", "gather_v4_window"}


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
        # how sure: the op's samples, their spread, the yardsticks' spreads and the flag
        assert r["samples"] == 2
        assert r["min_us"] <= r["p10_us"] <= r["q1_us"] <= r["us"] <= r["q3_us"] <= r["p90_us"]
        assert r["spread_pct"] == pytest.approx(100 * (r["q3_us"] - r["q1_us"]) / r["us"])
        assert r["copy_spread_pct"] >= 0 and r["torch_spread_pct"] >= 0
        spreads = {"op": r["spread_pct"], "same-size copy": r["copy_spread_pct"],
                   "torch": r["torch_spread_pct"]}
        assert r["noisy_in"] == [k for k, v in spreads.items() if v > NOISY_SPREAD_PCT]
        assert r["noisy"] == bool(r["noisy_in"])
        assert r["gbps"] == pytest.approx(r["bytes"] / r["us"] / 1e3)
        assert r["pct_copy"] == pytest.approx(100 * r["gbps"] / data["copy_gbps"])
        assert r["pct_same_copy"] == pytest.approx(100 * r["copy_us"] / r["us"])
        assert r["speedup"] == pytest.approx(r["torch_us"] / r["us"])
    # the copy yardstick: measured at the start, after every size and at the end
    copy = data["copy"]
    assert [p["at"] for p in copy["checkpoints"]] == \
        ["start", "LBNHC T=1", "LBNHC T=8", "BLHNC T=1", "BLHNC T=8", "end"]
    assert copy["samples"] == sum(p["n"] for p in copy["checkpoints"]) and copy["spread_pct"] >= 0
    assert copy["gbps"] == data["copy_gbps"]
    lo, hi = min(p["gbps"] for p in copy["checkpoints"]), max(p["gbps"] for p in copy["checkpoints"])
    assert lo <= data["copy_gbps"] <= hi
    assert isinstance(data["warnings"], list)
    committed = BENCH / "results" / "bench_cpu.json"
    if committed.exists():  # the machine's usual figure comes from the committed run, if it
        old = json.loads(committed.read_text())  # was measured on this host; else it is named
        if old["meta"].get("host") in (None, meta["host"]):
            assert data["usual_copy"]["gbps"] == old["copy_gbps"]
        else:
            assert data["usual_copy"] is None
            assert meta["usual_copy_other_host"]["host"] == old["meta"]["host"]
    copies = data["block_copies"]
    assert {(c["layout"], c["direction"], c["blocks"]) for c in copies} == \
        {(lay, d, n) for lay in ("BLHNC", "LBNHC") for d in ("to_host", "to_device") for n in (1, 16, 64)}
    spans = {(c["layout"], c["blocks"]): c["spans"] for c in copies}
    assert all(spans[("BLHNC", n)] < spans[("LBNHC", n)] for n in (1, 16, 64))
    assert all(c["samples"] == 2 and c["spread_pct"] >= 0 and "noisy" in c for c in copies)
    md = (tmp_path / "bench_cpu.md").read_text()
    assert md.count("| dsa_write |") == 4 and "Incomplete" not in md
    assert "| us/call | spread % |" in md and "usual copy bandwidth" in md
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
    def result(op, tokens, us, pct, speedup, graph):
        return Result(op, "BLHNC", tokens, us, 1000, 1.0, pct, us, 100.0, speedup * us, speedup,
                      None, graph)

    good = [result("a", 16384, 10, 90, 12, False), result("c", 64, 4, 5, 20, True),
            result("gather_indexer", 16384, 10, 75, 12, False)]  # 132-byte rows: 70% suffices
    assert [t.met for t in targets(good, "cuda")] == [True, True, True, True]
    bad = good + [result("b", 65536, 10, 80, 9, False), result("d", 16384, 10, 95, 9.5, False),
                  result("e", 8, 6.5, 1, 30, True), result("indexer_k_quant_and_cache", 16384, 10, 60, 12, False)]
    bandwidth, idx_bandwidth, latency, speedup = targets(bad, "cuda")
    assert not bandwidth.met and "b BLHNC T=65536: 80%" in bandwidth.detail and "a BLHNC" not in bandwidth.detail
    assert "gather_indexer" not in bandwidth.detail  # indexer ops have their own target
    assert not idx_bandwidth.met and "indexer_k_quant_and_cache BLHNC T=16384: 60%" in idx_bandwidth.detail
    assert not latency.met and "e BLHNC T=8: 6.50 us" in latency.detail and "c BLHNC" not in latency.detail
    assert not speedup.met and "d BLHNC T=16384: 9.5x" in speedup.detail
    cpu, cpu_fp8 = targets(bad, "cpu")
    assert cpu.met and "d BLHNC T=16384: 9.5x" in cpu.detail  # the closest case
    assert cpu_fp8.met and "indexer_k_quant_and_cache BLHNC T=16384: 60%" in cpu_fp8.detail
    slow = bad + [result("dsa_write", 16384, 10, 30, 12, False)]
    assert not targets(slow, "cpu")[1].met and "misses: dsa_write BLHNC T=16384: 30%" in targets(slow, "cpu")[1].detail
    assert targets(good, "cpu")[1].met is None  # no fp8 op in that run
    assert [t.met for t in targets([], "cuda")] == [None, None, None, None]


# How sure the figures are: spreads, noisy rows, the copy yardstick's warnings.

META = {"device_name": "CPU", "device": "cpu", "torch": "t", "cuda": None, "commit": "c" * 40,
        "date": "2026-12-01", "copy_bytes": 256 << 20, "host": "test-cpu x2", "complete": True}


def row(op="a", tokens=16384, us=10.0, pct_copy=50.0, pct_same=80.0, speedup=8.0, spread=5.0,
        copy_spread=5.0, torch_spread=5.0):
    # GB/s such that write(), which takes pct_copy against the copy yardstick, keeps pct_copy
    # with steady_copy()'s 20 GB/s
    r = Result(op, "BLHNC", tokens, us, 1000, pct_copy * 20 / 100, pct_copy, us * pct_same / 100, pct_same,
               speedup * us, speedup, None, False, copy_spread_pct=copy_spread,
               torch_spread_pct=torch_spread)
    r.set_stats(Timing([us] * 5).stats())
    r.spread_pct = spread
    return r


def steady_copy(gbps=20.0, points=("start", "end")):
    us = 2 * META["copy_bytes"] / gbps / 1e3
    return copy_summary([(at, [us] * 5) for at in points], META["copy_bytes"])


def test_timing_quantiles_and_spread():
    t = Timing([float(x) for x in (5, 1, 4, 2, 3, 100)])
    st = t.stats()
    assert st["n"] == 6 and st["min"] == 1 and st["median"] == 3.5
    assert st["q1"] == pytest.approx(2.25) and st["q3"] == pytest.approx(4.75)
    assert st["p10"] == pytest.approx(1.5) and st["p90"] == pytest.approx(52.5)
    # one stray sample moves neither the median nor the interquartile spread much
    assert st["spread_pct"] == pytest.approx(100 * 2.5 / 3.5)
    assert Timing([7.0] * 4).spread_pct == 0


def test_interleaved_timers_alternate_and_take_every_repeat():
    log = []
    a = Timer([lambda: log.append("a")], torch.device("cpu"), use_graph=False)
    b = Timer([lambda: log.append("b")], torch.device("cpu"), use_graph=False)
    log.clear()  # the warm-up calls
    ta, tb = time_interleaved([(a, 10), (b, 3)], rounds=5)
    assert ta.n == 10 and tb.n == 3 and log.count("a") == 10 and log.count("b") == 3
    # every round times a, then b's share: b's samples are spread through the run, not bunched
    first_b, last_b = log.index("b"), len(log) - 1 - log[::-1].index("b")
    assert first_b < log.index("a", 5) and last_b == len(log) - 1 and log[:2] == ["a", "a"]


def test_noisy_rows_are_flagged_and_targets_say_so(tmp_path):
    quiet = row("quiet", speedup=6.0)
    shaky = row("shaky", speedup=12.0, spread=80.0)  # meets the CPU target, on noisy figures
    shaky_ref = row("shaky_ref", speedup=9.0, torch_spread=45.0)  # the torch yardstick is
    results = [quiet, shaky, shaky_ref]
    write(tmp_path, "t", results, steady_copy(), [{"layout": "BLHNC", "direction": "to_host",
          "blocks": 1, "spans": 1, "bytes": 1000, "us": 5.0, "gbps": 0.2, "spread_pct": 50.0}],
          META, False)
    data = json.loads((tmp_path / "bench_t.json").read_text())
    flags = {r["op"]: (r["noisy"], r["noisy_in"]) for r in data["results"]}
    assert flags == {"quiet": (False, []), "shaky": (True, ["op"]), "shaky_ref": (True, ["torch"])}
    assert data["block_copies"][0]["noisy"] and data["noisy_spread_pct"] == NOISY_SPREAD_PCT
    target, fp8_target = data["targets"]
    assert fp8_target["met"] is None  # no fp8 op among these rows
    assert target["met"] and sorted(target["noisy_passes"]) == ["shaky BLHNC T=16384",
                                                                "shaky_ref BLHNC T=16384"]
    assert "shaky BLHNC T=16384 (noisy)" in target["detail"]
    md = (tmp_path / "bench_t.md").read_text()
    lines = {ln.split(" | ")[0][2:]: ln for ln in md.splitlines() if ln.startswith("| ")}
    assert "⚠" not in lines["quiet"]
    assert "| 80 ⚠ |" in lines["shaky"] and "5 ⚠ (torch 45)" in lines["shaky_ref"]
    assert "met (2 noisy)" in md and "2 of 3 rows" in md
    # a noisy case that misses is named noisy too
    t, _ = targets(results + [row("slow", speedup=3.0, copy_spread=60.0)], "cpu")
    assert not t.met and t.detail.startswith("misses: slow BLHNC T=16384: 3.0x (noisy)")
    # with the spread under the bound, the same rows are not flagged
    for r in results:
        r.spread_pct = r.torch_spread_pct = NOISY_SPREAD_PCT
    t, _ = targets(results, "cpu")
    assert t.noisy_passes == [] and "noisy" not in t.detail


def test_implausible_pct_of_copy_warns(tmp_path):
    fine = row("fine", pct_copy=90, pct_same=95)
    cached = row("cached", tokens=4096, pct_copy=187, pct_same=219)  # the idle CPU run's highest
    assert run_warnings([fine, cached], steady_copy(), None, "cpu") == []
    # on a GPU the L2 is flushed: 187 % of the copy bandwidth cannot be right
    (w,) = run_warnings([fine, cached], steady_copy(), None, "cuda")
    assert w.startswith("implausible % of the copy bandwidth") and "cached BLHNC T=4096, 187 %" in w
    loaded = row("loaded", tokens=64, pct_copy=359, pct_same=51274)  # figures of a loaded machine
    warnings = write(tmp_path, "t", [fine, loaded], steady_copy(), [], META, False)
    assert len(warnings) == 2
    assert any(w.startswith(f"implausible % of the copy bandwidth: 1 row(s) above "
                            f"{MAX_PCT_COPY['cpu']:.0f} %") and "359 %" in w for w in warnings)
    assert any(w.startswith(f"implausible % of a same-size copy: 1 row(s) above "
                            f"{MAX_PCT_SAME_COPY:.0f} %") and "loaded BLHNC T=64, 51274 %" in w
               for w in warnings)
    data = json.loads((tmp_path / "bench_t.json").read_text())
    assert data["warnings"] == warnings
    md = (tmp_path / "bench_t.md").read_text()
    assert "**Warnings**" in md and md.index("**Warnings**") < md.index("## Targets")
    assert all(w in md for w in warnings)


def test_copy_yardstick_drift_warns():
    steady = steady_copy(20.0, ("start", "BLHNC T=1", "end"))
    assert run_warnings([], steady, None, "cpu") == []
    us = lambda gbps: [2 * META["copy_bytes"] / gbps / 1e3] * 5  # noqa: E731
    within = copy_summary([("start", us(20)), ("BLHNC T=1", us(16)), ("end", us(14))],
                          META["copy_bytes"])
    assert run_warnings([], within, None, "cpu") == []  # 1.43x apart: under the bound
    drift = copy_summary([("start", us(20)), ("BLHNC T=1", us(18)), ("end", us(9))],
                         META["copy_bytes"])
    assert drift["gbps"] == pytest.approx(18)  # the median of all the samples
    (w,) = run_warnings([], drift, None, "cpu")
    assert w.startswith("copy yardstick drift") and "20.0 GB/s at the start" in w
    assert "9.0 GB/s at the end" in w and "2.2x apart" in w
    # one checkpoint whose samples disagree among themselves: a noisy yardstick
    shaky = copy_summary([("start", us(20) + us(10) + us(40))], META["copy_bytes"])
    (w,) = run_warnings([], shaky, None, "cpu")
    assert w.startswith("noisy copy yardstick")


def test_copy_yardstick_below_usual_figure_warns(tmp_path, capsys):
    usual_file = tmp_path / "usual.json"
    usual_file.write_text(json.dumps({"meta": dict(META, commit="u" * 40), "copy_gbps": 40.0}))
    usual = usual_copy(usual_file, META)
    assert usual["gbps"] == 40.0 and usual["commit"] == "u" * 40
    assert run_warnings([], steady_copy(30.0), usual, "cpu") == []
    (w,) = run_warnings([], steady_copy(20.0), usual, "cpu")
    assert w.startswith("copy yardstick far below usual") and "20.0 GB/s in this run" in w
    assert "40.0 GB/s in" in w
    # another device, another copy size or another host: no usual figure to compare with
    for other in ({"device_name": "NVIDIA H200"}, {"copy_bytes": 1 << 30}, {"host": "other x64"}):
        assert usual_copy(usual_file, dict(META, **other)) is None
    assert usual_copy(tmp_path / "absent.json", META) is None
    # end to end: the run says it on stderr, in the JSON and in the Markdown header
    usual_file.write_text(json.dumps({"meta": dict(META, host=bench_cache_ops.host_name()),
                                      "copy_gbps": 1e6}))
    out = tmp_path / "run"
    assert bench_cache_ops.main(["--device", "cpu", "--budget-s", "0", "--no-block-copies",
                                 "--repeats", "2", "--out", str(out),
                                 "--usual-copy", str(usual_file)]) == 0
    data = json.loads((out / "bench_cpu.json").read_text())
    assert data["usual_copy"]["gbps"] == 1e6
    assert [p["at"] for p in data["copy"]["checkpoints"]] == ["start", "end"]
    assert any(w.startswith("copy yardstick far below usual") for w in data["warnings"])
    assert "warning: copy yardstick far below usual" in capsys.readouterr().err
    assert "copy yardstick far below usual" in (out / "bench_cpu.md").read_text()


def test_a_result_from_another_host_is_named_not_compared(tmp_path):
    """The committed results may come from another machine (AMD EPYC, Intel Xeon with AMX...):
    a run on this host names that host and compares nothing with its figure."""
    usual_file = tmp_path / "usual.json"
    usual_file.write_text(json.dumps({"meta": dict(META, host="Some Other CPU @ 9.9GHz x2"),
                                      "copy_gbps": 1e6}))
    out = tmp_path / "run"
    assert bench_cache_ops.main(["--device", "cpu", "--budget-s", "0", "--no-block-copies",
                                 "--repeats", "2", "--out", str(out),
                                 "--usual-copy", str(usual_file)]) == 0
    data = json.loads((out / "bench_cpu.json").read_text())
    assert data["usual_copy"] is None
    assert data["meta"]["usual_copy_other_host"]["host"] == "Some Other CPU @ 9.9GHz x2"
    assert not any("usual" in w for w in data["warnings"])
    assert ("measured on Some Other CPU @ 9.9GHz x2: not compared"
            in (out / "bench_cpu.md").read_text())


def test_a_run_with_capped_row_loops_gets_its_own_files(tmp_path, monkeypatch):
    """KVC_CPU_ISA=avx2 (the loops CPUs without AVX-512 run) writes bench_cpu_avx2.*, and every
    run records which loops it measured."""
    monkeypatch.setattr(bench_cache_ops, "cpu_isa", lambda: "avx2")
    monkeypatch.setenv("KVC_CPU_ISA", "avx2")
    assert bench_cache_ops.main(["--device", "cpu", "--budget-s", "0", "--no-block-copies",
                                 "--repeats", "2", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "bench_cpu.json").exists()
    assert json.loads((tmp_path / "bench_cpu_avx2.json").read_text())["meta"]["cpu_isa"] == "avx2"
    assert "CPU row loops: avx2" in (tmp_path / "bench_cpu_avx2.md").read_text()
    monkeypatch.delenv("KVC_CPU_ISA")
    out = tmp_path / "widest"
    assert bench_cache_ops.main(["--device", "cpu", "--budget-s", "0", "--no-block-copies",
                                 "--repeats", "2", "--out", str(out)]) == 0
    assert (out / "bench_cpu.json").exists()
