"""Layout policies: pure arithmetic from logical positions to physical rows.

A policy is immutable and holds no history: the cache keeps the history (which rows are still
intact) and asks the policy what a step writes and reads. Layers with equal policies share one
policy object.
"""

from __future__ import annotations

import abc
from typing import Optional

import icontract

from ._errors import ConfigError
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

    @icontract.require(lambda position: position >= 0, "ARG-RANGE: position >= 0")
    @icontract.require(lambda T: T >= 1, "STEP-T: T >= 1")
    @icontract.require(lambda position, T: position + T <= INT_MAX, "ARG-RANGE: the step ends within INT_MAX")
    @icontract.ensure(lambda result, position, T: _plan_covers(result, position, T), "PLAN-WRITE, PLAN-READ")
    @icontract.ensure(lambda result: result.read_base_pos == 0, "PLAN-READ: flat reads from position 0")
    @icontract.ensure(lambda result, position: result.write[0].start == position, "LAYOUT-CANON: row = position")
    def plan(self, position: int, T: int) -> SeqStepPlan:
        return SeqStepPlan(write=(Run(position, T),), read=(Run(0, position + T),), read_base_pos=0)

    @icontract.require(lambda capacity: capacity >= 1, "CFG-CAPACITY: capacity >= 1")
    @icontract.ensure(lambda result, capacity: result == capacity, "DEPTH: a flat pool holds every position")
    def depth(self, capacity: int) -> int:
        return capacity

    def max_step(self) -> Optional[int]:
        return None

    @icontract.require(lambda position: position >= 0, "ARG-RANGE: position >= 0")
    @icontract.ensure(lambda result: result == 0, "PLAN-READ: a flat step reads from position 0")
    def read_base(self, position: int) -> int:
        return 0

    @icontract.require(lambda retained, end: 0 <= retained <= end, "RETAINED: 0 <= retained <= end")
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

    @icontract.require(lambda position: position >= 0, "ARG-RANGE: position >= 0")
    @icontract.require(lambda self, T: 1 <= T <= self.max_write, "STEP-T, STEP-T-MAX")
    @icontract.require(lambda position, T: position + T <= INT_MAX, "ARG-RANGE: the step ends within INT_MAX")
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

    @icontract.require(lambda capacity: capacity >= 1, "CFG-CAPACITY: capacity >= 1")
    @icontract.ensure(lambda self, result, capacity: result == min(capacity, self.n_slots),
                      "DEPTH: the ring, or less when the sequence never wraps it")
    def depth(self, capacity: int) -> int:
        return min(capacity, self.n_slots)

    def max_step(self) -> Optional[int]:
        return self.max_write

    @icontract.require(lambda position: position >= 0, "ARG-RANGE: position >= 0")
    @icontract.ensure(lambda self, result, position: 0 <= result <= position and position - result < self.window,
                      "PLAN-READ: the window start, at most window - 1 before the position")
    def read_base(self, position: int) -> int:
        return max(0, position - self.window + 1)

    @icontract.require(lambda retained, end: 0 <= retained <= end, "RETAINED: 0 <= retained <= end")
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

