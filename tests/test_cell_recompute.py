"""The cell layout seen only through its outputs (layout cell-recompute, SPEC.md 5.3): the model's
CELL-RECOMPUTE helpers, the engine on a numpy stand-in that conforms, and on stand-ins that each break one
thing - found through the outputs and next_pos alone, with no K/V in sight."""

from __future__ import annotations

import pytest

from kvcache_spec import cell_model as cm
from kvcache_spec import op_model as om
from kvcache_spec.conformance import PythonTarget, layouts, run_suite
from kvcache_spec.conformance.cell import recompute
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.suite.plan import CONFORMING, NOT_CONFORMING

STANDINS = "python:tests.recompute_standins:"
# the broken stand-ins are run on small configs (a stand-in serves any capacity): the suite's own are llama.cpp's
SMALL = (recompute.recompute_config(8, 0), recompute.recompute_config(8, 3), recompute.recompute_config(8, 3, 0))


def test_CELL_RECOMPUTE_rows_are_the_history_up_to_the_query() -> None:
    entries = [(3, 9, 7), (0, 5, 1), (1, 6, 2), (5, 4, 8)]   # (position, token, uid), any order
    assert cm.recompute_rows(entries, 3) == ((0, 5, 1), (1, 6, 2), (3, 9, 7))
    assert cm.recompute_rows(entries, 0) == ((0, 5, 1),)


def test_CELL_RECOMPUTE_decidable_with_one_layer_always_with_more_only_over_unchanged_rows() -> None:
    rows = ((0, 5, 1), (3, 9, 7))            # position 1 and 2 were removed after row 7 was written over them
    written_over = {1: (), 7: (1, 2, 3)}
    assert cm.recompute_decidable(1, rows, written_over)
    assert not cm.recompute_decidable(2, rows, written_over)
    assert cm.recompute_decidable(2, rows, {1: (), 7: (1,)})


def test_CELL_RECOMPUTE_tolerance() -> None:
    assert cm.outputs_agree([1.0, -2.0], [1.0005, -2.0])
    assert not cm.outputs_agree([1.0, -2.0], [1.1, -2.0])
    assert not cm.outputs_agree([1.0], [1.0, 2.0])
    assert not cm.outputs_agree([float("nan")], [1.0])


def _table() -> om.OpModel:
    return om.OpModel(om.OpConfig(om.CELL, 1, (0,), 1, 1, 1, 8, 1))


def test_CELL_KEEP_ends_every_other_sequence_and_keeps_what_it_shares() -> None:
    table = _table()
    table.held = {0: {10: 0, 11: 1}, 1: {10: 0, 12: 1}, 2: {13: 0}}
    assert table.seq_keep(1) is None and table.held == {1: {10: 0, 12: 1}}
    assert table.seq_keep(2) is None and table.held == {}   # a sequence holding nothing: everything goes
    assert table.seq_keep(63).rule == "CELL-KEEP" and table.seq_keep(True).rule == "CELL-KEEP"


def test_CELL_SHIFT_moves_one_sequences_view_and_refuses_collisions_and_negatives() -> None:
    table = _table()
    table.held = {0: {10: 0, 11: 1, 12: 2}, 1: {10: 0, 11: 1}}
    assert table.seq_add(0, 1, None, 5) is None
    assert table.held == {0: {10: 0, 11: 6, 12: 7}, 1: {10: 0, 11: 1}}   # seq 1 keeps the shared token at 1
    before = {seq: dict(tokens) for seq, tokens in table.held.items()}
    for args in ((0, 6, None, -6), (0, 0, 1, -1), (0, 2, 1, 1), (0, 0, None, 1.0), (63, 0, None, 1)):
        assert table.seq_add(*args).rule == "CELL-SHIFT", args
        assert table.held == before   # refused: nothing moved
    assert table.seq_add(0, 0, 5, 0) is None and table.held == before   # a zero shift


def test_the_layout_is_registered_in_the_cell_package() -> None:
    layout = layouts.get("cell-recompute")
    assert layout.run_program is recompute.run_program
    assert layouts.PACKAGES["cell-recompute"] == "cell"


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_a_conforming_standin_is_CONFORMING_strict() -> None:
    result = run_suite(PythonTarget(STANDINS + "TinyAttentionCells"), "quick", seed=0)
    assert result.verdict(strict=True) == CONFORMING, (result.findings, result.incomplete())
    assert "CELL-RECOMPUTE" in result.exercised and "OP-FORK" in result.exercised


@pytest.mark.parametrize("name, kind, rule", [
    ("ForgetsSharedRemoval", "wrong", "OP-RM"),          # seq_rm keeps a shared cell for the removed sequence
    ("IgnoresWindow", "wrong", "CELL-RECOMPUTE"),        # a sliding layer served as a full one
    ("StalePosMax", "wrong", "OP-RM"),                   # next_pos not lowered by a removal at the end
    ("ShiftsEveryOwner", "wrong", "CELL-SHIFT"),         # seq_add moves a shared cell for every owner
    ("UncheckedState", "lenient", "CELL-STATE"),         # a state with a byte flipped is loaded
    ("EmptiesBeforeChecking", "lenient", "CELL-STATE"),  # a refused load has emptied the live destination
    ("RestoresWindowOnly", "wrong", "OP-RM"),            # a restored sliding sequence rewound has lost rows
])
def test_a_broken_standin_is_found(name: str, kind: str, rule: str) -> None:
    result = run_suite(PythonTarget(STANDINS + name), "quick", seed=0, configs=SMALL)
    assert result.verdict(strict=True) == NOT_CONFORMING
    assert (kind, rule) in result.findings, sorted(result.findings)


