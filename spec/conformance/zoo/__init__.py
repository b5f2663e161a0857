"""A zoo of deliberately broken caches: the suite must catch each one with the right class.

`Faithful` is a small contract-free port of the reference (closed forms); every mutant changes one
thing, the way real implementations go wrong (upstream's rewind floor, off-by-one windows, lax
validation...). `ZOO` maps a name to (factory, the finding class the suite must report, the rule).
Use one as a target: `--target python:kvcache_spec.conformance.zoo:upstream_floor`.
`HOSTILE` holds targets that attack the harness itself (never creating, slow, huge depth, printing,
exiting, raising BaseException, wrong protocol types, several defects at once).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Callable, Optional

from kvcache import CacheConfig, Kind, Run, SeqStepPlan

INT_MAX = 2**31 - 1


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Faithful:
    """The reference's behaviour in plain Python: one length, per-policy retained marks."""

    def __init__(self, config: CacheConfig) -> None:
        self.capacity_ = config.capacity
        self.n_layers = config.n_layers
        self.policies: list[tuple[int, int]] = []   # (window, slots); window 0 = flat
        self.layer_policy: list[int] = []
        for index in range(config.n_layers):
            policy = config.layer(index).policy
            if policy.kind is Kind.RING:
                m = config.max_write if config.max_write is not None else policy.window
                key = (policy.window, policy.window + m - 1)
            else:
                key = (0, 0)
            if key not in self.policies:
                self.policies.append(key)
            self.layer_policy.append(self.policies.index(key))
        limits = [slots - window + 1 for window, slots in self.policies if window]
        self.limit: Optional[int] = min(limits) if limits else None
        self.len_ = 0
        self.open_step: Optional[tuple[int, int]] = None
        self.retained = [0] * len(self.policies)

    # --- validation (mutants relax or tighten these)
    def valid_int(self, value: Any, low: int) -> bool:
        return _int(value) and low <= value <= INT_MAX

    def valid_layer(self, layer: Any) -> bool:
        return self.valid_int(layer, 0) and layer < self.n_layers

    def step_allowed(self, position: int, T: int) -> bool:
        return position == self.len_ or self.open_step == (position, T)

    def admitted(self, position: int, T: int) -> bool:
        return position + T <= self.capacity_

    # --- layout
    def read_base(self, window: int, position: int) -> int:
        return 0 if window == 0 else max(0, position - window + 1)

    def slot(self, slots: int, position: int) -> int:
        return position % slots

    def runs(self, slots: int, first: int, count: int) -> tuple[Run, ...]:
        head = min(count, slots - first)
        return (Run(first, count),) if head == count else (Run(first, head), Run(0, count - head))

    def policy_plan(self, index: int, position: int, T: int) -> SeqStepPlan:
        window, slots = self.policies[index]
        if window == 0:
            return SeqStepPlan((Run(position, T),), (Run(0, position + T),), 0)
        base = self.read_base(window, position)
        return SeqStepPlan(self.runs(slots, self.slot(slots, position), T),
                           self.runs(slots, self.slot(slots, base), position + T - base), base)

    def retained_after(self, index: int, retained: int, end: int) -> int:
        window, slots = self.policies[index]
        return 0 if window == 0 else max(retained, end - slots)

    def rewind_safe(self, new_len: int) -> bool:
        return all(self.read_base(window, new_len) >= min(r, new_len)
                   for (window, _), r in zip(self.policies, self.retained))

    # --- the faces
    def can_extend(self, n: int = 1) -> bool:
        if not self.valid_int(n, 0):
            raise ValueError("n")
        return self.len_ + n <= self.capacity_

    def capacity(self) -> int:
        return self.capacity_

    def length(self) -> int:
        return self.len_

    def rewind(self, new_len: int) -> bool:
        if not self.valid_int(new_len, 0):
            raise ValueError("new_len")
        if new_len > self.len_ or not self.rewind_safe(new_len):
            return False
        self.len_, self.open_step = new_len, None
        self.retained = [min(r, new_len) for r in self.retained]
        return True

    def clear(self) -> None:
        self.len_, self.open_step = 0, None
        self.retained = [0] * len(self.policies)

    def check_step(self, layer: Any, position: Any, T: Any) -> None:
        if not self.valid_layer(layer):
            raise IndexError("layer")
        if not self.valid_int(position, 0) or not self.valid_int(T, 1):
            raise ValueError("position or T")
        if self.limit is not None and T > self.limit:
            raise ValueError("T > max_write")
        if not self.step_allowed(position, T):
            raise ValueError("STEP-APPEND")

    def plan(self, layer: int, position: int, T: int) -> Optional[SeqStepPlan]:
        self.check_step(layer, position, T)
        if not self.admitted(position, T):
            return None
        return self.policy_plan(self.layer_policy[layer], position, T)

    def span(self, plan: Any) -> Optional[tuple[int, int]]:
        """The plan's arithmetic: (position, T) from its write and read lengths, when that is a step
        this cache may commit now (the length or the open step, admitted, within max_write)."""
        if not isinstance(plan, SeqStepPlan):
            return None
        try:
            T, end = plan.n_written, plan.end
        except (TypeError, AttributeError):
            return None
        position = end - T
        if position < 0 or T < 1 or not self.step_allowed(position, T) or not self.admitted(position, T):
            return None
        if self.limit is not None and T > self.limit:
            return None
        return position, T

    def issued(self, plan: Any) -> bool:
        """The span, and the very rows some layer's policy plans for it."""
        step = self.span(plan)
        return step is not None and any(self.policy_plan(index, *step) == plan for index in range(len(self.policies)))

    def commit(self, plan: SeqStepPlan) -> None:
        if not self.issued(plan):
            raise ValueError("COMMIT-ISSUED")
        self.advance(plan)

    def advance(self, plan: SeqStepPlan) -> None:
        end = plan.end
        if end > self.len_:
            self.len_, self.open_step = end, (plan.position, plan.n_written)
            self.retained = [self.retained_after(i, r, end) for i, r in enumerate(self.retained)]

    def depth(self, layer: int) -> int:
        if not self.valid_layer(layer):
            raise IndexError("layer")
        window, slots = self.policies[self.layer_policy[layer]]
        return self.capacity_ if window == 0 else min(self.capacity_, slots)

    def retained_from(self, layer: int) -> int:
        if not self.valid_layer(layer):
            raise IndexError("layer")
        return self.retained[self.layer_policy[layer]]

    def as_control(self) -> Any:
        return self

    def as_planner(self) -> Any:
        return self


