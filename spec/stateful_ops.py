"""The lockstep's vocabulary: the configurations it runs (`ConfigSpec`), every call the checkers make as a
printable, replayable `Op` value, and the conversions between the model's plans and the API's. Used by
the lockstep harness (lockstep.py), the state machine (stateful.py) and the model checker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

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
