"""Lockstep checking of a cache implementation against the spec model, and a Hypothesis state machine.

Two layers live here, both reusable:

* `Lockstep` runs a *target* (any object with SequenceCache's public methods, built by a factory from a
  `kvcache.CacheConfig`) side by side with the spec model (`model.py`). Every operation is an `Op`
  value (`Step`, `Rewind`, `Plan`, `CommitForged`, ...); `Lockstep.apply(op)` makes the same call on
  both, and returns the problems found, each a sentence that starts with the rule broken. The checks:
  the target's answers equal the model's (values, refusals, and for caller errors a `KVCacheError`
  with the model's rule); a rejected or refused call leaves the target exactly as it was (ATOMIC);
  every plan the target issues is executed on a pool of our own, sized by the target's depth, and
  every row it reads must be sound (DATA-SOUND) - this holds for any layout; separately, the plan
  must equal the model's canonical plan (LAYOUT-CANON). The model checker (`proofs/model_checker.py`)
  drives the same class breadth-first.

* `make_machine(factory)` wraps it in a Hypothesis `RuleBasedStateMachine`. A failure prints a
  program (`state = Name()`, `state.configure(config=ConfigSpec(...))`, `state.rewind(new_len=3)`, ...)
  that can be pasted into a test next to `Name = make_machine(factory, name="Name")`.

Settings profiles: "dev" (default), "ci" (derandomized, chosen when the CI variable is set) and
"deep"; `KVCACHE_PROFILE` overrides. `stateful_settings()` returns the chosen one.
"""

from __future__ import annotations

import copy
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar, Union

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvcache

from . import model
from .target_contract import forge_plan, forge_run, read_plan

Factory = Callable[[kvcache.CacheConfig], Any]


def reference_factory(config: kvcache.CacheConfig) -> kvcache.SequenceCache:
    """The default target: the contract-checked reference implementation."""
    return kvcache.SequenceCache(config)


# --- configurations ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigSpec:
    """A cache configuration in one line: `windows` has one entry per layer, 0 for a flat layer and
    w >= 1 for a ring layer of window w; `max_write` as in CacheConfig (ring layers only)."""

    capacity: int
    windows: tuple[int, ...]
    max_write: Optional[int] = None

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    def cache_config(self) -> kvcache.CacheConfig:
        layers = [kvcache.LayerConfig(kvcache.LayerPolicy.flat() if w == 0 else kvcache.LayerPolicy.ring(w))
                  for w in self.windows]
        return kvcache.CacheConfig(capacity=self.capacity, n_layers=len(self.windows), layers=layers,
                                   max_write=self.max_write)

    def model_config(self) -> model.Config:
        config = model.make_config(self.capacity, len(self.windows),
                                   [(model.FLAT if w == 0 else model.RING, w, 1, 1) for w in self.windows],
                                   max_write=self.max_write)
        assert isinstance(config, model.Config), f"{self} is not a valid configuration: {config}"
        return config


# --- operations: every call the checkers make, as a printable, replayable value -----------------------

COMMIT_WITH = ("first", "last", "every")   # whose plan a plan-all-then-commit step commits
PATTERNS = ("plan-all-then-commit", "per-layer")


@dataclass(frozen=True)
class Step:
    """A whole step (position, T) on every layer. "plan-all-then-commit": plan every layer, execute
    every layer, then commit the plan of the first / last layer, or of every layer in turn;
    "per-layer": plan, execute and commit each layer in turn (the MLX runtime's pattern)."""

    position: int
    T: int
    pattern: str = "plan-all-then-commit"
    commit_with: str = "first"


@dataclass(frozen=True)
class LayerStep:
    """One layer's share of a per-layer step: plan, execute, commit."""

    layer: int
    position: int
    T: int


@dataclass(frozen=True)
class AbortedStep:
    """Plan the step on the first `n_layers` layers, then drop the plans (never executed nor committed)."""

    position: int
    T: int
    n_layers: int


@dataclass(frozen=True)
class Rewind:
    new_len: Any


@dataclass(frozen=True)
class Clear:
    pass


@dataclass(frozen=True)
class Observe:
    """Compare length, retained_from and depth of every layer, and can_extend(n) for n in `ns`."""

    ns: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """plan(layer, position, T) with any arguments, answer compared and never executed (a probe)."""

    layer: Any
    position: Any
    T: Any


@dataclass(frozen=True)
class CanExtend:
    n: Any


@dataclass(frozen=True)
class Depth:
    layer: Any


@dataclass(frozen=True)
class RetainedFrom:
    layer: Any


#: Plans a caller may forge. Wrong types the model rejects itself (ARG-TYPE); malformed SeqStepPlans
#: (built around the constructor's checks) break PLAN-SHAPE before the model could compare them.
FORGED_KINDS = ("none", "tuple", "model-plan", "empty-write", "three-read-runs", "zero-len-run",
                "negative-base", "bool-base", "float-start", "list-runs")


@dataclass(frozen=True)
class CommitForged:
    kind: str


