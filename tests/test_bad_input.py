"""Bad input on every public entry point: a typed error naming the argument and the rule; no state change.

Also the hostile input of issue 11: plan subclasses, config trees tampered with after creation, the
public policies under -O, the et adapter, the registries (a second session on a live key, under
threads), and every name of `kvcache.__all__`."""

from __future__ import annotations

import inspect
import itertools
import subprocess
import sys
import threading
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvcache
from kvcache import (INT_MAX, ArgumentTypeError, ArgumentValueError, CacheBuilderRegistry, CacheConfig,
                     CacheRegistry, CacheSession, ConfigError, ConfigTypeError, KVCacheError, Kind, LayerConfig,
                     LayerPolicy, PlanError, Run, SeqStepPlan, SequenceCache, et, make_unique_key)

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


def _base_has_no_faces() -> None:
    """CacheBase is concrete (upstream: every face defaults to null); a bare one serves no face."""
    base = kvcache.CacheBase()
    assert [base.as_control(), base.as_planner(), base.as_batch_control(), base.as_cell_stepper()] == [None] * 4
    _refuses(lambda: et.plan(base, 0, 0, 1), "ARG-TYPE")  # type: ignore[arg-type]


def _session_on_live_key() -> None:
    key = make_unique_key()
    with CacheSession(key, cache(2)):
        _refuses(lambda: CacheSession(key, cache(2)), "REG-SESSION")
    _refuses(lambda: CacheSession(key, object()), "ARG-TYPE")  # type: ignore[arg-type]


def _one_flat_layer() -> CacheConfig:
    return CacheConfig(capacity=4, n_layers=1, layers=[LayerConfig(LayerPolicy.flat())])


