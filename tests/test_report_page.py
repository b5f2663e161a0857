"""The HTML report (spec/conformance/report_page.py, drawing.py) and the matrix (matrix.py), without a browser
(tests/test_pages_browser.py opens them in one): a wrong answer's finding carries the attend grid the page draws,
the page is one self-contained file, `kvcache report` renders a saved JSON report as `--html` does, a layout adds
its own drawing of its cells, and the matrix is its reports' table - the committed one held to the libraries'
documented causes (tests/library_verdicts.py)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import drawing, matrix, report_page
from kvcache_spec.conformance.cli import main as conformance_main
from kvcache_spec.conformance.suite import replay
from kvcache_spec.rules import RULES

from .library_verdicts import EXPECTED

ROOT = Path(__file__).resolve().parent.parent
STANDIN = "python:tests.op_standin:CellWindowOffByOne"   # a window one position too long (OP-ATTEND)
# Its minimal program (what a quick run shrinks to): two tokens of sequence 0 on a ring of window 1; query 1 (position
# 1) must attend token 1 only, the stand-in also lets it attend token 0.
CONFIG = {"capacity": 2, "n_layers": 2, "layers": [{"kind": "flat", "window": 0, "n_kv_heads": 1, "head_dim": 1},
                                                   {"kind": "ring", "window": 1, "n_kv_heads": 1, "head_dim": 1}],
          "initial_capacity": 512, "max_write": None, "n_kv_heads": 1, "head_dim": 1, "v_head_dim": 1,
          "batch_size": 1, "sizing": "dynamic"}
STEPS = [{"op": "begin", "seqs": [0, 0]}, {"op": "fetch", "layer": 1, "positions": [0, 1]}]


@pytest.fixture(scope="module")
def standin_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The stand-in judged at strict quick, its JSON report and its HTML page (one run for the module)."""
    folder = tmp_path_factory.mktemp("standin")
    code = conformance_main(["--target", STANDIN, "--strict", "--json", str(folder / "r.json"), "--html",
                             str(folder / "r.html")])
    assert code == 1
    return json.loads((folder / "r.json").read_text()), folder


def test_a_wrong_attend_carries_its_grid_and_the_cells() -> None:
    from kvcache_spec.conformance.layouts import run_any
    from kvcache_spec.conformance.targets import parse_target

    target = parse_target(STANDIN)
    try:
        finding = run_any(target, CONFIG, STEPS, False).finding
    finally:
        target.close()
    assert finding is not None and (finding.kind, finding.rule) == ("wrong", "OP-ATTEND")
    attend = finding.picture["attend"]
    assert (attend["layer"], attend["batch"], attend["head"], attend["query"]) == (1, 0, 0, 1)
    assert attend["queries"] == [{"position": 0, "seq": 0}, {"position": 1, "seq": 0}] and attend["sequences"]
    assert attend["spec"] == [[0], [1]] and attend["target"] == [[0], [0, 1]]
    assert [(i, key, state) for i, key, state in drawing.grid_cells(attend) if state != drawing.NEITHER] == \
        [(0, "t0", drawing.BOTH), (1, "t0", drawing.TARGET_ONLY), (1, "t1", drawing.BOTH)]
    assert finding.picture["cells"] == {"layout": "op-cell", "cells": [
        {"cell": 0, "token": 0, "position": 0, "owners": [0]}, {"cell": 1, "token": 1, "position": 1, "owners": [0]}]}


def test_the_page_draws_each_cause_offline(standin_report: tuple[dict[str, Any], Path]) -> None:
    report, folder = standin_report
    html = (folder / "r.html").read_text()
    finding = report["semantic"]["findings"][0]
    assert finding["picture"]["attend"]["target"][1] == [0, 1]
    assert html.index('id="verdict"') < html.index('id="cause-1"')   # verdict and coverage first
    assert 'class="cell target-only" x=' in html and 'data-column="t0" data-state="target-only"' in html
    assert 'class="cellbox own0" data-cell="0"' in html and "step 1: call" in html
    assert "def test_kvcache_conformance_wrong_op_attend" in html   # the pytest test to copy
    # self-contained: nothing fetched - no script, no stylesheet or image by address, every link in the page
    assert "<script" not in html and not re.search(r"""(src|href)=["'](?!#)""", html) and "url(" not in html
    assert report_page.render(report) == html


def test_the_replay_command_replays_the_cause() -> None:
    command = report_page.replay_command(STANDIN, {"config": CONFIG, "steps": STEPS})
    code = command.split("\n", 1)[1].rsplit("\nEOF", 1)[0]   # the here-document's Python
    assert command.startswith("python - <<'EOF'\n")
    printed: list[Any] = []
    exec(code, {"print": printed.append})   # noqa: S102 - the page's own text, run as a user runs it
    assert printed[0]["rule"] == "OP-ATTEND" and printed[0] == replay(STANDIN, CONFIG, STEPS)


