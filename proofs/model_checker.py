"""Exhaustive model checker: every reachable state of (spec model x implementation), breadth-first.

For every configuration within the bounds (flat, ring and mixed layers, with and without max_write)
the checker explores every state reachable by the operations a consumer may perform - every
admissible step with each commit pattern (plan every layer then commit the first / last / every
plan; or per layer, one layer at a time, so half-done steps are states too), re-running the open
step, rewinds to every target, clear - and at every state checks every rule: length, retained_from,
depth and can_extend(n) for every n; plan() for every layer and every current step plus admission
probes, gaps, overlaps, other Ts, T past max_write; and a representative set of bad calls (wrong
types, bools, negatives, ints past INT_MAX, layers out of range, forged, doctored and malformed plans),
each of which must raise the model's rule as a typed error and leave the implementation unchanged.
Every plan the implementation issues is executed on pools of our own and every read must be sound
(DATA-SOUND); the layout must also equal the canonical one. The comparisons are `Lockstep`'s
(`kvcache_spec.stateful`), shared with the Hypothesis machine.

States are deduplicated by `Lockstep.key()`: the model's state with each pool row reduced to its
position when it holds current content (tags only matter through that equality), the same for our
pools of the implementation's plans, a half-done per-layer step, and the implementation's attribute
fingerprint. A violation is reported with a SHORTEST path (BFS parents) within its configuration,
configurations being tried smallest first; `replay` re-runs it.

Usage: python -m kvcache_proofs.model_checker [--profile quick|pre-merge|deep] [--layout sequence|cell]
       [--jobs N] [--target python:MODULE:FACTORY] [--time-budget S] [--progress] [--json FILE]
       [--engine processes|ray] [--ray-address ADDRESS] [--no-symmetry]
Exit: 0 holds, 1 violation (a counterexample), 3 incomplete (the time safety net ran out), 2 usage.

The search is layout-independent (`Layout`): `--layout cell` checks the cell layout with the
transitions and checks of `kvcache_proofs.cell_model_checker`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import inspect
import itertools
import json
import multiprocessing
import os
import sys
import time
import types
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

if __name__ == "__main__":   # before the imports that need the extra: one line instead of a traceback
    from kvcache_spec._extras import exit_unless_installed
    exit_unless_installed("verify", "python -m kvcache_proofs.model_checker")

from kvcache_proofs._processes import default_sigterm, from_wall_clock, to_wall_clock
from kvcache_spec import model
from kvcache_spec.conformance.targets import import_target_module
from kvcache_spec.stateful import (COMMIT_WITH, FORGED_KINDS, AbortedStep, CanExtend, Clear, CommitForged,
                                   CommitOther, ConfigSpec, Depth, Factory, LayerStep, Lockstep, Observe, Op,
                                   Plan, RetainedFrom, Rewind, Step, reference_factory)

INT_MAX = model.INT_MAX


@dataclass(frozen=True)
class Bounds:
    """Which configurations to check: every capacity in 1..max_capacity, 1..max_layers layers, each
    flat or a ring of window 1..max_window, max_write unset or 1..max_max_write (only with a ring)."""

    max_capacity: int
    max_layers: int
    max_window: int
    max_max_write: int

    def configs(self) -> list[ConfigSpec]:
        """Smallest first, so the first failing configuration is a small one."""
        specs = []
        for capacity in range(1, self.max_capacity + 1):
            for n_layers in range(1, self.max_layers + 1):
                for windows in itertools.product(range(self.max_window + 1), repeat=n_layers):
                    writes: list[Optional[int]] = [None]
                    if any(windows):  # max_write applies to ring layers only
                        writes += list(range(1, self.max_max_write + 1))
                    specs += [ConfigSpec(capacity, windows, m) for m in writes]
        return specs


#: The work is the bounds: every reachable state of every configuration they allow, so a verdict is
#: a function of the code. The time budget is a safety net: running out is INCOMPLETE, not a pass and
#: not a violation. pre-merge: every mix of two layers with windows <= 2 and max_write <= 2 (below,
#: equal to and above the window), capacity <= 4: 128 configurations, 1,815 states, 13.7 s of CPU
#: on a quiet machine (measured; windows and max_write <= 3 took 49 s of CPU, too much for 60 s on two
#: busy cores with the other stages; the deep profile's full bounds, 6104 configurations, take about
#: an hour). The pickled twins and reused fingerprints (stateful.twins_of, call_target) cut it by a
#: sixth: 20.9 -> 17.1 s of CPU (87 -> 106 states per CPU second) measured side by side at load 5;
#: two thirds of what is left is the reference's own icontract checking.
PROFILES: dict[str, Bounds] = {
    "quick": Bounds(max_capacity=3, max_layers=2, max_window=2, max_max_write=2),
    "pre-merge": Bounds(max_capacity=4, max_layers=2, max_window=2, max_max_write=2),
    "deep": Bounds(max_capacity=8, max_layers=3, max_window=4, max_max_write=4),
}
ENGINES = ("processes", "ray")
DEFAULT_BUDGET = {"quick": 60.0, "pre-merge": 180.0, "deep": 14400.0}  # deep measured: 3548 s on 2 cores


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


class _Progress:
    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.started, self.last = enabled, total, time.monotonic(), 0.0

    def update(self, done: int, states: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        elapsed = now - self.started
        rate = states / elapsed if elapsed > 0 else 0.0
        print(f"\rmodel checker: {done}/{self.total} configs, {states} states, {rate:.0f} states/s, "
              f"{elapsed:.0f} s", end="\n" if final else "", file=sys.stderr, flush=True)


def check_all(bounds: Any, factory: Optional[Callable[..., Any]] = None, time_budget: Optional[float] = None,
              *, jobs: int = 1, target: Optional[str] = None, progress: bool = False,
              configs: Optional[Sequence[Any]] = None, layout: Optional[Layout] = None,
              engine: str = "processes", ray_address: Optional[str] = None,
              ray_partition_from: Optional[int] = None) -> CheckReport:
    """Check every configuration of `bounds` (or `configs`). With jobs > 1 the configurations are spread
    over worker processes; the factory travels by name (`target`, python:MODULE:FACTORY, derived from a
    module-level factory; a local one is checked in this process). Stops at the first violation; the report's counterexample is the shortest found.

    `engine="ray"` runs on Ray instead (`kvcache_proofs.ray_engine`; Ray at `ray_address`, else a local
    one): each configuration one Ray task, and those of at least `ray_partition_from` cells searched
    over `jobs` Ray workers partitioned by fingerprint: the same verdict, states and shortest
    counterexample length."""
    if engine == "ray":
        from kvcache_proofs import ray_engine

        distributed: CheckReport = ray_engine.check_all_ray(bounds, factory, time_budget, workers=jobs, target=target,
                                                            address=ray_address, configs=configs, layout=layout,
                                                            partition_from=ray_partition_from)
        return distributed
    if engine != "processes":
        raise ValueError(f"engine is processes or ray, not {engine!r}")
    layout = layout or SEQUENCE
    factory = factory or layout.reference
    specs = list(configs) if configs is not None else bounds.configs()
    if target is None and factory is not layout.reference:
        target = f"python:{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
    name = target or "reference"
    if "<" in name:  # a local factory cannot be named in a worker process: check in this one
        jobs = 1
    report = CheckReport(bounds, name, len(specs), jobs=jobs)
    started = time.monotonic()
    deadline = None if time_budget is None else started + time_budget
    bar = _Progress(progress, len(specs))

    def absorb(result: ConfigResult) -> bool:
        go_on = report.add(result)
        bar.update(report.configs_checked, report.states)
        return go_on

    if jobs <= 1:
        for spec in specs:
            if not absorb(check_config(spec, factory, deadline, layout)):
                break
    else:
        wall_deadline = to_wall_clock(deadline)
        ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
        with default_sigterm(), ctx.Pool(jobs) as pool:
            # One configuration at a time, smallest first: the largest come last and would serialise on
            # one worker in a chunk (the cell pre-merge's two largest, 5 s of CPU each, took one worker's
            # chunk of 4, so 2 jobs ran no faster than 1); singly they run side by side.
            for result in pool.imap_unordered(_worker, [(s, name, wall_deadline, layout) for s in specs], chunksize=1):
                if not absorb(result):
                    pool.terminate()
                    break
    report.complete &= report.configs_checked == len(specs) or report.counterexample is not None
    report.seconds = time.monotonic() - started
    bar.update(report.configs_checked, report.states, final=True)
    return report


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache-model-checker", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="pre-merge")
    parser.add_argument("--layout", choices=("sequence", "cell"), default="sequence",
                        help="the sequence cache (default) or the cell layout (kvcache_proofs.cell_model_checker)")
    parser.add_argument("--target", help="python:MODULE:FACTORY (default: the reference, kvcache.SequenceCache; "
                                         "kvcache.CellCache with --layout cell, a factory of (config, max_seqs))")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: every core)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds (default: per profile)")
    parser.add_argument("--progress", action="store_true", help="progress on stderr even when not a tty")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--engine", choices=ENGINES, default="processes",
                        help="processes on this machine (default), or ray: each configuration a Ray task "
                             "(pip install 'kvcache-spec[cluster]')")
    parser.add_argument("--ray-address", default=None, help="a Ray cluster to join (default: a local Ray)")
    parser.add_argument("--ray-partition-from", type=int, default=None, metavar="CELLS",
                        help="with --engine ray: configurations of at least CELLS cells are each searched over "
                             "--jobs Ray workers, partitioned by fingerprint (default: none)")
    parser.add_argument("--no-symmetry", action="store_true",
                        help="--layout cell: the full search, no reduction over renamings of ids")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    try:
        factory = None if args.target is None else resolve_target(args.target)
    except (ValueError, ImportError, AttributeError) as error:
        print(f"model checker: bad --target: {error}", file=sys.stderr)
        return 2
    bounds: Any = PROFILES[args.profile]
    budget, layout = DEFAULT_BUDGET[args.profile], SEQUENCE
    if args.layout == "cell":
        from kvcache_proofs import cell_model_checker  # imports this module: kept out of its import

        bounds, budget = cell_model_checker.PROFILES[args.profile], cell_model_checker.DEFAULT_BUDGET[args.profile]
        layout = cell_model_checker.layout(bounds, symmetry=not args.no_symmetry)
    try:
        report = check_all(bounds, factory, args.time_budget or budget, jobs=args.jobs or os.cpu_count() or 1,
                           target=args.target, progress=args.progress or sys.stderr.isatty(), layout=layout,
                           engine=args.engine, ray_address=args.ray_address,
                           ray_partition_from=args.ray_partition_from)
    except RuntimeError as error:  # the Ray engine without Ray
        print(f"model checker: {error}", file=sys.stderr)
        return 2
    print(report.summary())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report.to_json(), handle, indent=2)
    return 0 if report.ok else 1 if report.counterexample else 3


if __name__ == "__main__":
    sys.exit(main())
