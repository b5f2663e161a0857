"""`kvcache verify`: verdicts, exit codes, reports."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvcache_proofs import verify
from kvcache_spec import cli

BROKEN = "python:kvcache_proofs._mc_broken:"


def _reports(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    json_file, junit_file = tmp_path / "verify.json", tmp_path / "verify.xml"
    return json_file, junit_file, ["--json", str(json_file), "--junit", str(junit_file)]


@pytest.mark.slow
def test_reference_passes_the_quick_profile(tmp_path: Path) -> None:
    """Every stage but CrossHair's (tests/test_proofs.py runs the gate; its time depends on the load)."""
    json_file, junit_file, report_args = _reports(tmp_path)
    assert verify.main(["--profile", "quick", "--stages", "stateful,z3,model-checker", *report_args]) == 0
    data = json.loads(json_file.read_text())
    assert data["verdict"] == "pass"
    assert [s["name"] for s in data["stages"]] == ["stateful", "z3", "model-checker"]
    assert all(s["verdict"] == "pass" for s in data["stages"])
    checker = data["stages"][-1]["numbers"]
    assert checker["states"] > 500 and checker["configs"] == "96/96"
    suite = ET.parse(junit_file).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "0"


def _gate_child(verdict: str, confirmed: int, counterexample: int, unknown: int) -> str:
    summary = {"confirmed": confirmed, "counterexample": counterexample, "unknown": unknown,
               "failed otherwise": 0, "rows": confirmed + counterexample + unknown}
    return (f"import json; print(json.dumps({{'verdict': {verdict!r}, 'summary': {summary!r}, 'excluded': 0, "
            f"'table': 'the gate table'}}))")


@pytest.mark.parametrize("verdict, confirmed, counterexample, unknown, code, junit", [
    ("PASS", 4, 0, 0, 0, None),
    ("FAIL", 3, 1, 0, 1, "failure"),        # a counterexample always fails
    ("INCOMPLETE", 3, 0, 1, 3, "error"),    # unknown: not a pass, and not a counterexample either
])
def test_crosshair_stage_reports_unknown_apart_from_counterexample(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verdict: str, confirmed: int, counterexample: int,
        unknown: int, code: int, junit: str) -> None:
    """The gate runs in a child process; its JSON line decides the verdict, and the table, the JSON and
    the JUnit report keep counterexample and unknown apart."""
    monkeypatch.setattr(verify, "_CROSSHAIR_CHILD", _gate_child(verdict, confirmed, counterexample, unknown))
    json_file, junit_file, report_args = _reports(tmp_path)
    assert verify.main(["--profile", "quick", "--stages", "crosshair", *report_args]) == code
    stage = json.loads(json_file.read_text())["stages"][0]
    assert stage["verdict"] == {"PASS": "pass"}.get(verdict, verdict)
    assert (stage["numbers"]["counterexample"], stage["numbers"]["unknown"]) == (counterexample, unknown)
    case = ET.parse(junit_file).getroot().find("testsuite/testcase")
    assert case is not None
    if junit is None:
        assert case.find("failure") is None and case.find("error") is None
    else:
        element = case.find(junit)
        assert element is not None and element.get("type") == ("counterexample" if junit == "failure" else "incomplete")
        assert case.find({"failure": "error", "error": "failure"}[junit]) is None