def test_kvcache_report_renders_a_saved_report(standin_report: tuple[dict[str, Any], Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from kvcache_spec.cli import main

    _, folder = standin_report
    assert main(["report", str(folder / "r.json"), "--html", str(folder / "again.html")]) == 0
    assert (folder / "again.html").read_text() == (folder / "r.html").read_text()
    (folder / "not.json").write_text('{"format": 1}')
    assert main(["report", str(folder / "not.json"), "--html", str(folder / "x.html")]) == 2
    assert "not a kvcache conformance JSON report" in capsys.readouterr().err
    assert main(["report", str(folder / "missing.json"), "--html", str(folder / "x.html")]) == 2
    assert conformance_main(["--html", "-"]) == 2 and "--html -" in capsys.readouterr().err


def test_a_hundred_causes_stay_small(standin_report: tuple[dict[str, Any], Path]) -> None:
    """A report of 100 causes of the real shape (the stand-in's cause, grid and cells, 100 times): the page's size."""
    report, _ = standin_report
    many = copy.deepcopy(report)
    one = many["semantic"]["findings"][0]
    many["semantic"]["findings"] = [dict(one, cause=n, causes_of_rule=100) for n in range(1, 101)]
    size = len(report_page.render(many).encode())
    print(f"\n100 causes: {size} bytes ({size / 1024:.0f} KiB); JSON {len(json.dumps(many))} bytes")
    assert size < 1_500_000, size


def test_a_layout_adds_its_own_drawing_of_its_cells() -> None:
    picture = {"layout": "paged-test", "blocks": [[0, 1], [2]]}
    assert drawing.cells_drawing(picture).startswith("<pre>")   # no drawing: its JSON, never dropped
    try:
        @drawing.draws_cells("paged-test")
        def blocks(cells: dict[str, Any]) -> str:
            return f"<svg data-blocks='{len(cells['blocks'])}'></svg>"
        assert drawing.cells_drawing(picture) == "<svg data-blocks='2'></svg>"
    finally:
        drawing.CELL_DRAWINGS.pop("paged-test", None)


# --- the matrix ---------------------------------------------------------------------------------------------------
def test_every_rule_is_in_exactly_one_family() -> None:
    listed = [rule for rules in matrix.FAMILIES.values() for rule in rules]
    assert sorted(listed) == sorted(rule.id for rule in RULES)


def test_each_librarys_version_is_its_extras_pin() -> None:
    pins = (ROOT / "pyproject.toml").read_text()
    for marker, library, version, page_name in matrix.LIBRARIES:
        distribution = {"transformers": "transformers", "mlx-lm": "mlx-lm", "executorch": "executorch"}.get(library,
                                                                                                          "llama-cpp-python")
        assert f"{distribution}=={version}" in pins + (ROOT / ".ci" / "run").read_text(), library
        assert (ROOT / "docs" / page_name).exists(), page_name


def _report(target: str, findings: list[tuple[str, str]], exercised: list[str]) -> dict[str, Any]:
    return {"target": target, "verdict": "NOT CONFORMING" if findings else "CONFORMING", "strict": True,
            "profile": "pre-merge", "coverage": {"rules": {"exercised": exercised, "not_exercised": []}},
            "semantic": {"findings": [{"class": kind, "rule": rule, "label": f"{kind} {rule}: at fetch; flat",
                                       "message": "m", "config_name": "cap 1, flat", "config": {}, "steps": [],
                                       "cause": 1, "causes_of_rule": 1} for kind, rule in findings]}}


def test_a_cell_is_its_familys_worst_class_linked_to_its_cause(tmp_path: Path) -> None:
    reports = [_report("python:kvcache_spec.conformance.op.hf:static_full",
                       [("lenient", "OP-CONFIG"), ("wrong", "OP-ATOMIC"), ("over-strict", "OP-TRIM"),
                        ("lenient", "OP-TRIM")], ["OP-ATTEND", "OP-CONFIG", "OP-ATOMIC", "OP-TRIM"]),
               _report("python:kvcache_spec.conformance.op.mlxlm:kv", [], ["OP-ATTEND"])]
    cells = matrix.cells(reports[0])
    assert cells["configuration"] == ("lenient", 1) and cells["steps and atomicity"] == ("wrong", 2)
    assert cells["trim and removal"] == ("over-strict", 3) and cells["attention"] == (matrix.OK, 0)
    assert cells["sequences"] == (matrix.NOT_JUDGED, 0)
    table = matrix.markdown(reports)
    assert table.splitlines()[2].startswith("| transformers | 5.23.0 | `static_full` | NOT CONFORMING (strict) |")
    assert "[**wrong**](hf-findings.md)" in table and "| mlx-lm | 0.32.2 | `kv` | CONFORMING (strict) | - |" in table
    html = matrix.render(reports)
    assert '<a href="#transformers-static-full-cause-2">wrong</a>' in html
    assert 'id="transformers-static-full-cause-2"' in html
    paths = []
    for n, report in enumerate(reports):
        paths.append(str(tmp_path / f"{n}.json"))
        Path(paths[-1]).write_text(json.dumps(report))
    md, page = str(tmp_path / "m.md"), str(tmp_path / "m.html")
    assert matrix.main([*paths, "--markdown", md, "--html", page]) == 0
    assert matrix.main([*paths, "--markdown", md, "--html", page, "--check"]) == 0
    Path(md).write_text(Path(md).read_text().replace("**wrong**", "**lenient**"))
    assert matrix.main([*paths, "--markdown", md, "--html", page, "--check"]) == 1


def test_the_committed_matrix_holds_the_libraries_documented_causes() -> None:
    """docs/matrix.md's row of each hf and mlx-lm target: its verdict, and in each family the worst class of the
    causes tests/library_verdicts.py holds the target to (CI regenerates the table from its runs and --checks it)."""
    text = (ROOT / "docs" / "matrix.md").read_text()
    names = list(matrix.FAMILIES)
    for target, expected in EXPECTED.items():
        library = "transformers" if target.startswith(("hf:", "hf_batch:")) else "mlx-lm"
        name = target.split(":", 1)[1]
        row = next((line for line in text.splitlines() if line.startswith(f"| {library} |")
                    and f"| `{name}` |" in line), None)
        assert row is not None, target
        fields = [field.strip() for field in row.strip("|").split("|")]
        assert fields[3] == f"{expected['verdict']} (strict)", (target, fields[3])
        worst: dict[str, str] = {}
        for key in expected["causes"]:
            kind, rule = key.split(":", 1)[0].rsplit(" ", 1)
            family = matrix.FAMILY_OF[rule]
            if family not in worst or matrix.SEVERITY.index(kind) < matrix.SEVERITY.index(worst[family]):
                worst[family] = kind
        for family, shown in zip(names, fields[4:]):
            kind = re.sub(r"\[\*\*(.*)\*\*\]\(.*\)", r"\1", shown)
            assert kind == worst.get(family, kind if kind in (matrix.OK, matrix.NOT_JUDGED) else "(none)"), \
                (target, family, shown)


def test_a_cell_layout_finding_carries_the_cells_and_their_owners() -> None:
    """The cell layout's findings carry the spec's cell table as the failing call found it (drawn by the layout's
    own drawing): upstream's lax cell cache refuses a fork of a new, empty sequence - one cell, free."""
    from kvcache_spec.conformance.suite import report_json, run_suite
    from kvcache_spec.conformance.targets import parse_target

    target = parse_target("python:kvcache_spec.conformance.zoo:upstream_lax_cells")
    try:
        report = report_json(run_suite(target, "quick", stop_after_first=True), True, False)
    finally:
        target.close()
    finding = report["semantic"]["findings"][0]
    assert (finding["class"], finding["rule"]) == ("over-strict", "CELL-FORK")
    cells = finding["picture"]["cells"]
    assert cells["layout"] == "cell" and len(cells["cells"]) == finding["config"]["capacity"]
    assert all(cell["owners"] == [] and cell["position"] is None for cell in cells["cells"])
    assert 'class="cellbox free" data-cell="0"' in drawing.cells_drawing(cells)


@pytest.mark.slow   # two pytest processes
def test_without_chromium_the_browser_test_says_how_and_is_skipped_never_passed() -> None:
    """No Chromium on PATH: tests/test_pages_browser.py is skipped with the one line saying how to install it, and
    where a skip is forbidden (KVCACHE_NO_SKIPS=1, as CI runs it) the run fails."""
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key not in ("KVCACHE_NO_SKIPS", "KVCACHE_CHROMIUM")}
    env["PATH"] = str(Path(sys.executable).parent)   # the venv's own commands: no chromium
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "", "-p", "no:cacheprovider",
               "tests/test_pages_browser.py"]
    skipped = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # exit 5: no test ran (none passed); a skip, said in one line
    assert skipped.returncode == 5 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    assert "headless Chromium not found: apt-get install -y chromium" in skipped.stdout
    forbidden = subprocess.run(command, cwd=ROOT, env={**env, "KVCACHE_NO_SKIPS": "1"}, capture_output=True,
                               text=True, timeout=300)
    assert forbidden.returncode == 1 and "KVCACHE_NO_SKIPS=1: 1 skipped" in forbidden.stdout, forbidden.stdout[-2000:]
