"""Hostile input (issue 11): plan subclasses, tampered config trees, the public policies under -O, the
et adapter and the registries. Each case: a typed KVCacheError naming the argument and the rule, and
the state exactly as it was."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from typing import Any, Callable

import pytest

import kvcache
from kvcache import (ArgumentTypeError, ArgumentValueError, CacheBuilderRegistry, CacheConfig, CacheRegistry,
                     CacheSession, ConfigError, ConfigTypeError, KVCacheError, Kind, LayerConfig, LayerPolicy,
                     PlanError, Run, SeqStepPlan, SequenceCache, et, make_unique_key)

from .conftest import cache, flat, ring, step
from .test_bad_input import fresh, observable


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
