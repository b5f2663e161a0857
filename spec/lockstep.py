"""The lockstep harness: a target and the spec model driven together, every answer checked.

`Lockstep` runs a *target* (any object with SequenceCache's public methods, built by a factory from a
`kvcache.CacheConfig`) side by side with the spec model (`model.py`). Every operation is an `Op` value
(stateful_ops.py: `Step`, `Rewind`, `Plan`, `CommitForged`, ...); `Lockstep.apply(op)` makes the same
call on both, and returns the problems found, each a sentence that starts with the rule broken. The
checks: the target's answers equal the model's (values, refusals, and for caller errors a
`KVCacheError` with the model's rule); a rejected or refused call leaves the target exactly as it was
(ATOMIC); every plan the target issues is executed on a pool of our own, sized by the target's depth,
and every row it reads must be sound (DATA-SOUND) - this holds for any layout; separately, the plan
must equal the model's canonical plan (LAYOUT-CANON). The state machine (stateful.py) and the model
checker (`proofs/model_checker.py`) drive the same class.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar, Union

import kvcache

from . import model
from .stateful_ops import (AbortedStep, CanExtend, Clear, CommitForged, CommitOther, CommitStale, ConfigSpec, Depth,
                           Factory, LayerStep, Observe, Op, Plan, RetainedFrom, Rewind, Step, _forge_run,
                           _forge_unchecked, _is_int, plan_well_formed, reference_factory, to_api_plan, to_model_plan)
from .target_contract import read_plan

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