@dataclass(frozen=True)
class CommitOther:
    """commit() the canonical plan of `layer` for the step (position, T), its read_base_pos shifted
    by `base_shift` (its runs kept) - a plan for a step that is not current, or a doctored one."""

    position: int
    T: int
    layer: int
    base_shift: int = 0


@dataclass(frozen=True)
class CommitStale:
    """commit() the `index`-th plan the target issued so far (modulo their number), e.g. one from
    before a rewind or a clear; skipped when the model would accept it (then it is not stale)."""

    index: int


Op = Union[Step, LayerStep, AbortedStep, Rewind, Clear, Observe, Plan, CanExtend, Depth, RetainedFrom,
           CommitForged, CommitOther, CommitStale]


# --- conversions between the model's plans and the API's ---------------------------------------------

def to_model_plan(plan: Any) -> model.Plan:
    """The model's view of a target's plan (the Python target contract, `target_contract.read_plan`)."""
    value = read_plan(plan)
    if isinstance(value, str):
        raise ValueError(f"not a plan by the Python target contract: {value}")
    return value


def to_api_plan(plan: model.Plan) -> kvcache.SeqStepPlan:
    return kvcache.SeqStepPlan(write=tuple(kvcache.Run(s, n) for s, n in plan.write),
                               read=tuple(kvcache.Run(s, n) for s, n in plan.read),
                               read_base_pos=plan.read_base_pos)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def plan_well_formed(plan: Any) -> bool:
    """PLAN-SHAPE as kvcache's API states it (ARG-TYPE, PLAN-SHAPE): exactly a SeqStepPlan of tuples of one
    or two exact Runs, int fields in range. (A target other than kvcache's own is held to the Python
    target contract instead: `target_contract.read_plan`.)"""
    def runs_ok(runs: Any) -> bool:
        return type(runs) is tuple and 1 <= len(runs) <= 2 and all(type(r) is kvcache.Run for r in runs)

    return (type(plan) is kvcache.SeqStepPlan and runs_ok(plan.write) and runs_ok(plan.read)
            and not isinstance(read_plan(plan), str))


_forge_unchecked = forge_plan
_forge_run = forge_run


Outcome = tuple[bool, Any]  # (True, value returned) or (False, exception raised)


def _call(method: Callable[..., Any], *args: Any) -> Outcome:
    try:
        return True, method(*args)
    except Exception as error:  # noqa: BLE001 - any exception is an answer to compare
        return False, error


def _describe(outcome: Outcome) -> str:
    ok, value = outcome
    if ok:
        return f"returned {value!r}"
    rule_id = getattr(value, "rule", None)
    return f"raised {type(value).__name__}" + (f" [{rule_id}]" if rule_id else "") + f": {value}"


def rejection_problems(what: str, rules: tuple[str, ...], argument: str, outcome: Outcome) -> list[str]:
    """A call the model rejects under `rules` (the first is the model's own; any of them is accepted):
    the target must raise a KVCacheError naming one of them. Shared by both layouts' lockstep."""
    rule = rules[0]
    if outcome[0]:
        return [f"{rule}: {what} {_describe(outcome)}; the model rejects it ({', '.join(rules)}, argument {argument})"]
    value = outcome[1]
    if not isinstance(value, kvcache.KVCacheError):
        return [f"{rule}: {what} {_describe(outcome)}; expected a KVCacheError [{' or '.join(rules)}]"]
    if value.rule not in rules:
        return [f"{rule}: {what} {_describe(outcome)}; the model's rule is {' or '.join(rules)}"]
    return []


def fingerprint_of(target: Any) -> Optional[str]:
    """A target's whole attribute state, when it has one (a plain object's vars)."""
    try:
        return repr(vars(target))
    except TypeError:
        return None


_Harness = TypeVar("_Harness")


def twin_of(lock: _Harness, *lists: str) -> _Harness:
    """A copy of a lockstep harness (either layout's) with a deep copy of its target and its own copies
    of the list attributes named (for the model checker, which branches from every state)."""
    return twins_of(lock, *lists)()


def twins_of(lock: _Harness, *lists: str) -> Callable[[], _Harness]:
    """A maker of copies of `lock` as it is now (`twin_of`'s, for the model checker, which branches
    many times from one state). The target is serialised once with pickle and each twin gets its own
    unpickled copy: the same object graph a deep copy builds (pickle and deepcopy both go through
    `__reduce_ex__` and keep shared references shared), at a fraction of the cost. A target that does
    not pickle, or whose unpickled copy's fingerprint differs from its own, is deep-copied for each twin
    instead. A twin's known-clean fingerprint (see `call_target`) is the target's only when its copy
    was checked to have the same one."""
    target = getattr(lock, "target")
    fingerprint = fingerprint_of(target)
    image: Optional[bytes] = None
    try:
        image = pickle.dumps(target, pickle.HIGHEST_PROTOCOL)
        if fingerprint is None or fingerprint_of(pickle.loads(image)) != fingerprint:
            image = None
    except Exception:  # noqa: BLE001 - any target that does not round-trip is deep-copied instead
        image = None

    def twin() -> _Harness:
        copied = copy.copy(lock)
        if image is not None:
            setattr(copied, "target", pickle.loads(image))
            setattr(copied, "clean", fingerprint)
        else:
            setattr(copied, "target", copy.deepcopy(target))
            setattr(copied, "clean", None)
        for name in lists:
            setattr(copied, name, list(getattr(lock, name)))
        return copied

    return twin


