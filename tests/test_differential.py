"""The first differential test: model and reference compared on every call of generated programs.

A program is a configuration and a list of operations (steps in either commit pattern, aborted
steps, rewinds and chains of them, clear, admission probes). Both sides run it; every answer must
agree, and every read the reference plans is executed on a tag pool and must be sound (DATA-SOUND).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache import CacheConfig, Kind, LayerConfig, LayerPolicy, SequenceCache
from kvcache_spec import model

from .backend import as_model_plan

RawLayer = tuple[int, int, int, int]


@st.composite
def configs(draw: st.DrawFn) -> tuple[int, int, list[RawLayer], Optional[int]]:
    capacity = draw(st.integers(1, 24))
    n_layers = draw(st.integers(1, 3))
    layer = st.one_of(st.just((0, 0, 1, 1)), st.builds(lambda w: (1, w, 1, 1), st.integers(1, 10)))
    layers = draw(st.lists(layer, min_size=1, max_size=1) | st.lists(layer, min_size=n_layers, max_size=n_layers))
    max_write = draw(st.none() | st.integers(1, 6))
    return capacity, n_layers, layers, max_write


operations = st.lists(st.one_of(
    st.tuples(st.sampled_from(["step-once", "step-per-layer", "abort"]), st.integers(1, 8)),
    st.tuples(st.just("rewind"), st.integers(0, 30)),
    st.tuples(st.just("rewind-back"), st.integers(0, 6)),
    st.tuples(st.just("clear"), st.just(0)),
    st.tuples(st.just("can-extend"), st.integers(0, 30)),
), min_size=8, max_size=60)


def build(capacity: int, n_layers: int, layers: list[RawLayer], max_write: Optional[int]) -> SequenceCache:
    return SequenceCache(CacheConfig(capacity, n_layers, [LayerConfig(LayerPolicy(Kind(k), w), h, d)
                                                          for k, w, h, d in layers], max_write=max_write))


class Lockstep:
    """Runs one program on the model and the reference, comparing every answer."""

    def __init__(self, raw: tuple[int, int, list[RawLayer], Optional[int]]) -> None:
        config = model.make_config(*raw[:3], 512, raw[3])
        assert isinstance(config, model.Config)
        self.config, self.state, self.impl = config, model.initial(config), build(*raw)
        self.impl_pools = [(None,) * self.impl.depth(layer) for layer in range(raw[1])]
        self.calls = 0

    def same(self, expected: Any, actual: Any, what: str) -> None:
        self.calls += 1
        assert expected == actual, f"{what}: model {expected!r}, reference {actual!r}"

    def observe(self) -> None:
        self.same(self.state.length, self.impl.length(), "length")
        for layer in range(len(self.config.layers)):
            self.same(model.retained_from(self.config, self.state, layer), self.impl.retained_from(layer),
                      f"retained_from({layer})")
            self.same(model.depth(self.config, layer), self.impl.depth(layer), f"depth({layer})")

    def step(self, T: int, pattern: str) -> None:
        limit = model.step_limit(self.config)
        T = min(T, limit) if limit else T
        position = self.state.length
        truth = model.step_truth(self.state, position, T)
        plans = []
        for layer in range(len(self.config.layers)):
            expected, actual = model.plan(self.config, self.state, layer, position, T), self.impl.plan(layer, position, T)
            self.same(expected, None if actual is None else as_model_plan(actual), f"plan({layer}, {position}, {T})")
            if actual is None or pattern == "abort":
                return
            self.impl_pools[layer], problems = model.execute(self.impl_pools[layer], truth, position, T,
                                                             as_model_plan(actual))
            assert problems == [], problems
            self.state, problems = model.run_layer(self.config, self.state, layer, position, T)
            assert problems == [], problems
            plans.append(actual)
            if pattern == "step-per-layer":
                self.commit(actual)
        self.commit(plans[0])

    def commit(self, plan: Any) -> None:
        after = model.commit(self.config, self.state, as_model_plan(plan))
        assert isinstance(after, model.State)
        self.state = after
        self.impl.commit(plan)

    def run(self, op: str, value: int) -> None:
        if op.startswith("step") or op == "abort":
            self.step(value, op)
        elif op.startswith("rewind"):
            target = value if op == "rewind" else max(0, self.state.length - value)
            outcome = model.rewind(self.config, self.state, target)
            assert not isinstance(outcome, model.Rejected)
            self.same(outcome[0], self.impl.rewind(target), f"rewind({target})")
            self.state = outcome[1]
        elif op == "clear":
            self.state = model.clear(self.config, self.state)
            self.impl.clear()
        else:
            self.same(model.can_extend(self.config, self.state, value), self.impl.can_extend(value),
                      f"can_extend({value})")
        self.observe()


@pytest.mark.slow
@settings(max_examples=1000)
@given(configs(), operations)
def test_model_and_reference_agree_on_every_call(raw: tuple[int, int, list[RawLayer], Optional[int]],
                                                 program: list[tuple[str, int]]) -> None:
    """DATA-SOUND, REWIND-SOUND, RETAINED, DEPTH, ADMIT, COMMIT-ADVANCE: lockstep on generated programs."""
    lockstep = Lockstep(raw)
    for op, value in program:
        lockstep.run(op, value)


@settings(max_examples=60)
@given(st.integers(1, 6), st.sampled_from([None, 1, 2, 5, 9]), st.integers(1, 3))
def test_floor_by_search_equals_reference(window: int, max_write: Optional[int], T: int) -> None:
    """REWIND-SOUND: after a long run of T-token steps, the model's floor (by search) is the reference's."""
    raw = (60, 1, [(1, window, 1, 1)], max_write)
    lockstep = Lockstep(raw)
    limit = model.step_limit(lockstep.config) or T
    while lockstep.state.length + min(T, limit) <= 40:
        lockstep.step(T, "step-once")
    floor = model.rewind_floor(lockstep.config, lockstep.state)
    if floor > 1:
        assert not lockstep.impl.rewind(floor - 1)
    lockstep.run("rewind", floor)
    assert lockstep.impl.length() == floor
    lockstep.step(1, "step-once")
