"""What the suite reports (issue 18): the consequence of a lenient step is graded, every distinct cause
is kept in one run and identical ones merged, and the summary shows each finding whole.

The targets are blind-style stand-ins of upstream shapes written from their descriptions
(tests/upstream_standins.py); each test runs the quick profile once per target (cached)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from kvcache_spec.conformance import cli, replay, run_suite
from kvcache_spec.conformance.consequences import SAFETY
from kvcache_spec.conformance.engine import CLASSES, LENIENT, WRONG, Finding
from kvcache_spec.conformance.suite import Reported, SuiteResult, report_json
from kvcache_spec.conformance.targets import PythonTarget
from kvcache_spec.rules import BY_ID

LEAK = "python:tests.upstream_standins:leaks_reused_id"
OVERFLOW = "python:tests.upstream_standins:next_pos_overflows"
FLOOR = "python:tests.upstream_standins:FloorFromLength"
CELL_REFERENCE = "python:kvcache:CellCache"


@functools.lru_cache(maxsize=None)
def suite(target: str, continue_past_lenient: bool = True) -> SuiteResult:
    return run_suite(PythonTarget(target), "quick", seed=0, continue_past_lenient=continue_past_lenient)


def test_CELL_ID_REUSE_the_leak_behind_a_mid_forward_seq_rm_is_wrong() -> None:
    """CELL-ID-REUSE: upstream's seq_rm between declare_step and place_step lets the removed id keep a cell;
    the lenient CELL-FORWARD is its entry, the stray cell its consequence - a wrong finding naming seq_rm."""
    result = suite(LEAK)
    assert (LENIENT, "CELL-FORWARD") in result.findings
    leak = result.findings[(WRONG, "CELL-ID-REUSE")]
    assert leak.finding.after == "lenient CELL-FORWARD in seq_rm", leak.finding
    assert "seq_rm(" in leak.finding.message and "SAFE-NO-STRAY" in leak.finding.message
    ops = [step["op"] for step in leak.steps]
    assert ops.index("declare") < ops.index("seq_rm") < ops.index("place"), leak.steps
    again = replay(LEAK, leak.config, leak.steps)
    assert again is not None and (again["class"], again["rule"], again["after"]) == (
        WRONG, "CELL-ID-REUSE", "lenient CELL-FORWARD in seq_rm")
    assert replay(CELL_REFERENCE, leak.config, leak.steps) is None   # the reference raises at seq_rm: conforming
    # what the entry alone showed before: lenient only, CONFORMING when not strict
    hidden = suite(LEAK, continue_past_lenient=False)
    assert not hidden.classes() & {WRONG}, sorted(hidden.findings)


def test_CELL_OWNERS_next_pos_overflow_after_a_position_INT_MAX_is_wrong() -> None:
    """CELL-OWNERS, CELL-POS: a position INT_MAX accepted (lenient ARG-RANGE) makes next_pos wrap; the wrapped
    next_pos is the wrong consequence."""
    result = suite(OVERFLOW)
    overflow = result.findings[(WRONG, "CELL-OWNERS")]
    assert overflow.finding.after == "lenient ARG-RANGE in place_step"
    assert "next_pos(0) is -2147483648" in overflow.finding.message and "SAFE-RANGE" in overflow.finding.message
    assert not any(r.finding.after == "" for r in result.causes.get((WRONG, "CELL-OWNERS"), []))


def test_the_reference_has_no_consequence_to_grade() -> None:
    """A conforming target has no lenient step: no consequence, and its verdict stays CONFORMING."""
    result = suite(CELL_REFERENCE)
    assert result.conforming(strict=True) and result.continued == 0


def test_safety_properties_are_data_with_a_rule_and_a_why() -> None:
    assert len({safety.id for safety in SAFETY}) == len(SAFETY)
    for safety in SAFETY:
        assert safety.rule in BY_ID and safety.statement and safety.why, safety


def test_REWIND_SOUND_a_single_unsound_rewind_and_a_chain_are_two_findings_in_one_run() -> None:
    """REWIND-SOUND: upstream's floor (new_len >= length - window) is unsound for max_write < window with one
    rewind, and blind to chains: one run reports both causes, each shrunk to its own kind."""
    causes = suite(FLOOR).causes[(WRONG, "REWIND-SOUND")]
    rewinds = sorted(sum(step["op"] == "rewind" for step in r.steps) for r in causes)
    assert rewinds[0] == 1 and rewinds[-1] >= 2, [r.steps for r in causes]
    single = next(r for r in causes if sum(step["op"] == "rewind" for step in r.steps) == 1)
    assert single.config.get("max_write") is not None and single.config["max_write"] < max(
        entry.get("window", 0) for entry in single.config["layers"])
    for reported in causes:
        again = replay(FLOOR, reported.config, reported.steps)
        assert again is not None and (again["class"], again["rule"]) == (WRONG, "REWIND-SOUND")


@pytest.mark.parametrize("target", [LEAK, OVERFLOW, FLOOR])
def test_identical_causes_are_merged(target: str) -> None:
    """No two kept counterexamples of one (class, rule) say the same words after the same step."""
    report = report_json(suite(target), strict=False, exact_layout=False)
    shown = [(f["class"], f["rule"], f["message"], f["after"]) for f in report["semantic"]["findings"]]
    assert len(shown) == len(set(shown)), shown


def test_same_cause_is_the_same_words_on_another_family() -> None:
    """A cause seen through a ring config and a flat one, with the same message, is one cause."""
    finding = Finding(LENIENT, "CELL-FORWARD", "seq_new() is a caller error", 2)
    flat = {"capacity": 4, "n_layers": 1, "layers": [{"kind": "flat", "window": 0}]}
    ring = {"capacity": 4, "n_layers": 1, "layers": [{"kind": "ring", "window": 2}]}
    steps = [{"op": "seq_new"}, {"op": "declare", "seqs": [0]}, {"op": "seq_new"}]
    assert Reported(finding, flat, steps).same_cause(Reported(finding, ring, steps))
    other = Finding(LENIENT, "CELL-FORWARD", "seq_rm(0, 0, None) is a caller error", 2)
    assert not Reported(finding, flat, steps).same_cause(Reported(other, ring, steps))


def test_two_safety_properties_broken_after_the_same_kind_of_step_are_two_causes() -> None:
    """Upstream's cell cache breaks SAFE-OP-KEEP after its lenient -1 position and SAFE-OP-ISOLATION after
    its lenient re-placed one: both wrong OP-ATTEND, after a lenient OP-POS fetch, on flat layers. Folded
    into one cause, the report showed the -1 program under the re-placed one's words (the shorter steps
    replaced the longer ones, the message stayed)."""
    config = {"capacity": 1, "n_layers": 1, "layers": [{"kind": "flat", "window": 0}]}
    steps = [{"op": "begin", "seqs": [0]}, {"op": "fetch", "layer": 0, "positions": [-1]},
             {"op": "begin", "seqs": [1]}, {"op": "fetch", "layer": 0, "positions": [0]}]
    after = "lenient OP-POS in update_and_fetch"
    keep = Finding(WRONG, "OP-ATTEND", "SAFE-OP-KEEP broken after ...", 3, after, 1, safety="SAFE-OP-KEEP")
    isolation = Finding(WRONG, "OP-ATTEND", "SAFE-OP-ISOLATION broken after ...", 3, after, 1,
                        safety="SAFE-OP-ISOLATION")
    assert not Reported(keep, config, steps).same_cause(Reported(isolation, config, steps))
    assert Reported(keep, config, steps).same_cause(Reported(keep, config, steps))


def _summary(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["--target", LEAK, *args]) == 1
    return capsys.readouterr().out


def test_the_summary_wraps_and_never_cuts_a_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    out = _summary(capsys, "--json", str(report))
    flat = " ".join(out.split())
    findings = json.loads(report.read_text())["semantic"]["findings"]
    assert any(len(f["message"]) > cli.WIDTH for f in findings)   # the case that used to be cut
    for finding in findings:
        assert " ".join(finding["message"].split()) in flat, finding["message"]
        assert " ".join(json.dumps(finding["steps"]).split()) in flat
    blocks = [line for line in out.splitlines() if line.startswith(cli.INDENT) or line.split()[0] in CLASSES]
    assert len(blocks) > 2 * len(findings)
    for line in blocks:   # longer only for a word that no line of the width could hold
        assert len(line) <= cli.WIDTH or max(len(word) for word in line.split()) > cli.WIDTH - 30, line
    assert "--pytest" in out and "def test_" not in out


def test_the_pytest_flag_prints_each_findings_test(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    out = _summary(capsys, "--pytest", "--json", str(report))
    findings = json.loads(report.read_text())["semantic"]["findings"]
    assert out.count("def test_kvcache_conformance_") == len(findings) > 0
    for finding in findings:
        assert finding["pytest"].splitlines()[0] in out
    assert cli.main(["--help"]) == 0 and "--pytest" in capsys.readouterr().out
    # Pasted as printed - every test, from its `def` to the blank line that ends it - the tests compile and
    # run, and each fails with its finding's rule (the target has the defect).
    printed = out.split("\n")
    starts = [i for i, text in enumerate(printed) if text.startswith("def test_")]
    pasted = "\n".join("\n".join(printed[i:printed.index("", i) + 1]) for i in starts)
    namespace: dict[str, object] = {}
    exec(compile(pasted, "pasted from kvcache conformance --pytest", "exec"), namespace)
    tests = [test for name, test in namespace.items() if name.startswith("test_") and callable(test)]
    assert len(tests) == len(findings)
    for test, finding in zip(tests, findings):   # printed in the report's order
        with pytest.raises(AssertionError, match=f"'rule': '{finding['rule']}'"):
            test()


def test_DATA_SOUND_a_forged_commit_moving_the_length_over_unwritten_rows_is_wrong() -> None:
    """DATA-SOUND, COMMIT-ISSUED: a commit that takes any plan (lenient) moves the length past positions no
    step wrote; the next step reads them - the wrong consequence, naming the commit."""
    result = suite("python:kvcache_spec.conformance.zoo:commits_anything")
    read = result.findings[(WRONG, "DATA-SOUND")]
    assert read.finding.after == "lenient COMMIT-ISSUED in commit" and "SAFE-READS" in read.finding.message
    assert [step["op"] for step in read.steps][-2:] == ["commit", "step"], read.steps
    assert replay("reference", read.config, read.steps) is None


def test_a_defect_of_its_own_is_not_a_consequence() -> None:
    """REWIND-SOUND: upstream's floor refuses rewind(0) (over-strict) and, later in the same program, lets an
    unsound rewind through; the bad read is the rewind's own finding, not a consequence of the refusal."""
    result = suite(FLOOR)
    assert (WRONG, "REWIND-SOUND") in result.findings
    assert not [r for rs in result.causes.values() for r in rs if r.finding.after], sorted(result.findings)
