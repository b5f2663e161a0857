"""The model checker's search, the same for every layout: breadth-first over a lockstep harness's
states (deduplicated by its key, shortest counterexample first), the target's contracts checked once
per state, the report. A layout is a `Layout` (its harness, transitions and checks); the sequence
layout's (SEQUENCE) is here too - the search's default - and the cell layout's in cell_model_checker.py.
`model_checker` runs all configurations (in processes or on Ray) and is the command."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import time
import types
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence


from kvcache_proofs._processes import from_wall_clock
from kvcache_spec.conformance.targets import import_target_module
from kvcache_spec.stateful import (COMMIT_WITH, FORGED_KINDS, AbortedStep, CanExtend, Clear, CommitForged, CommitOther, ConfigSpec, Depth, Factory, LayerStep, Lockstep, Observe, Op, Plan, RetainedFrom, Rewind, Step, reference_factory)


# --- the operations explored and the checks made at each state ------------------------------------

def transitions(lock: Lockstep) -> Iterator[Op]:
    """Every operation a consumer may perform now (PROTO-COMMIT: a half-done step is finished first)."""
    n, state = lock.spec.n_layers, lock.state
    if lock.pending is not None:
        position, T, layer = lock.pending
        yield LayerStep(layer, position, T)
        return
    steps = [(state.length, T) for T in lock.admissible_Ts()]
    if state.open_step is not None:
        steps.insert(0, state.open_step)
    for position, T in steps:
        for commit_with in COMMIT_WITH if n > 1 else COMMIT_WITH[:1]:
            yield Step(position, T, "plan-all-then-commit", commit_with)
        if n > 1:
            yield LayerStep(0, position, T)  # the per-layer pattern, one layer at a time
    for new_len in range(state.length + 2):  # every target, and one past the length (refused)
        yield Rewind(new_len)
    yield Clear()


def checks(lock: Lockstep) -> Iterator[Op]:
    """Calls that must change nothing: observations, plan probes and a representative set of bad calls."""
    n, state, capacity = lock.spec.n_layers, lock.state, lock.spec.capacity
    length, limit = state.length, lock.step_limit()
    yield Observe(tuple(range(capacity + 2)))
    probes = {(length, T) for T in range(1, (limit or capacity - length + 1) + 2)}  # admission, STEP-T-MAX
    probes |= {(length + 1, 1), (max(0, length - 1), 1), (length, capacity - length + 1)}  # gap, overlap, ADMIT
    if state.open_step is not None:
        position, T = state.open_step
        probes |= {(position, T), (position, T + 1), (position, max(1, T - 1))}  # the open step, other Ts
    for position, T in sorted(probes):
        for layer in range(n):
            yield Plan(layer, position, T)
    yield AbortedStep(length, 1, n)
    bad_plans: list[tuple[Any, Any, Any]] = [
        (True, length, 1), (n, length, 1), (-1, length, 1), (2**31, length, 1),            # layer
        (0, -1, 1), (0, 2**31, 1), (0, True, 1), (0, float(length), 1),                    # position
        (0, length, 0), (0, length, -1), (0, length, True), (0, length, 2**31)]            # T
    for layer, position, T in bad_plans:
        yield Plan(layer, position, T)
    bad_values: tuple[Any, ...] = (-1, True, 2**31, 1.0)
    for bad in bad_values:
        yield CanExtend(bad)
        yield Rewind(bad)
    bad_layers: tuple[Any, ...] = (-1, n, True, None)
    for bad in bad_layers:
        yield Depth(bad)
        yield RetainedFrom(bad)
    for kind in FORGED_KINDS:
        yield CommitForged(kind)
    # Plans of steps that are not current (stale or future), and current ones doctored.
    others = {(p, T) for p in {0, length - 1, length + 1, length - 2} if p >= 0
              for T in range(1, min(limit or 2, 2) + 1)}
    for position, T in sorted(others):
        for layer in range(n):
            yield CommitOther(position, T, layer)
    for T in lock.admissible_Ts():
        for layer in range(n):
            yield CommitOther(length, T, layer, base_shift=+1)
            if length >= 1:
                yield CommitOther(length, T, layer, base_shift=-1)


# --- the search (layout-independent) ----------------------------------------------------------------

def _no_settling(lock: Any) -> None:
    pass


def _forget_issued(lock: Any) -> None:
    """The plans issued while checking a state are not the branch's (CommitStale is a Hypothesis op)."""
    lock.issued.clear()


