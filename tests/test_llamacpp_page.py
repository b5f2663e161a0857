"""docs/llamacpp-findings.md and the README state what tests/llamacpp_causes.py holds: every llama.cpp cause
classed - (a) a defect under llama.cpp's documented use, (b) the spec stricter than its documented contract, (c)
uncertain - with the library's evidence, and the targets' counts, in which only (a) is a defect. CI's llama stage
holds each target's report to the same table (.ci/run). Needs no extra: it reads the pages and the table."""

from __future__ import annotations

import re

from . import llamacpp_causes as lc

README = lc.ROOT / "README.md"


def test_the_findings_page_holds_the_generated_table_of_causes() -> None:
    assert lc.generated() in lc.PAGE.read_text(), "refresh it: python -m tests.llamacpp_causes --page"


def test_the_readme_counts_each_targets_causes_by_class() -> None:
    assert lc.verdict_rows() in README.read_text()


def test_every_cause_has_a_class_and_evidence_at_a_line() -> None:
    numbers = [cause.number for cause in lc.CAUSES]
    assert len(numbers) == len(set(numbers))
    for cause in lc.CAUSES:
        assert cause.klass in lc.CLASSES, cause.number
        if cause.klass != "c":   # a defect, or the spec stricter: the line that says so
            assert re.search(r"\.(h|cpp):\d+", cause.evidence), (cause.number, cause.evidence)
        assert set(cause.targets) <= set(lc.TARGETS), cause.number


def test_every_report_key_names_a_cause() -> None:
    numbers = {cause.number for cause in lc.CAUSES}
    assert set(lc.KEYS.values()) <= numbers
    assert all(set(keys.values()) <= numbers and target in lc.TARGETS for target, keys in lc.TARGET_KEYS.items())
    found = {cause.number for cause in lc.CAUSES if cause.targets}
    assert found <= set(lc.KEYS.values()), "a cause some target finds needs its report key"


def _report(*keys: str) -> dict:   # type: ignore[type-arg]
    """A report whose causes have these keys (cause_key's "class rule: label")."""
    findings = [{"class": key.split(" ", 1)[0], "rule": key.split(" ", 2)[1].rstrip(":"), "label": key.split(": ", 1)[1]}
                for key in keys]
    assert [lc.cause_key(finding) for finding in findings] == list(keys)
    return {"semantic": {"findings": findings}}


def test_a_report_is_checked_against_the_page() -> None:
    """A cause with no class, a cause the page does not give that target, and one it gives but the run missed,
    each fail CI's check; the page's own causes pass."""
    default = [key for key, number in lc.KEYS.items() if "default" in lc.by_number()[number].targets]
    assert lc.check_report("default", _report(*default)) == []
    problems = lc.check_report("default", _report(*default[1:], "wrong OP-RM: wrong OP-RM: at rm; flat"))
    assert any("NO CLASS" in p for p in problems) and any("not found" in p for p in problems), problems
    unified_only = next(key for key, number in lc.KEYS.items() if lc.by_number()[number].targets == lc.UNIFIED)
    assert any("does not say" in p for p in lc.check_report("default", _report(*default, unified_only)))


def test_the_readme_counts_only_class_a_as_defects() -> None:
    a, b, c = lc.counts("default")
    assert a == sum(1 for cause in lc.CAUSES if "default" in cause.targets and cause.klass == "a")
    assert f"| {a + b + c} | {a} | {b} | {c} |" in lc.verdict_rows().splitlines()[2]