def call_target(lock: Any, method: Callable[..., Any], *args: Any) -> Outcome:
    """`_call` on a harness's target. Any call may change the target, so it forgets the harness's
    known-clean fingerprint (`lock.clean`: the fingerprint the target is known to have now, set when
    a call was just checked to have changed nothing; the next check's "before" reuses it instead of
    computing it again, which halves the fingerprints of a run of checks)."""
    lock.clean = None
    return _call(method, *args)


def atomic_snapshot(lock: Any) -> Optional[str]:
    """The fingerprint before a call that must change nothing: the known-clean one when there is one."""
    known: Optional[str] = lock.clean
    lock.clean = None
    return known if known is not None else fingerprint_of(lock.target)


def snapshot_unchanged(lock: Any, before: tuple[Any, ...]) -> tuple[bool, tuple[Any, ...]]:
    """(unchanged?, the snapshot now) for a harness's `_snapshot()` taken before a call that must change
    nothing: a fingerprint alone (1-tuple) through `still_clean`, a thorough one compared whole."""
    if len(before) == 1:
        same, fingerprint = still_clean(lock, before[0])
        return same, (fingerprint,)
    after: tuple[Any, ...] = lock._snapshot()
    return after == before, after


def still_clean(lock: Any, before: Optional[str]) -> tuple[bool, Optional[str]]:
    """After such a call: (unchanged?, the fingerprint now), always computed afresh; when unchanged,
    it becomes the known-clean fingerprint."""
    after = fingerprint_of(lock.target)
    if after == before and after is not None:
        lock.clean = after
        return True, after
    return after == before, after


# --- the lockstep harness ----------------------------------------------------------------------------

