"""Lockstep checking of a cache implementation against the spec model, and a Hypothesis state machine.

Two layers, both reusable, in three modules: the vocabulary (stateful_ops.py), the checks
(lockstep.py) and the machine with its rules (here); every name is importable from here.

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

import os
from contextlib import contextmanager
from typing import Any, Generic, Iterator, Optional, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from . import model
from .lockstep import (Lockstep, Outcome, _call, _describe, atomic_snapshot, call_target, fingerprint_of,
                       rejection_problems, snapshot_unchanged, still_clean, twin_of, twins_of)
from .stateful_ops import (COMMIT_WITH, FORGED_KINDS, PATTERNS, AbortedStep, CanExtend, Clear, CommitForged,
                           CommitOther, CommitStale, ConfigSpec, Depth, Factory, LayerStep, Observe, Op, Plan,
                           RetainedFrom, Rewind, Step, plan_well_formed, reference_factory, to_api_plan,
                           to_model_plan)

__all__ = ["COMMIT_WITH", "FORGED_KINDS", "PATTERNS", "AbortedStep", "CanExtend", "Clear", "CommitForged", "CommitOther",
           "CommitStale", "ConfigSpec", "Depth", "Factory", "LayerStep", "Lockstep", "LockstepMachine", "Observe",
           "Op", "Outcome", "Plan", "RetainedFrom", "Rewind", "Step", "_call", "_describe", "atomic_snapshot",
           "call_target", "config_specs", "fingerprint_of", "fixed_constant_pool", "ints_and_bad", "make_machine",
           "plan_well_formed", "profile_name", "reference_factory", "rejection_problems", "snapshot_unchanged",
           "stateful_settings", "still_clean", "to_api_plan", "to_model_plan", "twin_of", "twins_of"]


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
