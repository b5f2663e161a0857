"""Bad input on every public entry point: a typed error naming the argument and the rule; no state change."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvcache
from kvcache import (INT_MAX, ArgumentTypeError, CacheBuilderRegistry, CacheConfig, CacheRegistry, CacheSession,
                     ConfigError, KVCacheError, LayerConfig, LayerPolicy, PlanError, Run, SeqStepPlan, SequenceCache,
                     et, make_unique_key)

from .conftest import cache, flat, ring, step

junk = st.one_of(st.booleans(), st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.just([1]),
                 st.just((0,)), st.integers(-2**70, -1), st.integers(INT_MAX + 1, 2**70), st.just(1j))


def observable(c: SequenceCache) -> tuple[object, ...]:
    return (c.length(), tuple(c.retained_from(i) for i in range(c.n_layers)), c._open_step, c.can_extend(1))


def fresh() -> SequenceCache:
    c = cache(12, flat(), ring(3))
    step(c, 2)
    step(c, 3)
    return c


ENTRY_POINTS: dict[str, Callable[[SequenceCache, Any], object]] = {
    "can_extend(n)": lambda c, v: c.can_extend(v),
    "rewind(new_len)": lambda c, v: c.rewind(v),
    "plan(layer)": lambda c, v: c.plan(v, 5, 1),
    "plan(position)": lambda c, v: c.plan(0, v, 1),
    "plan(T)": lambda c, v: c.plan(0, 5, v),
    "commit(plan)": lambda c, v: c.commit(v),
    "depth(layer)": lambda c, v: c.depth(v),
    "retained_from(layer)": lambda c, v: c.retained_from(v),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@given(value=junk)
def test_junk_raises_a_typed_error_and_changes_nothing(entry: str, value: Any) -> None:
    """ARG-INT, ARG-RANGE, ARG-TYPE, ATOMIC: junk in, typed error out, state untouched."""
    c = fresh()
    before = observable(c)
    with pytest.raises(KVCacheError) as caught:
        ENTRY_POINTS[entry](c, value)
    assert caught.value.rule in {"ARG-INT", "ARG-RANGE", "ARG-TYPE", "STEP-T", "LAYER-RANGE"}
    assert caught.value.argument in entry
    assert observable(c) == before


@given(capacity=junk, n_layers=junk, initial=junk, max_write=junk.filter(lambda v: v is not None))
def test_broken_config_fields(capacity: Any, n_layers: Any, initial: Any, max_write: Any) -> None:
    """CFG-*: a broken field is a ConfigError naming it, whatever else is right."""
    good = {"capacity": 8, "n_layers": 1, "layers": [flat()], "initial_capacity": 0, "max_write": None}
    for name, value in (("capacity", capacity), ("n_layers", n_layers), ("initial_capacity", initial),
                        ("max_write", max_write)):
        with pytest.raises(ConfigError) as caught:
            CacheConfig(**{**good, name: value})
        assert caught.value.argument == f"CacheConfig.{name}"


@given(window=junk)
def test_broken_policy_and_shape(window: Any) -> None:
    """CFG-POLICY, CFG-SHAPE: windows and shapes are checked at construction."""
    with pytest.raises(ConfigError):
        LayerPolicy.ring(window)
    with pytest.raises(ConfigError):
        LayerConfig(LayerPolicy.flat(), window, 1)


@given(start=junk, length=junk)
def test_malformed_runs_and_plans(start: Any, length: Any) -> None:
    """PLAN-SHAPE: Run and SeqStepPlan check their fields on creation."""
    with pytest.raises(PlanError):
        Run(start, 1)
    with pytest.raises(PlanError):
        Run(0, length)
    with pytest.raises(PlanError):
        SeqStepPlan((Run(0, 1),), (Run(0, 1),), start)
    for runs in [(), (Run(0, 1),) * 3, [Run(0, 1)], (0, 1)]:
        with pytest.raises(PlanError):
            SeqStepPlan(runs, (Run(0, 1),), 0)  # type: ignore[arg-type]


def test_forged_plans_never_commit() -> None:
    """COMMIT-ISSUED: every single-field change of a valid plan is refused, and changes nothing."""
    c = fresh()
    good = c.plan(1, 5, 2)
    assert good is not None
    before = observable(c)
    forgeries = [SeqStepPlan(good.write, good.read, base) for base in range(0, 12) if base != good.read_base_pos]
    forgeries += [SeqStepPlan((Run(s, n),), good.read, good.read_base_pos) for s in range(6) for n in (1, 2, 3)
                  if (Run(s, n),) != good.write]
    for forged in forgeries:
        with pytest.raises(PlanError):
            c.commit(forged)
        assert observable(c) == before


def test_registry_rejects_bad_keys_and_values() -> None:
    """ARG-TYPE: registry keys are strings; values are caches; builders are callable."""
    for call in (lambda: CacheRegistry.install(1, cache(2)), lambda: CacheRegistry.install("k", object()),
                 lambda: CacheRegistry.get(None), lambda: CacheBuilderRegistry.register("a", "b", 3),
                 lambda: CacheBuilderRegistry.build(("a",), "b"), lambda: CacheSession(b"k", cache(2))):
        with pytest.raises(ArgumentTypeError):
            call()  # type: ignore[no-untyped-call]


OPTIMIZED_PROBE = """
import kvcache
from kvcache import SequenceCache, CacheConfig, LayerConfig, LayerPolicy
assert not __debug__
c = SequenceCache(CacheConfig(4, 1, [LayerConfig(LayerPolicy.flat())]))
for call in (lambda: c.plan(True, 0, 1), lambda: c.plan(3, 0, 1), lambda: c.rewind(-1), lambda: c.plan(0, 2, 1)):
    try:
        call()
    except kvcache.KVCacheError as error:
        print(error.rule)
