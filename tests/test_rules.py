"""One or more unit tests per rule of spec/rules.py; each docstring starts with the rule id it guards."""

from __future__ import annotations

import dataclasses

import pytest

from kvcache import (ArgumentTypeError, ArgumentValueError, CacheConfig, ConfigError, ConfigTypeError, FlatPolicy,
                     Kind, LayerConfig, LayerIndexError, LayerPolicy, PlanError, RingPolicy, Run, SeqStepPlan,
                     SequenceCache, StepError, et)

from .backend import TagBackend
from .conftest import cache, flat, ring, step


def state(c: SequenceCache) -> tuple[object, ...]:
    """Everything a caller can observe."""
    return (c.length(), c.capacity(), tuple(c.retained_from(i) for i in range(c.n_layers)),
            tuple(c.depth(i) for i in range(c.n_layers)), c._open_step)


# --- DATA-SOUND -----------------------------------------------------------------------------------

@pytest.mark.parametrize("layers,max_write", [((flat(),), None), ((ring(4),), None), ((ring(4),), 8),
                                              ((ring(4),), 1), ((flat(), ring(3), ring(5)), 2), ((ring(1),), None)])
@pytest.mark.parametrize("pattern", ["once", "per-layer"])
def test_DATA_SOUND_every_read_of_a_long_run(layers: tuple[LayerConfig, ...], max_write: int, pattern: str) -> None:
    """DATA-SOUND: steps, wraps, rewinds to every accepted target and clear never read a wrong row."""
    backend = TagBackend(cache(40, *layers, max_write=max_write))
    limit = backend.cache._step_limit or 40
    sizes = [min(limit, T) for T in (3, 1, 2, 1, 1, 4, 1, 2)]
    for round_ in range(3):
        for T in sizes:
            backend.step(T, pattern)
        for target in range(backend.cache.length(), -1, -1):
            if target % 3 == round_ and backend.rewind(target):
                backend.step(1, pattern)
    backend.clear()
    backend.step(min(limit, 2), pattern)
    assert backend.problems == []


# --- configuration --------------------------------------------------------------------------------

def test_CFG_TYPE_config_must_be_a_cache_config() -> None:
    """CFG-TYPE: SequenceCache takes a CacheConfig, and re-checks one tampered with after creation."""
    with pytest.raises(ConfigTypeError) as caught:
        SequenceCache("capacity=8")  # type: ignore[arg-type]
    assert caught.value.rule == "CFG-TYPE"
    config = CacheConfig(8, 1, [flat()])
    object.__setattr__(config, "capacity", 0)
    with pytest.raises(ConfigError) as caught:
        SequenceCache(config)
    assert caught.value.rule == "CFG-CAPACITY"


@pytest.mark.parametrize("build,rule,field", [
    (lambda: CacheConfig(0, 1, [flat()]), "CFG-CAPACITY", "CacheConfig.capacity"),
    (lambda: CacheConfig(True, 1, [flat()]), "CFG-CAPACITY", "CacheConfig.capacity"),
    (lambda: CacheConfig(2**31, 1, [flat()]), "CFG-CAPACITY", "CacheConfig.capacity"),
    (lambda: CacheConfig(8, 0, [flat()]), "CFG-LAYERS", "CacheConfig.n_layers"),
    (lambda: CacheConfig(8, 3, [flat(), flat()]), "CFG-LAYERS", "CacheConfig.layers"),
    (lambda: CacheConfig(8, 1, []), "CFG-LAYERS", "CacheConfig.layers"),
    (lambda: CacheConfig(8, 1, [LayerPolicy.flat()]), "CFG-LAYERS", "CacheConfig.layers[0]"),
    (lambda: LayerPolicy(Kind.FLAT, 3), "CFG-POLICY", "LayerPolicy.window"),
    (lambda: LayerPolicy.ring(0), "CFG-POLICY", "LayerPolicy.window"),
    (lambda: LayerPolicy(1, 4), "CFG-POLICY", "LayerPolicy.kind"),  # type: ignore[arg-type]
    (lambda: CacheConfig(8, 1, [flat()], max_write=0), "CFG-MAX-WRITE", "CacheConfig.max_write"),
    (lambda: LayerConfig(LayerPolicy.flat(), 0, 4), "CFG-SHAPE", "LayerConfig.n_kv_heads"),
    (lambda: LayerConfig(LayerPolicy.flat(), 2, -1), "CFG-SHAPE", "LayerConfig.head_dim"),
    (lambda: CacheConfig(8, 1, [flat()], initial_capacity=-1), "CFG-INITIAL-CAPACITY",
     "CacheConfig.initial_capacity"),
    (lambda: RingPolicy(0), "CFG-POLICY", "RingPolicy.window"),
    (lambda: RingPolicy(4, False), "CFG-MAX-WRITE", "RingPolicy.max_write"),
])
def test_CFG_each_violation_names_its_field(build: object, rule: str, field: str) -> None:
    """CFG-CAPACITY, CFG-LAYERS, CFG-POLICY, CFG-MAX-WRITE, CFG-SHAPE, CFG-INITIAL-CAPACITY: errors at construction."""
    with pytest.raises(ConfigError) as caught:
        build()  # type: ignore[operator]
    assert (caught.value.rule, caught.value.argument) == (rule, field)
    assert rule in str(caught.value) and field in str(caught.value)


