"""Documented preconditions on caller errors (the scope relaxation `requires=`, SPEC.md 6.1): which call breaks
which, how a scope declares them, and a target declaring one is never sent a call that breaks it - on the cell
layout seen through its outputs and on the op face's cell cache - while the calls that keep it are judged."""

from __future__ import annotations

import pytest

from kvcache_spec.conformance import PythonTarget, run_suite
from kvcache_spec.conformance.cell import recompute
from kvcache_spec.conformance.suite.plan import CONFORMING, NOT_CONFORMING

STANDINS = "python:tests.recompute_standins:"
SMALL = (recompute.recompute_config(8, 0), recompute.recompute_config(8, 3), recompute.recompute_config(8, 3, 0))

def test_a_precondition_names_the_calls_that_break_it() -> None:
    from kvcache_spec.conformance.preconditions import breaks, broken
    held = {0: {1: 0, 2: 1}, 1: {3: 0}}
    assert breaks("ids-in-range", "seq_rm", {"seq": 63, "p0": 0, "p1": None}, held)
    assert breaks("ids-in-range", "decode", {"seq_ids": [0, -1]}, held)
    assert breaks("ids-in-range", "seq_keep", {"seq": True}, held)   # bool is not an id
    assert not breaks("ids-in-range", "seq_cp", {"src": 0, "dst": 62, "upto": None}, held)
    assert breaks("empty-destination", "seq_cp", {"src": 0, "dst": 1, "upto": None}, held)   # seq 1 is live
    assert breaks("empty-destination", "seq_cp", {"src": 2, "dst": 2, "upto": None}, held)   # onto itself
    assert not breaks("empty-destination", "seq_cp", {"src": 0, "dst": 2, "upto": 1}, held)
    assert breaks("whole-copies", "seq_cp", {"src": 0, "dst": 2, "upto": 1}, held)
    assert breaks("ordered-ranges", "seq_rm", {"seq": 0, "p0": 2, "p1": 1}, held)
    assert breaks("ordered-ranges", "seq_cp", {"src": 0, "dst": 2, "upto": -1}, held)
    assert not breaks("ordered-ranges", "seq_add", {"seq": 0, "p0": 0, "p1": None, "delta": -1}, held)
    assert broken(frozenset({"whole-copies", "ids-in-range"}), "seq_cp", {"src": 0, "dst": 99, "upto": 1},
                  held) == "ids-in-range"
    assert broken(frozenset(), "seq_rm", {"seq": 300, "p0": 0, "p1": None}, held) is None


def test_a_precondition_is_declared_by_name_and_shown_in_the_scope() -> None:
    from kvcache_spec.conformance import scope as scopes
    scope = scopes.parse(["flat", "requires=whole-copies+ids-in-range"], "test")
    assert scope.requires == {"whole-copies", "ids-in-range"} and scopes.REQUIRES in scope.relaxations()
    assert "requires=ids-in-range+whole-copies" in scope.names() and not scope.full_for("cell-recompute")
    assert scopes.parse(["requires=ids-in-range"], "test").features == scopes.features_of(scopes.UNDECLARED_VERSION)   # SCOPE-REQUIRES, SCOPE-VERSION
    with pytest.raises(scopes.ScopeError, match="ids-in-range"):
        scopes.parse(["flat", "requires=ids-in-rnage"], "test")   # a typo must not keep calls back


def test_a_declared_precondition_keeps_back_the_calls_that_break_it() -> None:
    """MergingFork merges a fork onto a live destination (NOT CONFORMING: lenient OP-FORK and the wrong
    outputs that follow); declaring the preconditions its seq_cp relies on, it is sent no such fork, and the
    report says which calls were kept back."""
    result = run_suite(PythonTarget(STANDINS + "MergingForkOnAnEmptyDestinationOnly"), "quick", seed=0,
                       configs=SMALL)
    assert result.verdict(strict=True) == CONFORMING, (result.findings, result.incomplete())
    assert "OP-FORK" in result.exercised   # the forks it may be sent are still judged
    kept = [note for note in result.skipped if "precondition" in note]
    assert any("'empty-destination' not sent" in note for note in kept), result.skipped
    run = recompute.run_program(PythonTarget(STANDINS + "MergingForkOnAnEmptyDestinationOnly"), SMALL[0],
                                [recompute.decode(0), recompute.decode(1), recompute.cp(0, 1), recompute.decode(1)])
    assert run.finding is None and [step["op"] for step in run.steps] == ["decode", "decode", "decode"]


def test_a_declared_precondition_hides_no_defect_of_a_call_that_keeps_it() -> None:
    result = run_suite(PythonTarget(STANDINS + "ForgetsSharedRemovalRequiringIds"), "quick", seed=0, configs=SMALL)
    assert result.verdict() == NOT_CONFORMING and ("wrong", "OP-RM") in result.findings, sorted(result.findings)


def test_op_cell_a_merging_fork_is_found_unless_its_precondition_is_declared() -> None:
    merging = run_suite(PythonTarget("python:tests.op_standin:cell_merging_fork"), "quick", seed=0)
    assert ("lenient", "OP-FORK") in merging.findings, sorted(merging.findings)
    declared = run_suite(PythonTarget("python:tests.op_standin:cell_merging_fork_requiring_empty"), "quick", seed=0)
    assert ("lenient", "OP-FORK") not in declared.findings, sorted(declared.findings)
    assert declared.verdict(strict=True) == CONFORMING, (sorted(declared.findings), declared.incomplete())
    assert any("'empty-destination' not sent" in note for note in declared.skipped), declared.skipped
