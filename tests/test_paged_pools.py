"""Per-group pools (SPEC.md part 7, PAGED-CONFIG's "pools"; scope feature `pools`): with "pools": "per-group"
each KV group has a pool of its own of num_blocks blocks, block ids are per pool, and available() and
ref_counts() answer one entry per group. Conservation and idle fit hold pool by pool; a target whose scope
leaves `pools` out is never sent such a configuration."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache.paged import PagedCache
from kvcache_spec import paged_model as pm
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.engine import WRONG
from kvcache_spec.conformance.paged import programs, run_program
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import parse_target
from kvcache import ConfigError
from kvcache_spec.model import Rejected

HYBRID = programs.paged_config(2, 4, 16, [programs.FULL, programs.window(3)], pools="per-group")
PER_GROUP = [c for c in programs.PAGED_CONFIGS if c.get("pools") == "per-group"]
STANDIN = "python:kvcache_spec.conformance.zoo.paged:WindowPoolCountedInFullPool"


def _report(spec: str) -> dict[str, Any]:
    target = parse_target(spec)
    try:
        return report_json(run_suite(target, "quick"), strict=True, exact_layout=False)
    finally:
        target.close()


# --- the model ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pools", ["per-layer", "", True, 1, None, ["per-group"]])
def test_PAGED_CONFIG_a_bad_pools_value_is_refused_naming_it(pools: Any) -> None:
    assert pm.configured({**HYBRID, "pools": pools}) == Rejected("PAGED-CONFIG", "pools")
    with pytest.raises(ConfigError, match="pools"):
        PagedCache({**HYBRID, "pools": pools})


def test_PAGED_CONFIG_pools_default_to_shared() -> None:
    shared = {key: value for key, value in HYBRID.items() if key != "pools"}
    made, explicit = pm.configured(shared), pm.configured({**shared, "pools": "shared"})
    assert isinstance(made, pm.PagedConfig) and made == explicit and not made.per_group_pools
    per_group = pm.configured(HYBRID)
    assert isinstance(per_group, pm.PagedConfig) and per_group.per_group_pools and per_group.pools == 2


def test_PAGED_IDLE_FIT_holds_pool_by_pool() -> None:
    per_group = pm.configured(HYBRID)
    shared = pm.configured({**HYBRID, "pools": "shared"})
    assert isinstance(per_group, pm.PagedConfig) and isinstance(shared, pm.PagedConfig)
    assert pm.fits_idle(per_group, 8) and not pm.fits_idle(shared, 8)   # 4 blocks a group: 4 of 4 each, 8 of 4
    assert not pm.fits_idle(per_group, 9)


def test_PAGED_CONSERVE_and_REFCOUNT_per_pool_ids_are_per_pool() -> None:
    cfg = pm.configured(HYBRID)
    assert isinstance(cfg, pm.PagedConfig)
    admission = pm.admit(pm.initial(cfg), "a", [1, 2, 3], [], 64)
    assert not isinstance(admission, Rejected)
    state = admission.after(0)
    tables = {"a": [[0, 1], [0, 1]]}   # the same ids in both pools are two blocks each
    assert pm.table_problems(state, tables, [2, 2], [{0: 1, 1: 1}, {0: 1, 1: 1}]) == []
    # the sum across pools is right, each pool's count is not
    assert pm.table_problems(state, tables, [3, 1]) == [
        ("PAGED-CONSERVE", "available 3 + held 2 != 4 blocks of pool 0"),
        ("PAGED-CONSERVE", "available 1 + held 2 != 4 blocks of pool 1")]
    assert pm.table_problems(state, tables, 4)[0][0] == "PAGED-CONSERVE"   # not one count per pool
    # one dict for both pools (ids counted once across pools) is not the per-pool answer
    assert pm.table_problems(state, tables, [2, 2], {0: 2, 1: 2}) == [
        ("PAGED-REFCOUNT", "(pool, block) [(0, 0), (0, 1), (1, 0), (1, 1)]: counts differ from the live tables "
                           "holding them")]


# --- the reference --------------------------------------------------------------------------------------------

def test_the_reference_takes_each_groups_blocks_from_its_own_pool() -> None:
    cache = PagedCache(HYBRID)
    assert cache.available() == [4, 4]
    assert cache.admit("a", list(range(7)), [], 64) == 0
    assert cache.table("a") == [[0, 1, 2, 3], [0, 1, 2, 3]] and cache.available() == [0, 0]
    assert cache.ref_counts() == [{0: 1, 1: 1, 2: 1, 3: 1}] * 2
    assert cache.extend("a", [7], 64) == 1   # the window's first blocks go back to the window pool alone
    assert cache.table("a")[1][:2] == [None, None] and cache.available() == [0, 2]
    assert cache.admit("b", [9], [], 64) is None   # the full pool is empty: refused, nothing changed
    assert cache.available() == [0, 2]


# --- the conformance suite ----------------------------------------------------------------------------------------

def test_the_reference_with_pools_declared_is_conforming_strict_on_the_per_group_configs() -> None:
    assert PER_GROUP, "the programs carry a per-group configuration"
    report = _report("python:kvcache:PagedCache")
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2] or report["coverage"]["incomplete"]
    assert report["coverage"]["configurations"]["created"] == len(programs.PAGED_CONFIGS)


def test_a_window_pool_counted_in_the_full_pool_is_found_per_pool() -> None:
    result = run_program(parse_target(STANDIN), HYBRID, [
        {"op": "admit", "request": "r0", "tokens": [1, 2, 3], "keys": [], "budget": 64}])
    assert result.finding is not None and (result.finding.kind, result.finding.rule) == (WRONG, "PAGED-CONSERVE")
    assert "[3, 1]" in result.finding.message, result.finding.message
    report = _report(STANDIN)
    assert any((f["class"], f["rule"]) == (WRONG, "PAGED-CONSERVE") for f in report["semantic"]["findings"])


def test_a_target_not_declaring_pools_is_sent_no_pools_config() -> None:
    assert all("pools" in scopes.needs(c) for c in PER_GROUP + [c for c in programs.BAD_PAGED_CONFIGS if "pools" in c])
    assert not scopes.parse(["flat", "ring"], "test").covers(PER_GROUP[0])
    assert not scopes.FULL.covers(PER_GROUP[0])   # nothing declared: spec 1, before pools
    report = _report("python:kvcache_spec.conformance.zoo.paged:paged_pool")   # declares no scope
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:2]
    assert report["coverage"]["configurations"]["created"] == len(programs.PAGED_CONFIGS) - len(PER_GROUP)
