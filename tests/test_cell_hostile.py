"""The cell layout in hostile but fair hands: what tests/test_cell_cache.py's bad-input tables leave out.

- ARG-INT: a subclass of int is not an int (its == and hash may lie between a check and its use in the
  table); shown to matter by putting the old check back and watching the table break.
- CELL-DECLARE, CELL-POS: exactly a list or a tuple (a subclass may iterate differently each time).
- Aliasing: the lists a caller passes and the values it gets back are never the cache's own state.
- CELL-POS: the largest position is INT_MAX - 1, so next_pos fits an int (upstream's `int next_pos`).
- All of it under `python -O`, where only the self-checks vanish.
- The suite does not let a lenient answer hide a wrong one later in the same program.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import icontract
import pytest

import kvcache
from kvcache import (INT_MAX, ArgumentTypeError, ArgumentValueError, CacheConfig, CellCache, CellStep, ForwardError,
                     KVCacheError, LayerConfig, LayerPolicy, SequenceCache, StepError)
from kvcache_spec import cell_model as cm
from kvcache_spec.conformance import replay, run_suite
from kvcache_spec.conformance.engine import CRASH, LENIENT, WRONG
from kvcache_spec.conformance.targets import PythonTarget

from .suite_runs import cmd_suite, module_cmd

FLAT = LayerConfig(LayerPolicy.flat())


class LyingInt(int):
    """Equal to everything, one hash for all: passes `0 <= v < 64` as an int would, then collapses the
    ids of a declaration into one dict key."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


class Shifty(list):  # type: ignore[type-arg]
    """A list whose iteration differs each time: [0] when checked, [5] (a dead id) when used."""

    def __init__(self, first: list[int], later: list[int]) -> None:
        super().__init__(first)
        self.later, self.seen = later, 0

    def __iter__(self) -> Iterator[int]:
        self.seen += 1
        return iter(list.__iter__(self) if self.seen == 1 else self.later)


def busy() -> CellCache:
    """Seq 0 holds positions 0..2, seq 1 position 5; two layers (flat, window 2); no forward open."""
    c = CellCache(CacheConfig(8, 2, [FLAT, LayerConfig(LayerPolicy.ring(2))]), 4)
    assert c.seq_new() == 0 and c.seq_new() == 1
    assert c.declare_step([0, 0, 0, 1])
    for layer in range(2):
        c.place_step(layer, [0, 1, 2, 5])
    return c


def observe(c: CellCache) -> tuple[object, ...]:
    return (c._state(), c.free_cells(), c.used_end(), c.live())


# Every int a cell call takes, given a LyingInt(0) / LyingInt(1): (call, rule, argument).
SUBCLASS_CALLS: list[tuple[str, Callable[[CellCache, int], object], str, str]] = [
    ("seq_len", lambda c, v: c.seq_len(v), "CELL-SEQ-ID", "seq_id"),
    ("next_pos", lambda c, v: c.next_pos(v), "CELL-SEQ-ID", "seq_id"),
    ("seq_clone src", lambda c, v: c.seq_clone(v), "CELL-SEQ-ID", "src"),
    ("seq_clone upto", lambda c, v: c.seq_clone(0, v), "ARG-INT", "upto"),
    ("seq_rm seq_id", lambda c, v: c.seq_rm(v, 0), "CELL-SEQ-ID", "seq_id"),
    ("seq_rm p0", lambda c, v: c.seq_rm(0, v), "ARG-INT", "p0"),
    ("seq_rm p1", lambda c, v: c.seq_rm(0, 0, v), "ARG-INT", "p1"),
    ("can_extend", lambda c, v: c.can_extend(v), "ARG-INT", "n"),
    ("declare_step", lambda c, v: c.declare_step([0, v]), "CELL-SEQ-ID", "seq_ids[1]"),
    ("CellCache max_seqs", lambda c, v: CellCache(c.config, v), "CELL-MAX-SEQS", "max_seqs"),
]


@pytest.mark.parametrize("name, call, rule, argument", SUBCLASS_CALLS, ids=[row[0] for row in SUBCLASS_CALLS])
def test_ARG_INT_a_subclass_of_int_is_not_an_int(name: str, call: Callable[[CellCache, int], object], rule: str,
                                                 argument: str) -> None:
    for value in (LyingInt(1), LyingInt(0)):
        c = busy()
        before = observe(c)
        with pytest.raises(ArgumentTypeError) as caught:
            call(c, value)
        assert (caught.value.rule, caught.value.argument) == (rule, argument)
        assert observe(c) == before


