"""The op face's trim verb and attention sinks (OP-TRIM, OP-SINKS; SPEC.md part 5): the model rule by
rule, the reference's contracts (numpy here, torch in tests/test_op_torch.py), the suite on the reference
and on tests/op_standin.py's stand-in (CONFORMING, strict, within `trim` and `sinks`), each stand-in of
tests/op_trim_standins.py found with a minimal program, and the scope features `trim` and `sinks`."""

from __future__ import annotations

import json
from itertools import count
from typing import Any, Optional

import numpy as np
import pytest

from kvcache import KVCacheError, TrimError
from kvcache._op_types import mask_of
from kvcache.op import CacheConfig, CellReferenceCache, ContiguousReferenceCache, LayerPolicy
from kvcache_spec import op_model
from kvcache_spec.conformance import layouts, scope as scopes
from kvcache_spec.conformance.op import checker as op_checker
from kvcache_spec.conformance.op.programs import CONTIGUOUS_CONFIGS, op_config, random_contiguous_program, \
    trim_programs
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING, replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget

REFERENCE = "python:kvcache_spec.conformance.op.targets:contiguous"
STANDINS = "python:tests.op_trim_standins:{}"

# --- the model ------------------------------------------------------------------------------------------


def _model(*layers: dict[str, Any], max_write: Optional[int] = None, kind: str = op_model.CONTIGUOUS) -> Any:
    return op_model.make_config({"capacity": 30, "n_layers": len(layers), "n_kv_heads": 1, "head_dim": 1,
                                 "batch_size": 1, "layers": list(layers), "max_write": max_write}, kind)


UIDS = count()


def _steps(m: op_model.OpModel, *sizes: int) -> list[list[list[int]]]:
    """Contiguous steps of these sizes on every layer: each layer's attends (as positions) of the last."""
    attends: list[list[list[int]]] = []
    for q in sizes:
        start, uids = m.used(0), [next(UIDS) for _ in range(q)]
        shapes = op_model.Shapes((1, 1, q, 1), (1, 1, q, 1), (q, 1))
        answers = [m.fetch(layer, shapes, list(range(start, start + q)), uids) for layer in range(m.cfg.n_layers)]
        where = {**m.held.get(0, {})}
        attends = [[sorted(where[u] for u in query) for query in answer] for answer in answers]   # type: ignore[union-attr]
    return attends


def _owed(m: op_model.OpModel) -> list[int]:
    return [n for n in range(m.used(0) + 1) if m.snapshot().trim(n) is None]


RING4 = {"kind": "ring", "window": 4}


def test_OP_SINKS_a_query_attends_its_sinks_and_the_rest_of_its_window() -> None:
    """OP-SINKS: q < keep or q > p - (w - keep); the window holds w positions, the sinks among them; a step of
    several tokens keeps them for each of its queries; keep 0 is the plain window."""
    m = op_model.OpModel(_model({**RING4, "keep": 2}, RING4, {**RING4, "keep": 0}))
    sinks, plain, zero = _steps(m, 3, 3, 2)
    assert sinks == [[0, 1, 5, 6], [0, 1, 6, 7]]        # positions 6 and 7 of the last step
    assert plain == zero == [[3, 4, 5, 6], [4, 5, 6, 7]]


@pytest.mark.parametrize("keep", [4, 5, -1, True, 1.0, None])
def test_OP_SINKS_a_keep_not_below_the_window_is_refused(keep: Any) -> None:
    """OP-CONFIG, OP-SINKS: keep >= w (no position left for the window: mlx-lm's keep >= max_size), negative,
    or not an int; a flat layer with a keep; the cell cache keeps no sinks."""
    made = _model({**RING4, "keep": keep})
    assert isinstance(made, op_model.Rejected) and (made.rule, made.case) == ("OP-CONFIG", "keep")
    assert isinstance(_model({"kind": "flat", "window": 0, "keep": 1}), op_model.Rejected)
    assert isinstance(_model({**RING4, "keep": 1}, kind=op_model.CELL), op_model.Rejected)
    assert isinstance(_model({**RING4, "keep": 3}), op_model.OpConfig)