#: Bad input for every name of `kvcache.__all__`: a new export without an entry fails the test below.
#: Where the name takes no input (a constant, an error class, an abstract face) the entry says so and
#: checks what it can.
EXPORTS: dict[str, Callable[[], None]] = {
    "INT_MAX": lambda: _refuses(lambda: fresh().can_extend(INT_MAX + 1), "ARG-RANGE"),
    **{name: _is_error_class(name) for name in ("ArgumentTypeError", "ArgumentValueError", "ConfigError",
                                                 "ConfigTypeError", "KVCacheError", "LayerIndexError",
                                                 "PlanError", "StepError", "ForwardError", "CapacityError",
                                                 "TrimError")},
    "CacheBase": _base_has_no_faces,
    **{name: _is_abstract_face(name) for name in ("SequenceControl", "SequencePlanner",
                                                   "LayoutPolicy", "CacheControl", "BatchControl", "CellStepper")},
    "MAX_SEQS": lambda: _refuses(lambda: kvcache.CellCache(_one_flat_layer(), kvcache.MAX_SEQS + 1), "CELL-MAX-SEQS"),
    "CellCache": lambda: _refuses(lambda: kvcache.CellCache(_one_flat_layer(), True), "CELL-MAX-SEQS"),
    "PagedCache": lambda: _refuses(lambda: kvcache.PagedCache({"block_size": True, "num_blocks": 4, "max_model_len": 8,
                                                                "groups": [{"kind": "full"}], "prefix_caching": True}),
                                   "PAGED-CONFIG"),
    "CellStep": lambda: _refuses(lambda: kvcache.CellStep(True, 1, (0,), b"\x01"), "CELL-STEP-SHAPE"),
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


# --- hostile input (issue 11) ---------------------------------------------------------------------------

def raises(call: Callable[[], object], kind: type[KVCacheError], rule: str, argument: str) -> KVCacheError:
    with pytest.raises(kind) as caught:
        call()
    assert (caught.value.rule, caught.value.argument) == (rule, argument), caught.value
    return caught.value


# --- commit: plans are judged by exact type and field values ----------------------------------------

class AlwaysEqual(SeqStepPlan):
    """Answers True to every ==, as a hostile caller's plan could."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = SeqStepPlan.__hash__


class Shifting(SeqStepPlan):
    """`.end` grows on every read: it moved the length from 3 to 12 before ARG-TYPE refused subclasses."""

    reads = 0

    @property
    def end(self) -> int:
        Shifting.reads += 1
        return self.read_base_pos + sum(run.len for run in self.read) + 3 * Shifting.reads


class ShiftingRun(Run):
    @property
    def end(self) -> int:
        return self.start + self.len + 7


class SlipperyInt(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


def _forged(write: tuple[Any, ...], read: tuple[Any, ...], base: Any) -> SeqStepPlan:
    plan = object.__new__(SeqStepPlan)
    for name, value in (("write", write), ("read", read), ("read_base_pos", base)):
        object.__setattr__(plan, name, value)
    return plan


def _run(start: Any, length: Any, kind: type[Run] = Run) -> Run:
    run = object.__new__(kind)
    object.__setattr__(run, "start", start)
    object.__setattr__(run, "len", length)
    return run


def test_plan_subclasses_are_refused_whatever_they_answer() -> None:
    """ARG-TYPE, ATOMIC: a subclass (== always True, or an `.end` that changes between reads) is refused."""
    c = cache(12, flat())
    step(c, 3)
    before = observable(c)
    bogus = AlwaysEqual((Run(7, 2),), (Run(0, 9),), 0)
    good = c.plan(0, 3, 1)
    assert good is not None
    honest_values = Shifting(good.write, good.read, good.read_base_pos)
    for plan in (bogus, honest_values, AlwaysEqual(good.write, good.read, good.read_base_pos)):
        raises(lambda: c.commit(plan), ArgumentTypeError, "ARG-TYPE", "plan")
        assert observable(c) == before
    assert c.length() == 3


def test_plans_with_hostile_runs_or_fields_are_malformed() -> None:
    """PLAN-SHAPE, ATOMIC: Run subclasses, int subclasses and lists are not a plan's fields."""
    c = cache(12, flat())
    step(c, 3)
    before = observable(c)
    good = c.plan(0, 3, 1)
    assert good is not None
    hostile = [
        _forged((_run(3, 1, ShiftingRun),), good.read, 0),
        _forged(good.write, (_run(0, 4, ShiftingRun),), 0),
        _forged((_run(SlipperyInt(3), 1),), good.read, 0),
        _forged(good.write, good.read, SlipperyInt(0)),
        _forged(list(good.write), good.read, 0),  # type: ignore[arg-type]
        _forged(good.write, good.read, True),
    ]
    for plan in hostile:
        raises(lambda: c.commit(plan), PlanError, "PLAN-SHAPE", "plan")
        assert observable(c) == before
    c.commit(good)  # the honest plan still commits
    assert c.length() == 4


def test_the_model_refuses_plan_subclasses_too() -> None:
    """ARG-TYPE in the model: exactly its Plan type, so a subclass's own == cannot pass COMMIT-ISSUED."""
    from kvcache_spec import model

    class Agreeable(model.Plan):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = model.Plan.__hash__

    config = model.make_config(8, 1, [(model.FLAT, 0, 1, 1)])
    assert isinstance(config, model.Config)
    state = model.initial(config)
    assert model.commit(config, state, Agreeable(((5, 1),), ((0, 6),), 0)) == model.Rejected("ARG-TYPE", "plan")
    assert isinstance(model.commit(config, state, model.Plan(((0, 1),), ((0, 1),), 0)), model.State)


# --- SequenceCache(config): the whole tree, validated and copied --------------------------------------

def _tampered(change: Callable[[CacheConfig], None]) -> CacheConfig:
    config = CacheConfig(8, 2, [LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(4))])
    change(config)
    return config


TAMPERINGS: dict[str, tuple[Callable[[CacheConfig], None], type[KVCacheError], str, str]] = {
    "kind replaced by a string": (lambda c: object.__setattr__(c.layers[1].policy, "kind", "ring"),
                                  ConfigTypeError, "CFG-POLICY", "CacheConfig.layers[1].policy.kind"),
    "flat window 5": (lambda c: object.__setattr__(c.layers[0].policy, "window", 5),
                      ConfigError, "CFG-POLICY", "CacheConfig.layers[0].policy.window"),
    "ring window 0": (lambda c: object.__setattr__(c.layers[1].policy, "window", 0),
                      ConfigError, "CFG-POLICY", "CacheConfig.layers[1].policy.window"),
    "ring window bool": (lambda c: object.__setattr__(c.layers[1].policy, "window", True),
                         ConfigTypeError, "CFG-POLICY", "CacheConfig.layers[1].policy.window"),
    "n_kv_heads -1": (lambda c: object.__setattr__(c.layers[0], "n_kv_heads", -1),
                      ConfigError, "CFG-SHAPE", "CacheConfig.layers[0].n_kv_heads"),
    "head_dim float": (lambda c: object.__setattr__(c.layers[1], "head_dim", 2.0),
                       ConfigTypeError, "CFG-SHAPE", "CacheConfig.layers[1].head_dim"),
    "policy None": (lambda c: object.__setattr__(c.layers[0], "policy", None),
                    ConfigTypeError, "CFG-POLICY", "CacheConfig.layers[0].policy"),
    "layer None": (lambda c: object.__setattr__(c, "layers", (c.layers[0], None)),
                   ConfigTypeError, "CFG-LAYERS", "CacheConfig.layers[1]"),
    "layers a dict": (lambda c: object.__setattr__(c, "layers", {0: c.layers[0]}),
                      ConfigTypeError, "CFG-LAYERS", "CacheConfig.layers"),
    "three layers for two": (lambda c: object.__setattr__(c, "layers", (*c.layers, c.layers[0])),
                             ConfigError, "CFG-LAYERS", "CacheConfig.layers"),
    "capacity bool": (lambda c: object.__setattr__(c, "capacity", True),
                      ConfigTypeError, "CFG-CAPACITY", "CacheConfig.capacity"),
    "max_write 0": (lambda c: object.__setattr__(c, "max_write", 0),
                    ConfigError, "CFG-MAX-WRITE", "CacheConfig.max_write"),
}


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_a_tampered_config_tree_is_refused(name: str) -> None:
    """CFG-TYPE and the field's rule: a config changed after creation, at any depth, is refused."""
    change, kind, rule, argument = TAMPERINGS[name]
    config = _tampered(change)
    raises(lambda: SequenceCache(config), kind, rule, argument)


