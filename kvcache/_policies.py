"""Layout policies: pure arithmetic from logical positions to physical rows.

A policy is immutable and holds no history: the cache keeps the history (which rows are still
intact) and asks the policy what a step writes and reads. Layers with equal policies share one
policy object.
"""

from __future__ import annotations

import abc
from typing import Any, Optional

import icontract

from ._errors import ArgumentValueError, ConfigError, not_an_int, out_of_range
from ._ints import INT_MAX, is_int
from ._types import Kind, Run, SeqStepPlan


def _runs_total(runs: tuple[Run, ...]) -> int:
    return sum(run.len for run in runs)


def _plan_covers(plan: SeqStepPlan, position: int, T: int) -> bool:
    """PLAN-WRITE and PLAN-READ in run arithmetic: T rows written, reads end at position + T."""
    return _runs_total(plan.write) == T and plan.end == position + T


@icontract.require(lambda n_slots: n_slots >= 1, "LAYOUT-CANON: a ring has at least one slot")
@icontract.require(lambda first, n_slots: 0 <= first < n_slots, "LAYOUT-CANON: the first slot is a slot of the ring")
@icontract.require(lambda count, n_slots: 1 <= count <= n_slots, "PLAN-SHAPE: non-empty, at most one lap of the ring")
@icontract.require(lambda first, count: first <= INT_MAX and count <= INT_MAX, "PLAN-SHAPE: a Run's fields fit an int")
@icontract.ensure(lambda result, count: _runs_total(result) == count, "PLAN-WRITE, PLAN-READ: the runs hold exactly count rows")
@icontract.ensure(lambda result, n_slots: all(0 <= r.start and r.end <= n_slots for r in result),
                  "PLAN-SHAPE: every row lies in [0, n_slots)")
@icontract.ensure(lambda result, first: result[0].start == first, "LAYOUT-CANON: the first run starts at the first slot")
@icontract.ensure(lambda result, n_slots: len(result) == 1 or (len(result) == 2 and result[0].end == n_slots
                                                            and result[1].start == 0),
                  "PLAN-SHAPE: logical order: a second run continues at row 0 once the first reaches the end of the ring")
def wrap_runs(first: int, count: int, n_slots: int) -> tuple[Run, ...]:
    """`count` consecutive slots of a ring of `n_slots`, from `first`: one run, or two when it wraps."""
    head = min(count, n_slots - first)
    if head == count:
        return (Run(first, count),)
    return (Run(first, head), Run(0, count - head))


# The typed preconditions shared by both policies: FlatPolicy and RingPolicy are public, so a caller
# error raises a KVCacheError naming the argument and the rule, under `python -O` too (enabled=True),
# as the cache's preconditions do. Named functions, not lambdas (see `_cache.py`: icontract and
# CrossHair read a lambda back from its decorator line, which a shared decorator does not have).
# A step's arguments are checked by ONE condition (types, then ranges), and the range check is
# position >= 0, T >= 1 and position + T <= INT_MAX (which bounds both): every extra precondition is
# one more branch on every path CrossHair explores through plan. Measured on RingPolicy.plan's six
# conditions, three gate runs each on a loaded 2-core machine: the type and range checks as separate
# preconditions took 3.9 s CPU per condition and one run of three ended 'unknown' at the per-path
# limit; as one condition, 3.3 s and all confirmed - what the plan took before it had type checks.
def _step_arguments_valid(position: Any, T: Any) -> bool:
    return is_int(position) and is_int(T) and position >= 0 and T >= 1 and position + T <= INT_MAX


def _step_arguments_error(position: Any, T: Any) -> Exception:
    if not is_int(position):
        return not_an_int("position", position)
    if not is_int(T):
        return not_an_int("T", T)
    if position < 0:
        return out_of_range("position", position, 0)
    if T < 1:
        return out_of_range("T", T, 1, rule="STEP-T")
    return ArgumentValueError("ARG-RANGE", "T", "position + T must not exceed INT_MAX", position=position, T=T)


def _position_valid(position: Any) -> bool:
    return is_int(position) and 0 <= position <= INT_MAX


def _position_error(position: Any) -> Exception:
    return not_an_int("position", position) if not is_int(position) else out_of_range("position", position, 0)


def _capacity_valid(capacity: Any) -> bool:
    return is_int(capacity) and 1 <= capacity <= INT_MAX