def test_CFG_DEDUP_equal_policies_share_one_object() -> None:
    """CFG-DEDUP: equal policies share an object; each layer's layout depends only on its own policy."""
    c = cache(20, ring(4), flat(), ring(4), ring(8))
    assert c.policy(0) is c.policy(2)
    assert c.policy(0) is not c.policy(3) and c.policy(1) is not c.policy(0)
    alone = cache(20, ring(8))
    for _ in range(6):
        step(c, 3)
        step(alone, 3)
        assert c.plan(3, c.length(), 2) == alone.plan(0, alone.length(), 2)
        assert c.retained_from(3) == alone.retained_from(0)


def test_CFG_MAX_WRITE_applies_to_ring_layers_only() -> None:
    """CFG-MAX-WRITE: a flat-only model ignores max_write; a ring layer's max_write defaults to its window."""
    assert cache(8, flat(), max_write=1).plan(0, 0, 5) is not None
    assert cache(8, ring(3)).policy(0) == RingPolicy(3, 3)


# --- arguments ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,argument", [
    (lambda c: c.plan(True, 0, 1), "layer"), (lambda c: c.plan(0, 0.0, 1), "position"),
    (lambda c: c.plan(0, 0, False), "T"), (lambda c: c.can_extend(True), "n"),
    (lambda c: c.rewind(1.0), "new_len"), (lambda c: c.depth("0"), "layer"),
    (lambda c: c.retained_from(None), "layer"),
])
def test_ARG_INT_bool_and_floats_are_not_ints(call: object, argument: str) -> None:
    """ARG-INT: every integer argument is an int, and bool is not."""
    c = cache(8)
    with pytest.raises(ArgumentTypeError) as caught:
        call(c)  # type: ignore[operator]
    assert (caught.value.rule, caught.value.argument) == ("ARG-INT", argument)


@pytest.mark.parametrize("call,argument", [
    (lambda c: c.plan(0, -1, 1), "position"), (lambda c: c.plan(0, 2**31, 1), "position"),
    (lambda c: c.can_extend(-1), "n"), (lambda c: c.can_extend(2**40), "n"),
    (lambda c: c.rewind(-1), "new_len"), (lambda c: c.rewind(2**63), "new_len"),
])
def test_ARG_RANGE_negatives_and_huge_values(call: object, argument: str) -> None:
    """ARG-RANGE: negatives and values past INT_MAX are caller errors, not refusals."""
    c = cache(8)
    with pytest.raises(ArgumentValueError) as caught:
        call(c)  # type: ignore[operator]
    assert (caught.value.rule, caught.value.argument) == ("ARG-RANGE", argument)


def test_ARG_TYPE_commit_takes_a_plan() -> None:
    """ARG-TYPE: commit of something that is not a SeqStepPlan."""
    with pytest.raises(ArgumentTypeError) as caught:
        cache(8).commit(((0, 1), (0, 1), 0))  # type: ignore[arg-type]
    assert caught.value.rule == "ARG-TYPE"