@dataclass
class Lockstep:
    """A target and the model, driven together. `apply(op)` returns the problems found (empty: agreed).

    Which contract: kvcache's own `SequenceCache` (and subclasses) is held to the reference's API - caller
    errors are `KVCacheError`s naming the model's rule, plans exactly kvcache's types; any other target
    to the Python target contract of `target_contract` (duck-typed plans, any exception for a caller
    error), the contract `kvcache conformance` holds it to as well.

    ATOMIC: a call that must change nothing is checked by the target's attribute fingerprint
    (`repr(vars(target))`, exact for plain objects) before and after. The observables (length,
    retained_from, depth, can_extend) are compared with the model's after every operation by the
    drivers (`observe()`), and the model's state did not change, so they are checked unchanged too.
    `thorough` also compares the observables before and after each such call (the default when the
    target has no fingerprint).
    """

    spec: ConfigSpec
    factory: Factory = reference_factory
    thorough: bool = False
    config: model.Config = field(init=False)
    target: Any = field(init=False)
    state: model.State = field(init=False)
    target_pools: list[tuple[Optional[model.Row], ...]] = field(init=False)
    pending: Optional[tuple[int, int, int]] = field(init=False, default=None)  # per-layer step: (pos, T, next layer)
    issued: list[Any] = field(init=False, default_factory=list)  # plans the target issued, for stale commits
    setup_problems: list[str] = field(init=False, default_factory=list)
    reference_api: bool = field(init=False, default=False)  # see the class docstring: which contract
    clean: Optional[str] = field(init=False, default=None, repr=False, compare=False)  # see call_target

    def __post_init__(self) -> None:
        self.config = self.spec.model_config()
        self.target = self.factory(self.spec.cache_config())
        self.reference_api = isinstance(self.target, kvcache.SequenceCache)
        self.state = model.initial(self.config)
        self.target_pools = []
        for layer in range(self.spec.n_layers):
            ok, rows = call_target(self, self.target.depth, layer)
            if not ok or not _is_int(rows) or not 0 <= rows <= 4 * self.spec.capacity + 64:
                self.setup_problems.append(f"DEPTH: target depth({layer}) {_describe((ok, rows))}")
                rows = model.depth_of(self.config, self.config.layers[layer])
            self.target_pools.append((None,) * rows)

    # --- copying and identity (used by the model checker) -----------------------------------------

    def clone(self) -> Lockstep:
        return twin_of(self, "target_pools", "issued", "setup_problems")

    def twins(self) -> Callable[[], Lockstep]:
        return twins_of(self, "target_pools", "issued", "setup_problems")

    def fingerprint(self) -> Optional[str]:
        return fingerprint_of(self.target)

    def key(self) -> tuple[Any, ...]:
        """The abstract state, for deduplication. Content tags matter only through equality with the
        current truth (tags are never reused, so a row that is not current never becomes current), so
        each row is canonicalised to its position when it holds the current content and to None
        otherwise. Two states with equal keys behave the same under every operation."""
        truth = self.state.truth

        def canon(pool: tuple[Optional[model.Row], ...]) -> tuple[Optional[int], ...]:
            return tuple(row[0] if row is not None and row[0] < len(truth) and truth[row[0]] == row[1] else None
                         for row in pool)

        return (self.state.length, self.state.open_step, tuple(canon(p) for p in self.state.pools),
                tuple(canon(p) for p in self.target_pools), self.pending,
                self.clean if self.clean is not None else self.fingerprint())

    # --- observing ------------------------------------------------------------------------------

    def _snapshot(self) -> tuple[Any, ...]:
        if not self.thorough:
            fingerprint = atomic_snapshot(self)
            if fingerprint is not None:
                return (fingerprint,)
        n = self.spec.n_layers
        return (self.fingerprint(), call_target(self, self.target.length),
                tuple(call_target(self, self.target.retained_from, i) for i in range(n)),
                tuple(call_target(self, self.target.depth, i) for i in range(n)),
                tuple(call_target(self, self.target.can_extend, k) for k in self._probe_ns()))

    def _probe_ns(self) -> tuple[int, ...]:
        room = self.spec.capacity - self.state.length
        return tuple(sorted({0, 1, max(0, room), room + 1}))

    def _unchanged(self, before: tuple[Any, ...], what: str) -> list[str]:
        same, after = snapshot_unchanged(self, before)
        return [] if same else [f"ATOMIC: {what} changed the target's state: {before!r} -> {after!r}"]

    def observe(self, ns: tuple[int, ...] = ()) -> list[str]:
        problems: list[str] = []
        expected_length = self.state.length
        ok, length = call_target(self, self.target.length)
        if not ok or length != expected_length:
            problems.append(f"LEN-BOUNDS: length() {_describe((ok, length))}, the model says {expected_length}")
        for layer in range(self.spec.n_layers):
            expected = model.retained_from(self.config, self.state, layer)
            outcome = call_target(self, self.target.retained_from, layer)
            if outcome != (True, expected):
                problems.append(f"RETAINED: retained_from({layer}) {_describe(outcome)}, the model says {expected}")
            expected = model.depth(self.config, layer)
            outcome = call_target(self, self.target.depth, layer)
            if outcome != (True, expected):
                problems.append(f"DEPTH: depth({layer}) {_describe(outcome)}, the model says {expected}")
        for n in ns or self._probe_ns():
            problems += self._can_extend(n, check_atomic=False)
        return problems

    # --- single calls, compared ----------------------------------------------------------------

    def _rejected(self, what: str, expected: model.Rejected, outcome: Outcome) -> list[str]:
        if outcome[0] or self.reference_api:
            return rejection_problems(what, (expected.rule,), expected.argument, outcome)
        return []  # the Python target contract: any exception is a caller error's answer

    def _can_extend(self, n: Any, check_atomic: bool = True) -> list[str]:
        expected = model.can_extend(self.config, self.state, n)
        before = self._snapshot() if check_atomic else ()
        outcome = call_target(self, self.target.can_extend, n)
        what = f"can_extend({n!r})"
        if isinstance(expected, model.Rejected):
            problems = self._rejected(what, expected, outcome)
        else:
            problems = [] if outcome == (True, expected) else [
                f"ADMIT: {what} {_describe(outcome)}, the model says {expected}"]
        return problems + (self._unchanged(before, what) if check_atomic else [])

    def _layer_query(self, name: str, layer: Any) -> list[str]:
        expected: Union[int, model.Rejected] = (model.depth(self.config, layer) if name == "depth"
                                                 else model.retained_from(self.config, self.state, layer))
        before = self._snapshot()
        outcome = call_target(self, getattr(self.target, name), layer)
        what = f"{name}({layer!r})"
        if isinstance(expected, model.Rejected):
            problems = self._rejected(what, expected, outcome)
        else:
            rule_id = "DEPTH" if name == "depth" else "RETAINED"
            problems = [] if outcome == (True, expected) else [
                f"{rule_id}: {what} {_describe(outcome)}, the model says {expected}"]
        return problems + self._unchanged(before, what)

    def _plan(self, layer: Any, position: Any, T: Any) -> tuple[list[str], Any]:
        """plan() on both; returns the problems and the target's plan when both issue one."""
        expected = model.plan(self.config, self.state, layer, position, T)
        before = self._snapshot()
        outcome = call_target(self, self.target.plan, layer, position, T)
        what = f"plan({layer!r}, {position!r}, {T!r})"
        problems = self._unchanged(before, what)  # PLAN-PURE as well as ATOMIC
        ok, value = outcome
        if isinstance(expected, model.Rejected):
            return problems + self._rejected(what, expected, outcome), None
        if expected is None:
            if outcome != (True, None):
                problems.append(f"ADMIT: {what} {_describe(outcome)}; the model refuses it (None)")
            return problems, None
        if not ok or value is None:
            return problems + [f"ADMIT: {what} {_describe(outcome)}; the model issues {expected}"], None
        read = read_plan(value)
        if isinstance(read, str):
            return problems + [f"PLAN-SHAPE: {what} {_describe(outcome)} breaks the plan contract: {read}"], None
        if self.reference_api and not plan_well_formed(value):
            return problems + [f"PLAN-SHAPE: {what} {_describe(outcome)} is not a well-formed SeqStepPlan"], None
        self.issued.append(value)
        if read != expected:
            problems.append(f"LAYOUT-CANON: {what} {_describe(outcome)}; the canonical plan is {expected}")
        return problems, value

    def _execute(self, layer: int, position: int, T: int, target_plan: Any) -> list[str]:
        """The backend's work for one layer: on the model's pool (canonical plan) and on ours (the
        target's plan), each checked for DATA-SOUND."""
        truth = model.step_truth(self.state, position, T)
        self.state, model_problems = model.run_layer(self.config, self.state, layer, position, T)
        pool, problems = model.execute(self.target_pools[layer], truth, position, T, to_model_plan(target_plan))
        self.target_pools[layer] = pool
        where = f"layer {layer}, step ({position}, {T})"
        return ([f"MODEL {p} ({where}: the model's own plan)" for p in model_problems]
                + [f"{p} ({where}: executing the target's plan)" for p in problems])

    def _commit_issued(self, layer: int, position: int, T: int, target_plan: Any) -> list[str]:
        """Commit a plan both sides issued; the model commits its canonical plan for the same layer."""
        expected = model.commit(self.config, self.state, model.canonical_plan(self.config.layers[layer], position, T))
        assert isinstance(expected, model.State), "the model accepts its own plan for a current step"
        outcome = call_target(self, self.target.commit, target_plan)
        self.state = expected
        if not outcome[0]:
            return [f"COMMIT-ISSUED: commit(plan of layer {layer} for step ({position}, {T})) {_describe(outcome)}"]
        ok, length = call_target(self, self.target.length)
        if (ok, length) != (True, expected.length):
            return [f"COMMIT-ADVANCE: after commit(plan of layer {layer} for step ({position}, {T})) length() "
                    f"{_describe((ok, length))}, the model says {expected.length}"]
        return []

    def _commit_rejected(self, what: str, plan: Any) -> list[str]:
        """commit() a plan the model rejects: a typed error with the model's rule, nothing changed."""
        expected = self.expected_commit(plan)
        if isinstance(expected, model.State):
            return []  # the model accepts it: not a bad call (the generators avoid this)
        before = self._snapshot()
        outcome = call_target(self, self.target.commit, plan)
        return self._rejected(what, expected, outcome) + self._unchanged(before, what)

    def expected_commit(self, plan: Any) -> Union[model.State, model.Rejected]:
        """The model's answer to commit(plan). kvcache's API: exactly its plan type stands for the model's
        (anything else is ARG-TYPE); a malformed SeqStepPlan is rejected by PLAN-SHAPE before any
        comparison. The Python target contract: a plan is judged by its duck-typed fields."""
        if not self.reference_api:
            read = read_plan(plan)
            return (model.Rejected("PLAN-SHAPE", "plan") if isinstance(read, str)
                    else model.commit(self.config, self.state, read))
        if type(plan) is not kvcache.SeqStepPlan:
            return model.commit(self.config, self.state, ("not a plan", plan))  # ARG-TYPE, model.Plan included
        if not plan_well_formed(plan):
            return model.Rejected("PLAN-SHAPE", "plan")
        return model.commit(self.config, self.state, to_model_plan(plan))

    # --- operations ----------------------------------------------------------------------------

    def apply(self, op: Op) -> list[str]:
        problems = list(self.setup_problems)
        self.setup_problems = []
        if isinstance(op, Step):
            problems += self._step(op)
        elif isinstance(op, LayerStep):
            problems += self._layer_step(op.layer, op.position, op.T)
        elif isinstance(op, AbortedStep):
            for layer in range(min(op.n_layers, self.spec.n_layers)):
                problems += self._plan(layer, op.position, op.T)[0]
        elif isinstance(op, Rewind):
            problems += self._rewind(op.new_len)
        elif isinstance(op, Clear):
            self.state = model.clear(self.config, self.state)
            self.pending = None
            outcome = call_target(self, self.target.clear)
            if not outcome[0]:
                problems.append(f"CLEAR: clear() {_describe(outcome)}")
        elif isinstance(op, Observe):
            problems += self.observe(op.ns)
        elif isinstance(op, Plan):
            problems += self._plan(op.layer, op.position, op.T)[0]
        elif isinstance(op, CanExtend):
            problems += self._can_extend(op.n)
        elif isinstance(op, Depth):
            problems += self._layer_query("depth", op.layer)
        elif isinstance(op, RetainedFrom):
            problems += self._layer_query("retained_from", op.layer)
        elif isinstance(op, CommitForged):
            problems += self._commit_rejected(f"commit(<forged: {op.kind}>)", self.forge(op.kind))
        elif isinstance(op, CommitOther):
            layer_spec = self.config.layers[op.layer % self.spec.n_layers]
            limit = self.step_limit()
            T = op.T if limit is None else min(op.T, limit)  # a longer ring step has no 2-run plan to forge
            base = model.canonical_plan(layer_spec, op.position, T)
            plan = to_api_plan(model.Plan(base.write, base.read, max(0, base.read_base_pos + op.base_shift)))
            problems += self._commit_rejected(f"commit({plan!r})", plan)
        elif isinstance(op, CommitStale):
            if self.issued:
                plan = self.issued[op.index % len(self.issued)]
                problems += self._commit_rejected(f"commit(stale {plan!r})", plan)
        else:
            raise TypeError(f"not an operation: {op!r}")
        return problems

    def _step(self, op: Step) -> list[str]:
        n = self.spec.n_layers
        if op.pattern == "per-layer":
            problems: list[str] = []
            for layer in range(n):
                problems += self._layer_step(layer, op.position, op.T)
                if self.pending is None and layer < n - 1:
                    break  # refused or rejected on the first layer (the rest would repeat it), or failed
            return problems
        assert op.pattern == "plan-all-then-commit", op.pattern
        plans = []
        problems = []
        for layer in range(n):
            found, plan = self._plan(layer, op.position, op.T)
            problems += found
            if plan is None:  # refused or rejected (as the model says, or a problem): no step
                return problems
            plans.append(plan)
        for layer, plan in enumerate(plans):
            problems += self._execute(layer, op.position, op.T, plan)
        committers = {"first": [0], "last": [n - 1], "every": list(range(n))}[op.commit_with]
        for layer in committers:
            problems += self._commit_issued(layer, op.position, op.T, plans[layer])
        return problems

    def _layer_step(self, layer: int, position: int, T: int) -> list[str]:
        # A plan off the canonical layout is still executed: the data-level check judges it on its own.
        problems, plan = self._plan(layer, position, T)
        if plan is None:
            return problems
        problems += self._execute(layer, position, T, plan)
        problems += self._commit_issued(layer, position, T, plan)
        self.pending = None if layer == self.spec.n_layers - 1 else (position, T, layer + 1)
        return problems

    def _rewind(self, new_len: Any) -> list[str]:
        expected = model.rewind(self.config, self.state, new_len)
        before = self._snapshot()
        outcome = call_target(self, self.target.rewind, new_len)
        what = f"rewind({new_len!r})"
        if isinstance(expected, model.Rejected):
            return self._rejected(what, expected, outcome) + self._unchanged(before, what)
        accepted, state = expected
        if outcome != (True, accepted):
            rule_id = "REWIND-GROW" if _is_int(new_len) and new_len > self.state.length else "REWIND-SOUND"
            return [f"{rule_id}: {what} {_describe(outcome)}, the model says {accepted} "
                    f"(length {self.state.length}, model floor {model.rewind_floor(self.config, self.state)})"]
        if not accepted:
            return self._unchanged(before, what)
        self.state = state
        self.pending = None
        return []

    def forge(self, kind: str) -> Any:
        """A forged commit() argument of the given kind (see FORGED_KINDS)."""
        run = kvcache.Run(0, 1)
        if kind == "none":
            return None
        if kind == "tuple":
            return ((0, 1), (0, 1), 0)
        if kind == "model-plan":
            return model.Plan(write=((0, 1),), read=((0, 1),), read_base_pos=0)
        if kind == "empty-write":
            return _forge_unchecked((), (run,), 0)
        if kind == "three-read-runs":
            return _forge_unchecked((run,), (run, run, run), 0)
        if kind == "zero-len-run":
            return _forge_unchecked((_forge_run(0, 0),), (run,), 0)
        if kind == "negative-base":
            return _forge_unchecked((run,), (run,), -1)
        if kind == "bool-base":
            return _forge_unchecked((run,), (run,), False)
        if kind == "float-start":
            return _forge_unchecked((_forge_run(0.0, 1),), (run,), 0)
        if kind == "list-runs":
            return _forge_unchecked([run], [run], 0)
        raise ValueError(f"unknown forged kind {kind!r}")

    # --- what the drivers may do next -----------------------------------------------------------

    def step_limit(self) -> Optional[int]:
        return model.step_limit(self.config)

    def admissible_Ts(self) -> range:
        """Every T a new step at the length may take (STEP-T-MAX and ADMIT)."""
        limit = self.step_limit()
        room = self.spec.capacity - self.state.length
        return range(1, (room if limit is None else min(room, limit)) + 1)

    def trial_next_step(self) -> list[str]:
        """On a copy: the next valid step (T = 1, per layer) still works, or is refused as the model says."""
        twin = self.clone()
        if twin.pending is not None:
            position, T, first = twin.pending
            problems: list[str] = []
            for layer in range(first, self.spec.n_layers):
                problems += twin._layer_step(layer, position, T)
            return problems
        return twin._step(Step(twin.state.length, 1, "plan-all-then-commit", "last"))


