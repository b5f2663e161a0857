"""One check the op face's stand-in tests share (tests/test_op_batch.py, test_op_chunked.py, test_op_persist.py,
test_op_quantize.py): a stand-in is found as its zoo module says, with a short program that replays the same on the
stand-in and that the reference serves with no finding."""

from __future__ import annotations

import json

from kvcache_spec.conformance.suite import NOT_CONFORMING, replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget

MAX_STEPS = 4   # issue 42's bar: each new rule's stand-in found with a program of at most 4 steps


def assert_found_short(spec: str, found_as: tuple[str, str], reference: str) -> None:
    """The quick strict run of `spec` finds (class, rule) `found_as`; its shortest such program has at most
    MAX_STEPS steps, is JSON, shows the same class and rule again when replayed, and the reference serves it."""
    report = report_json(run_suite(PythonTarget(spec), "quick"), True, False)
    found = [f for f in report["semantic"]["findings"] if (f["class"], f["rule"]) == found_as]
    assert report["verdict"] == NOT_CONFORMING and found, [(f["class"], f["rule"]) for f in
                                                           report["semantic"]["findings"]]
    first = min(found, key=lambda f: len(f["steps"]))
    assert len(first["steps"]) <= MAX_STEPS, first["steps"]
    json.dumps(first)
    again = replay(spec, first["config"], first["steps"])
    assert again is not None and (again["class"], again["rule"]) == found_as
    assert replay(reference, first["config"], first["steps"]) is None