@pytest.mark.parametrize("call", [lambda c: c.plan(2, 0, 1), lambda c: c.plan(-1, 0, 1),
                                  lambda c: c.depth(2), lambda c: c.depth(-1), lambda c: c.retained_from(7)])
def test_LAYER_RANGE_on_plan_depth_and_retained_from(call: object) -> None:
    """LAYER-RANGE: layer bounds on plan, depth and retained_from alike."""
    with pytest.raises(LayerIndexError) as caught:
        call(cache(8, flat(), ring(2)))  # type: ignore[operator]
    assert caught.value.rule == "LAYER-RANGE" and isinstance(caught.value, IndexError)


# --- length and admission -------------------------------------------------------------------------

def test_LEN_BOUNDS_one_length_for_every_layer() -> None:
    """LEN-BOUNDS: the length is the model's, never a layer's, and never passes the capacity."""
    c = cache(6, ring(2), flat())
    step(c, 2)
    step(c, 2)
    step(c, 2)
    assert c.length() == 6 and c.retained_from(0) == 3 and c.retained_from(1) == 0  # ring of 3 slots
    assert c.plan(0, 6, 1) is None and c.length() == 6


@pytest.mark.parametrize("layers", [(flat(),), (ring(8),), (flat(), ring(8))])
def test_ADMIT_exactly_the_capacity_is_admitted(layers: tuple[LayerConfig, ...]) -> None:
    """ADMIT: an input of exactly the capacity is admitted; one more token is refused (None, not an error)."""
    c = cache(8, *layers)
    assert c.can_extend(8) and not c.can_extend(9) and c.can_extend(0)
    assert c.plan(0, 0, 8) is not None
    step(c, 5)
    assert c.plan(0, 5, 3) is not None and c.plan(0, 5, 4) is None
    assert c.can_extend(3) and not c.can_extend(4)


# --- steps ----------------------------------------------------------------------------------------

def test_STEP_T_zero_tokens_is_an_error() -> None:
    """STEP-T: T >= 1."""
    with pytest.raises(ArgumentValueError) as caught:
        cache(8).plan(0, 0, 0)
    assert caught.value.rule == "STEP-T"


def test_STEP_T_MAX_binds_every_layer_of_the_step() -> None:
    """STEP-T-MAX: T above a ring layer's max_write is an error on that layer and on its flat neighbours."""
    c = cache(50, flat(), ring(4), max_write=2)
    for layer in (0, 1):
        with pytest.raises(ArgumentValueError) as caught:
            c.plan(layer, 0, 3)
        assert caught.value.rule == "STEP-T-MAX"
    assert c.plan(1, 0, 2) is not None


def test_STEP_APPEND_gap_overlap_and_other_T() -> None:
    """STEP-APPEND: a step starts at the length; the open step may be planned again, only as it was."""
    c = cache(20, flat(), ring(4))
    step(c, 3, "per-layer")
    assert c.plan(0, 0, 3) is not None  # the open step, as the per-layer pattern needs
    for position, T in [(4, 1), (2, 1), (1, 2), (0, 2), (0, 4)]:
        with pytest.raises(StepError) as caught:
            c.plan(1, position, T)
        assert caught.value.rule == "STEP-APPEND"
    step(c, 1)
    with pytest.raises(StepError):
        c.plan(0, 0, 3)  # a step no longer open


def test_PLAN_PURE_planning_changes_nothing() -> None:
    """PLAN-PURE: any number of plans, of any admissible size, on any layer, leave the state as it was."""
    c = cache(12, flat(), ring(3))
    step(c, 2)
    before = state(c)
    for layer in (0, 1):
        for T in (1, 2, 3):
            c.plan(layer, 2, T)
        c.plan(layer, 0, 2)
    assert state(c) == before


