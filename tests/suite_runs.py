"""Shared by the conformance tests: a command target's spec, and a whole suite run on it that always
closes the target (a test that fails must not leave a served process behind)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from kvcache_spec.conformance import run_suite
from kvcache_spec.conformance.suite import SuiteResult
from kvcache_spec.conformance.targets import SubprocessTarget

PYTHON = sys.executable


def module_cmd(module: str, *args: str) -> str:
    """The cmd: spec that serves `python -m module args...`."""
    return " ".join(["cmd:" + PYTHON, "-m", module, *args])


def cmd_suite(spec: str, profile: str = "quick", seed: int = 0, timeout: float = 5.0,
              start_timeout: Optional[float] = None, **options: Any) -> tuple[SuiteResult, SubprocessTarget]:
    """run_suite on a fresh SubprocessTarget(spec), closed afterwards whatever happened; the closed
    target is returned too, for checks on what it left behind."""
    target = SubprocessTarget(spec, timeout=timeout, start_timeout=start_timeout)
    try:
        return run_suite(target, profile, seed=seed, **options), target
    finally:
        target.close()