# --- Hypothesis strategies ---------------------------------------------------------------------------

def config_specs(max_capacity: int = 12) -> st.SearchStrategy[ConfigSpec]:
    """Flat, ring and mixed layers, with and without max_write; small capacities mostly, with windows
    larger than max_write and larger than the capacity."""
    capacity = st.one_of(st.integers(1, max_capacity), st.integers(1, max_capacity),
                         st.integers(1, max_capacity), st.integers(max_capacity + 1, 3 * max_capacity))
    window = st.one_of(st.just(0), st.integers(1, 5), st.integers(1, 5), st.integers(6, 16))
    max_write = st.one_of(st.none(), st.integers(1, 6))
    return st.builds(ConfigSpec, capacity=capacity,
                     windows=st.lists(window, min_size=1, max_size=3).map(tuple), max_write=max_write)


#: Values no integer argument may take: bools, floats, strings, None, negatives, past INT_MAX.
BAD_INTS: tuple[Any, ...] = (True, False, 1.0, "0", None, -1, -(2**31), 2**31, 2**63)


def ints_and_bad(low: int, high: int) -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(low, high), st.sampled_from(BAD_INTS))


# --- the state machine -------------------------------------------------------------------------------

_Lock = TypeVar("_Lock", bound="Any")


class LockstepMachine(RuleBasedStateMachine, Generic[_Lock]):
    """What both layouts' machines share: the harness `h` (set by `start` in the @initialize rule) and
    `check`, which fails the run with the problems found, the rule broken first."""

    def __init__(self) -> None:
        super().__init__()
        self.h: Optional[_Lock] = None

    @property
    def lock(self) -> _Lock:
        assert self.h is not None, "configure() runs first"
        return self.h

    def check(self, problems: list[str]) -> None:
        if problems:  # raised, not asserted: the machines also run under `python -O` (contracts off)
            raise AssertionError("\n".join(problems))

    def start(self, harness: _Lock) -> None:
        self.h = harness
        self.check(harness.setup_problems)
        harness.setup_problems = []

    @invariant()
    def agrees_with_model(self) -> None:
        """After every rule: every observable of the target equals the model's."""
        if self.h is not None:
            self.check(self.h.observe())