"""


def test_validation_survives_python_O() -> None:
    """Preconditions (input validation) stay enabled under -O; only self-checks vanish."""
    result = subprocess.run([sys.executable, "-O", "-c", OPTIMIZED_PROBE], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["ARG-INT", "LAYER-RANGE", "ARG-RANGE", "STEP-APPEND"]


def test_attributes_cannot_be_deleted() -> None:
    """`del` on the cache or a ring policy is refused before it can break an invariant (and CrossHair
    confirms the invariants at __delattr__ because of it)."""
    c = fresh()
    before = observable(c)
    for name in ("_length", "_retained", "_open_step", "config", "unknown"):
        with pytest.raises(AttributeError, match="cannot be deleted"):
            delattr(c, name)
    assert observable(c) == before
    policy = c.policy(1)
    for name in ("window", "n_slots"):
        with pytest.raises(AttributeError, match="cannot be deleted"):
            delattr(policy, name)
    assert c.plan(1, 5, 1) is not None and policy.n_slots == 5  # window 3, max_write 3


# --- every exported name ------------------------------------------------------------------------------

def _refuses(call: Callable[[], object], rule: str) -> None:
    with pytest.raises(KVCacheError) as caught:
        call()
    assert caught.value.rule == rule, caught.value


def _is_error_class(name: str) -> Callable[[], None]:
    def check() -> None:
        kind = getattr(kvcache, name)
        assert issubclass(kind, KVCacheError)
        error = kind("ARG-INT", "n", "must be an int", value=True)
        assert (error.rule, error.argument, error.values) == ("ARG-INT", "n", {"value": True})
    return check


def _is_abstract_face(name: str) -> Callable[[], None]:
    def check() -> None:
        assert inspect.isabstract(getattr(kvcache, name))  # cannot be built; the et adapter refuses non-faces
        _refuses(lambda: et.plan(object(), 0, 0, 1), "ARG-TYPE")  # type: ignore[arg-type]
    return check


def _session_on_live_key() -> None:
    key = make_unique_key()
    with CacheSession(key, cache(2)):
        _refuses(lambda: CacheSession(key, cache(2)), "REG-SESSION")
    _refuses(lambda: CacheSession(key, object()), "ARG-TYPE")  # type: ignore[arg-type]


#: Bad input for every name of `kvcache.__all__`: a new export without an entry fails the test below.
#: Where the name takes no input (a constant, an error class, an abstract face) the entry says so and
#: checks what it can.
EXPORTS: dict[str, Callable[[], None]] = {
    "INT_MAX": lambda: _refuses(lambda: fresh().can_extend(INT_MAX + 1), "ARG-RANGE"),
    **{name: _is_error_class(name) for name in ("ArgumentTypeError", "ArgumentValueError", "ConfigError",
                                                 "ConfigTypeError", "KVCacheError", "LayerIndexError",
                                                 "PlanError", "StepError")},
    **{name: _is_abstract_face(name) for name in ("CacheBase", "SequenceControl", "SequencePlanner",
                                                   "LayoutPolicy")},
    "CacheBuilderRegistry": lambda: _refuses(lambda: CacheBuilderRegistry.unregister(None, "k"), "ARG-TYPE"),  # type: ignore[arg-type]
    "CacheRegistry": lambda: _refuses(lambda: CacheRegistry.install("k", "not a cache"), "ARG-TYPE"),  # type: ignore[arg-type]
    "CacheSession": _session_on_live_key,
    "CacheConfig": lambda: _refuses(lambda: CacheConfig(8, 1, "flat"), "CFG-LAYERS"),  # type: ignore[arg-type]
    "LayerConfig": lambda: _refuses(lambda: LayerConfig("flat"), "CFG-POLICY"),  # type: ignore[arg-type]
    "LayerPolicy": lambda: _refuses(lambda: LayerPolicy("ring", 4), "CFG-POLICY"),  # type: ignore[arg-type]
    "Kind": lambda: _refuses(lambda: LayerPolicy(1, 4), "CFG-POLICY"),  # type: ignore[arg-type]  # an int is no Kind
    "Run": lambda: _refuses(lambda: Run(0, True), "PLAN-SHAPE"),
    "SeqStepPlan": lambda: _refuses(lambda: SeqStepPlan((Run(0, 1),), (Run(0, 1),), -1), "PLAN-SHAPE"),
    "SequenceCache": lambda: _refuses(lambda: SequenceCache({"capacity": 8}), "CFG-TYPE"),  # type: ignore[arg-type]
    "FlatPolicy": lambda: _refuses(lambda: kvcache.FlatPolicy().depth(0), "CFG-CAPACITY"),
    "RingPolicy": lambda: _refuses(lambda: kvcache.RingPolicy(4).plan(0, 9), "STEP-T-MAX"),
    "make_unique_key": lambda: None if make_unique_key() != make_unique_key() else pytest.fail("keys repeat"),
}


@pytest.mark.parametrize("name", sorted(kvcache.__all__))
def test_every_export_has_bad_input_coverage(name: str) -> None:
    """Every exported name: a typed error for bad input (or, for names that take none, what holds instead)."""
    assert name in EXPORTS, f"kvcache exports {name} but tests/test_bad_input.py has no bad-input case for it"
    EXPORTS[name]()


def test_plan_subclasses_and_tampered_trees_are_covered() -> None:
    """The nested config tree and plan subclasses: the cases live in tests/test_hostile_input.py."""
    from . import test_hostile_input as hostile
    assert {"policy None", "kind replaced by a string", "n_kv_heads -1", "flat window 5"} <= set(hostile.TAMPERINGS)
    assert issubclass(hostile.AlwaysEqual, SeqStepPlan) and issubclass(hostile.Shifting, SeqStepPlan)