def test_the_cache_keeps_its_own_copy_of_the_config() -> None:
    """CFG-TYPE: the caller's objects changed after the cache was built cannot reach it."""
    layers = [LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(4))]
    config = CacheConfig(8, 2, layers, max_write=2)
    c = SequenceCache(config)
    before = (observable(c), [c.depth(i) for i in range(2)], c.plan(1, 0, 2))
    layers.append(LayerConfig(LayerPolicy.ring(1)))  # the list given to CacheConfig
    object.__setattr__(config.layers[1].policy, "window", 100)
    object.__setattr__(config.layers[0].policy, "kind", Kind.RING)
    object.__setattr__(config, "capacity", 2)
    object.__setattr__(config, "max_write", 7)
    assert (observable(c), [c.depth(i) for i in range(2)], c.plan(1, 0, 2)) == before
    assert c.config is not config and c.config.layers[1].policy.window == 4


# --- the public policies, under python -O too --------------------------------------------------------

POLICY_PROBE = """
import kvcache
from kvcache import FlatPolicy, RingPolicy
calls = [
    lambda: FlatPolicy().depth(0), lambda: FlatPolicy().depth(True), lambda: RingPolicy(4).plan(0, 9),
    lambda: RingPolicy(4).plan(0, 0), lambda: RingPolicy(4).plan(-1, 1), lambda: FlatPolicy().plan(1.0, 1),
    lambda: FlatPolicy().plan(2**31 - 1, 1), lambda: RingPolicy(2).read_base(-1),
    lambda: FlatPolicy().retained_after_write(3, 1), lambda: RingPolicy(3).retained_after_write(0, "9"),
    lambda: RingPolicy(0), lambda: RingPolicy(3, max_write=False),
]
for call in calls:
    try:
        print("no error", call())
    except kvcache.KVCacheError as error:
        print(type(error).__name__, error.rule, error.argument)
"""

POLICY_ERRORS = [
    "ArgumentValueError CFG-CAPACITY capacity", "ArgumentTypeError ARG-INT capacity",
    "ArgumentValueError STEP-T-MAX T", "ArgumentValueError STEP-T T", "ArgumentValueError ARG-RANGE position",
    "ArgumentTypeError ARG-INT position", "ArgumentValueError ARG-RANGE T", "ArgumentValueError ARG-RANGE position",
    "ArgumentValueError ARG-RANGE retained", "ArgumentTypeError ARG-INT end",
    "ConfigError CFG-POLICY RingPolicy.window", "ConfigError CFG-MAX-WRITE RingPolicy.max_write",
]


@pytest.mark.parametrize("flags", [[], ["-O"]])
def test_public_policies_raise_typed_errors_with_and_without_O(flags: list[str]) -> None:
    """FlatPolicy and RingPolicy are public: their preconditions are typed errors that stay under -O."""
    result = subprocess.run([sys.executable, *flags, "-c", POLICY_PROBE], capture_output=True, text=True,
                            check=True)
    assert result.stdout.splitlines() == POLICY_ERRORS


# --- the et adapter -------------------------------------------------------------------------------------

def test_et_refuses_what_is_not_a_cache() -> None:
    """ARG-TYPE: et.plan / et.rewind take a cache's face, not anything with a similar name."""
    for value in (None, "cache", 3, object()):
        raises(lambda: et.plan(value, 0, 0, 1), ArgumentTypeError, "ARG-TYPE", "planner")  # type: ignore[arg-type]
        raises(lambda: et.rewind(value, 0), ArgumentTypeError, "ARG-TYPE", "control")  # type: ignore[arg-type]


