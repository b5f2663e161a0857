"""pytest plugin (entry point `kvcache`): run the conformance suite inside another project's tests.

    pytest --kvcache-target=python:mypkg.cache:make_cache [--kvcache-profile quick] [--kvcache-strict]

Without --kvcache-target the plugin does nothing (it only declares its options). With it, the
session gets one test per finding class - wrong, crash, lenient, over-strict - plus the exact
layout and the coverage; the suite runs once, on the first of them. wrong and crash fail; lenient
and over-strict fail under --kvcache-strict (otherwise they pass with a warning); layout fails under
--kvcache-exact-layout; coverage fails when the run is INCOMPLETE (it exercised less than its
profile promises), so the plugin gives the verdicts of `kvcache conformance`. A failure prints each
finding's rule, minimal steps and a pytest test.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any, Optional

import pytest

CLASSES = ("wrong", "crash", "lenient", "over-strict")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache", "kvcache conformance suite")
    group.addoption("--kvcache-target", default=None, metavar="T",
                    help="run the kvcache conformance suite against T (python:MODULE:FACTORY or cmd:COMMAND)")
    group.addoption("--kvcache-profile", default="quick", choices=("quick", "pre-merge", "deep"))
    group.addoption("--kvcache-seed", default=0, type=int)
    group.addoption("--kvcache-strict", action="store_true", help="lenient and over-strict findings fail")
    group.addoption("--kvcache-exact-layout", action="store_true", help="a non-canonical layout fails")
    group.addoption("--kvcache-timeout", default=5.0, type=float, help="seconds per request (cmd: targets)")
    group.addoption("--kvcache-isolate", action="store_true", help="run a python: target in a subprocess")


class _Suite:
    """Runs the suite once per session, on demand."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.report: Optional[dict[str, Any]] = None

    def get(self) -> dict[str, Any]:
        if self.report is None:
            from .conformance.layouts import add_layout_hint
            from .conformance.suite import report_json, run_suite
            from .conformance.targets import parse_target, stop_on_signals

            option = self.config.getoption
            timeout = option("kvcache_timeout")
            if not (math.isfinite(timeout) and timeout > 0):
                raise pytest.UsageError(f"--kvcache-timeout {timeout}: must be a finite number above 0")
            target = parse_target(option("kvcache_target"), timeout=timeout, isolate=option("kvcache_isolate"))
            # The harness's own SIGTERM/SIGINT stop the run (INCOMPLETE), never blamed on the target.
            with stop_on_signals():
                try:
                    result = run_suite(target, option("kvcache_profile"), option("kvcache_seed"))
                finally:
                    target.close()
            self.report = report_json(result, option("kvcache_strict"), option("kvcache_exact_layout"))
            add_layout_hint(self.report, result.interrupted, target)
        return self.report


class KvcacheFinding(Exception):
    pass


class KvcacheItem(pytest.Item):
    def __init__(self, *, suite: _Suite, kind: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.suite, self.kind = suite, kind

    def runtest(self) -> None:
        report = self.suite.get()
        if self.kind == "coverage":
            incomplete = report["coverage"]["incomplete"]
            if incomplete:
                raise KvcacheFinding("INCOMPLETE: the run exercised less than its profile promises:\n"
                                     + "\n".join(incomplete))
            return
        if self.kind == "layout":
            divergences = report["layout"]["divergences"]
            if divergences and report["exact_layout"]:
                raise KvcacheFinding("the layout is not canonical:\n" + json.dumps(divergences, indent=1))
            return
        found = [f for f in report["semantic"]["findings"] if f["class"] == self.kind]
        if not found:
            return
        text = "\n\n".join(f"[{f['rule']}] {f['message']}\nconfig: {f['config_name']}\n"
                           f"steps: {json.dumps(f['steps'])}\n--- paste as a test:\n{f['pytest']}" for f in found)
        if self.kind in ("wrong", "crash") or report["strict"]:
            raise KvcacheFinding(text)
        warnings.warn(f"kvcache conformance: {len(found)} {self.kind} finding(s):\n{text}", stacklevel=1)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, KvcacheFinding):
            hint = self.suite.get().get("hint")
            return f"kvcache conformance ({self.kind}) against {self.config.getoption('kvcache_target')}:\n" \
                   f"{excinfo.value}" + (f"\nhint: {hint}" if hint else "")
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int, str]:
        return "kvcache-conformance", 0, f"kvcache conformance: {self.kind}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("kvcache_target"):
        return
    suite = _Suite(config)
    for kind in CLASSES + ("layout", "coverage"):
        items.append(KvcacheItem.from_parent(session, name=f"kvcache_conformance[{kind}]", suite=suite, kind=kind))
