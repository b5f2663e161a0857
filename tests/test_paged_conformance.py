"""The conformance suite on paged caches (spec/conformance/paged/): the harness acts as the model runner.

A correct block pool is CONFORMING (strict) with every PAGED- rule exercised, in process and over the protocol;
each stand-in of spec/conformance/zoo/paged.py (one defect a serving engine's bookkeeping has) is caught under
its rule with a program of a few requests, printed minimal and replayable; the scale configuration holds more
than 64 requests at once over more than 1,000 blocks.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvcache_spec.conformance import replay
from kvcache_spec.conformance.coverage import in_scope
from kvcache_spec.conformance.engine import LENIENT, WRONG, Finding, RunResult
from kvcache_spec.conformance.paged import programs, run_program
from kvcache_spec.conformance.paged.consequences import drive_on
from kvcache_spec.conformance.paged.engine import PagedEngine
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.suite.account import Reported
from kvcache_spec.conformance.suite.report import pytest_text
from kvcache_spec.conformance.targets import parse_target
from kvcache_spec.conformance.zoo.paged import PAGED_ZOO

POOL = "python:kvcache_spec.conformance.zoo.paged:paged_pool"
REFERENCE = "python:kvcache:PagedCache"   # kvcache.paged, the contract-checked reference


def _report(spec: str, profile: str = "quick") -> dict[str, Any]:
    target = parse_target(spec)
    try:
        return report_json(run_suite(target, profile), strict=True, exact_layout=False)
    finally:
        target.close()


def _config(block_size: int, num_blocks: int, groups: list[dict[str, Any]], caching: bool = True) -> dict[str, Any]:
    return programs.paged_config(block_size, num_blocks, 32, groups, caching)


def _admit(request: str, tokens: list[int], budget: int = 64, keys: list[str] | None = None) -> dict[str, Any]:
    return {"op": "admit", "request": request, "tokens": tokens, "keys": keys or [], "budget": budget}


FULL = [programs.FULL]
# r0 holds positions 0 .. 3 in blocks 0 and 1, r1 the third block; r0's extend to position 4 is refused, and its
# window of 3 reads positions 2 and 3 next: block index 0 may be released then, block index 1 may not
RELEASE_ON_REFUSAL = [_admit("r0", [1, 2, 3, 4]), _admit("r1", [5]),
                      {"op": "extend", "request": "r0", "tokens": [6], "budget": 1}]
# Each stand-in's shortest program, as the suite shrinks it (quick, seed 0): at most three requests.
MINIMAL: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "stale_hit_after_reuse": (_config(4, 6, FULL), [
        _admit("r0", [0, 37, 74, 14], 4), {"op": "free", "request": "r0"},
        _admit("r1", list(range(300, 324)), 24), {"op": "free", "request": "r1"},
        _admit("r2", [0, 37, 74, 14, 51])]),
    "in_use_evicted": (_config(2, 8, FULL * 2), [
        _admit("r0", [101, 138, 115, 152, 705, 523], 2, ["adapter-1"]),
        {"op": "extend", "request": "r0", "tokens": [], "budget": 4}, {"op": "free", "request": "r0"},
        _admit("r1", [354, 391, 331], 3, ["adapter-1"]), _admit("r2", [101, 138, 992], 64, ["adapter-1"])]),
    "window_released_early": (_config(2, 2, [programs.window(3)], caching=False), [
        _admit("r0", [74, 14, 901], 3), {"op": "extend", "request": "r0", "tokens": [7], "budget": 1}]),
    "refusal_keeps_hit": (_config(2, 1, FULL), [_admit("r0", [0, 37], 2), _admit("r1", [0, 37, 951], 1)]),
    "double_free": (_config(1, 1, FULL, caching=False), [
        _admit("r0", [5], 1), {"op": "free", "request": "r0"}, {"op": "free", "request": "r0"}]),
    "shared_block_rewritten": (_config(2, 3, FULL), [
        _admit("r0", [1, 2]), _admit("r1", [1, 2, 3], 1), {"op": "extend", "request": "r0", "tokens": [4],
                                                           "budget": 1}]),
    "refusal_releases_needed": (_config(2, 3, [programs.window(3)], caching=False), RELEASE_ON_REFUSAL),
    "hit_across_keys": (_config(3, 2, FULL), [_admit("r0", [0, 37, 74], 3),
                                              _admit("r1", [0, 37, 74, 5], 1, ["adapter-1"])]),
    "partial_block_shared": (_config(2, 2, FULL), [_admit("r0", [0], 1, ["adapter-1"]),
                                                   _admit("r1", [0], 1, ["adapter-1"])]),
}


def test_every_stand_in_has_a_minimal_program() -> None:
    assert set(MINIMAL) == set(PAGED_ZOO)


def test_the_correct_pool_passes_each_stand_ins_program() -> None:
    for name, (cfg, steps) in MINIMAL.items():
        assert replay(POOL, cfg, steps) is None, name


@pytest.mark.parametrize("name", sorted(PAGED_ZOO))
def test_each_stand_in_is_caught_by_its_minimal_program(name: str) -> None:
    spec, kind, rule = PAGED_ZOO[name]
    cfg, steps = MINIMAL[name]
    finding = replay(spec, cfg, steps)
    assert finding is not None and (finding["class"], finding["rule"]) == (kind, rule), finding
    assert sum(step["op"] == "admit" for step in steps) <= 3


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PAGED_ZOO))
def test_the_suite_finds_each_stand_in_shrunk_to_a_few_requests_and_prints_a_replayable_test(name: str) -> None:
    spec, kind, rule = PAGED_ZOO[name]
    report = _report(spec)
    found = [f for f in report["semantic"]["findings"] if (f["class"], f["rule"]) == (kind, rule)]
    assert found, [(f["class"], f["rule"]) for f in report["semantic"]["findings"]]
    # the shortest of its findings (one stand-in's bug shows in several causes; each is shrunk on its own)
    finding = min(found, key=lambda f: (sum(step["op"] == "admit" for step in f["steps"]), len(f["steps"])))
    assert sum(step["op"] == "admit" for step in finding["steps"]) <= 3, finding["steps"]
    assert len(finding["steps"]) <= 6, finding["steps"]
    replayed = replay(spec, finding["config"], finding["steps"])
    assert replayed is not None and (replayed["class"], replayed["rule"]) == (kind, rule)
    # the test `kvcache conformance --pytest` prints for it, run as it is, fails on the stand-in
    printed = pytest_text(spec, Reported(Finding(kind, rule, finding["message"], len(finding["steps"]) - 1),
                                         finding["config"], finding["steps"]))
    namespace: dict[str, Any] = {}
    exec(compile(printed, "<printed>", "exec"), namespace)
    with pytest.raises(AssertionError):
        namespace[f"test_kvcache_conformance_{kind}_{rule}".lower().replace("-", "_")]()


def test_the_correct_pool_is_conforming_strict_with_every_paged_rule_exercised() -> None:
    report = _report(POOL)
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]
    rules = report["coverage"]["rules"]
    assert not rules["not_exercised"]
    assert {r for r in rules["exercised"] if r.startswith("PAGED-")} == \
        {r for r, why in in_scope(True, frozenset({"ref_counts"}), "paged").items() if not why and r.startswith("PAGED-")}
    # every configuration but the per-group pools ones: the pool's scope does not declare `pools`
    assert report["coverage"]["configurations"]["created"] == len(
        [cfg for cfg in programs.PAGED_CONFIGS if "pools" not in cfg])


def test_a_pool_without_ref_counts_owes_no_PAGED_REFCOUNT_and_is_conforming() -> None:
    report = _report("python:kvcache_spec.conformance.zoo.paged:pool_without_counts")
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]
    assert "ref_counts" in report["coverage"]["rules"]["out_of_scope"]["PAGED-REFCOUNT"]


def test_a_paged_run_owes_only_the_paged_rules_and_other_layouts_owe_none_of_them() -> None:
    paged = in_scope(True, frozenset(), "paged")
    owed = {rule for rule, why in paged.items() if not why}
    assert owed and all(rule.startswith("PAGED-") or rule == "SCOPE-BORDER" for rule in owed)
    for layout in ("sequence", "cell", "op-cell", "cell-recompute"):
        assert all(why for rule, why in in_scope(True, frozenset(), layout).items() if rule.startswith("PAGED-"))


def test_the_scale_configuration_holds_over_64_requests_at_once_over_1000_blocks() -> None:
    cfg = programs.SCALE
    assert cfg["num_blocks"] >= 1000
    program = dict(programs.edge_paged_programs(cfg))["many concurrent requests"]
    most = 0

    class Counting(PagedEngine):
        def run_step(self, step: dict[str, Any]) -> Any:
            nonlocal most
            concrete = super().run_step(step)
            most = max(most, len(self.mirrors))
            return concrete

    target = parse_target(POOL)
    result = Counting(target, cfg, drive=drive_on).run(program)
    assert result.finding is None, result.finding
    assert most >= 64


def test_a_double_free_served_leads_to_a_broken_count_past_it() -> None:
    cfg = _config(2, 4, FULL, caching=False)
    # r1 is handed r0's blocks; the second free of r0 releases them under r1
    steps = [_admit("r0", [1, 2, 3]), {"op": "free", "request": "r0"}, _admit("r1", [4, 5, 6]),
             {"op": "free", "request": "r0"}, _admit("r2", [6, 7, 8, 9])]
    result: RunResult = run_program(parse_target(PAGED_ZOO["double_free"][0]), cfg, steps)
    assert result.finding is not None and (result.finding.kind, result.finding.rule) == (LENIENT, "PAGED-FREE")
    assert result.consequence is not None and result.consequence.kind == WRONG, result.consequence
    assert result.consequence.safety == "SAFE-PAGED-DATA" and result.consequence.rule == "PAGED-CONSERVE"


def test_bad_configurations_are_refused_and_bad_calls_change_nothing() -> None:
    report = _report(POOL)
    assert "PAGED-CONFIG" in report["coverage"]["rules"]["exercised"]
    assert {"PAGED-ARGS", "PAGED-FREE", "PAGED-ATOMIC"} <= set(report["coverage"]["rules"]["exercised"])


@pytest.mark.slow
def test_the_reference_paged_cache_is_conforming_strict_with_every_paged_rule_exercised() -> None:
    report = _report(REFERENCE)
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]
    assert not report["coverage"]["rules"]["not_exercised"]
    assert "PAGED-REFCOUNT" in report["coverage"]["rules"]["exercised"]


@pytest.mark.slow
def test_the_correct_pool_over_the_protocol_is_conforming() -> None:
    report = _report(f"cmd:{sys.executable} -m kvcache_spec.conformance.serve {POOL}")
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]


@pytest.mark.slow
def test_a_refusal_that_keeps_references_is_caught_over_the_protocol_through_ref_counts() -> None:
    spec, kind, rule = PAGED_ZOO["refusal_keeps_hit"]
    cfg, steps = MINIMAL["refusal_keeps_hit"]
    finding = replay(f"cmd:{sys.executable} -m kvcache_spec.conformance.serve {spec}", cfg, steps)
    assert finding is not None and (finding["class"], finding["rule"]) == (kind, rule)


def test_a_paged_finding_carries_the_blocks_held_and_the_report_draws_them() -> None:
    from kvcache_spec.conformance.drawing import CELL_DRAWINGS
    spec, _, _ = PAGED_ZOO["shared_block_rewritten"]
    cfg, steps = MINIMAL["shared_block_rewritten"]
    result = run_program(parse_target(spec), cfg, steps)
    assert result.finding is not None
    cells = result.finding.picture["cells"]
    assert cells["layout"] == "paged" and any(len(cell["held"]) > 1 for cell in cells["cells"])   # the shared one
    assert CELL_DRAWINGS["paged"](cells).startswith("<svg")


def test_a_pool_that_trusts_its_caller_is_conforming_only_when_it_declares_trusted_args() -> None:
    # SCOPE-TRUSTED-ARGS on the paged layout: a KV manager its scheduler alone calls serves a malformed call as it
    # comes; declared, no malformed call and no invalid configuration is sent, and the verdict says so
    undeclared = _report("python:kvcache_spec.conformance.zoo.paged:trusting_pool")
    assert undeclared["verdict"] != CONFORMING
    assert any(f["rule"] == "PAGED-ARGS" for f in undeclared["semantic"]["findings"]), undeclared["semantic"]
    declared = _report("python:kvcache_spec.conformance.zoo.paged:trusting_pool_declared")
    assert declared["verdict"] == CONFORMING, declared["semantic"]["findings"][:2] or declared["coverage"]["incomplete"]
    out = declared["coverage"]["rules"]["out_of_scope"]
    assert "trusted-args" in out["PAGED-ARGS"] and "trusted-args" in out["PAGED-CONFIG"]
    assert "PAGED-FREE" in declared["coverage"]["rules"]["exercised"]


def test_trusted_args_is_declarable_on_a_paged_target_and_user_config_is_not() -> None:
    from kvcache_spec.conformance import scope
    scope.check_layout(scope.parse(["trusted-args"], "test"), "paged")
    with pytest.raises(scope.ScopeError, match="SCOPE-DECLARE"):
        scope.check_layout(scope.parse(["trusted-args", "user-config=window"], "test"), "paged")


def test_an_idle_pool_may_refuse_a_first_chunk_whose_whole_prompt_never_fits() -> None:
    # PAGED-IDLE-FIT: a chunked prefill that can never complete is futile; a refusal of what fits stays wrong
    cfg = _config(2, 4, FULL)
    futile = [_admit("r0", list(range(10)), 2)]            # a chunk of 1 block; the prompt needs 5 of 4
    assert replay(WHOLE_PROMPT, cfg, futile) is None
    assert replay(WHOLE_PROMPT, cfg, [_admit("r0", list(range(8)), 2)]) is None   # it fits: served
    report = _report(WHOLE_PROMPT)
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]


WHOLE_PROMPT = "python:kvcache_spec.conformance.zoo.paged:whole_prompt_pool"


def test_a_refusal_may_release_window_blocks_out_of_every_window_and_nothing_else() -> None:
    # PAGED-ATOMIC: vLLM's allocate_slots hands back the window blocks no window reads before it checks the fit
    cfg = MINIMAL["refusal_releases_needed"][0]
    releases = "python:kvcache_spec.conformance.zoo.paged:releases_on_refusal"
    assert replay(releases, cfg, RELEASE_ON_REFUSAL) is None
    report = _report(releases)
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]