def test_et_result_holds_exactly_one_thing() -> None:
    """ET-MAP: a Result's error is an Error member; a value with Ok, or no value with another error."""
    for error in (0, 0x20, "NotFound", None, 1.0):
        raises(lambda: et.Result(_error=error), ArgumentTypeError, "ET-MAP", "_error")  # type: ignore[arg-type]
    raises(lambda: et.Result(), ArgumentValueError, "ET-MAP", "_value")
    raises(lambda: et.Result(cache(2), et.Error.NotFound), ArgumentValueError, "ET-MAP", "_value")
    raises(lambda: et.Result(_error=et.Error.NotFound).get(), ArgumentValueError, "ET-MAP", "result")
    assert et.Result(_error=et.Error.NotFound).error() is et.Error.NotFound


# --- registries -----------------------------------------------------------------------------------------

def test_unregister_checks_its_arguments() -> None:
    """ARG-TYPE: unregister's keys are strings, as register's are."""
    raises(lambda: CacheBuilderRegistry.unregister(1, "k"), ArgumentTypeError, "ARG-TYPE", "backend_id")  # type: ignore[arg-type]
    raises(lambda: CacheBuilderRegistry.unregister("b", None), ArgumentTypeError, "ARG-TYPE", "kind")  # type: ignore[arg-type]


@pytest.mark.parametrize("built", [None, "a cache", 3, object()])
def test_a_builder_that_returns_no_cache_is_named(built: object) -> None:
    """ARG-TYPE: build() fails naming the builder's pair when the builder returns something else."""
    CacheBuilderRegistry.register("hostile", "kind", lambda: built)  # type: ignore[arg-type,return-value]
    try:
        error = raises(lambda: CacheBuilderRegistry.build("hostile", "kind"), ArgumentTypeError, "ARG-TYPE", "builder")
        assert (error.values["backend_id"], error.values["kind"]) == ("hostile", "kind")
        assert "hostile" in str(error) and "kind" in str(error)
    finally:
        CacheBuilderRegistry.unregister("hostile", "kind")


def test_a_second_session_on_a_live_key_is_refused() -> None:
    """REG-SESSION, ATOMIC: nested sessions on one key: the second is refused and the first keeps its entry."""
    key = make_unique_key()
    with CacheSession(key, cache(4)) as outer:
        raises(lambda: CacheSession(key, cache(5)), ArgumentValueError, "REG-SESSION", "key")
        assert CacheRegistry.get(key) is outer.cache
        with CacheSession(make_unique_key(), cache(6)):
            assert CacheRegistry.get(key) is outer.cache
    assert CacheRegistry.get(key) is None
    CacheRegistry.install(key, cache(2))  # a key installed directly is live too
    try:
        raises(lambda: CacheSession(key, cache(5)), ArgumentValueError, "REG-SESSION", "key")
    finally:
        CacheRegistry.erase(key)


def test_a_session_never_erases_another_entry() -> None:
    """REG-SESSION: on exit a session erases its key only while the key still holds its own cache."""
    key = make_unique_key()
    session = CacheSession(key, cache(4))
    replacement = cache(5)
    CacheRegistry.install(key, replacement)  # someone overwrote the key inside the block
    session.close()
    try:
        assert CacheRegistry.get(key) is replacement
    finally:
        CacheRegistry.erase(key)


def test_sessions_on_shared_keys_under_threads() -> None:
    """REG-SESSION, THREADS: 8 threads x 5000 sessions on 4 shared keys: a session is either refused with
    REG-SESSION or owns its key for its whole `with` block; no thread ever finds its cache missing."""
    keys = [make_unique_key() for _ in range(4)]
    caches = [cache(2) for _ in range(8)]
    missing: list[str] = []
    counts = {"opened": 0, "refused": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        mine = caches[index]
        opened = refused = 0
        barrier.wait()
        for key in itertools.islice(itertools.cycle(keys[index % 4:] + keys[:index % 4]), 5000):
            try:
                session = CacheSession(key, mine)
            except ArgumentValueError as error:
                assert error.rule == "REG-SESSION"
                refused += 1
                continue
            with session:
                opened += 1
                for _ in range(2):
                    if CacheRegistry.get(key) is not mine:
                        missing.append(key)
        with lock:
            counts["opened"] += opened
            counts["refused"] += refused

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert missing == []
    assert counts["opened"] + counts["refused"] == 40000 and counts["opened"] > 0
    assert all(CacheRegistry.get(key) is None for key in keys)
