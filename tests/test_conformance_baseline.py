"""--baseline (issue 41.3): a run against an earlier run's report prints each cause known or NEW, and its exit
status counts the new ones only. A second defect of a kind that already fails (wrong OP-ATTEND at a fetch on a
ring layer) is NEW with its own minimal program; a target against its own report has no new cause; two invalid
values of one configuration key accepted are two causes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import layouts
from kvcache_spec.conformance.cli import main
from kvcache_spec.conformance.malform import config_cases
from kvcache_spec.conformance.suite import cause
from kvcache_spec.conformance.targets import parse_target

ONE = "python:tests.op_standin:contiguous_ring_one_too_wide"
TWO = "python:tests.op_standin:contiguous_ring_two_defects"


def _run(tmp_path: Path, target: str, name: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    code = main(["--target", target, "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_own_baseline_has_no_new_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, first = _run(tmp_path, ONE, "first")
    assert code == 1 and first["semantic"]["findings"] and first["failing_programs"]
    code, again = _run(tmp_path, ONE, "again", "--baseline", str(tmp_path / "first.json"))
    printed = capsys.readouterr().out
    assert again["baseline"]["new"] == 0 and again["baseline"]["known"] == len(first["semantic"]["findings"])
    assert again["baseline"]["gone"] == [] and again["baseline"]["newly_failing_programs"] == 0
    assert code == 0, printed   # every cause known: the exit status counts none
    assert "0 NEW" in printed and "  known wrong" in printed and "  NEW " not in printed


def test_second_defect_of_a_failing_kind_is_new(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, ONE, "first")
    known = json.loads((tmp_path / "first.json").read_text())["semantic"]["findings"]
    assert [f["label"] for f in known] == ["wrong OP-ATTEND: at fetch (attends tokens the spec does not); ring"]
    code, now = _run(tmp_path, TWO, "now", "--baseline", str(tmp_path / "first.json"))
    printed = capsys.readouterr().out
    assert code == 1
    marked = {f["label"]: f for f in now["semantic"]["findings"]}
    assert marked[known[0]["label"]]["baseline"] == "known"
    missed = marked["wrong OP-ATTEND: at fetch (misses tokens the spec attends); ring"]
    assert missed["baseline"] == "new" and missed["shrunk"]
    # its own minimal program: one step exactly as long as a window of 2 (not the known cause's window of 1)
    assert missed["config_name"] == "cap 2, ring(2)"
    assert missed["steps"] == [{"op": "fetch", "layer": 0, "positions": [0, 1]}]
    assert now["baseline"]["new"] >= 1 and now["baseline"]["newly_failing_programs"] > 0
    assert "  NEW   wrong" in printed and "against the baseline: NOT CONFORMING" in printed


def test_baseline_of_another_seed_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, ONE, "first")
    assert main(["--target", ONE, "--seed", "1", "--baseline", str(tmp_path / "first.json")]) == 2
    assert "seed 0, not this run's 1" in capsys.readouterr().err


def test_each_invalid_value_accepted_is_its_own_cause() -> None:
    """capacity 0 and capacity True, both accepted: two causes (one per value class), not one per family."""
    target = parse_target("python:tests.op_standin:contiguous_trusting_undeclared")
    try:
        found = {}
        for case, cfg in config_cases("op-contiguous"):
            if case.name in ("op.create.capacity 0", "op.create.capacity bool"):
                finding = layouts.run_any(target, cfg, [], True).finding
                assert finding is not None and finding.kind == "lenient", case.name
                found[case.name] = cause(finding, cfg, [])
    finally:
        target.close()
    assert len(found) == 2 and found["op.create.capacity 0"] != found["op.create.capacity bool"]


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_against_reports_a_program_wrong_on_one_target_only(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """--against: the old version (one defect) and the new (a second one) on the same programs; the programs wrong
    on the new one only are reported, shrunk on both; the exit status says a program fails here only."""
    code, report = _run(tmp_path, TWO, "against", "--against", ONE)
    printed = capsys.readouterr().out
    against = report["against"]
    assert code == 1 and against["same_programs"] and against["only_there_programs"] == 0
    assert against["only_here_programs"] > 0
    found = {(d["label"], d["config_name"], json.dumps(d["steps"])) for d in against["only_here"]}
    assert ("wrong OP-ATTEND: at fetch (misses tokens the spec attends); ring", "cap 2, ring(2)",
            json.dumps([{"op": "fetch", "layer": 0, "positions": [0, 1]}])) in found
    assert all(d["shrunk"] and d["wrong_on"] == TWO and d["right_on"] == ONE for d in against["only_here"])
    assert "programs wrong here only" in printed
    assert main(["--target", ONE, "--against", TWO, "--baseline", "x.json"]) == 2   # one comparison at a time