def test_OP_TRIM_n_is_an_int_in_zero_to_held() -> None:
    """OP-TRIM: bool, float, negative and more than held are refused, changing nothing; 0 and all are served."""
    m = op_model.OpModel(_model({"kind": "flat", "window": 0}))
    _steps(m, 3)
    before = m.snapshot()
    assert [m.trim(n).case for n in (True, 1.0, None, -1, 4)] == \
        ["n type", "n type", "n type", "n negative", "n above held"]   # type: ignore[union-attr]
    assert m.held == before.held and m.trim(0) is None and m.used(0) == 3
    assert m.trim(1) is None and m.used(0) == 2 and _steps(m, 1) == [[[0, 1, 2]]]
    assert m.trim(3) is None and m.used(0) == 0 and _steps(m, 1) == [[[0]]]


def _answers(m: op_model.OpModel) -> dict[int, str]:
    """OP-TRIM's answer for each n in [0, L] (SPEC.md OP-TRIM): owed or optional, never refused."""
    return {n: "refused" if isinstance(answer := m.trim_answer(n), op_model.Rejected) else answer
            for n in range(m.used(0) + 1)}


def _choice(m: op_model.OpModel) -> list[int]:
    return [n for n, answer in _answers(m).items() if answer == "optional"]


def test_OP_TRIM_owed_until_a_ring_may_have_dropped_a_row_then_optional_never_refused() -> None:
    """OP-TRIM: the floor F = max(F, end - (w - k - 1 + max_write)) at each step begun, min(F, L - n) at a trim;
    owed iff n = 0 or F <= k on every ring layer (nothing dropped: mlx-lm's is_trimmable), optional otherwise -
    a valid n is never refused for what a ring *may* have dropped (a cache that keeps more serves it right)."""
    ring = op_model.OpModel(_model(RING4))
    _steps(ring, 1, 1, 1)
    assert set(_answers(ring).values()) == {"owed"} and ring.floors == [0]
    _steps(ring, 1)
    assert _answers(ring) == {0: "owed", 1: "optional", 2: "optional", 3: "optional", 4: "optional"}
    assert ring.floors == [1] and _owed(ring) == [0, 1, 2, 3, 4]   # the model serves every valid n
    sinks = op_model.OpModel(_model({**RING4, "keep": 1}))
    _steps(sinks, 1, 1, 1)
    assert set(_answers(sinks).values()) == {"owed"} and sinks.floors == [1]   # F <= k: nothing dropped
    _steps(sinks, 1, 1, 1)
    assert _choice(sinks) == [1, 2, 3, 4, 5, 6] and sinks.floors == [4]
    window_one = op_model.OpModel(_model({"kind": "ring", "window": 1}))
    _steps(window_one, 3, 1)
    assert _choice(window_one) == [1, 2, 3, 4]
    flat = op_model.OpModel(_model({"kind": "flat", "window": 0}, RING4))
    _steps(flat, 1, 1)
    assert set(_answers(flat).values()) == {"owed"}


def test_OP_TRIM_a_trim_after_a_trim_is_optional_and_the_floor_stays() -> None:
    """OP-TRIM: ring(3), max_write 2, seven decodes: F = 7 - 4 = 3; trim(2) and then trim(1) are both optional
    (the second reaches position 2, which a ring of the least size overwrote); the floor does not come back.
    The reference (a ring of 4 rows) serves the first and refuses the second; the model, as a cache keeping
    more, serves both, and its next answer holds position 2."""
    m = op_model.OpModel(_model({"kind": "ring", "window": 3}, max_write=2))
    _steps(m, *[1] * 7)
    assert m.floors == [3] and m.trim_answer(2) == "optional" and m.trim(2) is None
    assert m.floors == [3] and m.trim_answer(1) == "optional" and m.trim(1) is None and m.used(0) == 4
    assert _steps(m, 1) == [[[2, 3, 4]]]
    cache = _reference(LayerPolicy.ring(3), max_write=2)
    _decode(cache, 7)
    cache.trim(2)
    before = cache._state()
    with pytest.raises(TrimError):
        cache.trim(1)
    assert cache._state() == before and cache.used(0) == 5


