"""The cell cache (kvcache.CellCache), upstream-style: numbers computed by hand from the CELL- rules.

Masks are written as one string per query token, cell j's character is 1 iff the token attends cell j
(`rows(step)`). Layouts follow CELL-LAYOUT-CANON (the lowest free cell, in token order). The reference's
own contracts are active here, so every call below is also checked against the invariants.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Callable

import pytest

from kvcache import (INT_MAX, MAX_SEQS, ArgumentTypeError, ArgumentValueError, CacheConfig, CellCache, CellStep,
                     ConfigError, ConfigTypeError, ForwardError, KVCacheError, LayerConfig, LayerIndexError,
                     LayerPolicy, SequenceCache, StepError)

FLAT = LayerConfig(LayerPolicy.flat())


def RING(window: int) -> LayerConfig:
    return LayerConfig(LayerPolicy.ring(window))


def cells(capacity: int = 8, *layers: LayerConfig, max_seqs: int = MAX_SEQS) -> CellCache:
    """A cell cache over the given layers (flat + ring(2) by default)."""
    chosen = list(layers) or [FLAT, RING(2)]
    return CellCache(CacheConfig(capacity, len(chosen), chosen), max_seqs)


def rows(step: CellStep) -> list[str]:
    return ["".join(str(step.mask_bits[i * step.read_len + j]) for j in range(step.read_len))
            for i in range(step.length)]


def forward(c: CellCache, seq_ids: list[int], positions: list[int]) -> list[CellStep]:
    """One whole forward: declare, then every layer in order; the step of each layer."""
    assert c.declare_step(seq_ids)
    return [c.place_step(layer, positions) for layer in range(c.n_layers)]


def observe(c: CellCache) -> tuple[object, ...]:
    """Everything a caller can see, and the whole state."""
    live = sorted(c.live())
    return (live, c.free_cells(), c.used_end(), [(s, c.seq_len(s), c.next_pos(s)) for s in live], c._state())


def prompt(c: CellCache, n: int) -> int:
    """A new sequence holding positions 0..n-1 (one forward)."""
    s = c.seq_new()
    assert s is not None
    forward(c, [s] * n, list(range(n)))
    return s


# --- placement and masks ----------------------------------------------------------------------------

def test_CELL_PLACE_a_prompt_takes_the_lowest_cells_and_masks_causally() -> None:
    c = cells()
    s = c.seq_new()
    assert s == 0
    flat, ring = forward(c, [0, 0, 0], [0, 1, 2])
    assert flat.cells == ring.cells == (0, 1, 2) and flat.length == 3 and flat.read_len == 3
    assert rows(flat) == ["100", "110", "111"]
    assert rows(ring) == ["100", "110", "011"]      # window 2: q=2 sees positions 1..2
    assert (c.free_cells(), c.used_end(), c.seq_len(0), c.next_pos(0)) == (5, 3, 3, 3)


def test_CELL_MASK_a_batch_of_two_sequences_never_sees_the_other() -> None:
    c = cells()
    assert (c.seq_new(), c.seq_new()) == (0, 1)
    flat, ring = forward(c, [0, 1, 0, 1], [0, 0, 1, 1])
    assert flat.cells == (0, 1, 2, 3)
    assert rows(flat) == rows(ring) == ["1000", "0100", "1010", "0101"]
    assert flat.attends(2, 0) and not flat.attends(2, 1)


def test_CELL_LAYOUT_CANON_cells_fill_holes_first() -> None:
    c = cells()
    s = prompt(c, 5)                                 # cells 0..4 hold positions 0..4
    assert c.seq_rm(s, 0, 1)                         # position 0 leaves: cell 0 is a hole
    assert (c.free_cells(), c.used_end()) == (4, 5)
    flat, ring = forward(c, [s], [5])
    assert flat.cells == (0,)                        # the lowest free cell, although it is below others
    assert rows(flat) == ["11111"]                   # positions 5, 1, 2, 3, 4
    assert rows(ring) == ["10001"]                   # window 2: positions 4..5, in cells 4 and 0 (CELL-WINDOW-POS)


def test_CELL_STEP_SHAPE_layers_with_one_window_share_one_step() -> None:
    c = cells(8, RING(2), FLAT, RING(2), RING(3))
    s = c.seq_new()
    assert s is not None
    steps = forward(c, [s, s, s], [0, 1, 2])
    assert steps[0] is steps[2] and steps[0] != steps[1] and steps[3] == steps[1]  # ring(3) sees all 3 here
    assert rows(steps[0]) == ["100", "110", "011"]


def test_CELL_WINDOW_POS_windows_measure_positions_not_tokens() -> None:
    c = cells()
    s = c.seq_new()
    assert s is not None
    flat, ring = forward(c, [s, s, s], [0, 5, 6])    # gaps are allowed
    assert rows(flat) == ["100", "110", "111"]
    assert rows(ring) == ["100", "010", "011"]       # q=5 sees [4, 5]: only itself; q=6 sees 5 and 6
    flat, ring = forward(c, [s], [10])
    assert rows(flat) == ["1111"] and rows(ring) == ["0001"]   # [9, 10]: nothing of 0, 5, 6
    assert c.next_pos(s) == 11 and c.seq_len(s) == 4


def test_CELL_POS_a_step_may_mix_sequences_at_their_own_positions() -> None:
    c = cells()
    a, b = prompt(c, 3), prompt(c, 1)                # a: cells 0..2 (0..2); b: cell 3 (0)
    flat, _ = forward(c, [b, a, b], [1, 3, 2])       # cells 4, 5, 6
    assert flat.cells == (4, 5, 6)
    assert rows(flat) == ["0001100", "1110010", "0001101"]


# --- forks ------------------------------------------------------------------------------------------

def test_CELL_FORK_without_upto_shares_everything_and_diverges() -> None:
    c = cells()
    s = prompt(c, 3)
    f = c.seq_clone(s)
    assert f == 1 and (c.seq_len(f), c.next_pos(f)) == (3, 3)
    assert c.free_cells() == 5                       # shared, not copied
    flat, ring = forward(c, [s, f], [3, 3])          # cells 3, 4
    assert rows(flat) == ["11110", "11101"]
    assert rows(ring) == ["00110", "00101"]          # window 2: position 2 (shared cell 2) and its own 3


def test_CELL_FORK_with_upto_shares_only_below_the_cut() -> None:
    c = cells()
    s = prompt(c, 3)
    f = c.seq_clone(s, 2)
    assert f is not None and (c.seq_len(f), c.next_pos(f)) == (2, 2)
    flat, _ = forward(c, [f], [2])                   # the fork writes its own position 2, in cell 3
    assert flat.cells == (3,) and rows(flat) == ["1101"]
    assert (c.seq_len(s), c.next_pos(s)) == (3, 3)   # src unchanged
    flat, _ = forward(c, [s], [3])                   # src does not see the fork's position 2
    assert rows(flat) == ["11101"]


def test_CELL_FORK_with_an_empty_cut_or_an_empty_source_is_a_live_empty_sequence() -> None:
    c = cells()
    s = prompt(c, 2)
    f = c.seq_clone(s, 0)
    assert f == 1 and f in c.live() and (c.seq_len(f), c.next_pos(f)) == (0, 0)
    e = c.seq_new()
    g = c.seq_clone(e if e is not None else -1)
    assert (e, g) == (2, 3) and c.seq_len(g) == 0 and c.live() == {0, 1, 2, 3}
    flat, _ = forward(c, [f], [0])
    assert rows(flat) == ["001"]


def test_CELL_FORK_upto_past_the_newest_shares_all() -> None:
    c = cells()
    s = prompt(c, 3)
    f = c.seq_clone(s, INT_MAX)
    assert f is not None and c.seq_len(f) == 3


# --- removals ---------------------------------------------------------------------------------------

def test_CELL_RM_removes_exactly_p0_to_p1_exclusive() -> None:
    c = cells()
    s = prompt(c, 5)
    assert c.seq_rm(s, 1, 3) is True                 # positions 1 and 2, not 3
    assert (c.seq_len(s), c.next_pos(s), c.free_cells(), c.used_end()) == (3, 5, 5, 5)
    before = observe(c)
    assert c.seq_rm(s, 3, 3) and observe(c) == before    # p0 == p1: an empty range
    assert c.seq_rm(s, 7) and observe(c) == before       # a range that owns nothing
    flat, _ = forward(c, [s], [5])
    assert flat.cells == (1,) and rows(flat) == ["11011"]


def test_CELL_RM_before_at_and_after_the_cut() -> None:
    c = cells()
    s = prompt(c, 6)                                 # cells 0..5
    f = c.seq_clone(s, 3)                            # shares cells 0, 1, 2
    assert f is not None
    assert c.seq_rm(f, 0, 1)                         # before the cut, a shared cell: s keeps it
    assert (c.seq_len(f), c.seq_len(s), c.free_cells()) == (2, 6, 2)
    assert c.seq_rm(s, 2, 3)                         # at the cut: cell 2 stays, owned by f
    assert (c.seq_len(s), c.seq_len(f), c.free_cells()) == (5, 2, 2)
    assert c.seq_rm(s, 4)                            # after the cut: s's own cells 4, 5 become free
    assert (c.seq_len(s), c.next_pos(s), c.next_pos(f), c.free_cells(), c.used_end()) == (3, 4, 3, 4, 4)
    flat, _ = forward(c, [s, f], [4, 3])             # cells 4, 5
    assert rows(flat) == ["110110", "011001"]        # s: 0, 1, 3 + own; f: 1, 2 + own


def test_CELL_RM_inside_and_outside_the_window() -> None:
    c = cells()
    s = prompt(c, 5)
    assert c.seq_rm(s, 4)                            # speculative rollback of the newest position
    assert (c.next_pos(s), c.used_end()) == (4, 4)
    _, ring = forward(c, [s], [4])                   # rewritten in cell 4
    assert rows(ring) == ["00011"]
    assert c.seq_rm(s, 3, 4)                         # inside the next token's window: it loses a key
    _, ring = forward(c, [s], [5])                   # cell 3; window [4, 5]: cells 4 and 3
    assert ring.cells == (3,) and rows(ring) == ["00011"]
    assert c.seq_rm(s, 0, 1)                         # outside every window: the ring mask is unchanged
    _, ring = forward(c, [s], [6])                   # cell 0; window [5, 6]
    assert ring.cells == (0,) and rows(ring) == ["10010"]


def test_CELL_RM_removing_everything_ends_the_sequence() -> None:
    c = cells()
    s = prompt(c, 3)
    assert c.seq_rm(s, 0)
    assert c.live() == frozenset() and (c.free_cells(), c.used_end()) == (8, 0)
    e = c.seq_new()
    assert e == 0 and c.seq_rm(e, 5, 9) and c.live() == frozenset()   # an empty sequence ends too


# --- ids --------------------------------------------------------------------------------------------

def test_CELL_NEW_hands_out_the_lowest_id_that_is_not_live() -> None:
    c = cells(8, FLAT, max_seqs=3)
    assert [c.seq_new(), c.seq_new(), c.seq_new()] == [0, 1, 2]
    before = observe(c)
    assert c.seq_new() is None and c.seq_clone(1) is None    # every id is live: refused, nothing changed
    assert observe(c) == before
    assert c.seq_rm(1, 0) and c.seq_new() == 1


def test_CELL_ID_REUSE_a_reused_id_sees_nothing_of_its_predecessor() -> None:
    c = cells()
    s = prompt(c, 3)                                 # id 0, cells 0..2
    f = c.seq_clone(s)                               # id 1 co-owns cells 0..2
    assert c.seq_rm(s, 0)                            # id 0 ends; its cells stay, carried by id 1 only
    assert c.live() == {1} and c.free_cells() == 5
    t = c.seq_new()
    assert t == 0 and (c.seq_len(t), c.next_pos(t)) == (0, 0)
    flat, _ = forward(c, [t], [0])
    assert flat.cells == (3,) and rows(flat) == ["0001"]     # not one of the cells id 0 used to own
    assert f is not None and c.seq_len(f) == 3


# --- forwards, clear, admission ---------------------------------------------------------------------

def test_CELL_FORWARD_verbs_are_refused_while_a_forward_is_open() -> None:
    c = cells()
    s = prompt(c, 2)
    assert c.declare_step([s])
    for stage in ("declared", "placed"):
        before = observe(c)
        for verb in (lambda: c.seq_new(), lambda: c.seq_clone(s), lambda: c.seq_rm(s, 0),
                     lambda: c.declare_step([s])):
            with pytest.raises(ForwardError) as caught:
                verb()
            assert caught.value.rule == "CELL-FORWARD"
            assert observe(c) == before
        held = 2 if stage == "declared" else 3       # placed by the first layer served
        assert c.can_extend(1) and c.seq_len(s) == held and c.next_pos(s) == held   # queries are allowed
        if stage == "declared":
            c.place_step(1, [2])                     # any layer order
    with pytest.raises(ForwardError, match="already served"):
        c.place_step(1, [2])
    with pytest.raises(ForwardError, match="differ"):
        c.place_step(0, [3])
    c.place_step(0, [2])                             # the last layer closes the forward
    assert c.seq_new() == 1
    with pytest.raises(ForwardError, match="no step is declared"):
        c.place_step(0, [3])


def test_CELL_CLEAR_forgets_everything_even_an_open_forward() -> None:
    c = cells()
    s = prompt(c, 3)
    assert c.seq_clone(s) == 1 and c.declare_step([s])
    c.place_step(0, [3])                             # mid-forward: clear is the escape hatch
    c.clear()
    assert (c.live(), c.free_cells(), c.used_end()) == (frozenset(), 8, 0)
    assert c.seq_new() == 0
    flat, ring = forward(c, [0], [0])
    assert flat.cells == (0,) and rows(ring) == ["1"]


def test_CELL_DECLARE_admission_counts_free_cells() -> None:
    c = cells(4)
    a = prompt(c, 2)
    before = observe(c)
    assert c.declare_step([a, a, a]) is False and observe(c) == before    # 3 tokens, 2 free cells
    assert c.can_extend(2) and not c.can_extend(3)
    b = c.seq_new()
    assert b is not None
    steps = forward(c, [a, b], [2, 0])               # exactly the free cells
    assert steps[0].cells == (2, 3) and c.free_cells() == 0 and not c.can_extend(1) and c.can_extend(0)


def test_FACES_the_cell_faces_are_the_cache_and_the_sequence_faces_are_none() -> None:
    c = cells()
    assert c.as_batch_control() is c and c.as_cell_stepper() is c
    assert c.as_control() is None and c.as_planner() is None
    s = SequenceCache(CacheConfig(4, 1, [FLAT]))
    assert s.as_batch_control() is None and s.as_cell_stepper() is None and s.as_control() is s
    assert c.capacity() == 8 and c.max_seqs == MAX_SEQS == 64


def test_REG_SESSION_a_cell_cache_in_a_session_has_no_sequence_runner_face() -> None:
    from kvcache import CacheRegistry, CacheSession, make_unique_key

    c = cells()
    with CacheSession(make_unique_key(), c) as session:
        assert CacheRegistry.get(session.key) is c and session.cache.as_batch_control() is c
        with pytest.raises(ArgumentTypeError) as caught:
            session.control()
        assert caught.value.rule == "ARG-TYPE" and caught.value.argument == "cache"


# --- bad input: typed errors, nothing changed ---------------------------------------------------------

def busy() -> CellCache:
    """Ids 0 (positions 0..2) and 1 (a fork at 2), id 2 not live, no forward open; 2 layers."""
    c = cells(8, FLAT, RING(2), max_seqs=4)
    s = prompt(c, 3)
    assert c.seq_clone(s, 2) == 1
    return c


JUNK: list[Any] = [True, False, -1, -2**70, INT_MAX + 1, 2**70, 1.0, "0", None, [0], (0,), 1j]
HUGE_OR_NEGATIVE = [-1, -2**70, INT_MAX + 1, 2**70]

# (call, values, {rule}) : every value must raise a typed error citing one of the rules.
BAD_CALLS: dict[str, tuple[Callable[[CellCache, Any], object], list[Any], set[str]]] = {
    "seq_len(seq_id)": (lambda c, v: c.seq_len(v), JUNK + [4, 2], {"CELL-SEQ-ID", "CELL-SEQ-LIVE"}),
    "next_pos(seq_id)": (lambda c, v: c.next_pos(v), JUNK + [4, 2], {"CELL-SEQ-ID", "CELL-SEQ-LIVE"}),
    "seq_clone(src)": (lambda c, v: c.seq_clone(v), JUNK + [4, 2], {"CELL-SEQ-ID", "CELL-SEQ-LIVE"}),
    "seq_clone(upto)": (lambda c, v: c.seq_clone(0, v), [v for v in JUNK if v is not None], {"ARG-INT", "ARG-RANGE"}),
    "seq_rm(seq_id)": (lambda c, v: c.seq_rm(v, 0), JUNK + [4, 2], {"CELL-SEQ-ID", "CELL-SEQ-LIVE"}),
    "seq_rm(p0)": (lambda c, v: c.seq_rm(0, v), JUNK, {"ARG-INT", "ARG-RANGE"}),
    "seq_rm(p1)": (lambda c, v: c.seq_rm(0, 1, v), [v for v in JUNK if v is not None] + [0], {"ARG-INT", "ARG-RANGE",
                                                                                                "CELL-RM"}),
    "can_extend(n)": (lambda c, v: c.can_extend(v), JUNK, {"ARG-INT", "ARG-RANGE"}),
    "declare_step(seq_ids)": (lambda c, v: c.declare_step(v),
                              [v for v in JUNK if v not in ([0], (0,))]  # [0] and (0,) are well-formed
                              + [[], (), [True], [0, -1], [0, 4], [2], [0, 2], "01", range(2), {0}, [0.0]],
                              {"CELL-DECLARE", "CELL-SEQ-ID", "CELL-SEQ-LIVE"}),
}


@pytest.mark.parametrize("entry", sorted(BAD_CALLS))
def test_ATOMIC_bad_input_is_a_typed_error_that_changes_nothing(entry: str) -> None:
    """CELL-ATOMIC, CELL-SEQ-ID, CELL-SEQ-LIVE, ARG-INT, ARG-RANGE, CELL-RM, CELL-DECLARE."""
    call, values, rules = BAD_CALLS[entry]
    for value in values:
        c = busy()
        before = observe(c)
        with pytest.raises(KVCacheError) as caught:
            call(c, value)
        assert caught.value.rule in rules, (value, caught.value)
        assert caught.value.argument.split("[")[0] in entry, (value, caught.value.argument)
        if not entry.startswith("declare_step"):     # a wrong type is a TypeError, a wrong value a ValueError
            expected = ArgumentValueError if isinstance(value, int) and not isinstance(value, bool) else ArgumentTypeError
            assert isinstance(caught.value, expected), (value, type(caught.value))
        assert observe(c) == before


def open_forward() -> CellCache:
    c = busy()
    assert c.declare_step([0, 1, 0])
    return c


# (positions or layer, rule) for place_step on a fresh declaration of [0, 1, 0] (0 holds 0..2, 1 holds 0..1).
BAD_PLACEMENTS: list[tuple[Any, Any, str, type]] = [
    (True, [3, 2, 4], "ARG-INT", ArgumentTypeError),
    (0.0, [3, 2, 4], "ARG-INT", ArgumentTypeError),
    (2, [3, 2, 4], "LAYER-RANGE", LayerIndexError),
    (-1, [3, 2, 4], "LAYER-RANGE", LayerIndexError),
    (INT_MAX + 1, [3, 2, 4], "LAYER-RANGE", LayerIndexError),
    (0, "324", "CELL-POS", ArgumentTypeError),
    (0, range(3, 6), "CELL-POS", ArgumentTypeError),
    (0, [3, True, 4], "CELL-POS", ArgumentTypeError),
    (0, [3, 2.0, 4], "CELL-POS", ArgumentTypeError),
    (0, [3, -1, 4], "CELL-POS", ArgumentValueError),
    (0, [3, 2, INT_MAX + 1], "CELL-POS", ArgumentValueError),
    (0, [3, 2], "CELL-POS", StepError),              # one position per declared token
    (0, [3, 2, 4, 5], "CELL-POS", StepError),
    (0, [2, 2, 4], "CELL-POS", StepError),           # not newer than seq 0's position 2 (forged)
    (0, [3, 1, 4], "CELL-POS", StepError),           # not newer than seq 1's position 1
    (0, [4, 2, 4], "CELL-POS", StepError),           # seq 0's second token not after its first
    (0, [4, 2, 3], "CELL-POS", StepError),
]


@pytest.mark.parametrize("layer, positions, rule, error", BAD_PLACEMENTS)
def test_CELL_POS_bad_placements_are_typed_errors_that_change_nothing(layer: Any, positions: Any, rule: str,
                                                                      error: type) -> None:
    c = open_forward()
    before = observe(c)
    with pytest.raises(error) as caught:
        c.place_step(layer, positions)
    assert caught.value.rule == rule and observe(c) == before   # type: ignore[attr-defined]
    step = c.place_step(1, [3, 2, 4])                 # and the forward still works: window 2
    assert step.cells == (3, 4, 5) and rows(step) == ["001100", "010010", "000101"]


def test_CELL_POS_the_largest_position_is_INT_MAX_minus_1_so_next_pos_fits_an_int() -> None:
    c = cells()
    s = c.seq_new()
    assert s is not None
    flat, _ = forward(c, [s, s], [INT_MAX - 2, INT_MAX - 1])
    assert rows(flat) == ["10", "11"]
    assert c.next_pos(s) == INT_MAX and c.declare_step([s])
    before = observe(c)
    for position in (INT_MAX, INT_MAX + 1):           # nothing newer than INT_MAX - 1 is a position
        with pytest.raises(ArgumentValueError) as caught:
            c.place_step(0, [position])
        assert caught.value.rule == "CELL-POS" and caught.value.argument == "positions[0]"
        assert observe(c) == before
    c.clear()


def test_arguments_are_checked_before_the_forward_and_liveness() -> None:
    """The documented order (kvcache/_cells.py): argument types and ranges, then CELL-FORWARD, then
    CELL-SEQ-LIVE, then the positions' order (CELL-POS)."""
    c = busy()                                        # id 2 is not live
    assert c.declare_step([0])
    for call, rule in ((lambda: c.seq_clone(2, -1), "ARG-RANGE"), (lambda: c.seq_rm(2, 0, True), "ARG-INT"),
                       (lambda: c.seq_rm(2, 3, 1), "CELL-RM"), (lambda: c.declare_step([True]), "CELL-SEQ-ID"),
                       (lambda: c.seq_clone(2), "CELL-FORWARD"), (lambda: c.declare_step([2]), "CELL-FORWARD"),
                       (lambda: c.place_step(0, [-1]), "CELL-POS"), (lambda: c.place_step(5, [0]), "LAYER-RANGE")):
        with pytest.raises(KVCacheError) as caught:
            call()
        assert caught.value.rule == rule, (rule, caught.value)
    c.clear()
    assert c.seq_new() == 0
    with pytest.raises(KVCacheError) as caught:
        c.seq_len(1)
    assert caught.value.rule == "CELL-SEQ-LIVE"


