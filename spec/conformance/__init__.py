"""The conformance suite: run the spec's checks against any implementation (Python or subprocess).

    kvcache conformance --target python:MODULE:FACTORY    # or cmd:COMMAND, see spec/PROTOCOL.md
    kvcache conformance ... --scope flat                   # a partial implementation (scope.py, SCOPE-BORDER)
    kvcache conformance ... --save-findings DIR            # each finding as a vector file, replayable anywhere
    kvcache vectors [--check]                              # golden vectors in spec/vectors/
"""

from .engine import CLASSES, Finding, RunResult, run_program
from .suite import SuiteResult, replay, run_suite
from .targets import Outcome, PythonTarget, SubprocessTarget, Target, TargetCrash, TargetError, parse_target

__all__ = ["CLASSES", "Finding", "Outcome", "PythonTarget", "RunResult", "SubprocessTarget", "SuiteResult",
           "Target", "TargetCrash", "TargetError", "parse_target", "replay", "run_program", "run_suite"]