def test_ARG_INT_place_step_refuses_int_subclasses_for_the_layer_and_the_positions() -> None:
    c = busy()
    assert c.declare_step([0, 1])
    before = observe(c)
    for layer, positions, rule, argument in ((LyingInt(0), [3, 6], "ARG-INT", "layer"),
                                             (0, [LyingInt(3), 6], "CELL-POS", "positions[0]")):
        with pytest.raises(ArgumentTypeError) as caught:
            c.place_step(layer, positions)
        assert (caught.value.rule, caught.value.argument) == (rule, argument)
        assert observe(c) == before
    with pytest.raises(StepError) as shape:
        CellStep(LyingInt(1), 1, (0,), b"\x01")
    assert shape.value.rule == "CELL-STEP-SHAPE"


def test_ARG_INT_the_old_check_let_a_lying_int_corrupt_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector shown to matter: with `isinstance(v, int) and not bool` back, LyingInt ids collapse into
    one key of the position check, so seq 1 is placed at a position it already holds (CELL-OWNERS broken;
    under -O nothing would notice)."""
    monkeypatch.setattr(kvcache._cells, "is_int", lambda v: isinstance(v, int) and not isinstance(v, bool))
    c = busy()                                  # seq 0 newest 2, seq 1 newest 5
    assert c.declare_step([LyingInt(0), LyingInt(1)])
    with pytest.raises(icontract.ViolationError):   # a postcondition: the mask it built is not the formula's
        c.place_step(0, [3, 5])                # seq 1 at 5 again: checked against seq 0's newest (2)
    assert [p for p, owners in zip(c._pos, c._owners) if owners == 1 << 1] == [5, 5]   # two cells, one position


def test_CELL_DECLARE_and_CELL_POS_take_exactly_a_list_or_a_tuple() -> None:
    c = busy()
    before = observe(c)
    with pytest.raises(ArgumentTypeError) as declared:
        c.declare_step(Shifty([0], [5]))
    assert (declared.value.rule, declared.value.argument) == ("CELL-DECLARE", "seq_ids")
    assert observe(c) == before and c._declared is None
    assert c.declare_step([0])
    before = observe(c)
    with pytest.raises(ArgumentTypeError) as placed:
        c.place_step(0, Shifty([3], [0]))
    assert (placed.value.rule, placed.value.argument) == ("CELL-POS", "positions")
    assert observe(c) == before
    # the model agrees: only a list or a tuple is a declaration or positions
    assert isinstance(cm.declare_step(_model_config(), cm.initial(_model_config()), Shifty([0], [5])),
                      cm.CellRejected)


def _model_config() -> cm.CellConfig:
    made = cm.make_cell_config(8, 1, [(0, 0, 1, 1)], max_seqs=4)
    assert isinstance(made, cm.CellConfig)
    return made


def test_aliasing_what_the_caller_holds_is_never_the_caches_state() -> None:
    c = busy()
    seq_ids, positions = [0, 1], [3, 6]
    assert c.declare_step(seq_ids)
    seq_ids[1] = 3                              # changing the caller's list changes no declaration
    first = c.place_step(0, positions)
    positions[0] = 9                            # ... nor the placement of the later layers
    with pytest.raises(ForwardError) as caught:
        c.place_step(1, positions)
    assert caught.value.rule == "CELL-FORWARD"
    second = c.place_step(1, [3, 6])
    assert first.cells == second.cells == (4, 5) and c.next_pos(1) == 7
    live = c.live()
    assert isinstance(live, frozenset) and isinstance(first.cells, tuple) and isinstance(first.mask_bits, bytes)
    with pytest.raises(AttributeError):
        first.cells = (0, 1)                    # type: ignore[misc]  # frozen


def test_CELL_POS_INT_MAX_minus_1_is_the_largest_position_in_the_model_too() -> None:
    cfg = _model_config()
    state = cm.initial(cfg)
    seq, state = cm.seq_new(cfg, state)
    declared = cm.declare_step(cfg, state, [seq])
    assert not isinstance(declared, cm.CellRejected) and declared[0] is True
    state = declared[1]
    rejected = cm.place_step(cfg, state, 0, [INT_MAX])
    assert isinstance(rejected, cm.CellRejected) and rejected.rule in ("ARG-RANGE", "CELL-POS")
    placed = cm.place_step(cfg, state, 0, [INT_MAX - 1])
    assert not isinstance(placed, cm.CellRejected)
    assert cm.next_pos(cfg, placed[1], seq) == INT_MAX


def test_ARG_INT_the_sequence_cache_refuses_int_subclasses_too() -> None:
    c = SequenceCache(CacheConfig(8, 1, [FLAT]))
    for call, argument in ((lambda: c.can_extend(LyingInt(1)), "n"), (lambda: c.plan(0, LyingInt(0), 1), "position"),
                           (lambda: c.rewind(LyingInt(0)), "new_len"), (lambda: c.plan(LyingInt(0), 0, 1), "layer")):
        with pytest.raises(ArgumentTypeError) as caught:
            call()
        assert caught.value.rule == "ARG-INT" and caught.value.argument == argument, caught.value
    assert c.length() == 0


OPTIMIZED_PROBE = """
import kvcache
from kvcache import CellCache, CacheConfig, LayerConfig, LayerPolicy, INT_MAX
if __debug__:
    raise SystemExit("run me under python -O")
