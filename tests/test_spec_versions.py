"""Spec versions (scope.py SPEC_VERSIONS; SPEC.md 6.1, SCOPE-VERSION): a target is judged on the features of the
spec version it declares, and a cache written against the previous release keeps its verdict after an upgrade
(issue 41 point 4). The C++ twin of these tests is in tests/test_cpp_op_target.py (Scope::full())."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.op.programs import CONTIGUOUS_CONFIGS
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget, parse_target

PREVIOUS = "python:tests.previous_release:{}"


def _report(spec: str) -> dict[str, Any]:
    target = parse_target(spec)
    try:
        return report_json(run_suite(target, "quick"), True, False)
    finally:
        target.close()


# --- the versions table ---------------------------------------------------------------------------------


def test_every_feature_is_added_by_exactly_one_version_and_versions_only_add() -> None:
    # SCOPE-VERSION: the version table itself
    added = [feature for _, features in scopes.SPEC_VERSIONS.values() for feature in features]
    assert sorted(added) == sorted(scopes.EVERY_FEATURE) and len(added) == len(set(added))
    assert list(scopes.SPEC_VERSIONS) == list(range(scopes.FIRST_VERSION, scopes.CURRENT_VERSION + 1))
    assert scopes.features_of(1) < scopes.features_of(2) < scopes.features_of(3) < scopes.features_of(4) < \
        scopes.features_of(5) == frozenset(scopes.EVERY_FEATURE)
    assert scopes.version_of("trim") == scopes.version_of("sinks") == 2 and scopes.version_of("batch") == 1
    assert scopes.version_of("chunk") == scopes.version_of("recording") == 3
    assert scopes.version_of("pad") == scopes.version_of("batch-verbs") == scopes.version_of("select") == 4
    assert scopes.version_of("seq-state") == 5   # the recompute face's saved sequence (CELL-STATE, issue 42)
    assert scopes.later_keys(1) == {"keep", "chunk"} and scopes.later_keys(2) == {"chunk"}
    assert not scopes.later_keys(scopes.CURRENT_VERSION)


def test_batch_verbs_include_select_and_select_alone_is_sent_no_reorder_nor_repeat() -> None:
    """`select` is select(rows) alone (mlx-lm's BatchGenerator filters rows, never reorders nor repeats them);
    `batch-verbs` includes it, so declaring `batch-verbs` reads as before: named once, select among its features."""
    from kvcache_spec.conformance.op.programs import reorder, repeat, select, sent_contiguous

    bundled = scopes.parse(["flat", "pad", "batch-verbs", "spec=4"], "test")
    assert "select" in bundled.features and bundled.names() == ["flat", "pad", "batch-verbs"]
    assert scopes.parse(bundled.announced(), "test").features == bundled.features
    alone = scopes.parse(["flat", "select"], "test")
    assert alone.version == 4 and "batch-verbs" not in alone.features
    program = [select([0]), reorder([0]), repeat(2)]
    assert sent_contiguous(program, alone) == [select([0])]
    assert sent_contiguous(program, bundled) == program
    assert sent_contiguous(program, scopes.parse(["flat", "pad"], "test")) == []


@pytest.mark.parametrize("items, version, has_trim", [
    ([], 1, False),                                  # nothing declared: spec 1 (the first release)
    (["all"], 1, False),                             # `all` is every feature of the declared version
    (["trusted-args"], 1, False),                    # relaxations alone: the whole of spec 1
    (["spec=2"], 2, True),                           # a version alone: the whole of spec 2
    (["flat", "trim"], 2, True),                     # naming a feature declares the version that added it
    (["all", "keep=4"], 2, True),                    # keep=N (N > 0) names sinks
    (["flat", "ring", "spec=1"], 1, False),
])
def test_the_declared_version(items: list[str], version: int, has_trim: bool) -> None:
    scope = scopes.FULL if not items else scopes.parse(items, "test")
    assert scope.version == version and ("trim" in scope.features) == has_trim


def test_a_version_alone_is_announced_and_read_back_the_same() -> None:
    """A served scope says its version when its features do not (serve.py's hello): spec 2 less trim and sinks
    is not spec 1's whole face."""
    scope = scopes.parse(["flat", "ring", "spec=2"], "test")
    assert scope.announced() == ["flat", "ring", "spec=2"] and scopes.parse(scope.announced(), "again") == \
        scopes.parse(["flat", "ring", "spec=2"], "again")
    assert scopes.parse(["flat", "trim"], "test").announced() == ["flat", "trim"]   # implied by trim


@pytest.mark.parametrize("bad", [["spec=0"], ["spec=x"], ["spec"], ["spec=1", "spec=2"]])
def test_a_malformed_version_is_an_error(bad: list[str]) -> None:
    with pytest.raises(scopes.ScopeError, match="spec"):
        scopes.parse(bad, "test")


def test_a_newer_version_is_reported_in_a_hello_and_refused_in_kvcache_scope() -> None:
    """A newer target talking to an older harness: judged on the versions the harness knows, the item reported."""
    newer = scopes.parse(["flat", f"spec={scopes.CURRENT_VERSION + 1}"], "hello")
    assert newer.version == scopes.CURRENT_VERSION and newer.ignored == (f"spec={scopes.CURRENT_VERSION + 1}",)

    def factory(cfg: Any) -> None:
        return None
    factory.kvcache_scope = [f"spec={scopes.CURRENT_VERSION + 1}"]   # type: ignore[attr-defined]
    with pytest.raises(scopes.ScopeError, match="unknown"):
        scopes.from_factory(factory)


def test_a_spec_1_scope_is_sent_no_configuration_of_a_later_version() -> None:
    """A config key outside the declared version is never sent: a spec-1 cache sees no `keep`, not even keep 0,
    and no invalid keep either; a spec-2 scope is sent them, but no chunk layer nor `record_past` (spec 3); a
    spec-3 scope is sent them all."""
    kept, notes = scopes.in_version(CONTIGUOUS_CONFIGS, scopes.FULL)
    assert kept and not any("keep" in entry for cfg in kept for entry in cfg["layers"])
    assert len(kept) < len(CONTIGUOUS_CONFIGS) and notes and "sinks" in notes[0]
    assert not scopes.FULL.speaks({**CONTIGUOUS_CONFIGS[0], "layers": [{"kind": "ring", "window": 2, "keep": 0}]})
    spec2, notes2 = scopes.in_version(CONTIGUOUS_CONFIGS, scopes.parse(["spec=2"], "test"))
    assert any("keep" in entry for cfg in spec2 for entry in cfg["layers"]) and len(spec2) < len(CONTIGUOUS_CONFIGS)
    assert not any("chunk" in entry for cfg in spec2 for entry in cfg["layers"]) and \
        not any("record_past" in cfg for cfg in spec2) and notes2
    assert scopes.in_version(CONTIGUOUS_CONFIGS, scopes.parse(["spec=3"], "test")) == (list(CONTIGUOUS_CONFIGS), [])


# --- caches of the previous release keep their verdict (each NOT CONFORMING before spec versions) -------------


def test_a_python_op_cache_without_kvcache_scope_and_trim_keeps_its_verdict() -> None:
    """The previous release's tiny op cache (no kvcache_scope, no trim, a keep never read) is CONFORMING strict:
    judged as spec 1, it is sent no trim and no keep. (Before: over-strict OP-TRIM on trim(0), and a ring
    served as if its keep were 0.)"""
    report = _report(PREVIOUS.format("tiny"))
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    assert report["scope"]["spec_version"] == 1 and report["scope"]["full"]
    assert any("later spec version" in note for note in report["skipped"])


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_a_cmd_target_whose_hello_predates_sinks_keeps_its_verdict() -> None:
    """A hello declaring the previous release's features less batch (no sinks, no trim, no version): no keep is
    sent, not even as a border check, so serving a keep it never heard of is no SCOPE-BORDER finding. (Before:
    wrong SCOPE-BORDER.)"""
    spec = f"cmd:{sys.executable} -m kvcache_spec.conformance.serve {PREVIOUS.format('hello_without_sinks')}"
    report = _report(spec)
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    assert report["scope"]["source"] == "declared in the target's hello" and report["scope"]["spec_version"] == 1
    assert "SCOPE-BORDER" in report["coverage"]["rules"]["exercised"]   # batch 2 still checked at the border


def test_a_python_cache_without_a_trim_method_is_not_judged_on_trim() -> None:
    """A contiguous op cache whose scope names trim but whose cache has no trim method is judged without trim
    (as the C++ driver drops trim from its hello without a trim callable), and the report says why."""
    report = _report("python:tests.previous_release:trim_declared_not_implemented")
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    assert "trim" not in report["scope"]["features"] and "no trim method" in report["scope"]["source"]


def test_the_reference_declares_the_current_version_and_is_sent_trims_and_keeps() -> None:
    target = PythonTarget("python:kvcache_spec.conformance.op.targets:contiguous")
    assert target.scope.version == scopes.CURRENT_VERSION and {"trim", "sinks"} <= target.scope.features
