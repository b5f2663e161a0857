"""The cell model checker (proofs/cell_model_checker.py): the reference holds within the quick bounds,
and broken targets are caught with a shortest counterexample whose program replays the failure."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache_proofs import cell_model_checker as cmc
from kvcache_proofs.model_checker import replay
from kvcache_spec.cell_stateful import Call, CellConfigSpec

from . import cell_model_target


def test_the_reference_holds_within_the_quick_bounds() -> None:
    """CELL-DATA-SOUND and every CELL- rule, in every reachable state of every quick configuration."""
    report = cmc.check_cells("quick", time_budget=300, jobs=2)
    assert report.ok, report.summary()
    assert report.configs_checked == report.configs_total == len(cmc.PROFILES["quick"].configs())
    assert report.states > 300 and report.checks > report.states * 15


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
    removals = {op.args for op in cmc.transitions(lock, cmc.PROFILES["quick"]) if op.verb == "seq_rm"}
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
