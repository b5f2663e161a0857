"""Broken-on-purpose variants of the reference, to show the checkers catch real bug classes.

Each is a factory `CacheConfig -> SequenceCache subclass` usable as a target anywhere a factory is
taken (`make_machine`, `check_all`, `kvcache verify --target python:kvcache_proofs._mc_broken:NAME`).
None of them trips the reference's own contracts: the point is that the *spec checks* find them.
"""

from __future__ import annotations

from typing import Callable, Optional

import kvcache
from kvcache import Kind, Run, SeqStepPlan
from kvcache._policies import LayoutPolicy


class UpstreamFloorCache(kvcache.SequenceCache):
    """Upstream's rewind floor: max over ring layers of max(0, length - window), ignoring max_write and
    earlier rewinds. Unsound when max_write < window, over-strict when max_write > window."""

    def _rewind_safe(self, new_len: int) -> bool:
        floor = max((max(0, self._length - getattr(policy, "window")) for policy in self._policies
                     if policy.kind is Kind.RING), default=0)
        return new_len >= floor


class LenientStepCache(kvcache.SequenceCache):
    """plan() (and commit()) ignore STEP-APPEND: gaps, overlaps and other Ts in the open step pass."""

    def _step_allowed(self, position: int, T: int) -> bool:
        return True


class _SkewedRing(LayoutPolicy):
    """A ring whose slot count is off by `skew` from window + max_write - 1 (no contracts of its own)."""

    kind = Kind.RING

    def __init__(self, window: int, max_write: int, skew: int) -> None:
        self.window, self.max_write = window, max_write
        self.n_slots = max(1, window + max_write - 1 + skew)

    def _runs(self, first: int, count: int) -> tuple[Run, ...]:
        # Rows first, first+1, ... modulo n_slots, as at most two runs; a read one row longer than the
        # ring (the short ring's case) ends on the row it started from.
        head = min(count, self.n_slots - first)
        return (Run(first, count),) if head == count else (Run(first, head), Run(0, count - head))

    def plan(self, position: int, T: int) -> SeqStepPlan:
        base = self.read_base(position)
        return SeqStepPlan(write=self._runs(position % self.n_slots, T),
                           read=self._runs(base % self.n_slots, position + T - base), read_base_pos=base)

    def depth(self, capacity: int) -> int:
        return min(capacity, self.n_slots)

    def max_step(self) -> Optional[int]:
        return self.max_write

    def read_base(self, position: int) -> int:
        return max(0, position - self.window + 1)

    def retained_after_write(self, retained: int, end: int) -> int:
        return max(retained, end - self.n_slots)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SkewedRing) and (self.window, self.max_write, self.n_slots) == (
            other.window, other.max_write, other.n_slots)

    def __hash__(self) -> int:
        return hash((self.window, self.max_write, self.n_slots))

    def __repr__(self) -> str:
        return f"_SkewedRing(window={self.window}, max_write={self.max_write}, n_slots={self.n_slots})"


def _skewed_ring_cache(skew: int) -> Callable[[kvcache.CacheConfig], kvcache.SequenceCache]:
    def factory(config: kvcache.CacheConfig) -> kvcache.SequenceCache:
        cache = kvcache.SequenceCache(config)
        policies: list[LayoutPolicy] = []
        for policy in cache._policies:
            if isinstance(policy, kvcache.RingPolicy):
                # the short ring keeps at least the window: fewer slots than that is no ring at all
                skewed = _SkewedRing(policy.window, policy.max_write, skew)
                skewed.n_slots = max(skewed.n_slots, policy.window)
                policies.append(skewed)
            else:
                policies.append(policy)
        cache._policies = policies
        return cache
    return factory


def upstream_floor(config: kvcache.CacheConfig) -> kvcache.SequenceCache:
    return UpstreamFloorCache(config)


def lenient_step(config: kvcache.CacheConfig) -> kvcache.SequenceCache:
    return LenientStepCache(config)


#: window + max_write slots (one too many): sound data, wrong layout, depth and rewind floor.
ring_slot_extra = _skewed_ring_cache(+1)
#: window + max_write - 2 slots (one too few, at least the window): a full-width read overlaps the write.
ring_slot_short = _skewed_ring_cache(-1)

BROKEN: dict[str, Callable[[kvcache.CacheConfig], kvcache.SequenceCache]] = {
    "upstream_floor": upstream_floor,
    "lenient_step": lenient_step,
    "ring_slot_extra": ring_slot_extra,
    "ring_slot_short": ring_slot_short,
}
