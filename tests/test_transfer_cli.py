"""python -m kvcache_ext transfer (span list and counts for two plans on the command line), and
split specs shown by the views table, the page data, the legend and the CLI."""
from __future__ import annotations

import re

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import cli
from kvcache_ext.viz import model, picture, text


def run(argv, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def spans_line(out: str) -> tuple[int, int]:
    m = re.search(r"^spans: (\d+) for (\d+) bytes", out, re.M)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def test_transfer_default_is_the_seed_request(capsys):
    rc, out, err = run(["transfer", "--matrix"], capsys)
    assert rc == 0, err
    assert out.startswith("src BLHNC: 8 blocks x 64 tokens, 806912 bytes")
    assert spans_line(out) == (12, 3 * 2 * 64 * (656 + 132))
    rows = re.findall(r"^(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\w+ L\d b\d+ \+\d+)", out, re.M)
    assert len(rows) == 12 and rows[8][:4] == ("8", "504320", "83968", "41984")
    matrix = {line.split()[0]: [int(v) for v in line.split()[1:]]
              for line in out.splitlines() if re.match(r"^(LB|LH|BL|BH)\w+\s+\d", line)}
    assert matrix["BLHNC"] == [12, 12, 12, 2, 2, 2] and matrix["LBNHC"] == [8, 8, 8, 12, 12, 12]


def test_transfer_lists_what_the_api_gives(capsys):
    argv = ["transfer", "--src", "LBNHC", "--dst", "BLNHC", "--block-size", "16",
            "--dst-block-size", "8", "--block-table", "3,0,2", "--tokens", "40", "--src-start",
            "5", "--dst-start", "3", "--dst-block-table", "7,1,2,9,4,5", "--show", "0", "--spec",
            "mla:656", "--spec", "indexer:128+4"]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2, split=(128, 4))]
    src, dst = kvc.plan_cache(specs, 6, 16, "LBNHC"), kvc.plan_cache(specs, 12, 8, "BLNHC")
    want = kvc.TransferPlan(src, dst).token_spans(
        torch.tensor([3, 0, 2], dtype=torch.int32), torch.tensor([7, 1, 2, 9, 4, 5],
                                                                 dtype=torch.int32),
        40, src_start=5, dst_start=3)
    assert spans_line(out) == (want.shape[0], int(want[:, 2].sum()))
    listed = [tuple(map(int, m)) for m in re.findall(r"^\d+\s+(\d+)\s+(\d+)\s+(\d+)\s", out, re.M)]
    assert listed == [tuple(r) for r in want.tolist()]
    assert "indexer:132 split 128+4" in out


def test_transfer_ranges_and_blocks(capsys):
    argv = ["transfer", "--src", "LBHNC", "--dst", "BLHNC", "--spec", "k:32:6:8", "--spec",
            "v:32:6:8", "--dst-spec", "k:32:3:4", "--dst-spec", "v:32:3:4", "--layer-range",
            "k:2:0:3", "--layer-range", "v:2:0:3", "--head-range", "k:4:0:4", "--head-range",
            "v:4:0:4", "--block-size", "4", "--blocks", "1:2,2:3"]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    assert "k layers 2..4 -> 0..2, heads 4..7 -> 0..3" in out
    assert spans_line(out) == (12, 2 * 2 * 3 * 4 * 4 * 32)


BAD = [
    (["transfer", "--blocks", "0:0", "--dst-block-size", "16"], "equal block sizes"),
    (["transfer", "--blocks", "0-1"], "SRC:DST"),
    (["transfer", "--layer-range", "mla:1:0:2"], "outside src_plan"),
    (["transfer", "--layer-range", "mla:1:0"], "NAME:SRC_FIRST:DST_FIRST:COUNT"),
    (["transfer", "--block-table", "0,99", "--num-blocks", "4"], "outside [0, num_blocks = 4)"),
    (["transfer", "--dst-spec", "mla:576", "--dst-spec", "indexer:132"], "differs in row_bytes"),
    (["transfer", "--spec", "indexer:128+4+1"], "A+B"),
    (["transfer", "--move", "kv"], "'kv' is not in src_plan"),
    (["transfer", "--src", "XYZ"], "layout must be one of"),
    (["transfer", "--tokens", "1000"], "block_table has 3 entries"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_transfer_bad_arguments_one_line(argv, message, capsys):
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err


def test_split_specs_are_shown(capsys):
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2, split=(128, 4))]
    plan = kvc.plan_cache(specs, 8, 64, "BLHNC")
    table = text.views_table(plan)
    assert table[1].split()[-1] == "split" and table[-1].split()[-1] == "128+4"
    assert table[-2].split()[-1] == "-"
    assert model.plan_data(plan)["specs"][1]["split"] == [128, 4]
    legend = [lab.text for lab in picture.map_picture(plan, [0, 1, 5]).labels]
    assert "indexer (132 B/token split 128+4, 2 layers, 1 head)" in legend
    plain = text.views_table(kvc.plan_cache(specs[:1], 8, 64, "BLHNC"))
    assert "split" not in plain[1]  # the seed's table keeps its columns
    rc, out, err = run(["layout", "--spec", "mla:656", "--spec", "indexer:128+4"], capsys)
    assert rc == 0 and "128+4" in out, err


@pytest.mark.parametrize("path", ["auto", "staged", "strided"])
def test_transfer_through_nixl_prints_what_it_did(capsys, path):
    import os
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    try:
        import kvcache_ext.nixl  # noqa: F401
    except ImportError:
        if os.environ.get("KVC_REQUIRE_NIXL") == "1":
            raise
        pytest.skip("nixl is not installed")
    rc, out, _ = run(["transfer", "--dst-block-size", "16", "--block-table", "0,5,2",
                      "--nixl", "--path", path, "--show", "1"], capsys)
    assert rc in (0, None), out
    spans, nbytes = spans_line(out)
    assert re.search(r"^as strided runs .*: \d+$", out, re.M)
    m = re.search(r"^NIXL read .*: path (\w+), (\d+) pieces posted in (\d+) transfer\(s\), (\d+) "
                  r"bytes .*; the same bytes as copy_spans$", out, re.M)
    assert m, out
    assert m.group(1) == ("plain" if path == "auto" else path) and int(m.group(4)) == nbytes
    assert int(m.group(2)) <= spans if path == "staged" else int(m.group(2)) == spans
