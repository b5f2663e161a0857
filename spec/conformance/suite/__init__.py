"""The suite: edge and random programs over a layout's configs, findings shrunk and reported.

One run goes through its phases, one module each: plan.py (the profiles, the verdicts, the limits, the
order of the programs), drive.py (the programs run by the layout's engine; `run_suite`, `replay`),
shrink.py (a finding's minimal program, kept unless its cause is most likely kept), account.py (what a
run adds to the result; the counterexamples per cause), report.py (JSON, JUnit, pytest; a run compared to a
baseline report); against.py (two targets on the same programs, the differences shrunk on both).
"""

from .account import Reported, SuiteResult, cause, how_it_crashed
from .drive import border, replay, run_suite
from .plan import (CONFORMING, CRASH_SHRINK_BUDGET, INCOMPLETE, MAX_CAUSES, MAX_CRASHES, MAX_SHRINKS, NOT_CONFORMING,
                   PROFILES, REPORT_FORMAT, SAME_CRASH_IN_A_ROW, Profile, declared_scope)
from .report import baseline_problem, compare_to_baseline, coverage_json, pytest_text, report_json, report_junit, wrap
from .shrink import shrink

__all__ = ["CONFORMING", "CRASH_SHRINK_BUDGET", "INCOMPLETE", "MAX_CAUSES", "MAX_CRASHES", "MAX_SHRINKS",
           "NOT_CONFORMING", "PROFILES", "REPORT_FORMAT", "SAME_CRASH_IN_A_ROW", "Profile", "Reported", "SuiteResult",
           "baseline_problem", "border", "cause", "compare_to_baseline", "coverage_json", "declared_scope", "how_it_crashed", "pytest_text", "replay",
           "report_json", "report_junit", "run_suite", "shrink", "wrap"]
