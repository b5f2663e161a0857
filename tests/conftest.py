"""Shared builders for the tests."""

from __future__ import annotations

from typing import Iterator, Optional

import pytest
from hypothesis import HealthCheck, settings

from kvcache import CacheConfig, LayerConfig, LayerPolicy, SequenceCache
from kvcache_spec.stateful import fixed_constant_pool

# CI: derandomized (reproducible) and no deadline (a 2-core CI box must not flake on timing).
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.register_profile("deep", deadline=None, max_examples=2000)


#: Registered here, not in pyproject.toml, because CI also runs a copy of tests/ against the installed wheel
#: where no pyproject.toml is read. pyproject's addopts deselect the marker (the README's test command).
SLOW = ("slow: a test that took 4 s or more on the project's busy 2-core machine, or compiles C++ - the "
        "CrossHair gate, the state machines and model checkers run through verify, the mutants, subprocess "
        "targets, the C++ drivers; the default run leaves them out, CI runs them with `python -m pytest -m slow`")


def pytest_configure(config: pytest.Config) -> None:
    import os
    config.addinivalue_line("markers", SLOW)
    settings.load_profile(os.environ.get("KVCACHE_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


#: Set by CI's stages that installed an extra (torch and executorch; Ray): there a skipped test or module is
#: a failure (a skip for want of the extra would pass the stage while checking nothing).
NO_SKIPS = "KVCACHE_NO_SKIPS"
_skipped: list[str] = []


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import os
    if os.environ.get(NO_SKIPS) == "1" and _skipped:
        print(f"\n{NO_SKIPS}=1: {len(_skipped)} skipped, which this run forbids: {', '.join(_skipped)}")
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _examples_independent_of_imports() -> Iterator[None]:
    """Every test draws with the constant pool pinned (spec/stateful.py, fixed_constant_pool), so a
    derandomized test draws the same examples run alone, in the whole suite, or from the wheel."""
    with fixed_constant_pool():
        yield


def flat() -> LayerConfig:
    return LayerConfig(LayerPolicy.flat(), 2, 4)


def ring(window: int) -> LayerConfig:
    return LayerConfig(LayerPolicy.ring(window), 2, 4)


def cache(capacity: int, *layers: LayerConfig, n_layers: Optional[int] = None,
          max_write: Optional[int] = None) -> SequenceCache:
    """A cache with the given layers (one flat layer by default)."""
    chosen = list(layers) or [flat()]
    return SequenceCache(CacheConfig(capacity, n_layers or len(chosen), chosen, max_write=max_write))


def step(c: SequenceCache, T: int, pattern: str = "once") -> None:
    """One whole step of T tokens at the current length: plan every layer, commit ("once") or per layer."""
    position = c.length()
    plans = []
    for layer in range(c.n_layers):
        p = c.plan(layer, position, T)
        assert p is not None
        plans.append(p)
        if pattern == "per-layer":
            c.commit(p)
    if pattern == "once":
        c.commit(plans[0])