def test_OP_TRIM_in_the_middle_of_a_step_abandons_it_first() -> None:
    """OP-TRIM, OP-STEP: a trim is a mutating verb: the open step goes, then n counts the tokens before it;
    a refused trim leaves the open step as it was. trim(0) there is owed: it leaves the state a new step at L
    leaves (OP-STEP owes that step), even after the open step moved a ring's floor past what the query at L
    attends - issue 44's case (flat + ring(3), six decodes, a step served on the flat layer only)."""
    m = op_model.OpModel(_model({"kind": "flat", "window": 0}, RING4))
    _steps(m, 2)
    m.fetch(0, op_model.Shapes((1, 1, 1, 1), (1, 1, 1, 1), (1, 1)), [2], [next(UIDS)])
    assert (m.used(0), m.used(1)) == (3, 2)
    assert m.trim(3) is not None and m.step is not None and m.step.served == {0}
    assert m.trim(0) is None and m.step is None and (m.used(0), m.used(1)) == (2, 2) and m.abandoned == 1
    ring3 = {"kind": "ring", "window": 3}
    for max_write in (None, 1):
        m = op_model.OpModel(_model({"kind": "flat", "window": 0}, ring3, max_write=max_write))
        cache = _reference(LayerPolicy.flat(), LayerPolicy.ring(3), max_write=max_write)
        _steps(m, *[1] * 6)
        _decode(cache, 6)
        m.fetch(0, op_model.Shapes((1, 1, 1, 1), (1, 1, 1, 1), (1, 1)), [6], [next(UIDS)])
        six = np.full((1, 1, 1, 2), 6, np.float32)
        cache.update_and_fetch(0, six, six, np.array([[6]]))
        assert m.trim_answer(0) == "owed" and m.trim_answer(1) == "optional", max_write
        assert m.trim(0) is None and cache.trim(0) is None
        assert (cache.used(0), cache.used(1)) == (m.used(0), m.used(1)) == (6, 6)
        assert _steps(m, 1) == [[[0, 1, 2, 3, 4, 5, 6]], [[4, 5, 6]]]
        assert _attended(cache) == [4.0, 5.0, 6.0]


# --- the reference ------------------------------------------------------------------------------------


def _reference(*layers: LayerPolicy, max_write: Optional[int] = None) -> ContiguousReferenceCache:
    return ContiguousReferenceCache(CacheConfig(len(layers), 1, 2, 30, layers=layers, max_write=max_write))


def _decode(cache: ContiguousReferenceCache, steps: int) -> Any:
    answer = None
    for _ in range(steps):
        p = cache.used(cache.config.n_layers - 1)
        for layer in range(cache.config.n_layers):
            k = np.full((1, 1, 1, 2), p, np.float32)
            answer = cache.update_and_fetch(layer, k, k, np.array([[p]]))
    return answer


def _attended(cache: ContiguousReferenceCache) -> list[float]:
    """One more decode on every layer: the K tags (positions) the last layer's query attends, sorted."""
    k_hist, _, spec = _decode(cache, 1)
    return sorted(k_hist[0, 0, mask_of(spec, 1, k_hist.shape[2])[0], 0].tolist())


@pytest.mark.parametrize("n, error, argument", [(True, TypeError, "n"), (1.0, TypeError, "n"), (-1, ValueError, "n"),
                                                (7, ValueError, "n"), (4, TrimError, "n")])
def test_the_reference_refuses_a_trim_typed_and_changes_nothing(n: Any, error: type, argument: str) -> None:
    """OP-TRIM, OP-ATOMIC: a typed error naming n and the rule (a ring's refusal of an optional trim, its
    rows overwritten, is also a RuntimeError, as its state decides it); nothing a later call observes changes."""
    cache = _reference(LayerPolicy.flat(), LayerPolicy.ring(3), max_write=1)
    _decode(cache, 6)
    before = cache._state()
    with pytest.raises(error) as raised:
        cache.trim(n)
    assert isinstance(raised.value, KVCacheError) and (raised.value.rule, raised.value.argument) == ("OP-TRIM", argument)
    assert isinstance(raised.value, RuntimeError) == (error is TrimError)
    assert cache._state() == before


