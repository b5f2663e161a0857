"""The conformance suite checks itself: the reference passes strictly, every zoo mutant is caught
with the right class and rule, findings are minimal and replayable, and the CLI and the pytest
plugin behave as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import cli, replay, run_program, run_suite
from kvcache_spec.conformance.configs import SUITE_CONFIGS, config, layer
from kvcache_spec.conformance.engine import LENIENT, WRONG
from kvcache_spec.conformance.sequence.modeltarget import ModelTarget
from kvcache_spec.conformance.suite import INCOMPLETE, pytest_text, report_json, report_junit
from kvcache_spec.conformance.targets import Outcome, PythonTarget, Target
from kvcache_spec.conformance.zoo import ZOO

ZOO_TARGET = "python:kvcache_spec.conformance.zoo:{}"


def test_reference_conforms_strictly_with_the_canonical_layout() -> None:
    result = run_suite(PythonTarget("python:kvcache:SequenceCache"), "quick", seed=0)
    assert result.findings == {}
    assert result.layout == []
    assert result.conforming(strict=True, exact_layout=True)
    assert result.programs > 300
    assert [note for note in result.skipped if not note.startswith("config validation")] == []


def test_the_model_as_a_target_conforms() -> None:
    """The engine's own pools and the model agree: a check of the harness, not of a target."""
    result = run_suite(ModelTarget(), "quick", seed=1)
    assert result.findings == {} and result.layout == []


def test_the_zoo_baseline_conforms() -> None:
    result = run_suite(PythonTarget(ZOO_TARGET.format("faithful")), "quick", seed=0)
    assert result.conforming(strict=True, exact_layout=True), result.findings


@pytest.mark.slow
def test_a_sound_non_canonical_layout_passes_semantically_but_not_exactly() -> None:
    result = run_suite(PythonTarget(ZOO_TARGET.format("rotated_ring")), "quick", seed=0)
    assert result.conforming(strict=True), sorted(result.findings)
    assert result.layout and not result.conforming(strict=True, exact_layout=True)
    assert "canonical" in result.layout[0]["divergences"][0]


