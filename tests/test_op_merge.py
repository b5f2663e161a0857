"""extend and extract on the op face (OP-ROWS, scope feature `merge`, spec 5; spec/conformance/op/merge.py): the
side cache's verbs on a python: target and over the wire, the programs as a target without the feature is sent
them, the reference serving every merge program (in process and served), its quick strict run CONFORMING with
extends and extracts served and refused, and each stand-in of spec/conformance/zoo/op_merge.py (and the lenient
one of extract's row clause) found with a short program."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache import KVCacheError
from kvcache.op import CacheConfig, ContiguousReferenceCache, LayerPolicy
from kvcache_spec import op_model
from kvcache_spec.conformance import layouts
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.op import merge
from kvcache_spec.conformance.op import targets as op_targets
from kvcache_spec.conformance.op.engine import OpEngine
from kvcache_spec.conformance.op.programs import (CONTIGUOUS_CONFIGS, MERGE_OPS, SWAP, extend, extract, forward,
                                                  merge_programs, op_config, sent_contiguous)
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.suite.plan import without_missing_verbs
from kvcache_spec.conformance.targets import FEATURE_METHODS, PythonTarget, parse_target
from kvcache_spec.conformance.zoo.op_merge import FOUND_AS
from tests.standin_found import assert_found_short

REFERENCE = "python:kvcache_spec.conformance.op.targets:contiguous"
STANDINS = "python:kvcache_spec.conformance.zoo.op_merge:{}"
BATCH_CONFIG = next(cfg for cfg in CONTIGUOUS_CONFIGS if cfg["batch_size"] == 3)
ONE_LAYER = op_config(8, (0,), batch=2)


def _run(spec: str, cfg: Any, program: list[Any], scope: Any = None) -> Any:
    return OpEngine(PythonTarget(spec), cfg, op_model.CONTIGUOUS, scope).run(program)


# --- the scope feature -----------------------------------------------------------------------------------

def test_merge_is_a_spec_5_feature_of_the_contiguous_layout_that_batch_verbs_leaves_out() -> None:
    assert scopes.version_of("merge") == 5 and "merge" in scopes.LAYOUT_FEATURES["op-contiguous"]
    assert "merge" not in scopes.INCLUDES.get("batch-verbs", frozenset())
    assert "merge" not in scopes.parse(["batch-verbs"], "test").features   # a library's batch verbs: as before
    assert "merge" in scopes.parse([f"spec={scopes.CURRENT_VERSION}"], "test").features
    assert {method for method, feature in FEATURE_METHODS.items() if feature == "merge"} == \
        {"aside", "swap", "extend", "extract"}


def test_a_target_without_merge_is_sent_no_merge_step_and_layout_sent_agrees() -> None:
    program = forward(ONE_LAYER, 1) + [extend(1), extract(0), SWAP] + forward(ONE_LAYER, 1)
    spec4 = scopes.parse(["spec=4"], "test")
    bare = [step for step in program if step["op"] not in MERGE_OPS]
    assert sent_contiguous(program, spec4) == bare
    assert layouts.get("op-contiguous").sent is sent_contiguous
    assert sent_contiguous(program, scopes.parse(["spec=5"], "test")) == program
    assert layouts.get("op-cell").sent is not None and layouts.get("op-cell").sent(program, spec4) == bare


def test_a_spec_4_target_is_judged_on_no_merge_and_says_so() -> None:
    """A stand-in whose extend drops the appended rows' pads passes every merge program when it declares spec 4:
    the steps are left out (a skipped note), the rest judged as before."""
    spec4 = scopes.parse(["spec=4"], "test")
    for cfg in (BATCH_CONFIG, ONE_LAYER):
        for name, program in merge_programs(cfg):
            result = _run(STANDINS.format("extend_drops_pads"), cfg, program, spec4)
            assert result.finding is None, (name, result.finding)
            assert all(step["op"] not in MERGE_OPS for step in result.steps)
            assert any("extend, extract and swap steps not sent" in note for note in result.skipped), name


class _NoMerge(ContiguousReferenceCache):
    extend = None   # type: ignore[assignment]   # a spec-5 cache of a library that has no extend


def no_merge(cfg: Any) -> _NoMerge:
    return _NoMerge(op_targets.contiguous(cfg).config)


no_merge.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
no_merge.kvcache_scope = ("spec=5",)   # type: ignore[attr-defined]


def test_a_python_cache_without_extend_and_extract_is_not_judged_on_merge() -> None:
    """As one without quantize is not judged on quantize: the scope the run judges by leaves `merge` out, saying
    why; the reference keeps it."""
    target = PythonTarget(f"python:{__name__}:no_merge")
    judged = without_missing_verbs(target, target.scope, CONTIGUOUS_CONFIGS)
    assert "merge" in target.scope.features and "merge" not in judged.features and "batch-verbs" in judged.features
    assert "no extend and extract methods" in judged.source
    reference = PythonTarget(REFERENCE)
    assert "merge" in without_missing_verbs(reference, reference.scope, CONTIGUOUS_CONFIGS).features


# --- the side cache's verbs ------------------------------------------------------------------------------

def test_the_python_target_holds_a_side_cache_through_aside_swap_extend_extract() -> None:
    target = PythonTarget(REFERENCE)
    assert target.create(ONE_LAYER).ok
    live = target.cache
    assert target.call("aside", {}).ok and target.cache is None and target.side is live
    assert not target.call("extract", {"row": 0}).ok   # no live cache
    assert target.create({**ONE_LAYER, "batch_size": 1}).ok and target.side is live   # create: the live one only
    other = target.cache
    assert target.call("swap", {}).ok and (target.cache, target.side) == (live, other)
    assert target.call("extend", {}).ok and live.config.batch_size == 3 and other.config.batch_size == 1
    assert target.call("extract", {"row": 2}).ok and target.side is not other and target.side.config.batch_size == 1
    assert live.config.batch_size == 3   # the live cache unchanged
    bad = target.call("extract", {"row": 3})
    assert not bad.ok and "OP-ROWS" in bad.error
    target.fresh()
    assert target.side is None


def test_the_reference_extends_mid_step_as_the_model_does() -> None:
    """OP-ROWS, OP-STEP: an open step of this cache is abandoned first, so another cache holding the positions before
    it is of the same length (the model serves it; the reference compared its length with the open step in it)."""
    config = CacheConfig(n_layers=2, n_kv_heads=1, head_dim=1, capacity=8, batch_size=1,
                         layers=[LayerPolicy.flat(), LayerPolicy.flat()])
    import numpy as np
    cache, other = ContiguousReferenceCache(config), ContiguousReferenceCache(config)
    one = np.ones((1, 1, 1, 1), np.float32)
    for layer in (0, 1):
        cache.update_and_fetch(layer, one, one, np.array([[0]]))
        other.update_and_fetch(layer, one, one, np.array([[0]]))
    cache.update_and_fetch(0, one, one, np.array([[1]]))   # a step open: layer 0 served
    cache.extend(other)
    assert cache.config.batch_size == 2 and cache.used(0) == 1 and cache.used(1) == 1
    with pytest.raises(KVCacheError, match="OP-ROWS"):   # the other's open step: refused
        other.update_and_fetch(0, one, one, np.array([[1]]))
        cache.extend(other)


# --- the suite's programs on the reference ------------------------------------------------------------------

def test_every_contiguous_config_has_merge_programs_the_reference_serves() -> None:
    before = dict(merge.MERGED)
    for cfg in CONTIGUOUS_CONFIGS:
        programs = dict(merge_programs(cfg))
        assert {"extend after decodes, pads on both sides", "extract, swap back, decode",
                "an extend of another config refused", "an extend of another length refused"} <= set(programs)
        assert any(name.startswith("extend of a ring") for name in programs) == \
            any(entry["kind"] == "ring" for entry in cfg["layers"])
        for name, program in programs.items():
            result = _run(REFERENCE, cfg, program)
            assert result.finding is None and not result.unjudged, (name, result.finding, result.skipped)
            assert "OP-ROWS" in result.exercised, name
    served = {key: merge.MERGED[key] - before[key] for key in before}
    assert served["extend"] > 100 and served["extract"] > 60 and served["refused"] > 40, served


def test_the_served_reference_serves_merge_programs_over_the_wire() -> None:
    """The protocol server keeps the side cache of the python: target it serves (PROTOCOL.md: aside, swap, extend,
    extract): the programs with each verb run over the wire as in process."""
    target = parse_target(REFERENCE, isolate=True)
    try:
        assert "merge" in target.declared_scope().features   # its hello (the process started)
        programs = dict(merge_programs(BATCH_CONFIG))
        for name in ("extend after decodes, pads on both sides", "extract, swap back, decode",
                     "an extend of another config refused", "malformed op.extract.row bool"):
            result = OpEngine(target, BATCH_CONFIG, op_model.CONTIGUOUS).run(programs[name])
            assert result.finding is None and not result.unjudged, (name, result.finding)
            assert any(step["op"] in MERGE_OPS for step in result.steps), name
    finally:
        target.close()


def test_a_swap_with_nothing_beside_is_not_sent_and_an_extend_past_the_batch_bound_is_not_judged() -> None:
    result = _run(REFERENCE, ONE_LAYER, [SWAP] + forward(ONE_LAYER, 1))
    assert result.finding is None and [step["op"] for step in result.steps] == ["fetch"]
    result = _run(REFERENCE, ONE_LAYER, forward(ONE_LAYER, 1) + [extend(7)] + forward(ONE_LAYER, 1))
    assert result.finding is None and result.unjudged and any("more than 8 rows" in note for note in result.skipped)


def test_an_extend_by_a_cache_of_another_capacity_is_not_judged_on_an_unbounded_target() -> None:
    """SCOPE-UNBOUNDED: a target without capacity has nothing to refuse it by (mlx-lm's batch caches grow): the
    program ends there, said; a bounded one owes the refusal."""
    program = forward(ONE_LAYER, 1) + [extend(1, form="foreign-config")] + forward(ONE_LAYER, 1)
    result = _run(REFERENCE, ONE_LAYER, program, scopes.parse(["spec=5", "unbounded"], "test"))
    assert result.finding is None and [step["op"] for step in result.steps] == ["fetch"]
    assert any("another capacity not judged" in note for note in result.skipped)
    result = _run(REFERENCE, ONE_LAYER, program)
    assert result.finding is None and [step["op"] for step in result.steps] == ["fetch", "extend", "fetch"]


def test_a_read_after_an_extend_judges_the_appended_rows_pads() -> None:
    """The appended rows keep their pads: a stand-in that drops them is wrong at the next read (OP-PAD), the
    program's three steps."""
    program = forward(ONE_LAYER, 2) + [extend(1, [1])] + forward(ONE_LAYER, 1)
    assert _run(REFERENCE, ONE_LAYER, program).finding is None
    found = _run(STANDINS.format("extend_drops_pads"), ONE_LAYER, program).finding
    assert found is not None and (found.kind, found.rule, found.step_index) == ("wrong", "OP-PAD", 2)


# --- the suite's run: the reference, the stand-ins -------------------------------------------------------

@pytest.mark.slow   # the reference's quick run, ~30 s (CI's conformance job runs it at pre-merge)
def test_the_reference_is_conforming_strict_with_merge_in_scope() -> None:
    before = dict(merge.MERGED)
    report = report_json(run_suite(PythonTarget(REFERENCE), "quick"), True, False)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    assert "merge" in report["scope"]["features"] and "OP-ROWS" in report["coverage"]["rules"]["exercised"]
    assert {f"op.extract.row {variant}" for variant in ("-1", "n", "bool", "float", "huge")} <= \
        set(report["coverage"]["clauses"]["exercised"])
    ran = {key: merge.MERGED[key] - before[key] for key in before}
    assert ran["extend"] and ran["extract"] and ran["refused"], ran


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name != "extend_drops_pads"
                                  else name for name in sorted(FOUND_AS)])
