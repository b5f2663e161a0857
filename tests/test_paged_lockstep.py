"""The paged reference and the paged model in lockstep (Hypothesis stateful): every call goes to both, and
`PagedLockstep` (kvcache_proofs.paged_checker, also the exhaustive checker's harness) acts as the model runner -
it writes each reserved position's fingerprint and judges what the reference shows by the model's functions:
the hit and n it allows, the data every live request reads back, the books, nothing changed by a refusal or a
rejected call (with the model's rule and argument)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kvcache_proofs.paged_checker import Call, PagedLockstep, PagedSpec

NAMES = st.sampled_from(["r0", "r1", "r2", "r3"])
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=9)
WINDOWS = st.sampled_from([(None,), (2,), (None, 3), (1, None), (4,)])
# Bad values, each of which some argument refuses.
BAD = st.sampled_from([True, -1, 2**31, 1.5, "x", None, [], [True], [-1], [1.5]])


class PagedMachine(RuleBasedStateMachine):
    """PAGED-DATA-SOUND, PAGED-HIT, PAGED-HIT-GROUPS, PAGED-RESERVE, PAGED-SHARE-FULL, PAGED-NO-REWRITE,
    PAGED-REFCOUNT, PAGED-EVICT, PAGED-CONSERVE, PAGED-ATOMIC, PAGED-FREE, PAGED-WINDOW-RELEASE, PAGED-IDLE-FIT,
    PAGED-ARGS: the reference against the model, call by call."""

    lock: PagedLockstep

    @initialize(size=st.integers(1, 3), blocks=st.integers(1, 12), windows=WINDOWS, caching=st.booleans(),
                max_len=st.integers(3, 12))
    def create(self, size: int, blocks: int, windows: tuple[Any, ...], caching: bool, max_len: int) -> None:
        self.lock = PagedLockstep(PagedSpec(size, blocks, windows, caching, max_len))

    def _apply(self, verb: str, *args: Any) -> None:
        problems = self.lock.apply(Call(verb, args))
        assert not problems, problems

    @rule(name=NAMES, tokens=TOKENS, keys=st.sampled_from([[], ["k"], ["k", "img"]]), budget=st.integers(1, 10))
    def admit(self, name: str, tokens: list[int], keys: list[str], budget: int) -> None:
        self._apply("admit", name, tokens, keys, budget)

    @rule(name=NAMES, tokens=st.lists(st.integers(0, 2), max_size=2), budget=st.integers(1, 4))
    def extend(self, name: str, tokens: list[int], budget: int) -> None:
        self._apply("extend", name, tokens, budget)

    @rule(name=NAMES)
    def free(self, name: str) -> None:
        self._apply("free", name)

    @rule(name=NAMES)
    def table(self, name: str) -> None:
        self._apply("table", name)

    @rule(name=NAMES, bad=BAD, where=st.integers(0, 3))
    def malformed_admit(self, name: str, bad: Any, where: int) -> None:
        args: list[Any] = [name, [0, 1], [], 2]
        args[where] = bad
        self._apply("admit", *args)

    @rule(name=NAMES, bad=BAD, where=st.integers(1, 2))
    def malformed_extend(self, name: str, bad: Any, where: int) -> None:
        args: list[Any] = [name, [0], 1]
        args[where] = bad
        self._apply("extend", *args)


PagedMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_reference_and_model_in_lockstep = PagedMachine.TestCase


def test_the_harness_finds_a_broken_target() -> None:
    """The lockstep harness is not blind: a target whose refusal keeps a block fails PAGED-ATOMIC / CONSERVE."""
    from kvcache.paged import PagedCache

    class Leaky(PagedCache):
        def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Any:
            result = super().admit(request, tokens, keys, budget)
            if result is None and self._pool.free:
                self._pool.hold([next(iter(self._pool.free))])
            return result

    lock = PagedLockstep(PagedSpec(2, 3, (None,), True, 8), Leaky)
    assert not lock.apply(Call("admit", ("a", [1, 2, 3, 4], [], 9)))
    problems = lock.apply(Call("admit", ("b", [5, 6, 7], [], 9)))
    assert problems and problems[0].startswith("PAGED-ATOMIC"), problems


@pytest.mark.parametrize("call, rule", [(Call("free", ("a",)), "PAGED-FREE"),
                                        (Call("admit", ("b", [], [], 1)), "PAGED-ARGS")])
def test_a_rejection_must_name_the_model_s_rule(call: Call, rule: str) -> None:
    """The reference names the model's rule and argument for each rejected call (the harness compares them)."""
    lock = PagedLockstep(PagedSpec(2, 3, (None,), True, 8))
    assert not lock.apply(call)