def make_machine(factory: Factory = reference_factory, *, name: str = "KVCacheMachine",
                 configs: Optional[st.SearchStrategy[ConfigSpec]] = None) -> type[RuleBasedStateMachine]:
    """A state machine running `factory`'s caches in lockstep with the model. Paste a failure's
    program next to `Name = make_machine(factory, name="Name")` (and `from kvcache_spec.stateful
    import ConfigSpec`)."""
    config_strategy = config_specs() if configs is None else configs

    class Machine(LockstepMachine[Lockstep]):
        def check_bad_call(self, problems: list[str]) -> None:
            """A call the model rejects must leave the cache usable: the next valid step still works."""
            self.check(problems)
            self.check(self.lock.trial_next_step())

        def idle(self) -> bool:
            """PROTO-COMMIT: no per-layer step half done (rewinds, clears and new steps wait for it)."""
            return self.h is not None and self.h.pending is None

        @initialize(config=config_strategy)
        def configure(self, config: ConfigSpec) -> None:
            self.start(Lockstep(config, factory))

        # --- steps
        @precondition(lambda self: self.idle())
        @rule(T=st.integers(1, 4), commit_with=st.sampled_from(COMMIT_WITH))
        def step_plan_all_then_commit(self, T: int, commit_with: str) -> None:
            self.check(self.lock.apply(Step(self.lock.state.length, T, "plan-all-then-commit", commit_with)))

        @precondition(lambda self: self.idle())
        @rule(T=st.integers(1, 4))
        def step_per_layer(self, T: int) -> None:
            self.check(self.lock.apply(Step(self.lock.state.length, T, "per-layer")))

        @precondition(lambda self: self.idle() and self.lock.spec.n_layers > 1)
        @rule(T=st.integers(1, 4))
        def begin_per_layer_step(self, T: int) -> None:
            """Only the first layer: the step stays half done while other calls come in."""
            self.check(self.lock.apply(LayerStep(0, self.lock.state.length, T)))

        @precondition(lambda self: self.h is not None and self.h.pending is not None)
        @rule()
        def continue_per_layer_step(self) -> None:
            assert self.lock.pending is not None
            position, T, layer = self.lock.pending
            self.check(self.lock.apply(LayerStep(layer, position, T)))

        @precondition(lambda self: self.idle())
        @rule(pattern=st.sampled_from(PATTERNS))
        def step_decode(self, pattern: str) -> None:
            """One token, the commonest step (also keeps the machine's steps frequent among its rules)."""
            self.check(self.lock.apply(Step(self.lock.state.length, 1, pattern, "last")))

        @precondition(lambda self: self.idle() and self.lock.state.open_step is not None)
        @rule(pattern=st.sampled_from(PATTERNS))
        def step_open_step_again(self, pattern: str) -> None:
            """The open step planned, executed and committed again: allowed, and changes nothing."""
            open_step = self.lock.state.open_step
            assert open_step is not None
            self.check(self.lock.apply(Step(open_step[0], open_step[1], pattern, "every")))

        @rule(T=st.integers(1, 8), n_layers=st.integers(1, 3))
        def aborted_step(self, T: int, n_layers: int) -> None:
            """Plans never executed nor committed: nothing changes."""
            self.check(self.lock.apply(AbortedStep(self.lock.state.length, T, n_layers)))

        # --- rewinds and clear
        @precondition(lambda self: self.idle())
        @rule(new_len=st.integers(0, 14))
        def rewind(self, new_len: int) -> None:
            self.check(self.lock.apply(Rewind(new_len)))

        @precondition(lambda self: self.idle())
        @rule(by=st.integers(0, 5))
        def rewind_back(self, by: int) -> None:
            self.check(self.lock.apply(Rewind(max(0, self.lock.state.length - by))))

        @precondition(lambda self: self.idle())
        @rule(below=st.booleans())
        def rewind_to_floor(self, below: bool) -> None:
            """To the model's floor (must succeed), or one below it (must be refused, when the floor > 0)."""
            floor = model.rewind_floor(self.lock.config, self.lock.state)
            self.check(self.lock.apply(Rewind(max(0, floor - 1) if below else floor)))

        @precondition(lambda self: self.idle() and self.lock.state.length > 0)
        @rule()
        def clear(self) -> None:
            self.check(self.lock.apply(Clear()))

        # --- admission probes and bad calls (each must leave the state as it was)
        @rule(n=ints_and_bad(0, 14))
        def can_extend(self, n: Any) -> None:
            self.check_bad_call(self.lock.apply(CanExtend(n)))

        @rule(layer=ints_and_bad(-1, 3), offset=st.integers(-2, 2), T=ints_and_bad(0, 8))
        def plan_near_length(self, layer: Any, offset: int, T: Any) -> None:
            """plan at length + offset: gaps, overlaps, other T in the open step, T too large, admission."""
            self.check_bad_call(self.lock.apply(Plan(layer, max(0, self.lock.state.length + offset), T)))

        @rule(layer=ints_and_bad(0, 2), position=ints_and_bad(0, 40), T=ints_and_bad(1, 40))
        def plan_anywhere(self, layer: Any, position: Any, T: Any) -> None:
            self.check_bad_call(self.lock.apply(Plan(layer, position, T)))

        @rule(new_len=st.sampled_from(BAD_INTS))
        def rewind_bad_argument(self, new_len: Any) -> None:
            self.check_bad_call(self.lock.apply(Rewind(new_len)))

        @rule(method=st.sampled_from(("depth", "retained_from")), layer=ints_and_bad(-1, 3))
        def layer_query(self, method: str, layer: Any) -> None:
            self.check_bad_call(self.lock.apply(Depth(layer) if method == "depth" else RetainedFrom(layer)))

        @rule(kind=st.sampled_from(FORGED_KINDS))
        def commit_forged(self, kind: str) -> None:
            self.check_bad_call(self.lock.apply(CommitForged(kind)))

        @rule(offset=st.integers(-3, 3), T=st.integers(1, 4), layer=st.integers(0, 2), base_shift=st.integers(-1, 1))
        def commit_other_step(self, offset: int, T: int, layer: int, base_shift: int) -> None:
            """The canonical plan of another step (before, after or overlapping the length), or doctored."""
            position = max(0, self.lock.state.length + offset)
            self.check_bad_call(self.lock.apply(CommitOther(position, T, layer, base_shift)))

        @rule(index=st.integers(0, 50))
        def commit_stale(self, index: int) -> None:
            self.check_bad_call(self.lock.apply(CommitStale(index)))

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