def test_the_reference_trims_agree_with_the_model_on_every_ring() -> None:
    """OP-TRIM: for each ring (window, keep, max_write), after each length, the reference serves every trim the
    model owes, refuses only optional ones - and only where its ring is laid out as one (max_write, no sinks):
    a history kept whole serves every n - and past each trim it served, its next answer is the model's."""
    for window, keep, max_write in ((4, 0, None), (4, 1, None), (4, 0, 2), (3, 2, 2), (1, 0, None), (5, 0, 1),
                                    (3, 0, 2)):
        refusals = 0
        for length in range(9):
            for n in range(length + 1):
                m = op_model.OpModel(_model({"kind": "ring", "window": window, "keep": keep}, max_write=max_write))
                _steps(m, *[1] * length)
                cache = _reference(LayerPolicy.ring(window, keep), max_write=max_write)
                _decode(cache, length)
                answer = m.trim_answer(n)
                try:
                    cache.trim(n)
                except TrimError:
                    refusals += 1
                    assert answer == "optional", (window, keep, max_write, length, n)
                    continue
                assert answer in ("owed", "optional") and m.trim(n) is None and cache.used(0) == length - n
                assert _attended(cache) == [float(p) for p in _steps(m, 1)[0][0]], (window, keep, max_write, length, n)
        assert (refusals > 0) == (max_write is not None and keep == 0 and window > 1), (window, keep, max_write)


def test_the_reference_masks_sinks_and_refuses_a_keep_at_the_window() -> None:
    """OP-SINKS: the answer's mask attends the sinks and the window's newest w - k; keep >= w is an OP-CONFIG
    error; the cell cache keeps no sinks."""
    cache = _reference(LayerPolicy.ring(4, 1), max_write=2)
    k_hist, _, spec = _decode(cache, 7)
    rows = k_hist[0, 0, :, 0][np.asarray(spec.mask)[0]]
    assert sorted(rows.tolist()) == [0.0, 4.0, 5.0, 6.0]
    for keep in (4, 5, -1, True):
        with pytest.raises(KVCacheError, match="OP-CONFIG"):
            LayerPolicy.ring(4, keep)
    with pytest.raises(KVCacheError, match="OP-CONFIG"):
        CellReferenceCache(CacheConfig(1, 1, 2, 8, layers=(LayerPolicy.ring(4, 1),)))


# --- the suite ----------------------------------------------------------------------------------------


def _report(spec: str, profile: str = "quick", strict: bool = True) -> dict[str, Any]:
    return report_json(run_suite(PythonTarget(spec), profile), strict, False)


# The reference's own run is CI's main job too (kvcache conformance on it at pre-merge): slow here, the stand-in fast.
@pytest.mark.parametrize("spec", [pytest.param(REFERENCE, marks=pytest.mark.slow), "python:tests.op_standin:contiguous"])
def test_the_reference_and_the_standin_are_conforming_strict_within_trim_and_sinks(spec: str) -> None:
    """OP-TRIM, OP-SINKS: CONFORMING (strict) in the whole scope, both rules exercised, the trim clause's
    every malformation sent, and among the programs trims past a wrapped ring, owed and optional."""
    report = _report(spec)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    assert {"OP-TRIM", "OP-SINKS"} <= set(report["coverage"]["rules"]["exercised"])
    assert {"trim", "sinks"} <= set(report["scope"]["features"]) and report["scope"]["full"]


TRIM_CHOICES = {
    # a ring that refuses what SPEC.md OP-TRIM leaves optional (mlx-lm's is_trimmable): valid; one that keeps
    # every row and serves what a ring of the least size could not give back: valid too (issue 41's false alarm)
    "ring_trim_only_unwrapped": None,
    "ring_keeps_every_row": None,
    # refused while the ring dropped nothing: over-strict; a refusal that trimmed anyway: OP-ATOMIC
    "ring_trim_refused_early": ("over-strict", "OP-TRIM"),
    "ring_trim_refusal_lowers_length": ("wrong", "OP-ATOMIC"),
}