@pytest.mark.parametrize("window,max_write", [(1, None), (3, None), (4, 8), (4, 1), (7, 3), (30, None)])
def test_PLAN_SHAPE_WRITE_READ_and_LAYOUT_CANON_for_every_position(window: int, max_write: int) -> None:
    """PLAN-SHAPE, PLAN-WRITE, PLAN-READ, LAYOUT-CANON: every plan of a ring, at every position and size."""
    policy = RingPolicy(window, max_write)
    slots = window + policy.max_write - 1
    for position in range(0, 3 * slots):
        for T in range(1, policy.max_write + 1):
            plan = policy.plan(position, T)
            assert 1 <= plan.n_write <= 2 and 1 <= plan.n_read <= 2
            rows = [r.start + i for r in plan.write for i in range(r.len)]
            assert rows == [q % slots for q in range(position, position + T)]
            assert plan.read_base_pos == max(0, position - window + 1)
            read = [r.start + i for r in plan.read for i in range(r.len)]
            assert read == [q % slots for q in range(plan.read_base_pos, position + T)]
            assert all(0 <= row < slots for row in rows + read)


def test_PLAN_READ_flat_reads_all_history() -> None:
    """PLAN-READ, LAYOUT-CANON: flat writes at the position and reads from 0."""
    assert FlatPolicy().plan(5, 3) == SeqStepPlan((Run(5, 3),), (Run(0, 8),), 0)


def test_DEPTH_flat_ring_and_ring_wider_than_capacity() -> None:
    """DEPTH: capacity for flat; window + max_write - 1 for ring, or the capacity when that is smaller."""
    c = cache(10, flat(), ring(4), ring(6), ring(20), max_write=3)
    assert [c.depth(layer) for layer in range(4)] == [10, 6, 8, 10]


# --- commit ---------------------------------------------------------------------------------------

def test_COMMIT_ISSUED_forged_stale_and_foreign_plans() -> None:
    """COMMIT-ISSUED: only a plan this cache issues for the current step is accepted."""
    c = cache(20, ring(4))
    step(c, 4)
    stale = c.plan(0, 4, 2)
    assert stale is not None
    good = c.plan(0, 4, 1)
    assert good is not None
    forged = dataclasses.replace(good, write=(Run(3, 1),))
    foreign = FlatPolicy().plan(4, 1)
    c.commit(good)
    before = state(c)
    for bad in (forged, foreign, stale):
        with pytest.raises(PlanError) as caught:
            c.commit(bad)
        assert caught.value.rule == "COMMIT-ISSUED" and state(c) == before
    assert c.rewind(4)
    with pytest.raises(PlanError):
        c.commit(dataclasses.replace(good, read_base_pos=2))
    malformed = SeqStepPlan((Run(0, 1),), (Run(0, 1),), 0)
    object.__setattr__(malformed, "write", ())
    with pytest.raises(PlanError) as caught:
        c.commit(malformed)
    assert caught.value.rule == "PLAN-SHAPE"


def test_COMMIT_ADVANCE_idempotent_within_the_step() -> None:
    """COMMIT-ADVANCE: the first commit moves the length to position + T; the rest change nothing."""
    c = cache(20, flat(), ring(4))
    plans = [c.plan(layer, 0, 3) for layer in (0, 1)]
    for plan in plans + plans:
        assert plan is not None
        c.commit(plan)
        assert c.length() == 3
    assert c._open_step == (0, 3)


def test_PROTO_COMMIT_rewind_mid_step_is_caught_by_the_step_rule() -> None:
    """PROTO-COMMIT: a rewind between a step's per-layer commits closes the step, so the rest cannot plan it."""
    c = cache(20, flat(), ring(4))
    p0 = c.plan(0, 0, 3)
    assert p0 is not None
    c.commit(p0)
    assert c.rewind(3)
    with pytest.raises(StepError):
        c.plan(1, 0, 3)


# --- rollback -------------------------------------------------------------------------------------

def test_REWIND_GROW_refused_and_nothing_changes() -> None:
    """REWIND-GROW, ATOMIC: growth is refused (False) and the state is exactly as it was."""
    c = cache(20, ring(4))
    step(c, 3)
    before = state(c)
    assert not c.rewind(4) and state(c) == before
    assert c.rewind(3) and c.length() == 3


def test_REWIND_SOUND_max_write_below_window_refuses_upstream_floor() -> None:
    """REWIND-SOUND: with max_write < window upstream's floor max(0, L - w) would read overwritten rows."""
    backend = TagBackend(cache(40, ring(4), max_write=1))
    for _ in range(8):
        backend.step(1)
    c = backend.cache
    assert c.retained_from(0) == 4
    assert not c.rewind(8 - 4)  # upstream accepts this one
    # ... and it is right to refuse: a step at 4 on these rows reads overwritten ones.
    trial = TagBackend(cache(40, ring(4), max_write=1))
    trial.pools, trial.truth = list(backend.pools), backend.truth[:4]
    trial.execute(0, RingPolicy(4, 1).plan(4, 1), tag=99)
    assert any(problem.startswith("DATA-SOUND") for problem in trial.problems)