def test_CELL_STATE_a_restore_replaces_the_destination_in_new_cells_and_refuses_what_does_not_fit() -> None:
    table = om.OpModel(om.OpConfig(om.CELL, 1, (0,), 1, 1, 1, 8, 1))   # 8 cells
    table.held = {0: {10: 0, 11: 1, 12: 2}, 1: {10: 0, 13: 1}}
    saved = sorted(table.held[0].items())
    assert table.seq_load(1, saved, 20) is None and table.held == {0: {10: 0, 11: 1, 12: 2}, 1: {20: 0, 21: 1, 22: 2}}
    refused = table.seq_load(2, saved, 30)   # 3 rows, 2 cells free (6 live): refused, nothing changes
    assert refused is not None and refused.rule == "OP-CAP" and 2 not in table.held
    assert table.seq_load(0, [], 40) is None and 0 not in table.held   # an empty sequence's state empties it


def test_CELL_STATE_steps_are_not_sent_without_the_scope_feature() -> None:
    program = [recompute.decode(0), recompute.save(0), recompute.load(1), recompute.decode(1)]
    assert recompute.sent(program, scopes.parse(["flat", "seq-state"], "test")) == program
    assert recompute.sent(program, scopes.parse(["flat"], "test")) == [program[0], program[3]]


def test_a_merging_fork_is_lenient_and_its_consequence_is_two_rows_at_one_position() -> None:
    result = run_suite(PythonTarget(STANDINS + "MergingFork"), "quick", seed=0, configs=SMALL)
    assert ("lenient", "OP-FORK") in result.findings
    consequence = result.findings[("wrong", "CELL-RECOMPUTE")].finding
    assert consequence.safety == "SAFE-ONE-HISTORY" and "two rows at one position" in consequence.message


def test_the_removal_a_shared_cell_survives_is_seen_in_the_outputs_too() -> None:
    """ForgetsSharedRemoval with next_pos right (it asks the cells it still owns only below the cut): the
    removed sequence's next token still attends the shared cell - a CELL-RECOMPUTE finding."""
    program = [recompute.decode(0, 0, 0), recompute.cp(0, 1), recompute.rm(0, 1, 2), recompute.decode(0)]
    target = PythonTarget(STANDINS + "ForgetsSharedRemoval")
    run = recompute.run_program(target, recompute.recompute_config(8, 0), program)
    assert run.finding is not None and run.finding.rule == "CELL-RECOMPUTE", run.finding


def test_CELL_SHIFT_a_context_shift_is_checked_through_the_recompute_at_the_new_positions() -> None:
    """After seq_rm of positions 1-2 and a shift of 3-5 back by two, the next token attends (token, position)
    rows 0-3: the conforming stand-in's output is its recompute over them, and a stand-in that moves shared
    cells for every owner is found at the other sequence."""
    program = [recompute.decode(0, 0, 0, 0, 0, 0), recompute.rm(0, 1, 3), recompute.add(0, 3, None, -2),
               recompute.decode(0), recompute.decode(0)]
    run = recompute.run_program(PythonTarget(STANDINS + "TinyAttentionCells"), recompute.recompute_config(8, 0),
                                program)
    assert run.finding is None and "CELL-RECOMPUTE" in run.exercised and "CELL-SHIFT" in run.exercised
    shared = [recompute.decode(0, 0, 0), recompute.cp(0, 1), recompute.add(1, 0, None, 5), recompute.decode(0)]
    broken = recompute.run_program(PythonTarget(STANDINS + "ShiftsEveryOwner"), recompute.recompute_config(8, 0),
                                   shared)
    assert broken.finding is not None and broken.finding.rule == "CELL-SHIFT", broken.finding


def test_a_gap_ends_the_program_unjudged_without_the_scope_feature() -> None:
    from kvcache_spec.conformance import scope as scopes
    program = [recompute.decode(0), recompute.decode(0, positions=[{"next": 2}]), recompute.decode(0)]
    target = PythonTarget(STANDINS + "TinyAttentionCells")
    narrow = scopes.Scope(frozenset({"flat", "ring"}))
    run = recompute.run_program(target, recompute.recompute_config(8, 0), program, scope=narrow)
    assert run.finding is None and any("position-gaps" in note for note in run.skipped)
    full = recompute.run_program(target, recompute.recompute_config(8, 0), program)
    assert full.finding is None and len(full.steps) == 3



def test_a_replacing_fork_keeps_one_history_and_a_recompute_that_is_no_oracle_is_not_judged() -> None:
    """A fork onto a live destination that replaces it (llama.cpp's default mode) is lenient OP-FORK only. With two
    layers the copied row at position 1 was written over position 0, removed since: a recompute over it is no
    oracle, so the consequence is not judged (it was once charged as 'two rows at one position', a false alarm)."""
    program = [recompute.decode(0, 0), recompute.decode(1, 1, 1, 1), recompute.rm(1, 0, 1), recompute.rm(1, 2),
               recompute.cp(1, 0), recompute.decode(0)]
    target = PythonTarget(STANDINS + "ReplacingFork")
    for cfg in (recompute.recompute_config(8, 0), recompute.recompute_config(8, 0, 0)):
        run = recompute.run_program(target, cfg, program)
        assert run.finding is not None and (run.finding.kind, run.finding.rule) == ("lenient", "OP-FORK")
        assert run.consequence is None, run.consequence
    merging = recompute.run_program(PythonTarget(STANDINS + "MergingFork"), recompute.recompute_config(8, 0),
                                    [recompute.decode(0, 0), recompute.decode(1, 1), recompute.cp(0, 1),
                                     recompute.decode(1)])
    assert merging.consequence is not None and merging.consequence.safety == "SAFE-ONE-HISTORY"