def test_each_merge_standin_is_found_with_a_short_program_that_replays(name: str) -> None:
    """OP-ROWS: each stand-in is found as FOUND_AS says, with a program of at most 4 steps, replayed the same; the
    reference serves that program with no finding."""
    assert_found_short(STANDINS.format(name), FOUND_AS[name], REFERENCE)


@pytest.mark.slow   # a quick run, ~30 s
def test_a_target_accepting_a_malformed_extract_row_is_found_lenient() -> None:
    assert_found_short("python:tests.lenient_standin:op.extract.row", ("lenient", "OP-ROWS"), REFERENCE)


# --- the exhaustive checker ---------------------------------------------------------------------------------

@pytest.mark.slow   # ~25 s for the reference, ~20 s a stand-in
def test_the_exhaustive_checker_finds_each_merge_standin_within_4_steps() -> None:
    """--merge: every program to depth 4 over one ring of 2 with extends, extracts and swaps: the reference passes
    (thousands of states); each stand-in is found as FOUND_AS says, with a program of at most 4 steps that merges."""
    from kvcache_spec.conformance.op import checker as op_checker

    config = op_checker.EXTRA_CONFIGS["merge"]
    passed = op_checker.check(PythonTarget(REFERENCE), 4, config)
    assert not passed.findings and passed.states > 2000, passed.summary()
    for name in sorted(FOUND_AS):
        found = op_checker.check(PythonTarget(STANDINS.format(name)), 4, config)
        assert FOUND_AS[name] in found.findings, (name, found.summary())
        steps = found.findings[FOUND_AS[name]][1]
        assert len(steps) <= 4 and any(step["op"] in ("extend", "extract") for step in steps), steps
