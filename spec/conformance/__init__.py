"""The conformance suite: run the spec's checks against any implementation (Python or subprocess).

    kvcache conformance --target python:MODULE:FACTORY    # or cmd:COMMAND, see spec/PROTOCOL.md
    kvcache conformance ... --scope flat                   # a partial implementation (scope.py, SCOPE-BORDER)
    kvcache conformance ... --save-findings DIR            # each finding as a vector file, replayable anywhere
    kvcache vectors [--check]                              # golden vectors in spec/vectors/

The shared machinery is at this level (engine.py the core, suite/, targets.py, scope.py, coverage.py,
vectors.py, serve.py, cli.py); each layout is a subpackage (sequence/, cell/, op/) reached through the
registry, layouts.py: no shared module imports a layout, and no layout imports another.
"""

from typing import Optional

from . import layouts
from . import scope as scopes
from .configs import JsonConfig
from .engine import CLASSES, Finding, RunResult, Step
from .suite import SuiteResult, replay, run_suite
from .targets import Outcome, PythonTarget, SubprocessTarget, Target, TargetCrash, TargetError, parse_target


def run_program(target: Target, cfg: JsonConfig, program: list[Step], exact: bool = False,
                scope: Optional[scopes.Scope] = None, row_budget: Optional[int] = None) -> RunResult:
    """One sequence program on a target (the sequence layout's engine, through the registry)."""
    return layouts.get("sequence").run_program(target, cfg, program, exact, scope=scope, row_budget=row_budget)

__all__ = ["CLASSES", "Finding", "Outcome", "PythonTarget", "RunResult", "SubprocessTarget", "SuiteResult",
           "Target", "TargetCrash", "TargetError", "parse_target", "replay", "run_program", "run_suite"]
