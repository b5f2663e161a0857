"""The cell model checker (proofs/cell_model_checker.py): the reference holds within the quick bounds,
and broken targets are caught with a shortest counterexample whose program replays the failure."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache_proofs import cell_model_checker as cmc
from kvcache_proofs.model_checker import check_config, replay
from kvcache_spec.cell_stateful import Call, CellConfigSpec

from . import cell_model_target


def test_the_reference_holds_within_the_quick_bounds() -> None:
    """CELL-DATA-SOUND and every CELL- rule, in every reachable state of every quick configuration."""
    report = cmc.check_cells("quick", time_budget=300, jobs=2)
    assert report.ok, report.summary()
    assert report.configs_checked == report.configs_total == len(cmc.PROFILES["quick"].configs())
    assert report.states > 150 and report.checks > report.states * 15   # canonical states (one per class of renamings)


@pytest.mark.parametrize("name, rule_id", [("fork_past_cut", "CELL-"), ("rm_off_by_one", "CELL-"),
                                           ("window_in_tokens", "CELL-DATA-SOUND")])
def test_a_broken_target_is_caught_with_a_replayable_program(name: str, rule_id: str) -> None:
    factory: Any = getattr(cell_model_target, name)
    report = cmc.check_cells("quick", factory, time_budget=120, jobs=1)
    cx = report.counterexample
    assert cx is not None and cx.problems[0].startswith(rule_id), report.summary()
    assert replay(cx.config, cx.ops, factory, cmc.layout(cmc.PROFILES["quick"])) == cx.problems
    program = cx.program(f"python:tests.cell_model_target:{name}")
    assert "CellLockstep(" in program and "Call(" in program
    with pytest.raises(AssertionError):
        exec(program, {})


def test_the_transitions_cover_removals_around_every_position() -> None:
    """CELL-RM: from a state where seq 0 holds positions 0 and 1, every range is tried."""
    lock = cmc._cell_harness(CellConfigSpec(3, (0,), 2), cmc.cell_reference_factory)
    for op in (Call("seq_new"), Call("declare_step", ([0, 0],)), Call("place_step", (0, [0, 1]))):
        assert lock.apply(op) == []
    removals = {op.args for op in cmc.transitions(lock, 2, 3) if op.verb == "seq_rm"}
    assert removals == {(0, p0, p1) for p0 in range(3) for p1 in [None, *range(p0 + 1, 3)]}


def test_the_command_checks_the_cell_layout(tmp_path: Any) -> None:
    """CELL-DATA-SOUND: `python -m kvcache_proofs.model_checker --layout cell` - one command, two layouts."""
    import json

    from kvcache_proofs import model_checker

    out = tmp_path / "cells.json"
    assert model_checker.main(["--layout", "cell", "--profile", "quick", "--jobs", "1", "--time-budget", "300",
                               "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ok"] and data["configs_checked"] == data["configs_total"] == 5


def test_a_depth_bound_explores_every_state_within_it_and_says_what_it_cut() -> None:
    """A group's max_depth: every state reachable in at most D calls gets every check and transition;
    a bound the space never reaches cuts nothing and checks exactly the exhaustive states."""
    spec = CellConfigSpec(2, (0,), 2)

    def run(depth: Any) -> Any:
        bounds = cmc.CellBounds(groups=((2, (2, 2), ((0,),), depth),), max_tokens=2, max_position=3)
        assert bounds.configs() == [spec] and bounds.max_depth(spec) == depth
        return check_config(spec, layout=cmc.layout(bounds))

    exhaustive, shallow, roomy = run(None), run(3), run(100)
    assert exhaustive.complete and exhaustive.beyond == 0 and exhaustive.counterexample is None
    assert shallow.complete and 0 < shallow.states < exhaustive.states and shallow.beyond > 0
    assert (roomy.states, roomy.beyond, roomy.checks) == (exhaustive.states, 0, exhaustive.checks)


def test_a_depth_bound_catches_what_lies_within_it_with_the_same_counterexample() -> None:
    """A violation at operation L is caught at depth bound L - 1 (that state's transitions are all
    applied and checked), with the exhaustive search's shortest counterexample; not at L - 2."""
    spec, factory = CellConfigSpec(2, (0,), 2), cell_model_target.fork_past_cut

    def run(depth: Any) -> Any:
        bounds = cmc.CellBounds(groups=((2, (2, 2), ((0,),), depth),), max_tokens=2, max_position=3)
        return check_config(spec, factory, layout=cmc.layout(bounds))

    full = run(None).counterexample
    assert full is not None
    caught = run(len(full.ops) - 1).counterexample
    assert caught is not None and (caught.ops, caught.problems) == (full.ops, full.problems)
    assert run(len(full.ops) - 2).counterexample is None


def test_a_configuration_in_an_exhaustive_group_is_never_depth_bounded() -> None:
    bounds = cmc.CellBounds(groups=((3, 3, (cmc.FLAT,)), (3, (2, 6), (cmc.FLAT,), 5, 6)), max_tokens=2,
                            max_position=4)
    assert bounds.governing(CellConfigSpec(3, (0,), 3)) == (None, 4)
    assert bounds.governing(CellConfigSpec(4, (0,), 3)) == (5, 6)
    assert [s.capacity for s in bounds.configs()] == [1, 2, 3, 4, 5, 6]
