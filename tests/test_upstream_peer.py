"""Upstream's own op tests (executorch 1.5.1's `test_update_and_attend.py`, read from the installed wheel) run
against the drop-in `kvcache.reference_cache` with only the import of the caches redirected
(tests/upstream_peer.py): every test passes but the deliberate differences docs/dropin.md names, each with
its rule, and the table stays true - a named test that passes, or one upstream's file no longer has, fails
here too.

Needs the `upstream` extra (torch, and executorch installed with --no-deps). Skipped without it, with the
reason - except where KVCACHE_REQUIRE_UPSTREAM=1 (CI's upstream stage): there a missing install fails.
"""

from __future__ import annotations


import pytest

from kvcache_spec.rules import BY_ID
from .upstream_peer import DOC, DROPIN_IMPORT, UPSTREAM_IMPORT, deliberate_differences, redirected, \
    run_peer_suite, upstream_test_source
from .upstream_install import import_or_skip

import_or_skip("executorch.extension.llm.cache.update_and_attend")

pytestmark = pytest.mark.filterwarnings("ignore::Warning")   # upstream's ExperimentalWarning on every config
UPSTREAM_TEST_COUNT = 38   # executorch 1.5.1's file (the upstream extra pins the wheel)


def test_the_redirection_changes_the_cache_import_only() -> None:
    _, source = upstream_test_source()
    changed = [(a, b) for a, b in zip(source.splitlines(), redirected(source).splitlines()) if a != b]
    assert changed == [(UPSTREAM_IMPORT, DROPIN_IMPORT)]
    assert "from executorch.extension.llm.cache.update_and_attend import REGISTRY" in redirected(source)


def test_upstreams_tests_pass_on_the_dropin_but_the_named_deliberate_differences() -> None:
    run = run_peer_suite()
    expected = deliberate_differences()
    assert len(run.outcomes) == UPSTREAM_TEST_COUNT, sorted(run.outcomes)
    assert run.surprises(expected) == []
    assert expected and set(expected.values()) <= set(BY_ID), expected   # each named with a rule of the spec
    passed = len(run.outcomes) - len(run.failed())
    # the counts docs/dropin.md states are this run's
    assert f"Of its {len(run.outcomes)} tests, {passed} pass" in DOC.read_text()
    print(f"\nupstream's {len(run.outcomes)} tests on kvcache.reference_cache: {passed} passed, "
          f"{len(run.failed())} deliberate differences ({', '.join(sorted(set(expected.values())))}) "
          f"in {run.seconds:.1f} s ({run.cpu_seconds:.1f} s of CPU)")