@pytest.mark.parametrize("name", sorted(TRIM_CHOICES))
def test_a_trim_the_spec_leaves_optional_may_be_refused_and_only_that(name: str) -> None:
    """OP-TRIM's optional answer: a ring that has dropped rows may refuse a trim no later query needs undone
    (the suite follows the refusal: CONFORMING, strict); one it owes refused is over-strict, and a refusal
    that changed the cache is wrong OP-ATOMIC."""
    report = _report(STANDINS.format(name))
    expected = TRIM_CHOICES[name]
    if expected is None:
        assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
        return
    found = {(f["class"], f["rule"]) for f in report["semantic"]["findings"]}
    assert report["verdict"] == NOT_CONFORMING and expected in found, found


def test_the_programs_trim_past_a_wrapped_ring_both_ways() -> None:
    """The edge programs of each ring config trim after the ring wrapped, once and twice: the reference serves
    them (no finding), and refuses some - optional there - exactly where its rings are laid out as rings
    (max_write, no sinks, a window wider than 1); the stand-in keeping every row serves every one."""
    spec2 = scopes.parse(["spec=2"], "test")   # the stand-ins' version: chunk and recording configs are spec 3's
    for cfg in CONTIGUOUS_CONFIGS:
        if not any(entry["kind"] == "ring" for entry in cfg["layers"]) or not spec2.speaks(cfg):
            continue
        for target in (REFERENCE, STANDINS.format("ring_keeps_every_row")):
            served = refused = 0
            for name, program in trim_programs(cfg):
                if name.startswith("decodes past the window"):
                    result = layouts.run_any(PythonTarget(target), cfg, program)
                    assert result.finding is None, (name, result.finding)
                    trims = [step for step in result.steps if step["op"] == "trim"]
                    refused += sum("refused_with" in step for step in trims)
                    served += sum("refused_with" not in step for step in trims)
            as_rings = target == REFERENCE and cfg.get("max_write") is not None and any(
                entry["kind"] == "ring" and not entry.get("keep") and entry["window"] > 1 for entry in cfg["layers"])
            assert served and (refused > 0) == as_rings, (target, cfg, served, refused)


STANDIN_FINDS = {
    # (class, rule) found; how many steps its shortest program has at most; found without --strict
    "trim_lowers_length_only": (("wrong", "OP-ATTEND"), 3, True),
    "ring_trim_past_wrap": (("wrong", "OP-ATTEND"), 5, True),    # past the optional trim it served, rows lost
    "negative_trim": (("wrong", "OP-ATTEND"), 3, True),          # past the lenient trim(-1)
    "sinks_dropped_by_multi_token_step": (("wrong", "OP-ATTEND"), 4, True),
    "keep_at_window_served": (("lenient", "OP-CONFIG"), 0, False),
}


# One of the five runs by default (the default run's time); the others, OP-SINKS's among them, in the slow stage.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name != "ring_trim_past_wrap"
                                  else name for name in sorted(STANDIN_FINDS)])
def test_each_trim_and_sinks_standin_is_found_with_a_minimal_program_that_replays(name: str) -> None:
    """OP-TRIM, OP-SINKS: each defect of a real cache (tests/op_trim_standins.py) is found, its program short,
    replayed the same, and served by the correct stand-in; the wrong ones fail a run without --strict."""
    (kind_rule, longest, plain) = STANDIN_FINDS[name]
    spec = STANDINS.format(name)
    report = _report(spec)
    found = [f for f in report["semantic"]["findings"] if (f["class"], f["rule"]) == kind_rule]
    assert report["verdict"] == NOT_CONFORMING and found, [(f["class"], f["rule"]) for f in
                                                           report["semantic"]["findings"]]
    first = min(found, key=lambda f: len(f["steps"]))
    assert len(first["steps"]) <= longest, first["steps"]
    json.dumps(first)
    again = replay(spec, first["config"], first["steps"])
    assert again is not None and (again["class"], again["rule"]) == kind_rule
    assert replay("python:tests.op_standin:contiguous", first["config"], first["steps"]) is None
    assert (_report(spec, strict=False)["verdict"] == NOT_CONFORMING) == plain
    if name == "negative_trim":   # the harm past a trim the spec refuses, served
        assert any(f["after"] == "lenient OP-TRIM in trim" and f["safety"] == "SAFE-OP-ISOLATION" for f in found)
    if name == "ring_trim_past_wrap":   # an optional trim served: no lenient cause, the later answer is wrong
        assert not any(f["class"] == "lenient" for f in report["semantic"]["findings"]) and not first["after"]