# --- the mutants ----------------------------------------------------------------------------------

class ReadBaseOffByOne(Faithful):
    """Each token sees window + 1 keys (the w vs w+1 bug class)."""

    def read_base(self, window: int, position: int) -> int:
        return 0 if window == 0 else max(0, position - window)


class RingSizedToWindow(Faithful):
    """Wrap-around modulo the window: a ring of w rows, which multi-token steps overrun."""

    def slot(self, slots: int, position: int) -> int:
        window = next(w for w, s in self.policies if s == slots)
        return position % window


class UpstreamFloor(Faithful):
    """Upstream's floor: rewind allowed iff new_len >= max(0, L - window) on every ring."""

    def rewind_safe(self, new_len: int) -> bool:
        return all(new_len >= max(0, self.len_ - window) for window, _ in self.policies if window)


class FloorIgnoresChains(Faithful):
    """A sound-looking floor from the current length only: forgets what earlier rewinds cost."""

    def rewind_safe(self, new_len: int) -> bool:
        return all(self.read_base(window, new_len) >= min(max(0, self.len_ - slots), new_len)
                   for window, slots in self.policies if window)


class ImpurePlan(Faithful):
    """plan moves the length (a backend planning speculatively would skip tokens)."""

    def plan(self, layer: int, position: int, T: int) -> Optional[SeqStepPlan]:
        plan = super().plan(layer, position, T)
        if plan is not None and position == self.len_:
            self.len_ = position + T
            self.open_step = (position, T)
        return plan


class AcceptsBool(Faithful):
    """bool passes as an int (plan(True, ...) means layer 1)."""

    def valid_int(self, value: Any, low: int) -> bool:
        return isinstance(value, int) and low <= value <= INT_MAX