def test_CELL_MAX_SEQS_and_config_are_checked() -> None:
    config = CacheConfig(4, 1, [FLAT])
    for bad, error in ((0, ArgumentValueError), (65, ArgumentValueError), (-1, ArgumentValueError),
                       (True, ArgumentTypeError), (1.0, ArgumentTypeError), (None, ArgumentTypeError)):
        with pytest.raises(error) as caught:
            CellCache(config, bad)
        assert caught.value.rule == "CELL-MAX-SEQS" and caught.value.argument == "max_seqs"
    assert CellCache(config, 1).max_seqs == 1 and CellCache(config, 64).max_seqs == 64
    with pytest.raises(ConfigTypeError) as type_error:
        CellCache("config")  # type: ignore[arg-type]
    assert type_error.value.rule == "CFG-TYPE"


def test_CFG_TYPE_kv_dtype_is_an_int_at_least_zero_or_none() -> None:
    assert CacheConfig(4, 1, [FLAT], kv_dtype=0).kv_dtype == 0 and CacheConfig(4, 1, [FLAT]).kv_dtype is None
    for bad in (-1, True, 1.5, "f16", INT_MAX + 1):
        with pytest.raises(ConfigError) as caught:
            CacheConfig(4, 1, [FLAT], kv_dtype=bad)
        assert caught.value.rule == "CFG-TYPE" and caught.value.argument == "CacheConfig.kv_dtype"
    # irrelevant to the bookkeeping of both layouts
    assert CellCache(CacheConfig(4, 1, [FLAT], kv_dtype=7))._state() == CellCache(CacheConfig(4, 1, [FLAT]))._state()