class LyingInt(int):
    def __eq__(self, other): return True
    def __hash__(self): return 0
class Shifty(list):
    seen = 0
    def __iter__(self):
        Shifty.seen += 1
        return iter([0] if Shifty.seen == 1 else [5])
c = CellCache(CacheConfig(8, 1, [LayerConfig(LayerPolicy.flat())]), 4)
a, b = c.seq_new(), c.seq_new()
c.declare_step([a, b]); c.place_step(0, [0, 5])
before = c._state()
for call in (lambda: c.declare_step([LyingInt(0), LyingInt(1)]), lambda: c.declare_step(Shifty([0])),
             lambda: c.seq_len(LyingInt(0)), lambda: c.seq_rm(a, LyingInt(0))):
    try:
        call()
    except kvcache.KVCacheError as error:
        print(error.rule)
print(c._state() == before)
c.declare_step([a])
before = c._state()
for call in (lambda: c.place_step(0, [INT_MAX]), lambda: c.place_step(0, [LyingInt(3)])):
    try:
        call()
    except kvcache.KVCacheError as error:
        print(error.rule)
print(c._state() == before)
c.place_step(0, [INT_MAX - 1])
print(c.next_pos(a) == INT_MAX)
"""


def test_the_new_checks_survive_python_O() -> None:
    result = subprocess.run([sys.executable, "-O", "-c", OPTIMIZED_PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CELL-SEQ-ID", "CELL-DECLARE", "CELL-SEQ-ID", "ARG-INT", "True",
                                     "CELL-POS", "CELL-POS", "True", "True"]


# --- the suite: a lenient answer must not hide a wrong one -------------------------------------------

LENIENT_THEN_STALE = "python:tests.cell_hostile_targets:LenientThenStale"


@pytest.mark.slow
def test_a_wrong_answer_behind_a_lenient_one_is_found() -> None:
    """Continuing past a lenient step finds the stale mask of tests/cell_hostile_targets.py; without it the
    run reports lenient only, and even CONFORMING when not strict - the weakness this closes."""
    found = run_suite(PythonTarget(LENIENT_THEN_STALE), "quick", seed=0)
    assert {(LENIENT, "CELL-FORWARD"), (WRONG, "CELL-DATA-SOUND")} <= set(found.findings) and found.continued > 0
    wrong = found.findings[(WRONG, "CELL-DATA-SOUND")]
    assert len(wrong.steps) <= 5 and {"op": "clear"} in wrong.steps, wrong.steps
    again = replay(LENIENT_THEN_STALE, wrong.config, wrong.steps)
    assert again is not None and (again["class"], again["rule"]) == (WRONG, "CELL-DATA-SOUND")
    assert replay("python:kvcache:CellCache", wrong.config, wrong.steps) is None
    hidden = run_suite(PythonTarget(LENIENT_THEN_STALE), "quick", seed=0, continue_past_lenient=False)
    assert set(hidden.findings) == {(LENIENT, "CELL-FORWARD")} and hidden.verdict() == "CONFORMING"


def test_the_reference_is_never_rerun_and_errors_stay_typed() -> None:
    """A conforming target has no lenient step to continue past (the count is evidence, not noise)."""
    result = run_suite(PythonTarget("python:kvcache:CellCache"), "quick", seed=0)
    assert result.conforming(strict=True) and result.continued == 0
    assert issubclass(ForwardError, KVCacheError) and issubclass(ArgumentValueError, KVCacheError)


# --- hostile cell targets (tests/cell_hostile_targets.py): the verdict each deserves ------------------

HOSTILE = "python:tests.cell_hostile_targets:{}"
SERVE = "kvcache_spec.conformance.serve"


def test_a_mistyped_cell_answer_is_a_crash_of_the_methods_rule_and_the_run_incomplete() -> None:
    result = run_suite(PythonTarget(HOSTILE.format("WrongTypes")), "quick", seed=0, restart_cap=2)
    assert set(result.findings) == {(CRASH, "CELL-OWNERS")}, sorted(result.findings)   # seq_len's rule
    assert result.verdict() == "NOT CONFORMING" and result.incomplete()


@pytest.mark.slow
@pytest.mark.parametrize("name, words", [("CrashesOnPlace", "exit code 3"), ("HangsInSeqNew", "hung"),
                                         ("IgnoresSigterm", "hung")])
def test_a_dying_or_hanging_cell_target_is_a_crash_never_conforming_and_leaves_no_process(name: str,
                                                                                          words: str) -> None:
    result, target = cmd_suite(module_cmd(SERVE, HOSTILE.format(name)), timeout=0.5, start_timeout=10.0,
                               restart_cap=2, crash_shrink_budget=1)
    assert result.classes() == {CRASH}, sorted(result.findings)
    messages = [r.finding.message for kept in result.causes.values() for r in kept]
    assert any(words in m for m in messages), messages
    assert result.verdict() == "NOT CONFORMING" and "restart cap (2)" in result.aborted and result.incomplete()
    assert target.process is None             # killed (SIGKILL after an ignored SIGTERM) and reaped


@pytest.mark.slow
def test_a_cell_target_that_prints_conforms_in_process_and_isolated() -> None:
    assert run_suite(PythonTarget(HOSTILE.format("PrintsToStdout")), "quick", seed=0).conforming(strict=True)
    served, _ = cmd_suite(module_cmd(SERVE, HOSTILE.format("PrintsToStdout")))
    assert served.conforming(strict=True)


def test_the_console_script_loads_a_python_target_from_the_current_directory() -> None:
    """`kvcache conformance --target python:pkg.mod:F` finds pkg in the current directory, as --isolate
    (and `python -m`) do: the same target, the same verdict, in process or not."""
    root = Path(__file__).resolve().parent.parent
    script = Path(sys.executable).parent / "kvcache"
    done = subprocess.run([str(script), "conformance", "--target", HOSTILE.format("WrongTypes")], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "crash       CELL-OWNERS" in done.stdout, done.stdout + done.stderr[-2000:]


# --- the numpy backends: wrong tensors are refused before the step is placed ---------------------------

def test_ARG_TYPE_the_numpy_backends_refuse_wrong_tensors_before_anything_changes() -> None:
    np = pytest.importorskip("numpy")
    from kvcache.backends.numpy_backend import BackendError, NumpyBackend, NumpyCellBackend
    config = CacheConfig(8, 1, [LayerConfig(LayerPolicy.flat(), 2, 4)])
    c = CellCache(config, 4)
    backend = NumpyCellBackend(c, config)
    s = c.seq_new()
    assert s is not None and c.declare_step([s, s])
    kv, q = np.zeros((2, 2, 4)), np.zeros((2, 4, 4))
    before = observe(c)
    for queries, keys, values in ((q, np.zeros((2, 2, 3)), kv), (q, kv, np.zeros((3, 2, 4))), (np.zeros((2, 3, 4)), kv, kv),
                                  ([[0.0]], kv, kv), (q, kv.astype(np.int64), kv), (q, np.zeros((2, 1, 4)), kv)):
        with pytest.raises(BackendError) as caught:
            backend.attend(0, [0, 1], queries, keys, values)
        assert caught.value.rule == "ARG-TYPE" and observe(c) == before      # not placed, no pool written
        assert (backend.pools[0].row_stamp == -1).all()
    assert backend.attend(0, [0, 1], q, kv, kv).shape == (2, 4, 4)
    sequence = SequenceCache(config)
    plans = NumpyBackend(sequence, config)
    with pytest.raises(BackendError) as caught:
        plans.attend(0, 0, q, kv, np.zeros((2, 2, 5)))
    assert caught.value.rule == "ARG-TYPE" and sequence.length() == 0 and (plans.pools[0].row_stamp == -1).all()


def test_an_in_process_target_that_ignores_sigterm_cannot_make_the_harness_deaf() -> None:
    """IgnoresSigterm sets SIGTERM to SIG_IGN in its constructor, inside the harness's process, then hangs;
    the harness restores its own handler after every call into the target, so SIGTERM still ends the run
    INCOMPLETE (before: the harness ignored SIGTERM until its safety net, minutes later)."""
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen([sys.executable, "-m", "kvcache_spec.cli", "conformance", "--target",
                                HOSTILE.format("IgnoresSigterm")], cwd=root, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:               # the target is now hanging, its SIG_IGN installed
            if "hanging in seq_new" in line:
                break
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 3 and "interrupted by SIGTERM" in out, out


@pytest.mark.parametrize("name", ["CellsOutOfRead", "ShortMask", "MaskOfTwos", "BoolLength", "SameCellTwice",
                                  "HugeReadLen"])
def test_a_forged_cell_step_is_wrong_CELL_STEP_SHAPE_with_a_two_step_program(name: str) -> None:
    result = run_suite(PythonTarget(HOSTILE.format(name)), "quick", seed=0)
    assert set(result.findings) == {(WRONG, "CELL-STEP-SHAPE")} and result.verdict() == "NOT CONFORMING"
    assert min(len(r.steps) for r in result.causes[(WRONG, "CELL-STEP-SHAPE")]) == 2   # seq_new, one forward