def _capacity_error(capacity: Any) -> Exception:
    return not_an_int("capacity", capacity) if not is_int(capacity) else \
        out_of_range("capacity", capacity, 1, rule="CFG-CAPACITY")


def _marks_valid(retained: Any, end: Any) -> bool:
    return is_int(retained) and is_int(end) and 0 <= retained <= end <= INT_MAX


def _marks_error(retained: Any, end: Any) -> Exception:
    if not is_int(retained):
        return not_an_int("retained", retained)
    if not is_int(end):
        return not_an_int("end", end)
    return ArgumentValueError("ARG-RANGE", "retained", f"must satisfy 0 <= retained <= end <= {INT_MAX}",
                              retained=retained, end=end)


_step_arguments = icontract.require(
    _step_arguments_valid, "ARG-INT, ARG-RANGE, STEP-T: position, T ints; position >= 0, T >= 1, position + T <= INT_MAX",
    error=_step_arguments_error, enabled=True)
_position = icontract.require(_position_valid, "ARG-INT, ARG-RANGE: position an int in [0, INT_MAX]",
                              error=_position_error, enabled=True)
_capacity = icontract.require(_capacity_valid, "ARG-INT, CFG-CAPACITY: capacity an int in [1, INT_MAX]",
                              error=_capacity_error, enabled=True)
_marks = icontract.require(_marks_valid, "ARG-INT, ARG-RANGE, RETAINED: ints, 0 <= retained <= end <= INT_MAX",
                           error=_marks_error, enabled=True)


class LayoutPolicy(abc.ABC):
    """Maps a step's logical positions to physical rows of one layer's pool."""

    kind: Kind

    @abc.abstractmethod
    def plan(self, position: int, T: int) -> SeqStepPlan:
        """The rows a step of T new tokens at `position` writes and reads (pure layout arithmetic)."""

    @abc.abstractmethod
    def depth(self, capacity: int) -> int:
        """Rows the backend allocates for this layer's pool when the sequence holds `capacity` tokens."""

    @abc.abstractmethod
    def max_step(self) -> Optional[int]:
        """The most tokens one step may write on this layer; None when unbounded."""

    @abc.abstractmethod
    def read_base(self, position: int) -> int:
        """The oldest logical position a step at `position` reads (its attention span's start)."""

    @abc.abstractmethod
    def retained_after_write(self, retained: int, end: int) -> int:
        """The oldest intact position after rows up to `end` are written, given `retained` before."""


class FlatPolicy(LayoutPolicy):
    """Full history: row = logical position."""

    kind = Kind.FLAT

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlatPolicy)

    def __hash__(self) -> int:
        return hash(Kind.FLAT)

    def __repr__(self) -> str:
        return "FlatPolicy()"

    @_step_arguments
    @icontract.ensure(lambda result, position, T: _plan_covers(result, position, T), "PLAN-WRITE, PLAN-READ")
    @icontract.ensure(lambda result: result.read_base_pos == 0, "PLAN-READ: flat reads from position 0")
    @icontract.ensure(lambda result, position: result.write[0].start == position, "LAYOUT-CANON: row = position")
    def plan(self, position: int, T: int) -> SeqStepPlan:
        return SeqStepPlan(write=(Run(position, T),), read=(Run(0, position + T),), read_base_pos=0)

    @_capacity
    @icontract.ensure(lambda result, capacity: result == capacity, "DEPTH: a flat pool holds every position")
    def depth(self, capacity: int) -> int:
        return capacity

    def max_step(self) -> Optional[int]:
        return None

    @_position
    @icontract.ensure(lambda result: result == 0, "PLAN-READ: a flat step reads from position 0")
    def read_base(self, position: int) -> int:
        return 0

    @_marks
    @icontract.ensure(lambda result: result == 0, "RETAINED: a flat pool never overwrites a row")
    def retained_after_write(self, retained: int, end: int) -> int:
        return 0


def _ring_window_error(window: object) -> ConfigError:
    return ConfigError("CFG-POLICY", "RingPolicy.window", f"must be an int in [1, {INT_MAX}]", value=window)


def _ring_max_write_error(max_write: object) -> ConfigError:
    return ConfigError("CFG-MAX-WRITE", "RingPolicy.max_write", f"must be None or an int in [1, {INT_MAX}]",
                       value=max_write)


