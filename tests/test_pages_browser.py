"""The pages in a real browser: headless Chromium (the distribution's package) opens the HTML report of a known finding
and the committed matrix, offline, and the tests assert on what it drew - the finding's grid cells with their colours,
read off the browser's layout and style and off a screenshot's pixels; the matrix cell of a known cause and the cause
it links to. Screenshots are saved under reports/browser/.

Without Chromium the module is skipped with one line saying how to install it; CI installs it and runs this module
with KVCACHE_NO_SKIPS=1, where a skip fails (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance.cli import main as conformance_main

from .browser import INSTALL, chromium, pixel, probe, screenshot
from .test_report_page import STANDIN

if chromium() is None:
    pytest.skip(f"headless Chromium not found: {INSTALL}", allow_module_level=True)

pytestmark = pytest.mark.slow   # a browser start per page, 2-4 s each
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "reports" / "browser"
GREEN, RED = (67, 160, 71), (229, 57, 53)   # .both and .target-only grid cells (report_page.STYLE)
WRONG_CELL = (255, 205, 210)   # a matrix cell whose worst class is wrong


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(part) for part in css[css.index("(") + 1:css.index(")")].split(",")[:3])


def _centre(drawn: dict[str, Any]) -> tuple[int, int]:
    return int(drawn["x"] + drawn["width"] / 2), int(drawn["y"] + drawn["height"] / 2)


def test_the_report_of_a_known_finding_draws_its_grid(tmp_path: Path) -> None:
    """CellWindowOffByOne keeps one position too many on a ring of window 1: at the failing call, query 1 (position
    1) attends token 0 as well - the one cell drawn "target only", red - and token 1, "spec and target", green."""
    page = tmp_path / "report.html"
    assert conformance_main(["--target", STANDIN, "--strict", "--html", str(page)]) == 1
    cells = probe(page, "#cause-1 rect.cell")
    states = {(c["data"]["query"], c["data"]["column"]): c for c in cells}
    assert {key: c["data"]["state"] for key, c in states.items()} == {
        ("0", "t0"): "both", ("0", "t1"): "neither", ("1", "t0"): "target-only", ("1", "t1"): "both"}
    assert all(c["width"] > 10 and c["height"] > 10 for c in cells)   # drawn, not only in the markup
    assert _rgb(states[("1", "t0")]["fill"]) == RED and _rgb(states[("1", "t1")]["fill"]) == GREEN
    labels = [c["text"] for c in probe(page, "#cause-1 svg.grid text")]
    assert "q1 p1 s0" in labels and "t0" in labels and "p0" in labels
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "report.png"
    screenshot(page, shot)
    assert pixel(shot, *_centre(states[("1", "t0")])) == RED
    assert pixel(shot, *_centre(states[("1", "t1")])) == GREEN


def test_the_matrix_shows_a_known_cause_and_links_it() -> None:
    """transformers' StaticCache with sliding layers (hf:static_sliding, docs/hf-findings.md): its attention cell
    is "wrong", linked to its cause, whose grid below has a query missing a token the spec owes (spec only)."""
    page = ROOT / "docs" / "matrix.html"
    drawn = {(c["data"]["target"], c["data"]["family"]): c for c in probe(page, "td[data-family]")}
    cell = drawn[("static_sliding", "attention")]
    assert cell["data"]["class"] == "wrong" and cell["text"] == "wrong" and cell["width"] > 0
    assert drawn[("dynamic_full", "attention")]["text"] == "ok"
    links = probe(page, 'td[data-target="static_sliding"][data-family="attention"] a')
    assert len(links) == 1
    target = probe(page, "#transformers-static-sliding-cause-1 rect.cell")
    assert any(c["data"]["state"] == "spec-only" for c in target), target
    assert all(c["width"] > 10 for c in target)
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "matrix.png"
    screenshot(page, shot)
    assert _rgb(cell["background"]) == WRONG_CELL and pixel(shot, int(cell["x"]) + 3, int(cell["y"]) + 3) == WRONG_CELL
