"""`SequenceCache`: one logical length for the whole model, per-layer plans, admission and rollback.

Preconditions validate the caller's input and stay enabled under `python -O`; postconditions and
class invariants check this implementation and follow `__debug__` (they vanish under `-O`).
Every precondition raises a typed `KVCacheError` naming the argument and the rule, before the body
runs, so a rejected call leaves the cache exactly as it was.
"""

from __future__ import annotations

from typing import Any, Optional

import icontract

from ._errors import ArgumentTypeError, ArgumentValueError, ConfigTypeError, LayerIndexError, PlanError, \
    StepError, not_an_int, out_of_range
from ._faces import CacheBase, SequenceControl, SequencePlanner, returns_self
from ._ints import INT_MAX, is_int
from ._layers import layer_in_range, layer_is_int
from ._policies import LayoutPolicy, policy_for
from ._types import CacheConfig, Kind, SeqStepPlan, copy_config, plan_value

# State as a value, for snapshots: (length, open step, retained per policy).
_State = tuple[int, Optional[tuple[int, int]], tuple[int, ...]]


_not_int = not_an_int
_out_of_range = out_of_range


@icontract.require(lambda retained, new_len: 0 <= retained and 0 <= new_len, "ARG-RANGE: marks are positions")
@icontract.ensure(lambda result, new_len: 0 <= result <= new_len, "RETAINED: 0 <= retained_from <= length after a rewind")
@icontract.ensure(lambda result, retained: result <= retained, "RETAINED: a rewind never makes a lost row intact again")
def retained_after_rewind(retained: int, new_len: int) -> int:
    """A policy's retained mark after a rewind to new_len: rows at and after new_len leave the branch."""
    return min(retained, new_len)


@icontract.invariant(lambda self: len(self.config.layers) in (1, self.n_layers)
                     and len(self._layer_policy) == self.n_layers,
                     "CFG-LAYERS: layers has 1 entry or n_layers; every layer has a policy")
@icontract.invariant(lambda self: 0 <= self._length <= self._capacity, "LEN-BOUNDS: 0 <= length <= capacity")
# CFG-DEDUP compares pairwise rather than len(set(...)): hashing a policy would make CrossHair realise
# its symbolic window and ring size.
@icontract.invariant(lambda self: all(a != b for i, a in enumerate(self._policies) for b in self._policies[i + 1:]),
                     "CFG-DEDUP: layers with equal policies share one policy object")
@icontract.invariant(lambda self: self._open_step is None or sum(self._open_step) == self._length,
                     "STEP-APPEND: the open step ends at the length")
@icontract.invariant(lambda self: all(0 <= r <= self._length for r in self._retained),
                     "RETAINED: 0 <= retained_from <= length")