# --- settings profiles -------------------------------------------------------------------------------

# No explain phase: on a failure it re-runs the machine hundreds of times to list the lines only failing
# runs reach (measured: 10 of 11 s of a failing run); the failure's message already names the rule.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
settings.register_profile("dev", deadline=None, max_examples=100, stateful_step_count=40, phases=_PHASES,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True, phases=_PHASES,
                          max_examples=300, stateful_step_count=50, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", deadline=None, print_blob=True, max_examples=2000, stateful_step_count=80,
                          phases=_PHASES, suppress_health_check=[HealthCheck.too_slow])


def profile_name() -> str:
    """KVCACHE_PROFILE if set, else "ci" under CI (the CI variable is set), else "dev"."""
    return os.environ.get("KVCACHE_PROFILE") or ("ci" if os.environ.get("CI") else "dev")


def stateful_settings(profile: Optional[str] = None) -> settings:
    return settings.get_profile(profile or profile_name())


@contextmanager
def fixed_constant_pool() -> Iterator[None]:
    """Derandomized examples that depend on the code under test only, not on what else was imported.

    Hypothesis (6.131 and later) mixes into generation the literals it finds in every imported module
    it deems local: not in site-packages, not a test file. So the same seed drew different examples
    depending on which of this project's modules happened to be loaded, and on how the package was
    installed (editable: local; from a wheel: in site-packages). Measured with the pre-merge sequence
    machine: 102 machines with `kvcache_spec.stateful` alone, 115 once `kvcache_spec.conformance` was
    imported too. Inside this block the pool of local literals is empty; the strategies state their
    edge values themselves. This reaches into `hypothesis.internal` (no public switch exists): should
    Hypothesis rename what it patches, every use fails at once with an AttributeError, and
    tests/test_stateful.py checks that the hazard and the pin still behave as described.
    """
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # a Hypothesis older than the local pool (before 6.131): nothing to pin
        yield
        return
    empty = Constants()
    original = providers._get_local_constants
    # The cache of allowed constants per choice type holds local literals already drawn from; clear it
    # on the way in and on the way out, so neither side sees the other's pool.
    providers.CONSTANTS_CACHE.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()
