"""A data-level backend for tests: executes a cache's plans on tag pools and checks every read.

Each row holds (logical position, content tag); the tag of a position changes whenever a new branch
rewrites it, so a stale row never passes for a current one (DATA-SOUND).
"""

from __future__ import annotations

from typing import Optional

from kvcache import SeqStepPlan, SequenceCache
from kvcache_spec import model


def as_model_plan(plan: SeqStepPlan) -> model.Plan:
    return model.Plan(tuple((r.start, r.len) for r in plan.write), tuple((r.start, r.len) for r in plan.read),
                      plan.read_base_pos)


class TagBackend:
    """Plays the backend for every layer of one cache; `problems` collects every unsound read."""

    def __init__(self, cache: SequenceCache) -> None:
        self.cache = cache
        self.pools: list[tuple[Optional[model.Row], ...]] = [(None,) * cache.depth(layer)
                                                              for layer in range(cache.n_layers)]
        self.truth: list[int] = []
        self.next_tag = 0
        self.problems: list[str] = []

    def execute(self, layer: int, plan: SeqStepPlan, tag: int) -> None:
        position, T = plan.position, plan.n_written
        truth = tuple(self.truth[:position]) + (tag,) * T
        self.pools[layer], problems = model.execute(self.pools[layer], truth, position, T, as_model_plan(plan))
        self.problems += problems

    def step(self, T: int, pattern: str = "once") -> bool:
        """One step at the current length on every layer; False (nothing done) when not admitted."""
        position, tag = self.cache.length(), self.next_tag
        plans = []
        for layer in range(self.cache.n_layers):
            plan = self.cache.plan(layer, position, T)
            if plan is None:
                assert layer == 0, "admission is the same on every layer"
                return False
            self.execute(layer, plan, tag)
            if pattern == "per-layer":
                self.cache.commit(plan)
            plans.append(plan)
        if pattern == "once":
            self.cache.commit(plans[0])
        self.truth[position:] = [tag] * T
        self.next_tag += 1
        return True

    def rewind(self, new_len: int) -> bool:
        accepted = self.cache.rewind(new_len)
        if accepted:
            del self.truth[new_len:]
        return accepted

    def clear(self) -> None:
        self.cache.clear()
        self.truth.clear()