class AcceptsGap(Faithful):
    """Upstream's plan: any position at or after the length (a gap reads rows never written)."""

    def step_allowed(self, position: int, T: int) -> bool:
        return position >= self.len_ or self.open_step == (position, T)


class RefusesExactCapacity(Faithful):
    """Admission off by one: refuses position + T == capacity."""

    def admitted(self, position: int, T: int) -> bool:
        return position + T < self.capacity_


class CommitNotIdempotent(Faithful):
    """Every commit advances by T, so per-layer commits count a step once per layer."""

    def advance(self, plan: SeqStepPlan) -> None:
        end = self.len_ + plan.n_written
        self.len_, self.open_step = min(end, self.capacity_), (plan.position, plan.n_written)
        self.retained = [self.retained_after(i, r, self.len_) for i, r in enumerate(self.retained)]


class CommitsAnything(Faithful):
    """commit trusts the plan: the length jumps to wherever a forged plan ends."""

    def commit(self, plan: SeqStepPlan) -> None:
        try:
            if plan.end <= self.capacity_:
                self.advance(plan)
        except (AttributeError, TypeError):
            pass


class NoOpenStep(Faithful):
    """Only new steps may be planned: the MLX per-layer commit pattern is refused."""

    def step_allowed(self, position: int, T: int) -> bool:
        return position == self.len_


class ClearKeepsHistory(Faithful):
    """clear() resets the length but not the retained marks."""

    def clear(self) -> None:
        self.len_, self.open_step = 0, None


class MultiTokenNoEvict(Faithful):
    """A multi-token ring step writes only its first row (multi-token steps never evicting)."""

    def policy_plan(self, index: int, position: int, T: int) -> SeqStepPlan:
        plan = super().policy_plan(index, position, T)
        if self.policies[index][0] and T > 1:
            first = plan.write[0]
            return SeqStepPlan((Run(first.start, 1),) + plan.write[1:], plan.read, plan.read_base_pos)
        return plan


class IgnoresMaxWrite(Faithful):
    """No STEP-T-MAX check: a step longer than max_write is planned."""

    def check_step(self, layer: Any, position: Any, T: Any) -> None:
        saved, self.limit = self.limit, None
        try:
            super().check_step(layer, position, T)
        finally:
            self.limit = saved

    def admitted(self, position: int, T: int) -> bool:
        return position + T <= self.capacity_

    def policy_plan(self, index: int, position: int, T: int) -> SeqStepPlan:
        window, slots = self.policies[index]
        if window and T > slots:
            T = slots
        return super().policy_plan(index, position, T)


class DepthUnchecked(Faithful):
    """depth(layer) indexes without a bounds check (Python's negative indexes answer)."""

    def depth(self, layer: int) -> int:
        window, slots = self.policies[self.layer_policy[layer]]
        return self.capacity_ if window == 0 else min(self.capacity_, slots)


class LengthFromSlidingLayer(Faithful):
    """length() read from a ring layer's retained window instead of the whole model."""

    def length(self) -> int:
        rings = [slots for window, slots in self.policies if window]
        return min(self.len_, rings[0]) if rings else self.len_


class RefusedRewindCloses(Faithful):
    """A refused rewind still closes the open step (not ATOMIC)."""

    def rewind(self, new_len: int) -> bool:
        done = super().rewind(new_len)
        if not done:
            self.open_step = None
        return done


class RotatedRing(Faithful):
    """Not a mutant: a sound, non-canonical layout (ring slot = (position + 1) mod S). It must pass
    semantic conformance and fail only exact layout conformance (LAYOUT-CANON)."""

    def slot(self, slots: int, position: int) -> int:
        return (position + 1) % slots

    def depth(self, layer: int) -> int:
        """The whole ring even when the capacity is smaller: rotated rows may use any of them."""
        if not self.valid_layer(layer):
            raise IndexError("layer")
        window, slots = self.policies[self.layer_policy[layer]]
        return self.capacity_ if window == 0 else slots


class BiggerRing(Faithful):
    """Not a mutant: rings of window + max_write rows (one more than canonical). It retains more, so
    it soundly accepts rewinds the canonical layout refuses: semantic yes, exact layout no."""

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self.policies = [(window, slots + 1 if window else slots) for window, slots in self.policies]