class SequenceCache(CacheBase, SequenceControl, SequencePlanner):
    """The single-sequence cache controller.

    Not thread-safe by design: it serves one sequence driven by one runner and its backend. Share it
    across threads only behind your own lock (the registry that holds it is thread-safe).
    """

    @icontract.require(lambda config: isinstance(config, CacheConfig), "CFG-TYPE: config is a CacheConfig",
                       error=lambda config: ConfigTypeError("CFG-TYPE", "config", "must be a CacheConfig",
                                                            value=config),
                       enabled=True)
    def __init__(self, config: CacheConfig) -> None:
        config = copy_config(config)  # CFG-*: the whole tree re-validated; later changes to the caller's objects cannot reach it
        self.config = config
        self.n_layers = config.n_layers
        self._capacity = config.capacity
        # CFG-DEDUP: layers with equal policies share one policy object (and one retained mark).
        self._policies: list[LayoutPolicy] = []
        layer_policy: list[int] = []
        for index in range(config.n_layers):
            lp = config.layer(index).policy
            policy = policy_for(lp.kind, lp.window, config.max_write if lp.kind is Kind.RING else None)
            if policy not in self._policies:
                self._policies.append(policy)
            layer_policy.append(self._policies.index(policy))
        self._layer_policy = tuple(layer_policy)
        limits = [m for m in (p.max_step() for p in self._policies) if m is not None]
        self._step_limit: Optional[int] = min(limits) if limits else None
        self._length = 0
        self._open_step: Optional[tuple[int, int]] = None
        self._retained = [0] * len(self._policies)

    def __delattr__(self, name: str) -> None:
        """Deleting an attribute would break the invariants behind the API's back, so it is refused.

        :raises AttributeError: always
        """
        raise AttributeError(f"SequenceCache.{name} cannot be deleted")

    # --- helpers (private; contracts call them too) -------------------------------------------

    def _state(self) -> _State:
        return (self._length, self._open_step, tuple(self._retained))

    @layer_in_range
    @layer_is_int
    def policy(self, layer: int) -> LayoutPolicy:
        """The (shared) policy object of `layer`."""
        return self._policy_of(layer)

    def _policy_of(self, layer: int) -> LayoutPolicy:
        # The unchecked lookup, for methods that have validated `layer` already: a call to the public
        # policy() would re-check its preconditions and the class invariants on every call.
        return self._policies[self._layer_policy[layer]]

    def _step_allowed(self, position: int, T: int) -> bool:
        """STEP-APPEND: a new step starts at the length; the open step may be planned again as it was."""
        return position == self._length or self._open_step == (position, T)

    def _step_error(self, position: int, T: int) -> StepError:
        if self._open_step is not None and position == self._open_step[0]:
            what = "differs from the T of the step already committed at this position"
        elif position > self._length:
            what = "leaves a gap: a step starts at the length"
        else:
            what = "overlaps committed tokens: a step starts at the length"
        return StepError("STEP-APPEND", "position", what, position=position, T=T, length=self._length,
                         open_step=self._open_step)

    def _issued(self, plan: SeqStepPlan) -> bool:
        """COMMIT-ISSUED: `plan` is what this cache plans, for some layer, for the current step.

        Compared by value (`plan_value`), never through the argument's own `==` or properties.
        """
        value = plan_value(plan)
        if value is None:
            return False
        write, read, base = value
        T = sum(length for _, length in write)
        position = base + sum(length for _, length in read) - T
        if position < 0 or not self._step_allowed(position, T) or position + T > self._capacity:
            return False
        if self._step_limit is not None and T > self._step_limit:
            return False
        return any(plan_value(policy.plan(position, T)) == value for policy in self._policies)

    def _rewind_safe(self, new_len: int) -> bool:
        """REWIND-SOUND: every layer still holds the rows a next step at `new_len` reads.

        A step at new_len reads [read_base(new_len), new_len + T); the rows at and after new_len
        are rewritten first, so the rows before it must be intact: [read_base, new_len) inside
        [retained, new_len). Writes of at most max_write rows cannot break them (see RingPolicy).
        """
        return all(policy.read_base(new_len) >= min(retained, new_len)
                   for policy, retained in zip(self._policies, self._retained))

    # --- the runner's face -----------------------------------------------------------------------

    @icontract.require(lambda n: 0 <= n <= INT_MAX, "ARG-RANGE: 0 <= n",
                       error=lambda n: _out_of_range("n", n, 0), enabled=True)
    @icontract.require(lambda n: is_int(n), "ARG-INT: n is an int", error=lambda n: _not_int("n", n), enabled=True)
    @icontract.ensure(lambda self, n, result: result == (self._length + n <= self._capacity),
                      "ADMIT: can_extend(n) iff length + n <= capacity")
    def can_extend(self, n: int = 1) -> bool:
        return self._length + n <= self._capacity

    def capacity(self) -> int:
        return self._capacity

    def length(self) -> int:
        return self._length

    @icontract.require(lambda new_len: 0 <= new_len <= INT_MAX, "ARG-RANGE: 0 <= new_len",
                       error=lambda new_len: _out_of_range("new_len", new_len, 0), enabled=True)
    @icontract.require(lambda new_len: is_int(new_len), "ARG-INT: new_len is an int",
                       error=lambda new_len: _not_int("new_len", new_len), enabled=True)
    @icontract.snapshot(lambda self: self._state(), name="state")
    @icontract.ensure(lambda self, OLD, result: result or self._state() == OLD.state,
                      "ATOMIC: a refused rewind changes nothing")
    @icontract.ensure(lambda OLD, new_len, result: not result or new_len <= OLD.state[0],
                      "REWIND-GROW: a rewind never grows the sequence")
    @icontract.ensure(lambda self, new_len, result: not result or (self._length == new_len and self._open_step is None),
                      "REWIND-SOUND: an accepted rewind sets the length and closes the step")
    def rewind(self, new_len: int) -> bool:
        if new_len > self._length or not self._rewind_safe(new_len):
            return False
        self._length = new_len
        self._open_step = None
        self._retained = [retained_after_rewind(retained, new_len) for retained in self._retained]
        return True

    @icontract.ensure(lambda self: self._state() == (0, None, (0,) * len(self._policies)),
                      "CLEAR: no length, no step, no history")
    def clear(self) -> None:
        self._length = 0
        self._open_step = None
        self._retained = [0] * len(self._policies)

    # --- the backend's face ----------------------------------------------------------------------

    @icontract.require(lambda self, position, T: self._step_allowed(position, T),
                       "STEP-APPEND: position == length, or (position, T) is the open step",
                       error=lambda self, position, T: self._step_error(position, T), enabled=True)
    @icontract.require(lambda self, T: self._step_limit is None or T <= self._step_limit,
                       "STEP-T-MAX: T <= max_write of every ring layer",
                       error=lambda self, T: ArgumentValueError(
                           "STEP-T-MAX", "T", "exceeds the tokens one step may write on a ring layer",
                           T=T, max_write=self._step_limit),
                       enabled=True)
    @icontract.require(lambda T: 1 <= T <= INT_MAX, "STEP-T: T >= 1",
                       error=lambda T: ArgumentValueError("STEP-T", "T", f"must lie in [1, {INT_MAX}]", T=T),
                       enabled=True)
    @icontract.require(lambda T: is_int(T), "ARG-INT: T is an int", error=lambda T: _not_int("T", T), enabled=True)
    @icontract.require(lambda position: 0 <= position <= INT_MAX, "ARG-RANGE: 0 <= position",
                       error=lambda position: _out_of_range("position", position, 0), enabled=True)
    @icontract.require(lambda position: is_int(position), "ARG-INT: position is an int",
                       error=lambda position: _not_int("position", position), enabled=True)
    @layer_in_range
    @layer_is_int
    @icontract.snapshot(lambda self: self._state(), name="state")
    @icontract.ensure(lambda self, OLD: self._state() == OLD.state, "PLAN-PURE: plan changes nothing")
    @icontract.ensure(lambda self, position, T, result: (result is None) == (position + T > self._capacity),
                      "ADMIT: plan refuses exactly when position + T > capacity")
    @icontract.ensure(lambda position, T, result: result is None
                      or (result.n_written == T and result.end == position + T),
                      "PLAN-WRITE, PLAN-READ: writes T rows; reads end at position + T")
    @icontract.ensure(lambda self, layer, result: result is None
                      or all(run.end <= self.depth(layer) for run in result.write + result.read),
                      "PLAN-SHAPE: every row lies in [0, depth(layer))")
    def plan(self, layer: int, position: int, T: int) -> Optional[SeqStepPlan]:
        if position + T > self._capacity:
            return None
        return self._policy_of(layer).plan(position, T)

    @icontract.require(lambda self, plan: self._issued(plan),
                       "COMMIT-ISSUED: plan is what this cache plans for the current step",
                       error=lambda self, plan: PlanError(
                           "COMMIT-ISSUED", "plan", "is not a plan this cache issues for the current step",
                           plan=plan, length=self._length, open_step=self._open_step),
                       enabled=True)
    @icontract.require(lambda plan: plan_value(plan) is not None,
                       "PLAN-SHAPE: plan is well formed: tuples of one or two exact Runs, int fields in range",
                       error=lambda plan: PlanError("PLAN-SHAPE", "plan", "is malformed", plan=plan), enabled=True)
    @icontract.require(lambda plan: type(plan) is SeqStepPlan, "ARG-TYPE: plan is exactly a SeqStepPlan, no subclass",
                       error=lambda plan: ArgumentTypeError(
                           "ARG-TYPE", "plan", "must be exactly a SeqStepPlan (a subclass could answer its own ==)",
                           value=plan, type=type(plan).__name__),
                       enabled=True)
    @icontract.snapshot(lambda self: self._length, name="length")
    @icontract.ensure(lambda self, OLD, plan: self._length == max(OLD.length, plan.end),
                      "COMMIT-ADVANCE: the length becomes the step's end")
    @icontract.ensure(lambda self, plan: self._open_step == (plan.position, plan.n_written),
                      "STEP-APPEND: the committed step is the open step")
    def commit(self, plan: SeqStepPlan) -> None:
        value = plan_value(plan)  # the preconditions judged these very values
        assert value is not None
        write, read, base = value
        T = sum(length for _, length in write)
        end = base + sum(length for _, length in read)
        if end > self._length:  # a new step; committing the open step again changes nothing
            self._length = end
            self._open_step = (end - T, T)
            self._retained = [policy.retained_after_write(retained, end)
                              for policy, retained in zip(self._policies, self._retained)]

    @layer_in_range
    @layer_is_int
    @icontract.ensure(lambda self, result: 1 <= result <= self._capacity, "DEPTH: 1 <= depth <= capacity")
    def depth(self, layer: int) -> int:
        return self._policy_of(layer).depth(self._capacity)

    @layer_in_range
    @layer_is_int
    @icontract.ensure(lambda self, result: 0 <= result <= self._length, "RETAINED: 0 <= retained_from <= length")
    def retained_from(self, layer: int) -> int:
        return self._retained[self._layer_policy[layer]]

    # --- faces -----------------------------------------------------------------------------------

    @returns_self("the runner's")
    def as_control(self) -> SequenceControl:
        return self

    @returns_self("the backend's")
    def as_planner(self) -> SequencePlanner:
        return self
