"""The cell-layout model (spec/cell_model.py) on hand-computed examples, one or more per rule.

Every expected value here was computed by hand from the rules' statements (the comments show how),
not by running the model. The detector `execute_step` is shown to catch broken steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvcache_spec import cell_model as c
from kvcache_spec.model import FLAT, INT_MAX, RING, Rejected


def config(capacity: int = 6, windows: tuple[int, ...] = (0, 2), max_seqs: int = 3) -> c.CellConfig:
    made = c.make_cell_config(capacity, len(windows), [(FLAT if w == 0 else RING, w, 1, 1) for w in windows],
                              max_seqs=max_seqs)
    assert isinstance(made, c.CellConfig)
    return made


def ok(result: c.Result) -> tuple[Any, c.CellState]:
    assert not isinstance(result, Rejected), result
    return result


def forward(cfg: c.CellConfig, state: c.CellState, seq_ids: list[int], positions: list[int]) -> tuple[
        list[list[str]], c.CellState]:
    """declare, then place on every layer in order; the mask rows of each layer."""
    accepted, state = ok(c.declare_step(cfg, state, seq_ids))
    assert accepted is True
    rows = []
    for layer in range(len(cfg.layers)):
        step, state = ok(c.place_step(cfg, state, layer, positions))
        rows.append(c.mask_rows(step))
    assert state.forward is None
    return rows, state


@pytest.fixture
def cfg() -> c.CellConfig:
    return config()


def prompt_and_fork(cfg: c.CellConfig) -> c.CellState:
    """seq 0 writes positions 0, 1, 2 (cells 0, 1, 2); seq 1 = fork of seq 0 below position 2."""
    state = c.initial(cfg)
    seq, state = ok(c.seq_new(cfg, state))
    assert seq == 0
    _, state = forward(cfg, state, [0, 0, 0], [0, 1, 2])
    fork, state = ok(c.seq_clone(cfg, state, 0, 2))
    assert fork == 1
    return state


# --- the ground truth and the masks ----------------------------------------------------------------

def test_CELL_DATA_SOUND_and_CELL_MASK_a_multi_token_prompt(cfg: c.CellConfig) -> None:
    state = c.initial(cfg)
    _, state = ok(c.seq_new(cfg, state))
    rows, state = forward(cfg, state, [0, 0, 0], [0, 1, 2])
    # flat: token at q sees positions 0..q (causal within the step); ring(2): q-1..q
    assert rows == [["100", "110", "111"], ["100", "110", "011"]]
    assert c.history(state, 0) == ((0, 0), (1, 1), (2, 2))      # (position, content id)


def test_CELL_DATA_SOUND_a_batch_of_a_source_and_its_fork(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    rows, state = forward(cfg, state, [0, 1], [3, 2])
    # seq 0 at 3 -> cell 3, seq 1 at 2 -> cell 4 (lowest free cells, token order); read_len 5.
    # flat: seq 0 sees cells 0,1,2,3; seq 1 sees 0,1 (shared, below the cut) and 4 (its own position 2),
    #       never cell 2 (seq 0's position 2).
    # ring(2): seq 0 at 3 sees positions 2,3 = cells 2,3; seq 1 at 2 sees positions 1,2 = cells 1,4.
    assert rows == [["11110", "11001"], ["00110", "01001"]]


def test_CELL_WINDOW_POS_gaps_shrink_what_a_window_sees() -> None:
    cfg = config(windows=(3,))
    state = c.initial(cfg)
    _, state = ok(c.seq_new(cfg, state))
    rows, state = forward(cfg, state, [0, 0, 0], [0, 5, 6])
    # ring(3) at 5 sees positions 3..5 (only 5 held); at 6 sees 4..6 (5, 6): 2 keys, not 3 tokens
    assert rows == [["100", "010", "011"]]


# --- ids, forks, removal ---------------------------------------------------------------------------

def test_CELL_NEW_lowest_id_and_refusal_when_all_live() -> None:
    cfg = config(max_seqs=2)
    state = c.initial(cfg)
    first, state = ok(c.seq_new(cfg, state))
    second, state = ok(c.seq_new(cfg, state))
    none, after = ok(c.seq_new(cfg, state))
    assert (first, second, none, after) == (0, 1, None, state)
    assert c.live(state) == {0, 1} and c.seq_len(cfg, state, 1) == 0 and c.next_pos(cfg, state, 1) == 0
    _, state = ok(c.seq_rm(cfg, state, 0, 0))          # an empty sequence emptied: no longer live
    assert ok(c.seq_new(cfg, state))[0] == 0            # the lowest id not live


def test_CELL_ID_REUSE_a_reused_id_sees_nothing_of_the_old_sequence(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    _, state = ok(c.seq_rm(cfg, state, 0, 0))          # seq 0 gone; cells 0, 1 stay for seq 1, cell 2 free
    assert c.live(state) == {1} and [c.owners(state, j) for j in range(3)] == [{1}, {1}, set()]
    seq, state = ok(c.seq_new(cfg, state))
    assert seq == 0 and c.history(state, 0) == ()
    rows, state = forward(cfg, state, [0], [0])        # placed in cell 2 (the lowest free), sees only itself
    assert rows == [["001"], ["001"]]


def test_CELL_FORK_cut_and_snapshot(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    assert c.history(state, 1) == ((0, 0), (1, 1))
    assert [c.owners(state, j) for j in range(3)] == [{0, 1}, {0, 1}, {0}]   # shared, nothing copied
    assert c.free_cells(cfg, state) == 3
    whole, full = ok(c.seq_clone(cfg, state, 0))       # upto None: everything
    assert whole == 2 and c.history(full, 2) == c.history(full, 0)
    empty, cut0 = ok(c.seq_clone(cfg, state, 0, 0))    # a cut that keeps nothing: live, empty
    assert empty == 2 and c.history(cut0, 2) == () and 2 in c.live(cut0)
    # later writes of the source are not the fork's
    _, after = forward(cfg, state, [0], [3])
    assert c.history(after, 1) == ((0, 0), (1, 1)) and c.next_pos(cfg, after, 1) == 2


def test_CELL_FORK_refused_only_when_every_id_is_live() -> None:
    cfg = config(max_seqs=2)
    state = prompt_and_fork(cfg)
    assert ok(c.seq_clone(cfg, state, 1)) == (None, state)


def test_CELL_RM_ranges_and_shared_cells(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    _, state = forward(cfg, state, [0, 1], [3, 2])     # seq 0: cells 0,1,2,3; seq 1: cells 0,1,4
    answer, removed = ok(c.seq_rm(cfg, state, 0, 1))   # seq 0 drops positions >= 1
    assert answer is True
    # cell 1 stays (seq 1 owns it, same position and content), cells 2 and 3 are free
    assert [c.owners(removed, j) for j in range(6)] == [{0, 1}, {1}, set(), set(), {1}, set()]
    assert removed.written[1] == (1, 1)
    assert (c.used_end(removed), c.free_cells(cfg, removed)) == (5, 3)
    assert (c.seq_len(cfg, removed, 0), c.next_pos(cfg, removed, 0)) == (1, 1)
    # [p0, p1): both ends exact
    _, middle = ok(c.seq_rm(cfg, state, 0, 1, 3))
    assert [p for p, _ in c.history(middle, 0) or ()] == [0, 3]
    assert ok(c.seq_rm(cfg, state, 0, 2, 2))[1] == state       # p0 == p1: an empty range
    assert ok(c.seq_rm(cfg, state, 1, 5))[1] == state          # owns nothing there: no change
    _, gone = ok(c.seq_rm(cfg, state, 1, 0))
    assert c.live(gone) == {0} and c.owners(gone, 4) == set() and c.used_end(gone) == 4


def test_CELL_OWNERS_and_CELL_USED_END_after_removing_the_top(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    _, state = ok(c.seq_rm(cfg, state, 0, 2))          # frees cell 2 (the top)
    assert (c.used_end(state), c.free_cells(cfg, state)) == (2, 4)
    assert [ok((c.can_extend(cfg, state, n), state))[0] for n in (0, 4, 5)] == [True, True, False]


# --- a forward -------------------------------------------------------------------------------------

def test_CELL_DECLARE_refusal_and_errors(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)                       # 3 free cells
    assert ok(c.declare_step(cfg, state, [0, 1, 0, 1])) == (False, state)
    assert c.declare_step(cfg, state, []) == c.CellRejected("CELL-DECLARE", "seq_ids")
    assert c.declare_step(cfg, state, {0}) == c.CellRejected("ARG-TYPE", "seq_ids")
    assert c.declare_step(cfg, state, [0, 2]) == c.CellRejected("CELL-SEQ-LIVE", "seq_ids")
    assert c.declare_step(cfg, state, [0, 3]) == c.CellRejected("CELL-SEQ-ID", "seq_ids")
    assert c.declare_step(cfg, state, [True]) == c.CellRejected("ARG-INT", "seq_ids")
    accepted, open_ = ok(c.declare_step(cfg, state, (1, 0, 1)))
    assert accepted is True and open_.forward == c.Forward((1, 0, 1))


def test_CELL_POS_order_within_the_sequence_and_the_step(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)                       # seq 0 newest 2, seq 1 newest 1
    _, state = ok(c.declare_step(cfg, state, [0, 1, 1]))
    for bad in ([2, 2, 3], [3, 1, 4], [3, 4, 4], [3, 4, 2]):
        assert c.place_step(cfg, state, 0, bad) == c.CellRejected("CELL-POS", "positions"), bad
    assert c.place_step(cfg, state, 0, [3, 2]) == c.CellRejected("CELL-POS", "positions")
    assert c.place_step(cfg, state, 0, [3, -1, 5]) == c.CellRejected("ARG-RANGE", "positions")
    assert c.place_step(cfg, state, 0, [3, 2, INT_MAX + 1]) == c.CellRejected("ARG-RANGE", "positions")
    assert c.place_step(cfg, state, 0, [3, 2.0, 5]) == c.CellRejected("ARG-INT", "positions")
    assert c.place_step(cfg, state, 0, "325") == c.CellRejected("ARG-TYPE", "positions")
    step, _ = ok(c.place_step(cfg, state, 0, [9, 2, 7]))   # gaps are allowed
    assert step.cells == (3, 4, 5)


def test_CELL_PLACE_and_CELL_LAYOUT_CANON_lowest_free_cells_in_token_order(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    _, state = ok(c.seq_rm(cfg, state, 0, 1))          # seq 0 keeps cell 0; cell 2 free, cell 1 is seq 1's
    _, state = ok(c.declare_step(cfg, state, [1, 0]))
    first, state = ok(c.place_step(cfg, state, 1, [2, 1]))
    again, state = ok(c.place_step(cfg, state, 0, [2, 1]))
    assert first.cells == again.cells == (2, 3)        # lowest free, token order; the later layer reuses them
    assert c.history(state, 0) == ((0, 0), (1, 4)) and c.history(state, 1) == ((0, 0), (1, 1), (2, 3))


def test_CELL_STEP_SHAPE_equal_windows_equal_steps() -> None:
    cfg = config(windows=(2, 0, 2))
    state = c.initial(cfg)
    _, state = ok(c.seq_new(cfg, state))
    _, state = ok(c.declare_step(cfg, state, [0, 0, 0]))
    steps = []
    for layer in (2, 0, 1):
        step, state = ok(c.place_step(cfg, state, layer, [0, 1, 2]))
        steps.append(step)
    assert steps[0] == steps[1] != steps[2]           # layers 2 and 0 are ring(2), layer 1 flat
    assert steps[0].length == 3 and steps[0].read_len == 3 and len(steps[0].mask_bits) == 9
    assert steps[0].attends(2, 1) and not steps[0].attends(2, 0)


def test_CELL_FORWARD_mid_forward_verbs_and_layers(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    assert c.place_step(cfg, state, 0, [3]) == c.CellRejected("CELL-FORWARD", "forward")   # nothing declared
    _, declared = ok(c.declare_step(cfg, state, [0]))
    _, half = ok(c.place_step(cfg, declared, 0, [3]))
    for open_ in (declared, half):                       # declared but not placed, and between layers
        assert c.seq_new(cfg, open_) == c.CellRejected("CELL-FORWARD", "forward")
        assert c.seq_clone(cfg, open_, 0) == c.CellRejected("CELL-FORWARD", "forward")
        assert c.seq_rm(cfg, open_, 0, 0) == c.CellRejected("CELL-FORWARD", "forward")
        assert c.declare_step(cfg, open_, [1]) == c.CellRejected("CELL-FORWARD", "forward")
        assert c.clear(cfg, open_).forward is None       # the escape hatch
    assert c.place_step(cfg, half, 0, [3]) == c.CellRejected("CELL-FORWARD", "layer")        # served twice
    assert c.place_step(cfg, half, 1, [4]) == c.CellRejected("CELL-FORWARD", "positions")    # other positions
    assert c.place_step(cfg, half, 2, [3]) == c.CellRejected("LAYER-RANGE", "layer")
    assert (c.seq_len(cfg, half, 0), c.free_cells(cfg, half)) == (4, 2)   # queries answer mid-forward
    _, done = ok(c.place_step(cfg, half, 1, [3]))
    assert done.forward is None


def test_CELL_CLEAR_forgets_every_sequence(cfg: c.CellConfig) -> None:
    state = c.clear(cfg, prompt_and_fork(cfg))
    assert (c.live(state), c.used_end(state), c.free_cells(cfg, state)) == (frozenset(), 0, 6)
    seq, state = ok(c.seq_new(cfg, state))
    rows, _ = forward(cfg, state, [seq], [0])
    assert rows == [["1"], ["1"]]                      # cell 0 again, and nothing old is seen


def test_CELL_SEQ_ID_and_CELL_SEQ_LIVE_on_every_verb(cfg: c.CellConfig) -> None:
    state = prompt_and_fork(cfg)
    assert c.seq_len(cfg, state, 3) == c.CellRejected("CELL-SEQ-ID", "seq_id")
    assert c.next_pos(cfg, state, -1) == c.CellRejected("CELL-SEQ-ID", "seq_id")
    assert c.next_pos(cfg, state, False) == c.CellRejected("ARG-INT", "seq_id")
    assert c.seq_len(cfg, state, 2) == c.CellRejected("CELL-SEQ-LIVE", "seq_id")
    assert c.seq_clone(cfg, state, 2) == c.CellRejected("CELL-SEQ-LIVE", "src")
    assert c.seq_clone(cfg, state, 0, -1) == c.CellRejected("ARG-RANGE", "upto")
    assert c.seq_rm(cfg, state, 2, 0) == c.CellRejected("CELL-SEQ-LIVE", "seq_id")
    assert c.seq_rm(cfg, state, 0, 3, 2) == c.CellRejected("CELL-RM", "p1")
    assert c.seq_rm(cfg, state, 0, None) == c.CellRejected("ARG-INT", "p0")


def test_CELL_ATOMIC_several_rules_broken_lists_them_all(cfg: c.CellConfig) -> None:
    _, declared = ok(c.declare_step(cfg, prompt_and_fork(cfg), [0]))
    rejected = c.seq_rm(cfg, declared, 2, 0)           # mid-forward and not live
    assert isinstance(rejected, c.CellRejected) and rejected.rules == ("CELL-FORWARD", "CELL-SEQ-LIVE")


def test_CELL_MAX_SEQS_and_kv_dtype() -> None:
    layers = [(FLAT, 0, 1, 1)]
    assert c.make_cell_config(4, 1, layers, max_seqs=0) == Rejected("CELL-MAX-SEQS", "max_seqs")
    assert c.make_cell_config(4, 1, layers, max_seqs=65) == Rejected("CELL-MAX-SEQS", "max_seqs")
    assert c.make_cell_config(4, 1, layers, max_seqs=True) == Rejected("CELL-MAX-SEQS", "max_seqs")
    assert c.make_cell_config(4, 1, layers, kv_dtype=-1) == Rejected("CFG-TYPE", "kv_dtype")
    assert c.make_cell_config(4, 1, layers, kv_dtype=True) == Rejected("CFG-TYPE", "kv_dtype")
    assert c.make_cell_config(0, 1, layers) == Rejected("CFG-CAPACITY", "capacity")
    made = c.make_cell_config(4, 1, layers, kv_dtype=6, max_seqs=64)
    assert isinstance(made, c.CellConfig) and made.max_seqs == 64


# --- the detector catches broken steps ---------------------------------------------------------------

def _batch(cfg: c.CellConfig) -> tuple[c.CellState, c.Forward, c.CellStep, c.Pool]:
    """The batch of test_CELL_DATA_SOUND_a_batch... on the flat layer, with our pool as it was."""
    state = prompt_and_fork(cfg)
    pool: c.Pool = state.written                        # a faithful backend's pool so far
    _, state = ok(c.declare_step(cfg, state, [0, 1]))
    step, state = ok(c.place_step(cfg, state, 0, [3, 2]))
    assert state.forward is not None
    return state, state.forward, step, pool


def test_execute_step_passes_the_model_s_own_step(cfg: c.CellConfig) -> None:
    state, fwd, step, pool = _batch(cfg)
    after, problems = c.execute_step(cfg, state, fwd, 0, pool, step)
    assert problems == [] and after[3:5] == ((3, 3), (2, 4))   # content ids 0-2 went to the prompt


def _flip(step: c.CellStep, i: int, j: int) -> c.CellStep:
    bits = bytearray(step.mask_bits)
    bits[i * step.read_len + j] ^= 1
    return replace(step, mask_bits=bytes(bits))


@pytest.mark.parametrize("i, j, what", [
    (1, 2, "attends cell 2 holding (2, 2)"),          # the fork sees its source's position 2 (past the cut)
    (0, 4, "attends cell 4 holding (2, 4)"),          # the source sees the fork's token
    (0, 0, "misses its (position, content) (0, 0)"),  # a shared cell left out
])
def test_execute_step_catches_a_wrong_mask_bit(cfg: c.CellConfig, i: int, j: int, what: str) -> None:
    state, fwd, step, pool = _batch(cfg)
    problems = c.execute_step(cfg, state, fwd, 0, pool, _flip(step, i, j))[1]
    assert len(problems) == 1 and problems[0].startswith("CELL-DATA-SOUND") and what in problems[0]


def test_execute_step_catches_a_stale_cell_and_an_overwrite(cfg: c.CellConfig) -> None:
    state, fwd, step, pool = _batch(cfg)
    stale = pool[:5] + ((1, 99),)                       # cell 5 holds a removed entry
    wide = replace(step, read_len=6, mask_bits=b"".join(r + bytes([1 if i == 0 else 0])
                                                        for i, r in enumerate((step.mask_bits[:5], step.mask_bits[5:]))))
    assert any("attends cell 5 holding (1, 99)" in p for p in c.execute_step(cfg, state, fwd, 0, stale, wide)[1])
    onto_live = replace(step, cells=(2, 4))            # token 0 over seq 0's own position 2
    problems = c.execute_step(cfg, state, fwd, 0, pool, onto_live)[1]
    assert problems[0] == "CELL-PLACE: token 0 placed in cell 2, which holds (2, 2) of a live history"


@pytest.mark.parametrize("change", [
    {"length": 3}, {"read_len": 7}, {"cells": (3, 3)}, {"cells": (3, 5)}, {"mask_bits": b"\x01" * 9},
    {"mask_bits": b"\x02" * 10}])
def test_execute_step_catches_a_bad_shape(cfg: c.CellConfig, change: dict[str, Any]) -> None:
    state, fwd, step, pool = _batch(cfg)
    problems = c.execute_step(cfg, state, fwd, 0, pool, replace(step, **change))[1]
    assert problems and all(p.startswith("CELL-STEP-SHAPE") for p in problems), problems


def test_every_cell_rule_says_what_it_prevents() -> None:
    from kvcache_spec.rules import RULES
    cell_rules = [rule for rule in RULES if rule.id.startswith("CELL-")]
    assert len(cell_rules) == 24   # 20 of the cell layout, 4 of the cell layout seen through outputs (SPEC.md 5.3)
    assert all(len(rule.prevents.split()) >= 6 and rule.why for rule in cell_rules), "statement, why, bug class"
