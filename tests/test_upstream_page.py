"""tests/upstream_page.py renders docs/upstream-findings.md's generated parts from JSON reports: what it
writes for a report's findings and coverage (no upstream install needed: a report of the JSON's shape). And
the page held to a fresh run of both upstream caches (needs the `upstream` extra: skipped without it, except
where KVCACHE_REQUIRE_UPSTREAM=1 - CI's upstream stage - where a missing install fails)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance.op.upstream import MODULE
from kvcache_spec.conformance.suite import NOT_CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget

from .upstream_install import import_or_skip
from .upstream_page import TARGET, main, not_on_page, not_replaying, render, show_program

PAGE = Path(__file__).resolve().parent.parent / "docs" / "upstream-findings.md"
PROFILE = "pre-merge"   # the page's "How to reproduce": --strict --profile pre-merge, seed 0

REMOVAL = [{"op": "begin", "seqs": [2]}, {"op": "fetch", "layer": 0, "positions": [0]},
           {"op": "rm", "seq": 0, "p0": 0, "p1": None}]
MALFORMED = [{"op": "begin", "seqs": [True], "clause": "op.begin_step.seq_ids.id", "variant": "bool"},
             {"op": "cp", "src": 0, "dst": 0, "upto": -1, "clause": "op.seq_cp.upto", "variant": "below"},
             {"op": "fetch", "layer": -1, "positions": [], "clause": "op.update_and_fetch.layer_id", "variant": "-1"}]


def _finding(kind: str, rule: str, steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"class": kind, "rule": rule, "label": f"{kind} {rule}: at {steps[-1]['op'] if steps else 'create'}; flat",
            "config_name": "cap 1, flat x2", "steps": steps, "programs_hit": 3, "shrunk": True, "note": "",
            "after": "", **extra}


def _report(findings: list[dict[str, Any]], never: list[str]) -> dict[str, Any]:
    return {"semantic": {"findings": findings},
            "coverage": {"programs": {"planned": 10, "run": 10, "continued": 4},
                         "configurations": {"planned": 2, "created": 2},
                         "families": {"planned": ["flat"], "exercised": ["flat"]},
                         "rules": {"exercised": ["OP-STEP"], "not_exercised": ["OP-RM"]},
                         "clauses": {"exercised": ["op.seq_rm.p0 below"], "not_exercised": never}}}


def test_a_program_is_written_as_the_page_writes_it() -> None:
    assert show_program(REMOVAL) == "`begin [2]`; `fetch L0 [0]`; `rm(0, 0)`"
    assert show_program(MALFORMED) == ("`begin [True] ⟨begin_step.seq_ids.id bool⟩`; "
                                       "`cp(0, 0, -1) ⟨seq_cp.upto below⟩`; "
                                       "`fetch L-1 [] ⟨update_and_fetch.layer_id -1⟩`")
    assert show_program([]) == "`create`"


def test_every_finding_is_a_numbered_row_with_its_counts_and_coverage() -> None:
    cell = _report([_finding("wrong", "OP-STEP", REMOVAL),
                    _finding("wrong", "OP-ATTEND", MALFORMED, after="lenient OP-STEP in begin_step",
                             safety="SAFE-OP-ISOLATION", shrunk=False)], ["op.create.n_layers 0"])
    contiguous = _report([_finding("lenient", "OP-CONFIG", [])], [])
    page = render([("cell", cell), ("contiguous", contiguous)])
    block = " ".join(page[:page.index("```", 3)].split())   # the coverage lines, unwrapped
    assert "cell: 10/10 programs (+4 rerun" in block and "1/2 rules in scope exercised" in block
    assert "1/2 argument and configuration cases broken; never broken: create.n_layers 0" in block
    assert "| cell | wrong OP-STEP | 1 | 0 |" in page and "| cell | **total** | **2** | **1** |" in page
    assert "| contiguous | **total** | **1** | **0** |" in page
    assert "| 1 | wrong OP-STEP | at rm; flat | cap 1, flat x2 | `begin [2]`; `fetch L0 [0]`; `rm(0, 0)` | 3 |" in page
    assert ("| 2 | wrong OP-ATTEND, after lenient OP-STEP in begin_step (SAFE-OP-ISOLATION) | at fetch; flat | "
            "cap 1, flat x2 | **not shrunk**: `begin [True]") in page
    assert "### contiguous: every distinct cause (1)" in page and "| 1 | lenient OP-CONFIG | at create; flat" in page


def test_the_command_wants_two_reports(capsys: Any) -> None:
    assert main(["only-one.json"]) == 2
    assert "python -m tests.upstream_page" in capsys.readouterr().err


def test_check_names_each_generated_block_the_page_does_not_hold(tmp_path: Any, capsys: Any) -> None:
    cell = _report([_finding("wrong", "OP-STEP", REMOVAL)], [])
    contiguous = _report([_finding("lenient", "OP-CONFIG", [])], [])
    generated = render([("cell", cell), ("contiguous", contiguous)])
    page = "# A page\n\nProse.\n\n" + generated + "\n## After\n"
    assert not_on_page(page, generated) == []
    stale = page.replace("| cell | wrong OP-STEP | 1 | 0 |", "| cell | wrong OP-STEP | 2 | 0 |")
    stale_blocks = not_on_page(stale, generated)
    assert [block.splitlines()[0] for block in stale_blocks] == ["| cache | class, rule | causes | of which not shrunk |"]
    paths = []
    for name, report in (("cell", cell), ("contiguous", contiguous)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
        paths.append(str(tmp_path / f"{name}.json"))
    (tmp_path / "page.md").write_text(page)
    (tmp_path / "stale.md").write_text(stale)
    assert main([*paths, "--check", str(tmp_path / "page.md")]) == 0 and capsys.readouterr().out == ""
    assert main([*paths, "--check", str(tmp_path / "stale.md")]) == 1
    assert "not on " in capsys.readouterr().out


@pytest.mark.slow   # both caches at strict pre-merge, about 40 s; CI's upstream stage runs it (-m "")
@pytest.mark.filterwarnings("ignore::Warning")   # upstream's ExperimentalWarning on every config
def test_the_page_holds_a_fresh_run_of_both_upstream_caches() -> None:
    """The page's coverage block, counts and every cause list are what a run today renders, word for word,
    and every cause's program shows its cause again on a fresh cache: a change to the suite or the engine
    that moves a cause fails here until the page is refreshed (python -m tests.upstream_page)."""
    import_or_skip(MODULE)
    reports = []
    for name in ("cell", "contiguous"):
        started = time.monotonic()
        report = report_json(run_suite(PythonTarget(TARGET + name), PROFILE), True, False)
        print(f"\nupstream {name}: {report['verdict']} at strict {PROFILE}, "
              f"{len(report['semantic']['findings'])} distinct causes, {time.monotonic() - started:.1f} s")
        assert report["verdict"] == NOT_CONFORMING, name
        reports.append((name, report))
        folder = os.environ.get("KVCACHE_LIBRARY_REPORTS")   # CI's matrix (kvcache matrix) is built from them
        if folder:
            (Path(folder) / f"upstream_{name}.json").write_text(json.dumps(report))
    missing = not_on_page(PAGE.read_text(encoding="utf-8"), render(reports))
    assert missing == [], "refresh docs/upstream-findings.md (python -m tests.upstream_page ...):\n" + \
        "\n\n".join(missing)
    assert not_replaying(reports) == []