def test_REWIND_SOUND_floor_values() -> None:
    """REWIND-SOUND: the accepted targets are {0} and [floor, length]; floor from the retained rows."""
    def accepted(c: SequenceCache) -> list[int]:
        length, result = c.length(), []
        for target in range(length + 1):
            snapshot = (c.length(), c._open_step, list(c._retained))
            if c.rewind(target):
                result.append(target)
                c._length, c._open_step, c._retained = snapshot
        return result

    under = cache(40, ring(4), max_write=1)       # S = 4
    over = cache(40, ring(4), max_write=8)        # S = 11: upstream refuses 12..15
    for c in (under, over):
        for _ in range(20):
            step(c, 1)
    assert accepted(under) == [0] + list(range(19, 21))
    assert accepted(over) == [0] + list(range(12, 21))


def test_REWIND_SOUND_chains_of_rewinds_remember_overwritten_rows() -> None:
    """REWIND-SOUND: after rewinding 20 -> 16, rows below 13 are still gone; 16 -> 12 must be refused."""
    backend = TagBackend(cache(40, ring(4)))
    for _ in range(20):
        backend.step(1)
    assert backend.rewind(16)
    assert not backend.rewind(12)  # upstream's max(0, 16 - 4) = 12 accepts it
    assert backend.rewind(0)
    backend.step(2)
    assert backend.problems == []


def test_ATOMIC_errors_leave_the_state_as_it_was() -> None:
    """ATOMIC: every caller error and refusal leaves the state exactly as it was."""
    c = cache(4, flat(), ring(3))
    step(c, 2)
    before = state(c)
    for call in (lambda: c.plan(0, 3, 1), lambda: c.plan(5, 2, 1), lambda: c.rewind(-2),
                 lambda: c.commit(FlatPolicy().plan(5, 1)), lambda: c.plan(0, 2, 4), lambda: c.can_extend(-1)):
        with pytest.raises((ArgumentValueError, ArgumentTypeError)):
            call()
        assert state(c) == before
    assert not c.rewind(3) and c.plan(0, 2, 3) is None and state(c) == before


def test_RETAINED_oldest_intact_row() -> None:
    """RETAINED: 0 while nothing wrapped; then length - ring size; never above the length."""
    c = cache(40, ring(3), flat(), max_write=2)  # S = 4
    seen = []
    for _ in range(6):
        step(c, 1)
        seen.append((c.length(), c.retained_from(0), c.retained_from(1)))
    assert seen == [(1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0), (5, 1, 0), (6, 2, 0)]
    assert c.rewind(0) and c.retained_from(0) == 0


def test_CLEAR_forgets_history() -> None:
    """CLEAR: length 0, no open step, nothing retained; the cache serves a new sequence."""
    c = cache(10, ring(2))
    for _ in range(5):
        step(c, 2)
    c.clear()
    assert (c.length(), c.retained_from(0), c._open_step) == (0, 0, None)
    with pytest.raises(StepError):
        c.plan(0, 8, 2)
    assert c.can_extend(10) and c.plan(0, 0, 2) is not None


def test_FACES_one_object() -> None:
    """FACES: the runner's and the backend's face are the same object."""
    c = cache(4)
    assert c.as_control() is c.as_planner() is c


def test_ET_MAP_refusal_and_caller_errors() -> None:
    """ET-MAP: refusal -> OutOfResources; caller error -> InvalidArgument (upstream: OutOfResources for a bad layer)."""
    c = cache(2)
    assert et.plan(c, 0, 0, 3).error() is et.Error.OutOfResources
    assert et.plan(c, 5, 0, 1).error() is et.Error.InvalidArgument
    assert et.plan(c, 0, 1, 1).error() is et.Error.InvalidArgument
    assert et.rewind(c, -1) is et.Error.InvalidArgument and et.rewind(c, 0) is et.Error.Ok