class CommitChecksArithmetic(Faithful):
    """commit checks the plan's arithmetic - (position, T) from read_base_pos + sum(read lens), the
    open step or the length, admission, max_write - but not its rows: a plan with the same span and
    moved, re-split or foreign runs is taken for the step's own."""

    def issued(self, plan: Any) -> bool:
        return self.span(plan) is not None and 1 <= len(plan.write) <= 2 and 1 <= len(plan.read) <= 2


class FlatOnly(Faithful):
    """Not a mutant: a flat-only cache shaped like ExecuTorch's first version (PR #21412: no ring
    policy, no max_write field). It declares its scope and refuses everything outside it."""

    kvcache_scope = ("flat",)

    def __init__(self, config: CacheConfig) -> None:
        if any(config.layer(index).policy.kind is not Kind.FLAT for index in range(config.n_layers)):
            raise ValueError("SCOPE-BORDER: this cache implements flat layers only")
        if config.max_write is not None:
            raise ValueError("SCOPE-BORDER: this cache's config has no max_write")
        super().__init__(config)


class FlatEverywhere(Faithful):
    """Declares the flat-only scope but accepts ring layers and serves them as full history (the
    policy of every layer is flat): silently wrong attention, caught at the border."""

    kvcache_scope = ("flat",)

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self.policies, self.layer_policy, self.limit = [(0, 0)], [0] * config.n_layers, None
        self.retained = [0]


ZOO: dict[str, tuple[Callable[[CacheConfig], Any], str, str]] = {
    "read_base_off_by_one": (ReadBaseOffByOne, "wrong", "PLAN-READ"),
    "ring_sized_to_window": (RingSizedToWindow, "wrong", "DATA-SOUND"),
    "upstream_floor": (UpstreamFloor, "wrong", "REWIND-SOUND"),
    "floor_ignores_chains": (FloorIgnoresChains, "wrong", "REWIND-SOUND"),
    "impure_plan": (ImpurePlan, "wrong", "PLAN-PURE"),
    "accepts_bool": (AcceptsBool, "lenient", "ARG-INT"),
    "accepts_gap": (AcceptsGap, "lenient", "STEP-APPEND"),
    "refuses_exact_capacity": (RefusesExactCapacity, "over-strict", "ADMIT"),
    "commit_not_idempotent": (CommitNotIdempotent, "wrong", "COMMIT-ADVANCE"),
    "commits_anything": (CommitsAnything, "lenient", "COMMIT-ISSUED"),
    "no_open_step": (NoOpenStep, "over-strict", "STEP-APPEND"),
    "clear_keeps_history": (ClearKeepsHistory, "wrong", "RETAINED"),
    "multi_token_no_evict": (MultiTokenNoEvict, "wrong", "PLAN-WRITE"),
    "ignores_max_write": (IgnoresMaxWrite, "lenient", "STEP-T-MAX"),
    "depth_unchecked": (DepthUnchecked, "lenient", "LAYER-RANGE"),
    "length_from_sliding_layer": (LengthFromSlidingLayer, "wrong", "LEN-BOUNDS"),
    "refused_rewind_closes_step": (RefusedRewindCloses, "wrong", "ATOMIC"),
    "commit_checks_arithmetic": (CommitChecksArithmetic, "lenient", "COMMIT-ISSUED"),
    "flat_everywhere": (FlatEverywhere, "wrong", "SCOPE-BORDER"),
}

# Module-level factories, so each mutant is a target: python:kvcache_spec.conformance.zoo:NAME
faithful = Faithful
rotated_ring = RotatedRing
bigger_ring = BiggerRing
flat_only = FlatOnly
for _name, (_factory, _, _) in ZOO.items():
    globals()[_name] = _factory


# --- hostile targets: the harness itself is under test ---------------------------------------------
# Each must get the verdict it deserves - INCOMPLETE or findings - and never CONFORMING by default.

def never_creates(config: CacheConfig) -> Any:
    """A factory that refuses every configuration: nothing is ever tested (over-strict, INCOMPLETE)."""
    raise NotImplementedError("not yet")


