"""Upstream's own op tests as a peer suite: ExecuTorch 1.5.1's `test_update_and_attend.py`, read from the
installed wheel (never copied here), run against the drop-in `kvcache.reference_cache` by one rewrite - the
import of the caches and their types - and judged against the deliberate differences docs/dropin.md names.

    python -m tests.upstream_peer        # prints each test's outcome, the counts and the time; exit 1 on a surprise

Needs torch and executorch (the `upstream` extra). The op itself (`update_and_attend`, its `REGISTRY`) stays
upstream's: only where the caches come from changes. A test outcome is a surprise when a test not named in
docs/dropin.md fails, a named one passes, or a named one no longer exists; the peer test
(tests/test_upstream_peer.py) fails on any surprise, so the list stays true.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
import types
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UPSTREAM_TESTS = "executorch.extension.llm.cache"
TEST_FILE = "test_update_and_attend.py"
UPSTREAM_IMPORT = "from executorch.extension.llm.cache.reference_cache import ("
DROPIN_IMPORT = "from kvcache.reference_cache import ("
DOC = Path(__file__).resolve().parent.parent / "docs" / "dropin.md"
# A row of the deliberate differences' table: | `Class.test_name` | RULE-ID | why |
ROW = re.compile(r"^\|\s*`(\w+\.test_\w+)`\s*\|\s*([A-Z][A-Z0-9-]+)\s*\|")


def upstream_test_source() -> tuple[Path, str]:
    """The path and text of upstream's test file in the installed executorch wheel."""
    spec = importlib.util.find_spec(UPSTREAM_TESTS)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{UPSTREAM_TESTS} is not installed (pip install --no-deps executorch==1.5.1)")
    path = Path(list(spec.submodule_search_locations)[0]) / TEST_FILE
    return path, path.read_text()


def redirected(source: str) -> str:
    """The source with its one import of the caches and their types taken from the drop-in module; nothing
    else changes (the op and its registry stay upstream's)."""
    if source.count(UPSTREAM_IMPORT) != 1:
        raise ValueError(f"upstream's test file no longer has exactly one {UPSTREAM_IMPORT!r}")
    return source.replace(UPSTREAM_IMPORT, DROPIN_IMPORT)


def deliberate_differences(doc: Path = DOC) -> dict[str, str]:
    """{`Class.test_name`: rule id} from docs/dropin.md's table of deliberate differences."""
    return {m.group(1): m.group(2) for line in doc.read_text().splitlines() if (m := ROW.match(line))}


@dataclass
class PeerRun:
    """Each test's outcome ('pass', or the first failure's or error's last line) and the time taken."""

    outcomes: dict[str, str]
    seconds: float   # wall clock
    cpu_seconds: float   # this process's CPU time: the run's cost on a loaded machine

    def failed(self) -> set[str]:
        return {name for name, outcome in self.outcomes.items() if outcome != "pass"}

    def surprises(self, expected: dict[str, str]) -> list[str]:
        """Every way the run disagrees with the named list (empty = as documented)."""
        out = [f"{name} failed and is not a named deliberate difference: {self.outcomes[name]}"
               for name in sorted(self.failed() - set(expected))]
        out += [f"{name} is named ({expected[name]}) but passed" for name in sorted(set(expected) - self.failed())
                if name in self.outcomes]
        out += [f"{name} is named ({expected[name]}) but upstream's file has no such test"
                for name in sorted(set(expected) - set(self.outcomes))]
        return out


class _Outcomes(unittest.TestResult):
    """Collects the first failure of each test (a failing subTest counts as its test's failure)."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, str] = {}

    @staticmethod
    def _name(test: Any) -> str:
        test = getattr(test, "test_case", test)   # a subTest reports through its test case
        return f"{type(test).__name__}.{test._testMethodName}"

    def _fail(self, test: Any, err: Any) -> None:
        name = self._name(test)
        if self.outcomes.get(name, "pass") == "pass":
            self.outcomes[name] = f"{err[0].__name__}: {str(err[1]).strip().splitlines()[-1] if str(err[1]) else ''}"

    def startTest(self, test: Any) -> None:
        super().startTest(test)
        self.outcomes[self._name(test)] = "pass"

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._fail(test, err)

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._fail(test, err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._fail(subtest, err)

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self.outcomes[self._name(test)] = f"skipped: {reason}"   # a skip is not a pass


def run_peer_suite() -> PeerRun:
    """Upstream's test file, redirected, run in this process with unittest."""
    path, source = upstream_test_source()
    module = types.ModuleType("upstream_test_update_and_attend_on_kvcache")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    try:
        exec(compile(redirected(source), str(path), "exec"), module.__dict__)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        result = _Outcomes()
        started, cpu = time.perf_counter(), time.process_time()
        suite.run(result)
        return PeerRun(result.outcomes, time.perf_counter() - started, time.process_time() - cpu)
    finally:
        sys.modules.pop(module.__name__, None)


def main() -> int:
    import warnings

    warnings.simplefilter("ignore")   # upstream's ExperimentalWarning on every config
    run = run_peer_suite()
    expected = deliberate_differences()
    for name, outcome in sorted(run.outcomes.items()):
        print(f"{'PASS' if outcome == 'pass' else 'FAIL'} {name}" + (
            "" if outcome == "pass" else f"  [{expected.get(name, 'NOT NAMED')}] {outcome}"))
    surprises = run.surprises(expected)
    print(f"{len(run.outcomes)} tests: {len(run.outcomes) - len(run.failed())} passed, {len(run.failed())} failed "
          f"({len(expected)} named deliberate differences) in {run.seconds:.1f} s ({run.cpu_seconds:.1f} s of CPU)")
    for line in surprises:
        print("SURPRISE:", line)
    return 1 if surprises else 0


if __name__ == "__main__":
    sys.exit(main())
