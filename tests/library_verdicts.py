"""What docs/hf-findings.md and docs/mlxlm-findings.md state of each library target at strict pre-merge: its
verdict, and every distinct cause the suite finds (its class, rule and label), each classed - `real` (a defect of
the library, with its repro in tests/library_repros.py where one is named) or `false alarm` / `spec` (the spec
stricter than the library's contract, or the suite's own reasoning wrong: which mechanism should remove it).
tests/test_library_targets.py holds every target to exactly these.

    python -m tests.library_verdicts hf:static_sliding    # the causes a target gives now, as entries to class
"""

from __future__ import annotations

import sys
from typing import Any

PROFILE = "pre-merge"


def cause_key(finding: dict[str, Any]) -> str:
    """A distinct cause as the report names it: class, rule and label (the label holds the failing step)."""
    return f"{finding['class']} {finding['rule']}: {finding['label']}"


EXPECTED: dict[str, dict[str, Any]] = {}


if __name__ == "__main__":
    from kvcache_spec.conformance.suite import report_json, run_suite
    from kvcache_spec.conformance.targets import PythonTarget

    for target in sys.argv[1:]:
        report = report_json(run_suite(PythonTarget(f"python:kvcache_spec.conformance.op.{target}"), PROFILE),
                             True, False)
        print(f"    {target!r}: {{'verdict': {report['verdict']!r}, 'causes': {{")
        for finding in report["semantic"]["findings"]:
            steps = len(finding["steps"])
            print(f"        {cause_key(finding)!r}: '',   # {steps} steps, shrunk {finding['shrunk']}")
        print("    }},")