def test_a_bigger_ring_may_accept_more_rewinds_soundly() -> None:
    result = run_suite(PythonTarget(ZOO_TARGET.format("bigger_ring")), "quick", seed=0)
    assert result.conforming(strict=True), sorted(result.findings)
    assert not result.conforming(strict=True, exact_layout=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_each_zoo_mutant_is_caught_with_its_class_and_rule(name: str) -> None:
    _, kind, rule = ZOO[name]
    target = PythonTarget(ZOO_TARGET.format(name))
    result = run_suite(target, "quick", seed=0)
    assert (kind, rule) in result.findings, sorted(result.findings)
    reported = result.findings[(kind, rule)]
    # minimal: a handful of steps; replayable: the steps alone reproduce the same class and rule
    assert len(reported.steps) <= 6, reported.steps
    again = replay(target, reported.config, reported.steps)
    assert again is not None and (again["class"], again["rule"]) == (kind, rule)
    # the same steps pass on the reference
    assert replay("reference", reported.config, reported.steps) is None
    assert result.conforming(strict=True) is False
    # without --strict a wrong answer, a crash and a valid call refused fail the run; a lenient one does not
    assert result.conforming(strict=False) == (not result.classes() & {"wrong", "crash", "over-strict"})


@pytest.mark.slow
def test_upstream_floor_counterexample_is_a_chain_of_rewinds() -> None:
    """The minimal program for upstream's floor: two steps, then rewinds the floor lets through."""
    result = run_suite(PythonTarget(ZOO_TARGET.format("upstream_floor")), "quick", seed=0)
    steps = result.findings[(WRONG, "REWIND-SOUND")].steps
    assert [s["op"] for s in steps][:2] == ["step", "step"] and steps[-1]["op"] == "rewind"


def test_pytest_text_reproduces_the_finding(tmp_path: Path) -> None:
    target = ZOO_TARGET.format("accepts_bool")
    result = run_suite(PythonTarget(target), "quick", seed=0)
    text = pytest_text(target, result.findings[(LENIENT, "ARG-INT")])
    namespace: dict[str, Any] = {}
    exec(compile(text, "pasted_test.py", "exec"), namespace)
    test = next(value for key, value in namespace.items() if key.startswith("test_"))
    with pytest.raises(AssertionError):
        test()
    exec(compile(text.replace(target, "reference"), "pasted_test.py", "exec"), namespace)
    next(value for key, value in namespace.items() if key.startswith("test_"))()


class ReturnsNoneOnBadCalls(Target):
    """Refuses bad calls by returning None / False instead of raising: that counts as rejected."""

    name = "none-refusals"

    def __init__(self) -> None:
        self.inner = PythonTarget("python:kvcache:SequenceCache")
        self.optional = self.inner.optional

    def create(self, cfg: dict[str, Any]) -> Outcome:
        got = self.inner.create(cfg)
        self.optional = self.inner.optional
        return got

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        got = self.inner.call(method, args)
        if got.ok:
            return got
        return Outcome(True, False if method in ("rewind", "can_extend") else None)


def test_a_refusal_value_counts_as_a_rejection_when_the_state_is_unchanged() -> None:
    result = run_suite(ReturnsNoneOnBadCalls(), "quick", seed=0)
    assert result.conforming(strict=True), sorted(result.findings)


def test_a_python_target_without_optional_methods_is_checked_through_can_extend() -> None:
    class Bare:
        """The reference without length(), depth() and retained_from()."""

        def __init__(self, cfg: Any) -> None:
            import kvcache
            self._inner = kvcache.SequenceCache(cfg)
            for name in ("can_extend", "capacity", "rewind", "clear", "plan", "commit"):
                setattr(self, name, getattr(self._inner, name))

        def as_control(self) -> Any:
            return self

        def as_planner(self) -> Any:
            return self

    sys.modules["_kvcache_bare_target"] = type(sys)("_kvcache_bare_target")
    sys.modules["_kvcache_bare_target"].Bare = Bare  # type: ignore[attr-defined]
    result = run_suite(PythonTarget("python:_kvcache_bare_target:Bare"), "quick", seed=0)
    assert result.conforming(strict=True), sorted(result.findings)
    assert any("length() absent" in note for note in result.skipped)
    assert any("retained_from() absent" in note for note in result.skipped)


def test_a_state_change_on_a_rejected_call_is_lenient() -> None:
    """commits_anything returns normally on a forged plan and moves the length: accepted, so lenient."""
    cfg = config(8, [layer("flat")])
    steps = [{"op": "commit", "plan": {"write": [[1, 1]], "read": [[0, 2]], "read_base_pos": 0}}]  # a gap
    got = run_program(PythonTarget(ZOO_TARGET.format("commits_anything")), cfg, steps).finding
    assert got is not None and (got.kind, got.rule) == (LENIENT, "COMMIT-ISSUED")


def test_seeds_change_the_random_programs_but_not_the_verdict() -> None:
    target = PythonTarget(ZOO_TARGET.format("floor_ignores_chains"))
    for seed in (1, 2):
        assert (WRONG, "REWIND-SOUND") in run_suite(target, "quick", seed=seed).findings


# --- the command line ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_reference_strict_writes_json_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    assert cli.main(["--strict", "--exact-layout", "--json", str(report), "--junit", str(junit)]) == 0
    data = json.loads(report.read_text())
    assert data["conforming"] and data["semantic"]["findings"] == [] and data["layout"]["canonical"]
    assert data["stats"]["programs"] > 300
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests") or 0) >= 5
    assert "CONFORMING" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_exit_codes(tmp_path: Path) -> None:
    lenient_only = ["--target", ZOO_TARGET.format("accepts_bool")]
    assert cli.main(lenient_only) == 0
    assert cli.main(lenient_only + ["--strict"]) == 1
    report = tmp_path / "r.json"
    assert cli.main(["--target", ZOO_TARGET.format("upstream_floor"), "--json", str(report)]) == 1
    findings = json.loads(report.read_text())["semantic"]["findings"]
    assert findings[0]["class"] == "wrong" and findings[0]["steps"] and "def test_" in findings[0]["pytest"]
    assert cli.main(["--target", "python:no_such_module_xyz:make"]) == 2
    assert cli.main(["--target", "ftp:nothing"]) == 2
    assert cli.main(["--profile", "nonsense"]) == 2


def test_json_report_separates_semantic_and_layout() -> None:
    result = run_suite(PythonTarget(ZOO_TARGET.format("ring_sized_to_window")), "quick", seed=0)
    data = report_json(result, strict=False, exact_layout=False)
    assert data["semantic"]["conforming"] is False and data["layout"]["canonical"] is False
    for finding in data["semantic"]["findings"]:
        assert {"class", "rule", "config", "steps", "pytest", "message"} <= set(finding)


# --- the pytest plugin ---------------------------------------------------------------------------------

def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def test_pytest_plugin_does_nothing_without_the_option(tmp_path: Path) -> None:
    (tmp_path / "test_other.py").write_text("def test_ok():\n    pass\n")
    done = _pytest(tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout and "kvcache" not in done.stdout


@pytest.mark.slow
def test_pytest_plugin_runs_the_suite_inside_another_test_run(tmp_path: Path) -> None:
    target = "--kvcache-target=" + ZOO_TARGET.format("accepts_bool")
    lenient = _pytest(tmp_path, target)
    assert lenient.returncode == 0 and "6 passed" in lenient.stdout
    strict = _pytest(tmp_path, target, "--kvcache-strict")
    assert strict.returncode == 1 and "kvcache_conformance[lenient]" in strict.stdout
    assert "def test_kvcache_conformance_lenient_arg_int" in strict.stdout


def test_suite_configs_cover_max_write_below_and_above_the_window() -> None:
    rings = [(c["layers"][0]["window"], c["max_write"]) for c in SUITE_CONFIGS if c["layers"][0]["kind"] == "ring"]
    assert any(m is not None and m < w for w, m in rings) and any(m is not None and m > w for w, m in rings)


# --- coverage is part of the verdict ------------------------------------------------------------------

def test_a_run_that_never_reaches_a_rule_in_scope_is_incomplete() -> None:
    """The detector on a broken variant of the suite: one flat configuration cannot exercise STEP-T-MAX
    (no ring) or CFG-DEDUP (one layer), so even the reference is INCOMPLETE there, never CONFORMING."""
    flat_only = (config(8, [layer("flat")]),)
    result = run_suite(PythonTarget("python:kvcache:SequenceCache"), "quick", seed=0, configs=flat_only)
    assert result.findings == {} and result.programs == result.planned
    assert result.verdict(strict=True, exact_layout=True) == INCOMPLETE
    assert result.incomplete() == ["rules in scope never exercised: CFG-DEDUP, STEP-T-MAX"]
    report = report_json(result, strict=True, exact_layout=True)
    assert report["verdict"] == INCOMPLETE and not report["conforming"]
    assert report["coverage"]["rules"]["not_exercised"] == ["CFG-DEDUP", "STEP-T-MAX"]
    case = ET.fromstring(report_junit(report)).find("testcase[@classname='kvcache.conformance.coverage']")
    assert case is not None and case.find("failure") is not None


def test_every_rule_is_in_scope_or_says_why_not() -> None:
    """The scope of a cmd: target with every optional method: each rule is exercised by the reference's
    protocol server, or has a reason to be out of scope."""
    from kvcache_spec.conformance.coverage import in_scope
    from kvcache_spec.rules import RULES

    scope = in_scope(config_validation=True, optional=frozenset({"length", "depth", "retained_from"}))
    assert set(scope) == {rule.id for rule in RULES}
    cell_rules = sorted(rule.id for rule in RULES if rule.id.startswith("CELL-"))
    assert cell_rules and all("cell layout" in scope[rule] for rule in cell_rules)
    op_rules = sorted(rule.id for rule in RULES if rule.id.startswith("OP-"))
    assert op_rules and all("another face" in scope[rule] for rule in op_rules)
    paged_rules = sorted(rule.id for rule in RULES if rule.id.startswith("PAGED-"))   # the paged layout's own
    assert paged_rules and all("paged layout" in scope[rule] for rule in paged_rules)
    from kvcache_spec.rules import DECLARATION_RULES   # the scope rules binding the suite (SPEC.md 6.1)
    assert all("declaration rule" in scope[rule] for rule in DECLARATION_RULES)
    assert sorted(rule for rule, why in scope.items() if why and rule not in cell_rules + op_rules + paged_rules
                  and rule not in DECLARATION_RULES) == ["ET-MAP", "PROTO-COMMIT", "REG-KEYS", "REG-SESSION", "THREADS"]
    paged = in_scope(config_validation=True, optional=frozenset({"ref_counts"}), layout="paged")
    assert sorted(rule for rule, why in paged.items() if not why) == sorted(paged_rules + ["SCOPE-BORDER"])
    uncounted = in_scope(config_validation=True, optional=frozenset(), layout="paged")   # ref_counts is optional
    assert "ref_counts" in uncounted["PAGED-REFCOUNT"] and not uncounted["PAGED-HIT"]
    ops = in_scope(config_validation=True, optional=frozenset(), layout="op-cell")
    contiguous_only = ("OP-MAX-WRITE", "OP-TRIM", "OP-SINKS", "OP-CHUNK", "OP-RECORD", "OP-STATE", "OP-PAD",
                       "OP-ROWS", "OP-QUANTIZE")   # cells have no rings to bound, trim, sinks, chunks, recording,
    # saved state, batch rows or quantize
    assert all(not ops[rule] for rule in op_rules if rule not in contiguous_only) and ops["CELL-MASK"] and \
        ops["REWIND-SOUND"] and all("other op cache" in ops[rule] for rule in contiguous_only)
    cells = in_scope(config_validation=True, optional=frozenset(), layout="cell")
    from kvcache_spec.conformance.coverage import RECOMPUTE_ONLY   # the cell layout seen through outputs (SPEC.md 5.3)
    assert all(not cells[rule] for rule in cell_rules if rule not in RECOMPUTE_ONLY) and cells["REWIND-SOUND"] \
        and not cells["ARG-INT"] and all(cells[rule] for rule in RECOMPUTE_ONLY)
    recompute = in_scope(config_validation=True, optional=frozenset(), layout="cell-recompute")
    assert all(not recompute[rule] for rule in RECOMPUTE_ONLY + ("OP-FORK", "OP-RM", "CELL-OWNERS")) \
        and recompute["CELL-MASK"] and recompute["OP-ATTEND"]
    bare = in_scope(config_validation=False, optional=frozenset())
    assert "no depth()" in bare["DEPTH"] and "no retained_from()" in bare["RETAINED"] and bare["CFG-CAPACITY"]


def test_a_wall_clock_stop_is_incomplete() -> None:
    result = run_suite(PythonTarget("python:kvcache:SequenceCache"), "quick", seed=0, deadline=0.0)
    assert result.verdict() == INCOMPLETE and "safety net" in result.aborted