# --- the scope features ---------------------------------------------------------------------------------


def test_a_target_without_trim_is_sent_no_trim_and_owes_no_op_trim() -> None:
    """Scope feature `trim`: the trims of a program are left out for a target without it (its other steps
    judged as they are), the skipped notes say so, and OP-TRIM is out of its scope."""
    cfg = op_config(8, (0,), n_layers=2)
    program = random_contiguous_program(cfg, __import__("random").Random(3), 30)
    assert any(step["op"] == "trim" for step in program)
    target = PythonTarget("python:kvcache_spec.examples.tiny_op_cache:TinyOpCache")   # declares no trim
    result = layouts.run_any(target, cfg, program)
    assert result.finding is None and not any(step["op"] == "trim" for step in result.steps)
    assert any("'trim'" in note for note in result.skipped)
    report = _report("python:kvcache_spec.examples.tiny_op_cache:TinyOpCache")
    assert "'trim'" in report["coverage"]["rules"]["out_of_scope"]["OP-TRIM"]
    assert "'sinks'" in report["coverage"]["rules"]["out_of_scope"]["OP-SINKS"]


def test_a_config_with_sinks_needs_the_sinks_feature() -> None:
    """Scope feature `sinks`: a keep > 0 needs it; keep 0 does not; a target without it must refuse such a
    config at creation (the README's tiny cache does, and is CONFORMING strict: tests/test_examples.py)."""
    assert scopes.needs(op_config(8, (4, 0), keep=1)) == {"flat", "ring", "sinks"}
    assert scopes.needs({**op_config(8, (4,)), "layers": [{**RING4, "keep": 0}]}) == {"ring"}
    assert not scopes.parse(["flat", "ring"], "test").covers(op_config(8, (4, 0), keep=1))
    assert "sinks" in scopes.LAYOUT_FEATURES["op-contiguous"] and "sinks" not in scopes.LAYOUT_FEATURES["op-cell"]


# --- the exhaustive checker -----------------------------------------------------------------------------


@pytest.mark.slow   # the exhaustive checker's depth-4 runs, as test_op_conformance's
@pytest.mark.parametrize("sinks", [False, True])
def test_the_exhaustive_checker_passes_the_reference_and_finds_each_trim_standin_shortest(sinks: bool) -> None:
    """OP-TRIM, OP-SINKS: every program to depth 4 over the alphabet with trims (a target with `trim`), on the
    flat + ring(2) config and, with --sinks, a ring(3, keep 1) + flat one: the reference and the stand-in pass,
    each broken stand-in is found with a short program (a state a trim reached is extended even when the model
    holds what it held before: a target may have kept the trimmed rows)."""
    config = op_checker.SINKS_CONFIG if sinks else None
    for correct in (REFERENCE, "python:tests.op_standin:contiguous", STANDINS.format("ring_keeps_every_row")):
        # depth 4: each stand-in shows at 4 steps or fewer; the checker's key also holds what the model let go
        # (a reset, a refusal, ...), so it runs more programs per depth than it did (issue 35)
        passed = op_checker.check(PythonTarget(correct), 4, config)
        assert not passed.findings and passed.states > 20, passed.summary()
    expected = {"trim_lowers_length_only": ("wrong", "OP-ATTEND"), "negative_trim": ("lenient", "OP-TRIM")}
    if sinks:   # the wrapped ring's lost row: on flat + ring(2) its trim is optional (no finding) and a query
        # reading the lost row comes 7 steps deep (only layer 0 takes two-token steps there)
        expected["sinks_dropped_by_multi_token_step"] = ("wrong", "OP-ATTEND")
        expected["ring_trim_past_wrap"] = ("wrong", "OP-ATTEND")
    for name, key in expected.items():
        found = op_checker.check(PythonTarget(STANDINS.format(name)), 4, config).findings
        assert key in found and len(found[key][1]) <= 4, (name, {k: len(v[1]) for k, v in found.items()})


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_trusted_args_sends_no_trim_of_an_n_outside_zero_to_held() -> None:
    """OP-TRIM under the relaxation `trusted-args`: a bad n (negative, more than held, not an int) is a call no
    model code makes, so none is sent - the negative-trim stand-in is then CONFORMING (strict) - while a trim
    past a wrapped ring is still sent (optional: the wrapped-ring stand-in serves it and answers wrong after)."""
    def judged(name: str) -> dict[str, Any]:
        target = PythonTarget(STANDINS.format(name))
        target.scope = scopes.parse(["all", "trusted-args", "spec=2"], "test")
        return report_json(run_suite(target, "quick"), True, False)
    negative = judged("negative_trim")
    assert negative["verdict"] == CONFORMING, negative["semantic"]["findings"][:1]
    assert any("'trusted-args'" in note and "trim" in note for note in negative["skipped"])
    wrapped = judged("ring_trim_past_wrap")
    assert {(f["class"], f["rule"]) for f in wrapped["semantic"]["findings"]} == {("wrong", "OP-ATTEND")}


