"""The command line a new user meets: demo at any size, bad arguments refused up front in one
line, every option's default in its help, usage without a subcommand, both layouts drawn, and
a PNG with the SVG's labels and legend."""
from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import cli
from kvcache_ext.cli import demo
from kvcache_ext.viz import page

SPECS = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """main() in this process (fast): exit status, stdout, stderr."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's errors exit from parse_args
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


# ---- demo -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 100])
def test_demo_runs_for_small_token_counts(n, capsys):
    rc, out, err = run(["demo", "--device", "cpu", "--tokens", str(n)], capsys)
    assert rc == 0, err
    assert "demo: all checks passed" in out
    walked = min(130, -(-n // 2) - 1)  # request 0 holds ceil(n / 2) tokens
    assert out.count(f"token {walked}: logical block {walked} // 64 = 0, block_table[0] = 0") == 2


def test_demo_default_keeps_the_seed_walk():
    assert demo.request_lengths(4096) == [2048, 1365, 683]
    assert demo.walked_token(4096) == 130
    table, cu, slots = demo.make_requests(4096, 72, torch.Generator().manual_seed(0))
    assert table[0, :3].tolist() == [0, 1, 5] and cu.tolist() == [0, 2048, 3413, 4096]
    assert slots[130].item() == 322  # seed 000: block_table[2] = 5, 5 x 64 + 2
    assert demo.request_lengths(1) == [1] and demo.request_lengths(2) == [1, 1]


# ---- bad arguments: one line on stderr, exit 2, nothing on stdout ---------------------------
BAD = [
    (["demo", "--tokens", "-3"], "--tokens"),
    (["demo", "--tokens", "0"], "--tokens"),
    (["demo", "--tokens", "99999999999"], "at most"),
    (["layout", "--png", "/tmp/map.txt"], "must end in .png"),
    (["demo", "--device", "cuda"], "no CUDA device"),
    (["demo", "--device", "xyz"], "cpu or cuda"),
    (["layout", "--html", "/nonexistent_dir/x.html"], "does not exist"),
    (["layout", "--png", "/nonexistent_dir/x.png"], "does not exist"),
    (["layout", "--svg", "/nonexistent_dir/x.svg"], "does not exist"),
    (["layout", "--num-blocks", "0"], "--num-blocks"),
    (["layout", "--layer", "5"], "layer"),
    (["capacity", "--budget-gib", "0"], "--budget-gib"),
    (["capacity", "--budget-gib", "-5"], "--budget-gib"),
    (["capacity", "--requests", "17,x"], "--requests"),
    (["capacity", "--tp", "3"], "divisible"),
    (["capacity", "--model", "gpt-9"], "model must be one of"),
    (["capacity", "--model", "deepseek-v3.2", "--kv-heads", "8"], "cannot be combined"),
    (["capacity", "--model", "deepseek-v3.2", "--dtype-bytes", "1"], "fixed formats"),
    (["capacity", "--model", "llama-3.1-8b", "--spec", "k:256"], "cannot be combined"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_are_one_line_before_any_output(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "cuda" is absent everywhere
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err


def test_bad_arguments_in_a_real_process():
    r = subprocess.run([sys.executable, "-m", "kvcache_ext", "demo", "--tokens", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1


def test_no_subcommand_prints_usage_and_exits_2():
    r = subprocess.run([sys.executable, "-m", "kvcache_ext"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("usage: python -m kvcache_ext")
    assert all(re.search(rf"^\s+{c}\s+\w", r.stderr, re.M) for c in ("layout", "capacity", "demo",
                                                                    "transfer"))


# ---- help -----------------------------------------------------------------------------------
def test_every_option_has_help_showing_its_default():
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subs.choices) == {"layout", "capacity", "demo", "transfer"}
    for name, sub in subs.choices.items():
        sub.format_help()  # every help string formats
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings} has no help"
            text = action.help % dict(vars(action), prog=sub.prog)  # what --help prints
            assert "(default: " in text, f"{name} {action.option_strings}: {text!r}"
            if action.default is not None and not isinstance(action.default, bool):
                assert f"(default: {action.default}" in text or f"here {action.default})" in text, \
                    f"{name} {action.option_strings}: {text!r}"


# ---- pictures -------------------------------------------------------------------------------
def svg_texts(svg: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>(.*?)</text>", svg)]


@pytest.mark.parametrize("layouts", [["BLHNC"], ["BLHNC", "LBNHC"], ["LHBNC"]])
def test_png_has_the_svg_labels_and_legend(layouts, tmp_path):
    specs = SPECS if layouts != ["LHBNC"] else [kvc.CacheSpec("kv", 256, 2, 4)]
    plans = [kvc.plan_cache(specs, 8, 64, lay) for lay in layouts]
    page.write_svg(tmp_path / "m.svg", plans, 130, [0, 1, 5], 1)
    svg = svg_texts((tmp_path / "m.svg").read_text())
    fig = page.png_figure(plans, 130, [0, 1, 5], 1)
    png = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sorted(png) == sorted(svg)
    for plan in plans:
        assert f"{plan.layout}: 8 blocks x 64 tokens, {plan.total_bytes:,} bytes" in png  # title
        for s in specs:  # legend
            assert f"{s.name} ({s.row_bytes} B/token, 2 layers, {s.num_heads} head" \
                   f"{'s' if s.num_heads > 1 else ''})" in png
        assert any(t.startswith("token 130 -> slot 322: ") for t in png)  # the walk
    assert "block 5" in png or "kv L1 H0" in png  # row labels
    # The walked rows (head 0 of each spec) are outlined in the PNG as in the SVG.
    outlined = [p for ax in fig.axes for p in ax.patches if p.get_linewidth() > 0]
    assert len(outlined) == len(layouts) * len(specs)


def test_layout_draws_every_layout_into_svg_and_png(tmp_path, capsys):
    argv = ["layout", "--layout", "BLHNC", "--layout", "LBNHC", "--num-blocks", "8",
            "--svg", str(tmp_path / "m.svg"), "--png", str(tmp_path / "m.png")]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    svg = (tmp_path / "m.svg").read_text()
    assert re.findall(r'data-layout="(\w+)"', svg) == ["BLHNC", "LBNHC"]
    from matplotlib.image import imread
    width = imread(str(tmp_path / "m.png")).shape[1]
    assert width > 2 * 960  # two maps side by side