def _unbounded(spec: Any) -> Optional[int]:
    return None


def _harness_key(lock: Any) -> Any:
    return lock.key()


# --- the target's contracts, once per state ----------------------------------------------------------
# icontract checks a class's invariants before and after every public call (measured on the cell checker
# at face2b5: the ten CellCache invariants ran ~15 times per call, a third of the CPU). An invariant is a
# function of the object's attributes, so the search checks them once per new state instead: every call
# runs with them suspended (its preconditions and postconditions still run: they are per call), and each
# state first reached gets `invariant_problems`. A call that must change nothing is checked unchanged
# (CELL-ATOMIC / ATOMIC, by the target's whole attribute fingerprint), so its state's verdict stands.
# Suspending uses icontract's own recursion guard (the set of instances whose invariants are being
# checked); where it is not there (another icontract), every call checks them as before.
try:
    from icontract._checkers import _IN_PROGRESS as _INVARIANTS_IN_PROGRESS  # the recursion guard
except ImportError:  # pragma: no cover - another icontract: invariants stay per call
    _INVARIANTS_IN_PROGRESS = None  # type: ignore[assignment]


@contextlib.contextmanager
def invariants_suspended(target: Any) -> Iterator[bool]:
    """Calls on `target` inside skip its class invariants (checked once per state by the search); yields
    whether they are suspended."""
    guard = _INVARIANTS_IN_PROGRESS
    if guard is None or not getattr(type(target), "__invariants__", None):
        yield False
        return
    in_progress = guard.get()
    if in_progress is None:
        in_progress = set()
        guard.set(in_progress)
    key = id(target)
    if key in in_progress:  # already suspended (a nested use)
        yield True
        return
    in_progress.add(key)
    try:
        yield True
    finally:
        in_progress.discard(key)


# icontract asks `inspect.iscoroutinefunction` of every condition on every call (measured: 0.87 of 11.7 s
# of the cell checker's profile); the answer is a property of the function, so the search asks it once
# per function. The cached test is installed in icontract's checker module only (where it is still the
# `inspect` module: another icontract is left as it is), and only by a search (`root_state`).
@functools.lru_cache(maxsize=None)
def _cached_iscoroutinefunction(function: Any) -> bool:
    return inspect.iscoroutinefunction(function)


def _iscoroutinefunction(function: Any) -> bool:
    try:
        return _cached_iscoroutinefunction(function)
    except TypeError:  # unhashable: asked every time, as icontract does
        return inspect.iscoroutinefunction(function)


class _InspectWithCachedCoroutineTest(types.ModuleType):
    """`inspect`, but for `iscoroutinefunction`."""

    def __init__(self) -> None:
        super().__init__("inspect")
        self.__dict__.update({name: value for name, value in vars(inspect).items() if not name.startswith("__")})
        self.iscoroutinefunction = _iscoroutinefunction


def _cache_icontract_coroutine_tests() -> None:
    try:
        from icontract import _checkers
    except ImportError:  # pragma: no cover - another icontract
        return
    if getattr(_checkers, "inspect", None) is inspect:
        _checkers.inspect = _InspectWithCachedCoroutineTest()  # type: ignore[attr-defined]


def invariant_problems(target: Any) -> list[str]:
    """The class invariants `target` breaks now, each as a problem naming its rule (icontract's own
    description); none when it has none (another implementation, or python -O)."""
    problems = []
    for invariant in getattr(type(target), "__invariants__", ()):
        try:
            holds = invariant.condition(self=target) if "self" in invariant.condition_arg_set else invariant.condition()
        except Exception as error:  # noqa: BLE001 - an invariant that crashes does not hold
            holds, error_text = False, f" (raised {type(error).__name__}: {error})"
        else:
            error_text = ""
        if not holds:
            problems.append(f"{invariant.description or 'an invariant'}: the target's invariant does not hold"
                            + error_text)
    return problems