def creates_nothing_valid(config: CacheConfig) -> Any:
    """A factory that returns something that is no cache at all."""
    return object()


class Slow(Faithful):
    """Correct, but every call takes 50 ms: the profile's program count cannot finish in the safety net."""

    DELAY = 0.05

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if callable(value) and not name.startswith("_") and name in _FACE_METHODS:
            def slow(*args: Any) -> Any:
                time.sleep(Slow.DELAY)
                return value(*args)
            return slow
        return value


class SlowAndWrong(Slow):
    """Slow, and capacity() is wrong on every ring configuration."""

    def capacity(self) -> int:
        return self.capacity_ + (1 if any(window for window, _ in self.policies) else 0)


class HugeDepth(Faithful):
    """Announces 2**24 rows per layer: sound, but each program costs the harness 2**24 pool rows."""

    def depth(self, layer: int) -> int:
        super().depth(layer)
        return 1 << 24


class PrintsToStdout(Faithful):
    """Correct, but chatty on stdout: under --isolate its prints must not break the protocol channel,
    and in process they must not corrupt `--json -`."""

    def plan(self, layer: int, position: int, T: int) -> Optional[SeqStepPlan]:
        print(f"planning layer {layer} at {position} for {T} tokens")
        return super().plan(layer, position, T)


class ExitsInProcess(Faithful):
    """Calls sys.exit(3) on a rewind to 0 of a non-empty cache (a crash, the run goes on)."""

    def rewind(self, new_len: int) -> bool:
        if new_len == 0 and self.len_ > 0:
            sys.exit(3)
        return super().rewind(new_len)


class TargetBug(BaseException):
    """Not an Exception: a target that raises one must be a finding, not a harness traceback."""


class RaisesBaseException(Faithful):
    """Raises a BaseException subclass from clear() on a non-empty cache."""

    def clear(self) -> None:
        if self.len_ > 0:
            raise TargetBug("clear() is not implemented for a non-empty cache")
        super().clear()


class WrongProtocolTypes(Faithful):
    """can_extend answers 1 / 0 instead of True / False (bool is not an int in the protocol)."""

    def can_extend(self, n: int = 1) -> bool:
        return int(super().can_extend(n))  # type: ignore[return-value]


class ManyDefects(AcceptsBool):
    """Several independent defects for one run to find - OUT OF PROCESS ONLY (`--isolate` or
    `cmd:python -m kvcache_spec.conformance.serve python:kvcache_spec.conformance.zoo:many_defects`):
    it kills its own process.

    - crash 1: SIGSEGV on a rewind of exactly 3 tokens from a length of 6 or more on a mixed cache;
    - crash 2: SIGABRT on can_extend(0) when a flat-only cache is full;
    - PLAN-READ, cause 1: decode steps (T = 1) of ring-only caches read one key too many;
    - PLAN-READ, cause 2: multi-token steps (T > 1) of flat-only caches read from position 1, not 0;
    - lenient ARG-INT: bool passes as an int (AcceptsBool).
    """

    def rewind(self, new_len: int) -> bool:
        if _int(new_len) and new_len == self.len_ - 3 and self.len_ >= 6 and self._kinds() == {"flat", "ring"}:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().rewind(new_len)

    def can_extend(self, n: int = 1) -> bool:
        if _int(n) and n == 0 and self.len_ == self.capacity_ and self._kinds() == {"flat"}:
            os.kill(os.getpid(), signal.SIGABRT)
        return super().can_extend(n)

    def _kinds(self) -> set[str]:
        return {"ring" if window else "flat" for window, _ in self.policies}

    def policy_plan(self, index: int, position: int, T: int) -> SeqStepPlan:
        plan = super().policy_plan(index, position, T)
        window, slots = self.policies[index]
        if self._kinds() == {"ring"} and T == 1 and plan.read_base_pos > 0:
            base = plan.read_base_pos - 1
            return SeqStepPlan(plan.write, self.runs(slots, self.slot(slots, base), position + T - base), base)
        if self._kinds() == {"flat"} and T > 1 and position > 0:
            return SeqStepPlan(plan.write, (Run(1, position + T - 1),), 1)
        return plan


