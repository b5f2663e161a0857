"""An independent Python target, written from spec/SPEC.md and the Python target contract alone.

It imports nothing from kvcache or kvcache_spec: its plans are its own NamedTuples, its errors its own
exception, and it reads the `kvcache.CacheConfig` it is given by attribute (kind 0 is flat, 1 a ring).
`make_cache` is conforming, and so is `make_namespace_cache` (plans as SimpleNamespaces whose runs are
lists: the contract's plans are duck-typed). Two must be failed: `make_broken_cache` places ring rows
at position mod window (the ring sized to the window, a classic bug: DEPTH, LAYOUT-CANON, and unsound
rewinds), and `make_pair_runs_cache` returns runs as bare (start, len) tuples, which the contract does
not accept (a run has `start` and `len` attributes).
Used by tests/test_target_contract.py through `kvcache verify --target` and `kvcache conformance --target`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple, Optional

INT_MAX = 2**31 - 1


class DuckError(Exception):
    """This cache's caller error (the contract judges that something is raised, not what)."""


class Span(NamedTuple):
    start: int
    len: int


class StepPlan(NamedTuple):
    write: tuple[Span, ...]
    read: tuple[Span, ...]
    read_base_pos: int


def _check_int(name: str, value: Any, low: int) -> None:
    if type(value) is not int:
        raise DuckError(f"{name} must be an int, not {value!r}")
    if not low <= value <= INT_MAX:
        raise DuckError(f"{name} must lie in [{low}, {INT_MAX}], not {value!r}")


class DuckCache:
    """One length for the model; per layer a window (0: flat) and a ring of window + max_write - 1 slots."""

    def __init__(self, config: Any, ring_slots_are_the_window: bool = False) -> None:
        layers = list(config.layers)
        per_layer = [layers[0] if len(layers) == 1 else layers[i] for i in range(config.n_layers)]
        self.cap: int = config.capacity
        self.windows: tuple[int, ...] = tuple(0 if int(layer.policy.kind) == 0 else layer.policy.window
                                              for layer in per_layer)
        self.max_writes = tuple(0 if w == 0 else (w if config.max_write is None else config.max_write)
                                for w in self.windows)
        self.slots = tuple(0 if w == 0 else (w if ring_slots_are_the_window else w + m - 1)
                           for w, m in zip(self.windows, self.max_writes))
        rings = [m for m in self.max_writes if m]
        self.limit: Optional[int] = min(rings) if rings else None
        self.len_ = 0
        self.open: Optional[tuple[int, int]] = None
        self.intact_from = [0] * len(self.windows)   # the retained mark of each layer

    # --- the runner's face
    def as_control(self) -> DuckCache:
        return self

    def as_planner(self) -> DuckCache:
        return self

    def capacity(self) -> int:
        return self.cap

    def length(self) -> int:
        return self.len_

    def can_extend(self, n: Any = 1) -> bool:
        _check_int("n", n, 0)
        return bool(self.len_ + n <= self.cap)

    def clear(self) -> None:
        self.len_, self.open, self.intact_from = 0, None, [0] * len(self.windows)

    def rewind(self, new_len: Any) -> bool:
        _check_int("new_len", new_len, 0)
        if new_len > self.len_:
            return False
        # The next step at new_len reads from its window's start: those rows must still be intact.
        if any(self._read_base(layer, new_len) < min(mark, new_len) for layer, mark in enumerate(self.intact_from)):
            return False
        self.len_, self.open = new_len, None
        self.intact_from = [min(mark, new_len) for mark in self.intact_from]
        return True

    # --- the backend's face
    def _layer(self, layer: Any) -> int:
        _check_int("layer", layer, 0)
        if layer >= len(self.windows):
            raise DuckError(f"layer {layer} out of range")
        return int(layer)

    def depth(self, layer: Any) -> int:
        index = self._layer(layer)
        return self.cap if self.windows[index] == 0 else min(self.cap, self.slots[index])

    def retained_from(self, layer: Any) -> int:
        return self.intact_from[self._layer(layer)]

    def _read_base(self, layer: int, position: int) -> int:
        window = self.windows[layer]
        return 0 if window == 0 else max(0, position - window + 1)

    def _runs(self, layer: int, first: int, count: int) -> tuple[Span, ...]:
        if self.windows[layer] == 0:
            return (Span(first, count),)
        size = self.slots[layer]
        start = first % size
        head = min(count, size - start)
        return (Span(start, count),) if head == count else (Span(start, head), Span(0, count - head))

    def _plan_of(self, layer: int, position: int, T: int) -> StepPlan:
        base = self._read_base(layer, position)
        return StepPlan(self._runs(layer, position, T), self._runs(layer, base, position + T - base), base)

    def plan(self, layer: Any, position: Any, T: Any) -> Optional[StepPlan]:
        index = self._layer(layer)
        _check_int("position", position, 0)
        _check_int("T", T, 1)
        if self.limit is not None and T > self.limit:
            raise DuckError(f"T={T} exceeds max_write {self.limit}")
        if position != self.len_ and self.open != (position, T):
            raise DuckError(f"step ({position}, {T}) is neither a new step at {self.len_} nor the open step")
        if position + T > self.cap:
            return None
        return self._plan_of(index, position, T)

    def commit(self, plan: Any) -> None:
        try:
            write = tuple((run.start, run.len) for run in plan.write)
            read = tuple((run.start, run.len) for run in plan.read)
            base = plan.read_base_pos
        except (AttributeError, TypeError) as error:
            raise DuckError(f"not a plan: {plan!r}") from error
        if type(base) is not int or not all(type(x) is int for run in write + read for x in run):
            raise DuckError(f"not a plan: {plan!r}")
        T = sum(n for _, n in write)
        end = base + sum(n for _, n in read)
        position = end - T
        current = position == self.len_ or self.open == (position, T)
        fits = T >= 1 and position >= 0 and end <= self.cap and (self.limit is None or T <= self.limit)
        mine = current and fits and any(
            (tuple(map(tuple, own.write)), tuple(map(tuple, own.read)), own.read_base_pos) == (write, read, base)
            for own in (self._plan_of(layer, position, T) for layer in range(len(self.windows))))
        if not mine:
            raise DuckError(f"{plan!r} is not a plan of the current step")
        if end > self.len_:
            self.len_, self.open = end, (position, T)
            self.intact_from = [0 if self.windows[i] == 0 else max(mark, end - self.slots[i])
                                for i, mark in enumerate(self.intact_from)]