@dataclass(frozen=True)
class Layout:
    """What the breadth-first search needs from a layout: its lockstep harness (built from a config
    spec and a factory; with `clone`, `key`, `apply` and `setup_problems`), the operations a consumer
    may perform in a state (`transitions`), the calls that must change nothing there (`checks`), and
    how a counterexample's program names them. The search itself is the same for every layout."""

    name: str
    module: str                                    # where the harness, its ops and the reference factory live
    harness: Callable[[Any, Any], Any]             # (config spec, factory) -> harness
    harness_name: str
    reference: Callable[..., Any]                  # the default factory: the reference implementation
    transitions: Callable[[Any], Iterator[Any]]
    checks: Callable[[Any], Iterator[Any]]
    settle: Callable[[Any], None] = _no_settling   # after a state's checks and after each transition
    max_depth: Callable[[Any], Optional[int]] = _unbounded  # per config: None, or see check_config
    key: Callable[[Any], Any] = _harness_key       # a state's identity: the harness's key, or a canonical form


@dataclass
class Counterexample:
    config: Any
    ops: list[Any]
    problems: list[str]
    layout: Optional[Layout] = None                # None: the sequence cache

    def program(self, target: str = "reference") -> str:
        """Python that replays it (paste into a test); `target` is "reference" or python:MODULE:FACTORY."""
        layout = self.layout or SEQUENCE
        factory = getattr(layout.reference, "__name__") if target == "reference" else f"resolve_target({target!r})"
        lines = [f"from {layout.module} import *",
                 "from kvcache_proofs.model_checker import resolve_target",
                 f"lock = {layout.harness_name}({self.config!r}, {factory}, thorough=False)"]
        lines += [f"assert not lock.apply({op!r})" for op in self.ops]
        return "\n".join(lines)


@dataclass
class ConfigResult:
    config: Any
    states: int = 0
    transitions: int = 0
    checks: int = 0
    seconds: float = 0.0
    complete: bool = True
    counterexample: Optional[Counterexample] = None
    max_depth: Optional[int] = None    # the depth bound the configuration was checked to (None: none)
    beyond: int = 0                    # states first reached past max_depth (0: the bound cut nothing)


def _sequence_harness(spec: ConfigSpec, factory: Factory) -> Lockstep:
    return Lockstep(spec, factory, thorough=False)


SEQUENCE = Layout("sequence", "kvcache_spec.stateful", _sequence_harness, "Lockstep", reference_factory,
                  transitions, checks, _forget_issued)


def fingerprint(key: Any) -> bytes:
    """A state's fingerprint: 128 bits of BLAKE2b over its key's repr (deterministic across processes
    and machines, so a distributed search can partition states by it; a collision among 10^9 states
    has probability below 10^-20)."""
    return hashlib.blake2b(repr(key).encode(), digest_size=16).digest()


@dataclass
class Expansion:
    """What exploring one state found: a violation (the operation and its problems; `Observe()` for a
    state whose checks failed or changed the model) or every successor (fingerprint, operation, harness),
    and the work done."""

    violation: Optional[tuple[Any, list[str]]] = None
    children: list[tuple[bytes, Any, Any]] = field(default_factory=list)
    checks: int = 0
    transitions: int = 0


def expand(layout: Layout, key: bytes, lock: Any) -> Expansion:
    """One state's work, the same in every engine: every check in place (each must change nothing),
    then every transition on a twin; stops at the first problem. The successors' invariants are left to
    whoever decides a successor is new (`admit`)."""
    found = Expansion()
    with invariants_suspended(lock.target):
        for op in layout.checks(lock):
            found.checks += 1
            problems = lock.apply(op)
            if problems:
                found.violation = (op, problems)
                return found
    layout.settle(lock)
    if fingerprint(layout.key(lock)) != key:  # a check the model accepted: the harness's fault
        found.violation = (Observe(), ["HARNESS: a check changed the model's state (it must be a probe or a "
                                       "call the spec rejects or refuses)"])
        return found
    twin = lock.twins() if hasattr(lock, "twins") else lock.clone  # the target serialised once per state
    for op in layout.transitions(lock):
        found.transitions += 1
        child = twin()
        with invariants_suspended(child.target):
            problems = child.apply(op)
        if problems:
            found.violation = (op, problems)
            return found
        layout.settle(child)
        found.children.append((fingerprint(layout.key(child)), op, child))
    return found


