"""The layout page in a real browser (headless Chromium via Selenium), and the CLI's pictures.

The browser test needs Debian's chromium and chromium-driver plus selenium (scripts/setup.sh
--browser installs them; CI sets KVC_REQUIRE_BROWSER=1 so a missing browser fails there
instead of skipping). A screenshot of the seed example is saved to tests/artifacts/.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import kvcache_ext as kvc

ARTIFACTS = Path(__file__).parent / "artifacts"
REQUIRE = os.environ.get("KVC_REQUIRE_BROWSER") == "1"
SEED_ARGS = ["layout", "--layout", "BLHNC", "--layout", "LBNHC", "--layers", "2", "--block-size", "64",
             "--spec", "mla:656", "--spec", "indexer:132", "--token", "130", "--block-table", "0,1,5",
             "--layer", "1", "--num-blocks", "8"]
SPECS = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvcache_ext", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_prints_the_seed_example():
    r = run_cli(*SEED_ARGS, "--side-by-side")
    assert r.returncode == 0, r.stderr
    assert "slot = 5 x 64 + 2 = 322" in r.stdout
    assert "mla layer 1: 0 + 1x41984 + 5x100864 + 2x656 = 547616" in r.stdout
    assert "indexer layer 1: 83968 + 1x8448 + 5x100864 + 2x132 = 597000" in r.stdout
    assert "[ mla L0 | mla L1 | indexer L0 | indexer L1 ]" in r.stdout
    assert "0 41984 83968 92416 100864" in run_cli("layout", "--token", "10").stdout


@pytest.mark.parametrize("args,message", [
    (["--layout", "BNLHC"], "layout must be one of"),
    (["--token", "500"], "block table has 3 entries"),
    (["--spec", "mla"], "--spec must be"),
    (["--spec", "mla:x"], "--spec must be"),
    (["--block-table", "0,1,99", "--num-blocks", "8"], r"block_table\[2\] = 99"),
])
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    r = run_cli("layout", *args, "--html", str(tmp_path / "x.html"))
    assert r.returncode == 2
    assert re.search(message, r.stderr) and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr and not (tmp_path / "x.html").exists()


def test_capacity_command():
    r = run_cli("capacity", "--tp", "4", "--pp", "2", "--block-size", "16", "--requests", "17,32")
    assert r.returncode == 0, r.stderr
    assert "112 KiB/token" in r.stdout and "14 KiB/token" in r.stdout
    assert "effective 56 MiB" in r.stdout and "49 effective vs 64 allocated slots" in r.stdout


def test_svg_and_png(tmp_path):
    r = run_cli(*SEED_ARGS, "--svg", str(tmp_path / "m.svg"), "--png", str(tmp_path / "m.png"))
    assert r.returncode == 0, r.stderr
    svg = (tmp_path / "m.svg").read_text()
    ET.fromstring(svg)  # well-formed
    # Both --layouts are drawn, side by side in one picture: one nested <svg> each.
    maps = re.findall(r'<svg [^>]*data-layout="(\w+)" x="([\d.]+)"[^>]*>(.*?)</svg>', svg, re.S)
    assert [(m[0], float(m[1]) > 0) for m in maps] == [("BLHNC", False), ("LBNHC", True)]
    for layout, _, body in maps:
        cells = re.findall(r'data-start="(\d+)" data-end="(\d+)"', body)
        assert len(cells) == 8 * 4  # every block of the seed plan, four pages each
        spans = sorted((int(a), int(b)) for a, b in cells)
        assert spans[0][0] == 0 and spans[-1][1] == 8 * 100864
        assert all(x[1] == y[0] for x, y in zip(spans, spans[1:]))  # the pages tile the buffer
        plan = kvc.plan_cache(SPECS, 8, 64, layout)
        hits = re.findall(r'class="cell hit"[^>]*data-start="(\d+)" data-end="(\d+)" data-spec="(\w+)"',
                          body)
        assert sorted(h[2] for h in hits) == ["indexer", "mla"]  # the walked token's rows
        assert all(int(a) <= plan.address(spec, 1, 322) < int(b) for a, b, spec in hits)
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_large_plans_elide_blocks(tmp_path):
    r = run_cli("layout", "--layout", "LBNHC", "--num-blocks", "5000", "--block-table", "0,1,4321",
                "--svg", str(tmp_path / "big.svg"))
    assert r.returncode == 0, r.stderr
    svg = (tmp_path / "big.svg").read_text()
    assert 0 < svg.count("<rect class=\"cell\"") <= 4 * 16 and "...4317" in svg and "...677" in svg
    assert 'data-block="4321"' in svg


# ---- the page in a browser ------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if REQUIRE:
            raise
        pytest.skip("selenium is not installed")
    if not (chromium and driver_path):
        if REQUIRE:
            pytest.fail("chromium and chromedriver are required (KVC_REQUIRE_BROWSER=1)")
        pytest.skip("chromium / chromedriver not installed (scripts/setup.sh --browser)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                 "--window-size=1100,1400", f"--user-data-dir={tmp_path_factory.mktemp('chrome')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
    yield drv
    drv.quit()


def text(drv, css: str) -> str:
    from selenium.webdriver.common.by import By
    return drv.find_element(By.CSS_SELECTOR, css).text


def addresses(drv) -> dict[str, int]:
    from selenium.webdriver.common.by import By
    rows = drv.find_elements(By.CSS_SELECTOR, "#addresses tbody tr")
    return {r.get_attribute("data-spec"): int(r.find_element(By.CSS_SELECTOR, ".address").text)
            for r in rows}


def hit_cells(drv) -> list[tuple[str, int, int]]:
    return drv.execute_script("""
      return [...document.querySelectorAll('.map-wrap')].filter(w => w.style.display !== 'none')
        .flatMap(w => [...w.querySelectorAll('.cell.hit')])
        .map(c => [c.dataset.spec, +c.dataset.start, +c.dataset.end]);""")


def test_page_in_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    page = tmp_path / "seed.html"
    r = run_cli(*SEED_ARGS, "--html", str(page))
    assert r.returncode == 0, r.stderr
    source = page.read_text()
    # Self-contained: no external scripts, styles, fonts or images.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", source)
    assert "@import" not in source and "url(" not in source
    browser.get(page.as_uri())
    browser.get_log("performance")  # drop the page load's own entry

    # The seed example opens with its numbers.
    assert text(browser, "#chain-logical") == "2" and text(browser, "#chain-physical") == "5"
    assert text(browser, "#chain-slot") == "322"
    assert addresses(browser) == {"mla": 547616, "indexer": 597000}
    hits = hit_cells(browser)
    assert sorted(h[0] for h in hits) == ["indexer", "mla"]
    for spec, start, end in hits:
        assert start <= {"mla": 547616, "indexer": 597000}[spec] < end
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "seed_example.png"))

    # Pick another token and layer through the page's own controls, in both layouts.
    token = browser.find_element(By.ID, "token-input")
    token.clear()
    token.send_keys("75")
    Select(browser.find_element(By.ID, "layer-select")).select_by_value("0")
    for index, layout in enumerate(["BLHNC", "LBNHC"]):
        Select(browser.find_element(By.ID, "layout-select")).select_by_value(str(index))
        plan = kvc.plan_cache(SPECS, 8, 64, layout)
        assert text(browser, "#chain-slot") == "75"  # block_table[1] = 1, position 11
        assert addresses(browser) == {s: plan.address(s, 0, 75) for s in ("mla", "indexer")}
        for spec, start, end in hit_cells(browser):
            assert start <= plan.address(spec, 0, 75) < end
    terms = browser.find_element(By.CSS_SELECTOR, '#addresses tr[data-spec="indexer"] .term-layer').text
    assert terms == f"0 × {plan.tensor('indexer').layer_stride:,} = 0"  # LBNHC: 8448 x 8 blocks

    # Side by side: both maps drawn, each with its own highlighted cells.
    browser.find_element(By.ID, "side-by-side").click()
    shown = browser.execute_script(
        "return [...document.querySelectorAll('.map-wrap')].filter(w => w.style.display !== 'none')"
        ".map(w => [w.dataset.layout, w.querySelectorAll('.cell.hit').length]);")
    assert shown == [["BLHNC", 2], ["LBNHC", 2]]

    # A token beyond the block table is refused on the page, not computed.
    token.clear()
    token.send_keys("300")
    assert "block table has 3 entries" in text(browser, "#walk-error")

    # The page made no network request: everything it loaded came from the file itself.
    urls = [json.loads(e["message"])["message"].get("params", {}).get("request", {}).get("url", "")
            for e in browser.get_log("performance")]
    assert [u for u in urls if u and not u.startswith(("file:", "data:", "about:"))] == []