def test_a_model_checker_out_of_time_is_incomplete_not_a_violation(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The clock is a safety net: when it runs out the stage is INCOMPLETE (exit 3), with no counterexample."""
    monkeypatch.setitem(verify.PROFILES, "quick", dataclasses.replace(verify.PROFILES["quick"], mc_budget=0.01))
    json_file, junit_file, report_args = _reports(tmp_path)
    assert verify.main(["--profile", "quick", "--stages", "model-checker", *report_args]) == 3
    stage = json.loads(json_file.read_text())["stages"][0]
    assert stage["verdict"] == "INCOMPLETE" and stage["numbers"]["counterexample"] == 0
    assert stage["numbers"]["unknown configs"] > 0
    assert "INCOMPLETE" in capsys.readouterr().out
    error = ET.parse(junit_file).getroot().find("testsuite/testcase/error")
    assert error is not None and error.get("type") == "incomplete"


def test_a_counterexample_outranks_an_incomplete_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "_CROSSHAIR_CHILD", _gate_child("INCOMPLETE", 3, 0, 1))
    monkeypatch.setattr(verify, "TARGET_STAGES", ("crosshair", "model-checker"))   # both run with --target
    assert verify.main(["--profile", "quick", "--stages", "crosshair,model-checker",
                        "--target", BROKEN + "lenient_step"]) == 1


def test_broken_implementation_fails_with_a_shortest_counterexample(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Upstream's rewind floor: the model checker finds the 3-operation program (two steps, rewind(0))."""
    json_file, junit_file, report_args = _reports(tmp_path)
    code = verify.main(["--profile", "quick", "--stages", "model-checker",
                        "--target", BROKEN + "upstream_floor", *report_args])
    assert code == 1
    out = capsys.readouterr().out
    assert "shortest counterexample (3 operations)" in out and "Rewind(new_len=0)" in out
    stage = json.loads(json_file.read_text())["stages"][0]
    assert stage["verdict"] == "FAIL" and stage["numbers"]["counterexample ops"] == 3
    failure = ET.parse(junit_file).getroot().find("testsuite/testcase/failure")
    assert failure is not None and "REWIND-SOUND" in (failure.text or "")
    assert failure.get("type") == "counterexample"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lenient_step", "ring_slot_short"])
def test_broken_implementation_fails_the_state_machine(variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify.main(["--profile", "quick", "--stages", "stateful", "--target", BROKEN + variant]) == 1
    assert "state = KVCacheMachine()" in capsys.readouterr().out  # the paste-able program


@pytest.mark.parametrize("argv", [["--profile", "nope"], ["--stages", "stateful,nope"], ["--target", "kvcache"],
                                  ["--target", "python:no_such_module:factory"], ["--bogus"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    assert verify.main(argv) == 2


def test_dispatcher_runs_verify() -> None:
    assert cli.main(["verify", "--profile", "nope"]) == 2


def test_missing_stage_module_is_an_environment_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A stage that cannot run (its module missing) is exit 2 when nothing failed, reported as ERROR."""
    monkeypatch.setattr(verify, "_CROSSHAIR_CHILD",
                        'import json; print(json.dumps({"import_error": "No module named crosshair_gate"}))')
    json_file, junit_file, report_args = _reports(tmp_path)
    assert verify.main(["--profile", "quick", "--stages", "crosshair", *report_args]) == 2
    assert json.loads(json_file.read_text())["stages"][0]["verdict"] == "ERROR"
    assert ET.parse(junit_file).getroot().find("testsuite/testcase/error") is not None


def test_missing_z3_module_is_an_environment_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = verify.importlib.import_module

    def without_z3(name: str) -> object:
        if name == "kvcache_proofs.z3_induction":
            raise ImportError("No module named 'kvcache_proofs.z3_induction'")
        return real(name)

    monkeypatch.setattr(verify.importlib, "import_module", without_z3)
    assert verify.main(["--profile", "quick", "--stages", "z3"]) == 2


def test_a_failure_outranks_an_environment_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "_CROSSHAIR_CHILD", 'import json; print(json.dumps({"import_error": "gone"}))')
    monkeypatch.setattr(verify, "TARGET_STAGES", ("crosshair", "model-checker"))   # both run with --target
    assert verify.main(["--profile", "quick", "--stages", "crosshair,model-checker",
                        "--target", BROKEN + "lenient_step"]) == 1


def test_pre_commit_hook_declares_the_quick_profile() -> None:
    text = (Path(__file__).resolve().parents[1] / ".pre-commit-hooks.yaml").read_text()
    for line in ("id: kvcache-verify", "entry: kvcache verify --profile quick", "language: python",
                 "pass_filenames: false", "always_run: true"):
        assert line in text


@pytest.mark.slow
def test_verify_covers_the_cell_layout(tmp_path: Path) -> None:
    """CELL-DATA-SOUND: the cell stages run kvcache.CellCache against the cell model, and report."""
    out = tmp_path / "cells.json"
    assert verify.main(["--profile", "quick", "--stages", "cell-stateful,cell-checker,cell-z3", "--json", str(out)]) == 0
    stages = {stage["name"]: stage for stage in json.loads(out.read_text())["stages"]}
    assert set(stages) == {"cell-stateful", "cell-checker", "cell-z3"}
    assert stages["cell-z3"]["numbers"]["proofs"] == "3/3"
    assert all(stage["verdict"] == "pass" for stage in stages.values())
    assert int(stages["cell-checker"]["numbers"]["states"]) > 150   # canonical states (docs/verification.md, "How the cell layout is verified")


def _work(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(s["name"], s["verdict"], {k: v for k, v in s["numbers"].items() if k not in ("states/s", "jobs")})
            for s in report["stages"]]


@pytest.mark.slow
def test_overlapping_the_serial_stages_changes_no_stage_s_work(tmp_path: Path) -> None:
    """With more than one process, the one-process stages run in a side lane beside the fanned-out
    ones: every stage must still do exactly the work it does when the stages run one by one."""
    stages = "stateful,z3,model-checker,cell-stateful,cell-z3"
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert verify.main(["--profile", "quick", "--stages", stages, "--jobs", "1", "--json", str(one)]) == 0
    assert verify.main(["--profile", "quick", "--stages", stages, "--jobs", "2", "--json", str(two)]) == 0
    sequential, overlapped = json.loads(one.read_text()), json.loads(two.read_text())
    assert [s["name"] for s in overlapped["stages"]] == stages.split(",")
    assert _work(overlapped) == _work(sequential)


def _processes_with(marker: str) -> list[int]:
    """The pids whose environment holds `marker` (Linux /proc): verify's children inherit it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc to find the children")
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_verify_incomplete_and_leaves_no_process(tmp_path: Path, signal_name: str) -> None:
    """A stopped verify is INCOMPLETE (exit 3), never a pass or a counterexample; its reports are still
    written; and no process it started (the side lane, the CrossHair gate and its workers, the model
    checker's workers) outlives it."""
    marker = f"KVCACHE_VERIFY_TEST_{uuid.uuid4().hex}"
    report = tmp_path / "verify.json"
    process = subprocess.Popen([sys.executable, "-m", "kvcache_proofs.verify", "--profile", "pre-merge",
                                "--json", str(report)], env={**os.environ, marker: "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(_processes_with(marker)) < 3 and time.monotonic() < deadline:   # verify, lane, gate at least
        time.sleep(0.2)
    assert len(_processes_with(marker)) >= 3, "verify never started its stages"
    process.send_signal(getattr(signal, signal_name))
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 3, stdout
    stages = json.loads(report.read_text())["stages"]
    stopped = [s for s in stages if s["verdict"] == "INCOMPLETE"]
    assert stopped and all(signal_name in s["detail"] for s in stopped)
    assert all(s["verdict"] in ("pass", "INCOMPLETE") for s in stages)
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == []


def test_a_target_is_imported_from_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify --target python:M:F` finds M in the current directory, as `conformance` does (the `kvcache`
    console script does not put the directory on sys.path): the same helper, import_target_module."""
    module = f"verify_cwd_target_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text("import kvcache\n\n\ndef make(config):\n    return kvcache.SequenceCache(config)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert verify.main(["--profile", "quick", "--stages", "stateful", "--target", f"python:{module}:make"]) == 0
    assert str(tmp_path) in sys.path


def test_a_module_missing_from_the_current_directory_too_is_a_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert verify.main(["--stages", "stateful", "--target", f"python:absent_{uuid.uuid4().hex}:make"]) == 2
    assert "bad --target" in capsys.readouterr().err


def test_a_cell_target_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--target names a sequence cache: a cell-layout factory (kvcache_layout = "cell") is refused before
    any stage runs, in one line naming the command that judges it, not driven as a sequence cache."""
    assert verify.main(["--profile", "quick", "--target", "python:kvcache:CellCache"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "cell" in lines[0] and "kvcache conformance --target python:kvcache:CellCache" in lines[0]


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_a_target_runs_only_the_stages_that_judge_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--target: the stages over the reference and the proofs (CrossHair, Z3, the cell stages) say nothing
    about the target; they do not run, and the table, the JSON and stderr name them as skipped."""
    ran: list[str] = []
    real = verify.run_stage

    def recording(name: str, *args: Any, **kwargs: Any) -> Any:
        ran.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(verify, "run_stage", recording)
    json_file, _, report_args = _reports(tmp_path)
    assert verify.main(["--profile", "quick", "--jobs", "1", "--target", "python:kvcache:SequenceCache",
                        *report_args]) == 0
    assert ran == list(verify.TARGET_STAGES)
    skipped = ["crosshair", "z3", *verify.CELL_STAGES]
    assert json.loads(json_file.read_text())["skipped"] == skipped
    captured = capsys.readouterr()
    assert all(f"{name:<15} skipped" in captured.out for name in skipped)
    assert "skipped crosshair, z3, cell-stateful" in captured.err
    # asked for stages none of which judges a target: a usage error, not an empty pass
    assert verify.main(["--profile", "quick", "--stages", "z3,cell-z3", "--target", "python:kvcache:SequenceCache"]) == 2