@icontract.invariant(lambda self: self.window >= 1 and self.max_write >= 1, "CFG-POLICY, CFG-MAX-WRITE")
@icontract.invariant(lambda self: self.n_slots == self.window + self.max_write - 1, "LAYOUT-CANON")
class RingPolicy(LayoutPolicy):
    """Sliding window of `window` keys per token, in a ring of `window + max_write - 1` slots.

    Why that many slots: a step of T <= max_write tokens at position p writes slots of positions
    [p, p + T) and so overwrites positions [p - S, p + T - S); its reads need [p - window + 1, p + T).
    The overwrites miss the reads exactly when S >= window + T - 1, i.e. S = window + max_write - 1.
    """

    kind = Kind.RING

    @icontract.require(lambda window: is_int(window) and 1 <= window <= INT_MAX, "CFG-POLICY",
                       error=lambda window: _ring_window_error(window), enabled=True)
    @icontract.require(lambda max_write: max_write is None or (is_int(max_write) and 1 <= max_write <= INT_MAX),
                       "CFG-MAX-WRITE", error=lambda max_write: _ring_max_write_error(max_write), enabled=True)
    def __init__(self, window: int, max_write: Optional[int] = None) -> None:
        self.window = window
        self.max_write = window if max_write is None else max_write
        self.n_slots = self.window + self.max_write - 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RingPolicy) and (other.window, other.max_write) == (self.window, self.max_write)

    def __hash__(self) -> int:
        return hash((Kind.RING, self.window, self.max_write))

    def __repr__(self) -> str:
        return f"RingPolicy(window={self.window}, max_write={self.max_write})"

    def __delattr__(self, name: str) -> None:
        """A policy is a value: deleting its fields would break its invariants, so it is refused.

        :raises AttributeError: always
        """
        raise AttributeError(f"RingPolicy.{name} cannot be deleted")

    @icontract.require(lambda self, T: T <= self.max_write, "STEP-T-MAX: T <= max_write",
                       error=lambda self, T: ArgumentValueError(
                           "STEP-T-MAX", "T", "exceeds the tokens one step may write on this ring", T=T,
                           max_write=self.max_write),
                       enabled=True)
    @_step_arguments
    @icontract.ensure(lambda result, position, T: _plan_covers(result, position, T), "PLAN-WRITE, PLAN-READ")
    @icontract.ensure(lambda self, result, position: result.read_base_pos == max(0, position - self.window + 1),
                      "PLAN-READ: a ring step reads its new tokens' windows")
    @icontract.ensure(lambda self, result, position: result.write[0].start == position % self.n_slots,
                      "LAYOUT-CANON: slot = position mod (window + max_write - 1)")
    @icontract.ensure(lambda self, result: all(r.end <= self.n_slots for r in result.write + result.read),
                      "PLAN-SHAPE: every row lies inside the ring")
    def plan(self, position: int, T: int) -> SeqStepPlan:
        base = self.read_base(position)
        return SeqStepPlan(
            write=wrap_runs(position % self.n_slots, T, self.n_slots),
            read=wrap_runs(base % self.n_slots, position + T - base, self.n_slots),
            read_base_pos=base,
        )

    @_capacity
    @icontract.ensure(lambda self, result, capacity: result == min(capacity, self.n_slots),
                      "DEPTH: the ring, or less when the sequence never wraps it")
    def depth(self, capacity: int) -> int:
        return min(capacity, self.n_slots)

    def max_step(self) -> Optional[int]:
        return self.max_write

    @_position
    @icontract.ensure(lambda self, result, position: 0 <= result <= position and position - result < self.window,
                      "PLAN-READ: the window start, at most window - 1 before the position")
    def read_base(self, position: int) -> int:
        return max(0, position - self.window + 1)

    @_marks
    @icontract.ensure(lambda result, retained, end: retained <= result <= end,
                      "RETAINED: the mark moves forward, never past the end")
    @icontract.ensure(lambda self, result, end: end - result <= self.n_slots, "RETAINED: a ring holds n_slots rows")
    def retained_after_write(self, retained: int, end: int) -> int:
        return max(retained, end - self.n_slots)


def policy_for(kind: Kind, window: int, max_write: Optional[int]) -> LayoutPolicy:
    """The policy object of a layer: flat, or a ring whose max_write defaults to its window."""
    if kind is Kind.FLAT:
        return FlatPolicy()
    return RingPolicy(window, max_write)