def make_cache(config: Any) -> DuckCache:
    return DuckCache(config)


def make_broken_cache(config: Any) -> DuckCache:
    return DuckCache(config, ring_slots_are_the_window=True)


class NamespaceCache(DuckCache):
    """Plans as SimpleNamespaces, runs in lists: still plans by the contract."""

    def plan(self, layer: Any, position: Any, T: Any) -> Any:
        own = super().plan(layer, position, T)
        if own is None:
            return None
        return SimpleNamespace(write=[SimpleNamespace(start=r.start, len=r.len) for r in own.write],
                               read=[SimpleNamespace(start=r.start, len=r.len) for r in own.read],
                               read_base_pos=own.read_base_pos)


class PairRunsCache(DuckCache):
    """Runs as bare (start, len) tuples: not runs by the contract."""

    def plan(self, layer: Any, position: Any, T: Any) -> Any:
        own = super().plan(layer, position, T)
        if own is None:
            return None
        return SimpleNamespace(write=tuple(map(tuple, own.write)), read=tuple(map(tuple, own.read)),
                               read_base_pos=own.read_base_pos)

    def commit(self, plan: Any) -> None:
        try:
            own = StepPlan(tuple(Span(*r) for r in plan.write), tuple(Span(*r) for r in plan.read), plan.read_base_pos)
        except (AttributeError, TypeError) as error:
            raise DuckError(f"not a plan: {plan!r}") from error
        super().commit(own)


def make_namespace_cache(config: Any) -> DuckCache:
    return NamespaceCache(config)


def make_pair_runs_cache(config: Any) -> DuckCache:
    return PairRunsCache(config)
