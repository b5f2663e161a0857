"""Every number of upstream's unit tests (ExecuTorch extension/llm/cache/test/cache_test.cpp), reproduced."""

from __future__ import annotations

import pytest

from kvcache import (CacheBuilderRegistry, CacheConfig, CacheRegistry, CacheSession, LayerConfig, LayerPolicy,
                     RingPolicy, Run, SeqStepPlan, SequenceCache, StepError, ArgumentValueError,
                     make_unique_key)
from kvcache import et

from .conftest import cache, flat, ring, step


def runs(*pairs: tuple[int, int]) -> tuple[Run, ...]:
    return tuple(Run(start, length) for start, length in pairs)


# --- flat -----------------------------------------------------------------------------------------

def test_flat_plan_appends_and_reads_all_history() -> None:
    c = cache(8)
    p = c.plan(0, 0, 4)
    assert p == SeqStepPlan(runs((0, 4)), runs((0, 4)), 0)
    c.commit(p)
    q = c.plan(0, 4, 1)
    assert q is not None and q.write == runs((4, 1)) and sum(r.len for r in q.read) == 5


def test_flat_admission_on_capacity_two() -> None:
    c = cache(2)
    assert c.can_extend(2)
    p = c.plan(0, 0, 2)
    assert p is not None
    c.commit(p)
    assert not c.can_extend(1)
    assert c.plan(0, 2, 1) is None


def test_flat_rewind_and_clear() -> None:
    c = cache(8)
    step(c, 5)
    assert c.rewind(0)
    assert not c.rewind(1)
    c.clear()
    assert c.can_extend(8)


def test_face_recovery() -> None:
    c = cache(4)
    control, planner = c.as_control(), c.as_planner()
    assert control is not None and planner is not None and control is planner is c
    assert control.can_extend(4)
    p = planner.plan(0, 0, 1)
    assert p is not None and sum(r.len for r in p.read) == 1


def test_et_adapter_on_capacity_two() -> None:
    c = cache(2)
    result = et.plan(c, 0, 0, 2)
    assert result.ok() and sum(r.len for r in result.get().read) == 2
    c.commit(result.get())
    assert et.plan(c, 0, 2, 1).error() is et.Error.OutOfResources
    assert not et.plan(c, 5, 0, 1).ok()
    assert et.rewind(c, 9) is et.Error.InvalidArgument
    assert et.rewind(c, 1) is et.Error.Ok


# --- registry ---------------------------------------------------------------------------------------

def test_registry_install_get_erase() -> None:
    key = make_unique_key()
    assert CacheRegistry.get(key) is None
    c = cache(16)
    CacheRegistry.install(key, c)
    got = CacheRegistry.get(key)
    assert got is c and got.as_control().can_extend(16)
    CacheRegistry.erase(key)
    assert CacheRegistry.get(key) is None
    assert make_unique_key() != make_unique_key()


def test_builder_registry() -> None:
    CacheBuilderRegistry.register("TestBackend", "seq", lambda: cache(32))
    try:
        built = CacheBuilderRegistry.build("TestBackend", "seq")
        assert built.ok() and built.get().as_control().capacity() == 32
        assert CacheBuilderRegistry.build("TestBackend", "missing").error() is et.Error.NotFound
    finally:
        CacheBuilderRegistry.unregister("TestBackend", "seq")


def test_session_scope() -> None:
    key = make_unique_key()
    with CacheSession(key, cache(8)) as session:
        assert CacheRegistry.get(key) is session.cache
        assert session.control().capacity() == 8
    assert CacheRegistry.get(key) is None


# --- ring -------------------------------------------------------------------------------------------

def test_ring_first_step() -> None:
    c = cache(100, ring(4))
    assert c.plan(0, 0, 4) == SeqStepPlan(runs((0, 4)), runs((0, 4)), 0)


def test_ring_layout_at_seven_on_the_policy() -> None:
    """LAYOUT-CANON: a layout fact, checked on RingPolicy directly."""
    assert RingPolicy(4).plan(7, 1) == SeqStepPlan(runs((0, 1)), runs((4, 3), (0, 1)), 4)


def test_ring_layout_at_seven_on_the_cache() -> None:
    """The same plan from the cache after stepping to 7 (one prefill of 4, then decode)."""
    c = cache(100, ring(4))
    step(c, 4)
    for _ in range(3):
        step(c, 1)
    assert c.plan(0, 7, 1) == SeqStepPlan(runs((0, 1)), runs((4, 3), (0, 1)), 4)


def test_ring_with_max_write_eight() -> None:
    policy = RingPolicy(4, 8)
    assert policy.plan(8, 8) == SeqStepPlan(runs((8, 3), (0, 5)), runs((5, 6), (0, 5)), 5)
    assert policy.plan(20, 1) == SeqStepPlan(runs((9, 1)), runs((6, 4)), 17)


def test_ring_refuses_five_tokens() -> None:
    """Upstream refuses (nullopt); here T > max_write is a caller error (STEP-T-MAX), InvalidArgument in et."""
    c = cache(100, ring(4))
    with pytest.raises(ArgumentValueError) as caught:
        c.plan(0, 0, 5)
    assert caught.value.rule == "STEP-T-MAX"
    assert et.plan(c, 0, 0, 5).error() is et.Error.InvalidArgument


def test_mixed_commit_once_admission() -> None:
    c = cache(100, flat(), ring(4))
    plans = [c.plan(layer, 0, 3) for layer in (0, 1)]
    assert all(p is not None for p in plans)
    c.commit(plans[0])  # type: ignore[arg-type]
    assert c.can_extend(97) and not c.can_extend(98)


@pytest.mark.parametrize("pattern", ["once", "per-layer"])
def test_mixed_rewind_after_ten(pattern: str) -> None:
    c = cache(100, flat(), ring(4))
    for _ in range(5):
        step(c, 2, pattern)
    assert c.length() == 10
    assert not c.rewind(5)
    assert c.rewind(6)
    assert not c.rewind(11)


def test_mixed_per_layer_second_layer_plans_below_length() -> None:
    """The MLX pattern: layer 1 plans at a position already below the committed length."""
    c = cache(100, flat(), ring(4))
    p0 = c.plan(0, 0, 3)
    assert p0 is not None
    c.commit(p0)
    assert c.length() == 3
    p1 = c.plan(1, 0, 3)
    assert p1 is not None
    c.commit(p1)
    assert c.length() == 3
    with pytest.raises(StepError):
        c.plan(1, 1, 2)