def admit(child: Any) -> list[str]:
    """A state reached for the first time: its target's invariants, once (see invariants_suspended)."""
    return invariant_problems(child.target)


def root_state(layout: Layout, spec: Any, factory: Optional[Callable[..., Any]]) -> tuple[bytes, Any, list[str]]:
    """The initial state: (fingerprint, harness, the problems of building it)."""
    _cache_icontract_coroutine_tests()
    root = layout.harness(spec, factory or layout.reference)
    problems = list(root.setup_problems) + invariant_problems(root.target)
    root.setup_problems = []
    return fingerprint(layout.key(root)), root, problems


def check_config(spec: Any, factory: Optional[Callable[..., Any]] = None,
                 deadline: Optional[float] = None, layout: Optional[Layout] = None,
                 seen: Optional[set[bytes]] = None) -> ConfigResult:
    """Breadth-first over every reachable state of one configuration; stops at the first violation
    (BFS: its path is a shortest one) or at the deadline (time.monotonic()).

    States are identified by the fingerprint of the layout's key (a canonical form, with the cell
    layout's symmetry reduction): each state first reached gets the target's class invariants once
    (`admit`), then its checks and its transitions (`expand`); every call runs with the invariants
    suspended. With `seen`, the fingerprints of every state reached are added to it.

    With a depth bound D (the layout's `max_depth(spec)`), the search is every state reachable in at
    most D operations: each gets every check and every transition (each transition is applied and
    checked), but a state first reached by an operation D + 1 is counted in `beyond` and not explored
    further. `beyond == 0` means the bound cut nothing: the search was exhaustive after all."""
    layout = layout or SEQUENCE
    started = time.monotonic()
    max_depth = layout.max_depth(spec)
    result = ConfigResult(spec, max_depth=max_depth)
    depth: dict[bytes, int] = {}
    parents: dict[bytes, tuple[Optional[bytes], Optional[Op]]] = {}

    def fail(key: bytes, op: Op, problems: list[str]) -> ConfigResult:
        result.counterexample = Counterexample(spec, path_to(parents, key) + [op], problems,
                                               None if layout is SEQUENCE else layout)
        result.seconds = time.monotonic() - started
        return result

    root_key, root, root_problems = root_state(layout, spec, factory)
    parents[root_key] = (None, None)
    depth[root_key] = 0
    if root_problems:
        return fail(root_key, Observe(), root_problems)
    queue: deque[tuple[bytes, Any]] = deque([(root_key, root)])
    while queue:
        if deadline is not None and time.monotonic() > deadline:
            result.complete = False
            break
        key, lock = queue.popleft()
        result.states += 1
        found = expand(layout, key, lock)
        result.checks += found.checks
        result.transitions += found.transitions
        for child_key, op, child in found.children:
            if child_key not in parents:
                problems = admit(child)
                if problems:
                    return fail(key, op, problems)
                parents[child_key] = (key, op)
                depth[child_key] = depth[key] + 1
                if max_depth is not None and depth[child_key] > max_depth:
                    result.beyond += 1  # reached and its transition checked, not explored
                else:
                    queue.append((child_key, child))
        if found.violation is not None:
            return fail(key, *found.violation)
    if seen is not None:
        seen.update(parents)
    result.seconds = time.monotonic() - started
    return result


def path_to(parents: Any, key: bytes) -> list[Any]:
    """The operations from the initial state to `key` (parents: key -> (parent key, operation))."""
    ops: list[Any] = []
    while True:
        parent, op = parents[key]
        if parent is None or op is None:
            return ops[::-1]
        ops.append(op)
        key = parent


def replay(spec: Any, ops: Sequence[Any], factory: Optional[Callable[..., Any]] = None,
           layout: Optional[Layout] = None) -> list[str]:
    """Apply `ops` in order; the problems of the first operation that has any (empty: none), the
    target's invariants checked after each as the search checks them."""
    layout = layout or SEQUENCE
    lock = layout.harness(spec, factory or layout.reference)
    problems: list[str] = list(lock.setup_problems)
    lock.setup_problems = []
    problems += invariant_problems(lock.target)
    for op in ops:  # as the search makes them: invariants suspended in the call, checked after it
        if problems:
            break
        with invariants_suspended(lock.target):
            problems = lock.apply(op)
        if not problems:
            problems = invariant_problems(lock.target)
    return problems