def test_CELL_STEP_SHAPE_a_cell_step_cannot_be_forged() -> None:
    good = CellStep(2, 3, (0, 2), bytes([1, 0, 0, 1, 0, 1]))
    assert good.attends(1, 2) and not good.attends(1, 1) and good.row(1) == b"\x01\x00\x01"
    for fields in ((0, 3, (), b""), (True, 3, (0,), b"\x01\x00\x00"), (2, 3, [0, 2], bytes(6)),
                   (2, 3, (0, 0), bytes(6)), (2, 3, (0, 3), bytes(6)), (2, 3, (0, 2), bytes(5)),
                   (2, 3, (0, 2), bytearray(6)), (2, 3, (0, 2), bytes([2, 0, 0, 0, 0, 0])),
                   (1, 1, (False,), b"\x01")):
        with pytest.raises(StepError) as caught:
            CellStep(*fields)
        assert caught.value.rule == "CELL-STEP-SHAPE"
    for i, j, error in ((2, 0, ArgumentValueError), (0, 3, ArgumentValueError), (-1, 0, ArgumentValueError),
                        (True, 0, ArgumentTypeError), (0, 1.0, ArgumentTypeError)):
        with pytest.raises(error):
            good.attends(i, j)


OPTIMIZED_PROBE = """
import kvcache
from kvcache import CellCache, CacheConfig, LayerConfig, LayerPolicy
if __debug__:
    raise SystemExit("run me under python -O")
c = CellCache(CacheConfig(4, 2, [LayerConfig(LayerPolicy.flat())]), 4)
s = c.seq_new()
print(c.declare_step([s, s]), c.place_step(0, [0, 1]).cells)   # no assert: -O strips them
before = c._state()
calls = (lambda: c.seq_rm(s, 0), lambda: c.place_step(0, [0, 1]), lambda: c.place_step(1, [0, 2]),
         lambda: c.place_step(True, [0, 1]), lambda: c.place_step(2, [0, 1]))
for call in calls:
    try:
        call()
    except kvcache.KVCacheError as error:
        print(error.rule)
print(c._state() == before)
c.place_step(1, [0, 1])
before = c._state()
for call in (lambda: c.seq_len(True), lambda: c.seq_len(3), lambda: c.declare_step([s, 99]),
             lambda: c.seq_rm(s, 2, 1), lambda: c.place_step(0, [2]), lambda: CellCache(c.config, 0)):
    try:
        call()
    except kvcache.KVCacheError as error:
        print(error.rule)
print(c._state() == before)
"""


def test_validation_survives_python_O() -> None:
    """The typed preconditions stay on under -O (only the self-checks vanish), and still change nothing."""
    result = subprocess.run([sys.executable, "-O", "-c", OPTIMIZED_PROBE], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "(0,", "1)", "CELL-FORWARD", "CELL-FORWARD", "CELL-FORWARD", "ARG-INT", "LAYER-RANGE", "True",
                                     "CELL-SEQ-ID", "CELL-SEQ-LIVE", "CELL-SEQ-ID", "CELL-RM", "CELL-FORWARD",
                                     "CELL-MAX-SEQS", "True"]


def test_attributes_cannot_be_deleted() -> None:
    c = busy()
    before = observe(c)
    for name in ("_pos", "_live", "max_seqs", "unknown"):
        with pytest.raises(AttributeError, match="cannot be deleted"):
            delattr(c, name)
    assert observe(c) == before