def test_random_trims_are_well_formed_or_tagged_and_trusted_args_gets_only_well_formed_ones() -> None:
    """OP-TRIM under `trusted-args`: a random program's trim draws n within [0, held] (resolved when it runs,
    as next positions are) or is a tagged malformation - never an untagged n above held - so `sendable` drops
    every malformed trim, and a cache that trims what it can (mlx-lm's trim_prompt_cache) is CONFORMING."""
    import random
    for cfg in CONTIGUOUS_CONFIGS[:4]:
        for seed in range(6):
            program = random_contiguous_program(cfg, random.Random(seed), 40)
            result = layouts.run_any(PythonTarget(REFERENCE), cfg, program)
            for step in result.steps:
                if step["op"] == "trim" and "clause" not in step:
                    assert type(step["n"]) is int and step.get("case") is None, step
    report = _report(STANDINS.format("trims_what_it_can"))
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    assert "OP-TRIM" in report["coverage"]["rules"]["exercised"]


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_a_scope_fixing_keep_drives_twins_with_that_keep_and_needs_the_others_refused() -> None:
    """keep=N (mlx-lm's make_prompt_cache: every ring keeps 4): each ring config gets an in-scope twin whose
    rings keep N (the window part past the sinks unchanged); configs with another keep lie outside and must be
    refused at creation (SCOPE-BORDER). A keep above 0 needs `sinks`; the value is an int >= 0."""
    scope = scopes.parse(["all", "keep=4"], "test")
    assert "keep=4" in scope.names() and not scope.full_for("op-contiguous")
    spoken, _ = scopes.in_version(CONTIGUOUS_CONFIGS, scope)   # spec 2's (keep names sinks): no chunk, no recording
    inside, outside = scopes.split(scopes.with_twins(spoken, scope), scope)
    rings = [cfg for cfg in inside if any(entry["kind"] == "ring" for entry in cfg["layers"])]
    assert rings and all(entry.get("keep") == 4 for cfg in rings for entry in cfg["layers"] if entry["kind"] == "ring")
    assert all(isinstance(op_model.make_config(cfg, op_model.CONTIGUOUS), op_model.OpConfig) for cfg in inside)
    assert {entry["window"] - 4 for cfg in rings for entry in cfg["layers"] if entry["kind"] == "ring"} >= {1, 3}
    assert outside and all(scope.missing(cfg) == {"keep"} for cfg in outside)
    for bad in (["flat", "ring", "keep=4"], ["all", "keep=-1"], ["all", "keep=x"], ["all", "keep"]):
        with pytest.raises(scopes.ScopeError):
            scopes.parse(bad, "test")
    report = _report(STANDINS.format("keep_four"))
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    others = _report(STANDINS.format("keep_four_serves_others"))
    assert others["verdict"] == NOT_CONFORMING
    assert {f["rule"] for f in others["semantic"]["findings"]} == {"SCOPE-BORDER"}