# --- all configurations, in parallel --------------------------------------------------------------

@dataclass
class CheckReport:
    bounds: Any                    # Bounds, or another layout's bounds (with .configs())
    target: str
    configs_total: int
    configs_checked: int = 0
    states: int = 0
    transitions: int = 0
    checks: int = 0
    seconds: float = 0.0
    jobs: int = 1
    complete: bool = True
    counterexample: Optional[Counterexample] = None
    largest: Optional[tuple[Any, int]] = None  # the configuration with the most states
    beyond: int = 0                            # states past a depth bound, not explored (see check_config)

    @property
    def ok(self) -> bool:
        return self.complete and self.counterexample is None

    def add(self, result: ConfigResult) -> bool:
        """Count a configuration's result in; False when the search should stop (a counterexample, or
        out of time). The report keeps the shortest counterexample."""
        self.configs_checked += result.complete
        self.states += result.states
        self.beyond += result.beyond
        self.transitions += result.transitions
        self.checks += result.checks
        self.complete &= result.complete
        if self.largest is None or result.states > self.largest[1]:
            self.largest = (result.config, result.states)
        cx = result.counterexample
        if cx and (self.counterexample is None or len(cx.ops) < len(self.counterexample.ops)):
            self.counterexample = cx
        return cx is None and result.complete

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        verdict = ("holds" if self.ok else "VIOLATION" if self.counterexample
                   else "INCOMPLETE (the time safety net ran out before every configuration was checked)")
        text = (f"model checker: {verdict} - {self.states} states, {self.transitions} transitions, "
                f"{self.checks} checks, {self.configs_checked}/{self.configs_total} configs, "
                + (f"depth-bounded ({self.beyond} states reached past a configuration's depth bound, not "
                   "explored), " if self.beyond else "")
                + f"{self.seconds:.1f} s, {self.states_per_second:.0f} states/s, {self.jobs} job(s); "
                f"bounds {self.bounds}")
        if self.counterexample:
            cx = self.counterexample
            text += (f"\nshortest counterexample ({len(cx.ops)} operations) on {cx.config}:\n  "
                     + "\n  ".join(repr(op) for op in cx.ops) + "\nproblems:\n  " + "\n  ".join(cx.problems)
                     + "\nreplay:\n" + cx.program(self.target))
        return text

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ok": self.ok, "complete": self.complete, "target": self.target, "bounds": asdict(self.bounds),
            "configs_total": self.configs_total, "configs_checked": self.configs_checked, "states": self.states,
            "transitions": self.transitions, "checks": self.checks, "seconds": round(self.seconds, 3),
            "states_per_second": round(self.states_per_second, 1), "jobs": self.jobs, "beyond_depth_bound": self.beyond,
        }
        if self.counterexample:
            data["counterexample"] = {"config": asdict(self.counterexample.config),
                                      "ops": [repr(op) for op in self.counterexample.ops],
                                      "problems": self.counterexample.problems}
        return data


def resolve_target(reference: str) -> Factory:
    """`python:MODULE:FACTORY` -> the factory (a callable taking a kvcache.CacheConfig). MODULE is found
    from the current directory too, as `kvcache conformance` finds it (one helper, import_target_module)."""
    parts = reference.split(":")
    if len(parts) != 3 or parts[0] != "python" or not parts[1] or not parts[2]:
        raise ValueError(f"a target is python:MODULE:FACTORY, not {reference!r}")
    factory: Factory = getattr(import_target_module(parts[1]), parts[2])
    if not callable(factory):
        raise ValueError(f"{reference} is not callable")
    return factory


def _worker(job: tuple[Any, str, Optional[float], Layout]) -> ConfigResult:
    spec, target, wall_deadline, layout = job
    factory = layout.reference if target == "reference" else resolve_target(target)
    return check_config(spec, factory, from_wall_clock(wall_deadline), layout)
