"""The pieces of benchmarks/gpu_check.sh that can be checked without a GPU: the cases it runs
(sanitize_case.py, on the CPU here), its kernel-coverage check, the ncu report's parsing and
arithmetic, and which tests `pytest -m gpu` selects."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ncu_report  # benchmarks/ (pyproject.toml's pytest pythonpath)
import sanitize_case
from conftest import _needs_gpu

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_the_sanitizer_and_ncu_cases_run_every_op_on_the_cpu():
    """The same calls the device runs under compute-sanitizer and ncu (CPU: no bad slots, no
    pinned memory; ncu's case at a small T), so a wrong argument shows here, not there."""
    cpu = torch.device("cpu")
    sanitize_case.every_op(cpu)
    sanitize_case.racecheck_case(cpu)
    sanitize_case.ncu_case(cpu, tokens=256)


def test_every_cuda_kernel_is_named_and_a_missing_launch_is_reported():
    names = sanitize_case.kernel_names()
    assert {"dsa_kernel", "v4_pair_write_kernel", "mla_gather_kernel", "v4_mla_gather_kernel",
            "v41_write_kernel", "copy_chunks_kernel", "v4_window_gather_kernel"} <= set(names)
    assert len(names) == len(set(names)) >= 17
    launched = ["void dsa_kernel<false, true, true>(kvc::MlaWriteParams, kvc::IndexerWriteParams)",
                "void kvc::v4_mla_gather_kernel<(kvc::MlaGatherMode)1>(kvc::V4GatherParams)"]
    # v4_mla_gather_kernel does not count as mla_gather_kernel: whole words only
    assert sanitize_case.never_launched(launched, ["dsa_kernel", "mla_gather_kernel",
                                                   "v4_mla_gather_kernel"]) == ["mla_gather_kernel"]


def _raw_csv(path: Path, rows: list[dict[str, str]], units: dict[str, str]) -> None:
    """A file shaped as `ncu --import R --page raw --csv`: a header, a units row, one row a launch."""
    cols = ["ID", "Kernel Name"] + [k for k in units]
    lines = ["==PROF== Connected to process 1", ",".join(f'"{c}"' for c in cols),
             ",".join(f'"{units.get(c, "")}"' for c in cols)]
    lines += [",".join(f'"{r.get(c, "")}"' for c in cols) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_ncu_report_reads_the_last_launch_and_divides_by_tokens(tmp_path):
    units = {"gpu__time_duration.sum": "ns", "dram__bytes.sum.per_second": "byte/s",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": "%",
             "smsp__issue_active.avg.pct_of_peak_sustained_active": "%",
             "smsp__inst_executed.sum": "inst",
             "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "%",
             "smsp__warp_issue_stalled_selected_per_warp_active.pct": "%",
             "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct": "%",
             "smsp__warp_issue_stalled_wait_per_warp_active.pct": "%"}
    name = "void dsa_kernel<false, true, true>(kvc::MlaWriteParams, kvc::IndexerWriteParams)"
    first = {"ID": "0", "Kernel Name": name, "smsp__inst_executed.sum": "1"}
    second = {"ID": "2", "Kernel Name": name, "gpu__time_duration.sum": "12,500",
              "dram__bytes.sum.per_second": "3,900,000,000,000",
              "dram__throughput.avg.pct_of_peak_sustained_elapsed": "81.5",
              "smsp__issue_active.avg.pct_of_peak_sustained_active": "20.25",
              "smsp__inst_executed.sum": "7,208,960",
              "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "40",
              "smsp__warp_issue_stalled_selected_per_warp_active.pct": "90",
              "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct": "25.5",
              "smsp__warp_issue_stalled_wait_per_warp_active.pct": "3"}
    csv = tmp_path / "ncu.csv"
    _raw_csv(csv, [first, second], units)
    rows, got_units = ncu_report.read_rows(csv)
    static, commit = ncu_report.static_counts(BENCH / "results" / "sass_after.json")
    (k,) = ncu_report.report(rows, got_units, 16384, static)
    assert k.duration_us == 12.5 and k.dram_gb_s == 3900.0 and k.dram_pct_of_peak == 81.5
    assert k.inst_per_token == 440.0  # 7,208,960 / 16,384
    assert k.static_per_token == 400  # sass_after.json: the aligned bf16 / ue8m0 fused write
    assert k.top_stalls == [("long_scoreboard", 40.0), ("lg_throttle", 25.5), ("wait", 3.0)]
    assert "x1.10" in ncu_report.summary_line(k)
    for ncu_name in ("void kvc::cuda::<unnamed>::dsa_kernel<(bool)0, (bool)1, (bool)1>"
                     "(kvc::MlaWriteParams, kvc::IndexerWriteParams)",
                     "void kvc::cuda::(anonymous namespace)::dsa_kernel<false, true, true>"
                     "(kvc::MlaWriteParams, kvc::IndexerWriteParams)"):
        assert ncu_report.normalise(ncu_name) in static  # how ncu may spell it
    assert ncu_report._bytes_per_second(2.0, "GB/s") == 2e9
    assert ncu_report._bytes_per_second(2.0, "furlong/s") is None  # warned, not fatal


def test_ncu_report_cli_writes_json_and_markdown(tmp_path):
    name = "void mla_gather_kernel<(kvc::MlaGatherMode)1, (kvc::MlaFormat)1>(kvc::MlaGatherParams)"
    _raw_csv(tmp_path / "ncu.csv", [{"Kernel Name": name, "smsp__inst_executed.sum": "5406720"}],
             {"smsp__inst_executed.sum": "inst"})
    sys.argv = ["ncu_report", str(tmp_path / "ncu.csv"), "--out", str(tmp_path / "o"), "--gpu", "H"]
    ncu_report.main()
    data = json.loads((tmp_path / "o" / "ncu_T16384.json").read_text())
    assert data["gpu"] == "H" and data["sass_commit"]
    (k,) = data["kernels"]
    assert k["inst_per_token"] == 330.0 and k["static_per_token"] == 330 and k["hw_over_static"] == 1.0
    assert "`mla_gather_kernel<(kvc::MlaGatherMode)1,(kvc::MlaFormat)1>(kvc::MlaGatherParams)`" in \
        (tmp_path / "o" / "ncu_T16384.md").read_text()


def test_a_file_that_is_not_an_ncu_export_is_refused(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="not an `ncu --page raw --csv` export"):
        ncu_report.read_rows(tmp_path / "x.csv")


def _item(params: dict, reasons: list[str] = ()):
    marks = [SimpleNamespace(name="skipif", kwargs={"reason": r}) for r in reasons]
    return SimpleNamespace(callspec=SimpleNamespace(params=params), iter_markers=lambda: iter(marks))


def test_pytest_m_gpu_selects_the_cuda_cases_and_the_tests_that_need_a_gpu():
    assert _needs_gpu(_item({"device": "cuda", "layout": "BLHNC"}))
    assert _needs_gpu(_item({"devs": ("cpu", "cuda")}))
    assert _needs_gpu(_item({}, ["needs a GPU"]))
    assert not _needs_gpu(_item({"device": "cpu"}))
    assert not _needs_gpu(_item({}, ["checks the message without a GPU"]))