_FACE_METHODS = frozenset({"can_extend", "capacity", "length", "rewind", "clear", "plan", "commit", "depth",
                           "retained_from", "as_control", "as_planner"})

# name -> factory (tests/test_conformance_hostile.py gives each its verdict)
HOSTILE: dict[str, Callable[[CacheConfig], Any]] = {
    "never_creates": never_creates, "creates_nothing_valid": creates_nothing_valid, "slow": Slow,
    "slow_and_wrong": SlowAndWrong, "huge_depth": HugeDepth, "prints_to_stdout": PrintsToStdout,
    "exits_in_process": ExitsInProcess, "raises_base_exception": RaisesBaseException,
    "wrong_protocol_types": WrongProtocolTypes, "many_defects": ManyDefects,
}
for _name, _hostile in HOSTILE.items():
    globals().setdefault(_name, _hostile)


class HangsInProcess(Faithful):
    """Loops forever in its first rewind: in process, only the wall-clock safety net can stop it."""

    def rewind(self, new_len: int) -> bool:
        while True:
            time.sleep(0.01)


HOSTILE["hangs_in_process"] = HangsInProcess
hangs_in_process = HangsInProcess


# --- the cell layout ---------------------------------------------------------------------------------
# The broken cell caches live in kvcache_proofs._cell_broken (subclasses of the reference whose
# contracts catch their own bug in a debug run): the suite drives each out of process under
# `python -O`, where only the conformance checks can see it. name -> (target, class, rule).
def _broken_cell(name: str) -> str:
    return f"cmd:{sys.executable} -O -m kvcache_spec.conformance.serve python:kvcache_proofs._cell_broken:{name}"


CELL_ZOO: dict[str, tuple[str, str, str]] = {
    "stale_owner_bit": (_broken_cell("stale_owner_bit"), "wrong", "CELL-DATA-SOUND"),
    "fork_past_cut": (_broken_cell("fork_past_cut"), "wrong", "CELL-FORK"),
    "rm_off_by_one": (_broken_cell("rm_off_by_one"), "wrong", "CELL-RM"),
    "stale_memo_mask": (_broken_cell("stale_memo_mask"), "wrong", "CELL-DATA-SOUND"),
    "id_reused_while_owned": (_broken_cell("id_reused_while_owned"), "wrong", "CELL-RM"),
}


class UpstreamLaxCells:
    """Upstream's lax answers over the reference (reference/upstream-cell-cache.md): an id out of
    range or not live answers False / 0 / None instead of raising, seq_rm of a dead id answers True,
    and seq_clone of a source that owns no cell answers None. Lenient (and over-strict for the fork),
    never wrong: every answer it gives where the spec serves the call is the spec's."""

    kvcache_layout = "cell"

    def __init__(self, config: CacheConfig, max_seqs: int = 64) -> None:
        from kvcache import CellCache
        self.inner = CellCache(config, max_seqs)
        self.max_seqs = max_seqs

    def __getattr__(self, name: str) -> Any:   # every other method is the reference's
        return getattr(self.inner, name)

    def _dead(self, seq_id: Any) -> bool:
        return not _int(seq_id) or seq_id not in self.inner.live()

    def as_batch_control(self) -> "UpstreamLaxCells":
        return self

    def as_cell_stepper(self) -> "UpstreamLaxCells":
        return self

    def seq_rm(self, seq_id: Any, p0: Any, p1: Any = None) -> bool:
        if not _int(seq_id) or not 0 <= seq_id < self.max_seqs:
            return False
        return True if self._dead(seq_id) else bool(self.inner.seq_rm(seq_id, p0, p1))

    def seq_len(self, seq_id: Any) -> int:
        return 0 if self._dead(seq_id) else int(self.inner.seq_len(seq_id))

    def next_pos(self, seq_id: Any) -> int:
        return 0 if self._dead(seq_id) else int(self.inner.next_pos(seq_id))

    def seq_clone(self, src: Any, upto: Any = None) -> Optional[int]:
        if self._dead(src) or self.inner.seq_len(src) == 0:
            return None
        return self.inner.seq_clone(src, upto)


upstream_lax_cells = UpstreamLaxCells
