"""What docs/vllm.md states of vLLM 0.33.0's KVCacheManager judged by the paged face's suite (strict pre-merge,
`python:kvcache_spec.conformance.libraries.vllm:manager`): its verdict and every distinct cause, each of a named kind,
and each kind classed with vLLM's own evidence (file:line in the installed package, under site-packages/vllm/) as
tests/library_verdicts.py classes the op face's libraries: `defect` (its standalone repro named), `stricter` (the
spec asks more than vLLM's documented contract), `uncertain`, `false alarm`. The page counts "real" as `defect` only.

tests/test_vllm_target.py holds a fresh run to exactly these (where vllm is installed); the tests here hold the page
to them and need no vllm.

    python -m tests.test_vllm_verdicts            # the page's list of causes, by kind, from a fresh run (needs vllm)
    python -m tests.test_vllm_verdicts --entries  # a fresh run's causes as EXPECTED entries, each kind a suggestion
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .library_verdicts import CLASSES, Kind, cause_key, page_line

PROFILE = "pre-merge"
TARGET = "vllm:manager"   # python:kvcache_spec.conformance.libraries.vllm:manager
PAGE = Path(__file__).resolve().parent.parent / "docs" / "vllm.md"

# vLLM's causes by kind. None at the moment: what the page classed before is now in the spec's terms - a refused
# extend handing back window blocks out of every needed window (v1/core/kv_cache_manager.py:557-568, PAGED-ATOMIC
# allows it) and an idle-pool admission refused because the whole prompt does not fit (v1/core/sched/scheduler.py
# :1435-1449, PAGED-IDLE-FIT allows it) - and the malformed calls are not sent (trusted-args). A cause a later run
# finds enters here with its class and evidence (python -m tests.test_vllm_verdicts --entries).
KINDS: dict[str, Kind] = {}

EXPECTED: dict[str, Any] = {"verdict": "CONFORMING", "causes": {}}


def suggested_kind(finding: dict[str, Any]) -> str:
    """The kind a cause most likely is, for a person to check against its message and program before it enters
    EXPECTED: none is known (KINDS is empty), so each cause is to be classed by hand."""
    return "unclassed"


def counts() -> dict[str, int]:
    """The distinct causes counted by class (CLASSES' order)."""
    kinds = list(EXPECTED["causes"].values())
    return {cls: sum(KINDS[kind].cls == cls for kind in kinds) for cls in CLASSES}


def row() -> str:
    """The page's verdict row: the target, verdict, distinct causes, and how many of each class."""
    return (f"| `manager` | {EXPECTED['verdict']} | {len(EXPECTED['causes'])} | "
            + " | ".join(str(count) for count in counts().values()) + " |")


def kind_heading(kind: str) -> str:
    entry = KINDS[kind]
    repro = f" Repro: `tests/test_vllm_target.py::{entry.repro}`." if entry.repro else ""
    return f"**{kind}** - {entry.cls}: {entry.what}. Evidence: {entry.evidence}.{repro}"


def page_section(report: dict[str, Any]) -> str:
    """The page's list of every distinct cause of a report, by kind, in KINDS' order."""
    by_kind: dict[str, list[str]] = {}
    for finding in report["semantic"]["findings"]:
        by_kind.setdefault(EXPECTED["causes"].get(cause_key(finding), "unclassed"), []).append(
            page_line(TARGET, finding))
    order = [*KINDS, "unclassed"]
    return "\n".join((kind_heading(kind) if kind in KINDS else f"**{kind}** - not in KINDS: class it") + "\n\n"
                     + "\n".join(lines) + "\n" for kind, lines in sorted(by_kind.items(), key=lambda kv: order.index(kv[0])))


def test_every_cause_is_of_a_kind_classed_with_evidence() -> None:
    assert set(EXPECTED["causes"].values()) <= set(KINDS)
    for name, kind in KINDS.items():
        assert kind.cls in CLASSES and kind.evidence and kind.what, name
        assert kind.cls != "defect" or kind.repro, f"{name}: a defect names its standalone repro"


def test_the_page_states_the_verdict_each_kind_and_its_evidence() -> None:
    page = PAGE.read_text()
    assert row() in page, row()
    for kind in sorted(set(EXPECTED["causes"].values())):
        assert kind_heading(kind) in page, kind


if __name__ == "__main__":
    from kvcache_spec.conformance.suite import report_json, run_suite
    from kvcache_spec.conformance.targets import PythonTarget

    judged = report_json(run_suite(PythonTarget(f"python:kvcache_spec.conformance.libraries.{TARGET}"), PROFILE),
                         True, False)
    if sys.argv[1:] == ["--entries"]:
        for finding in judged["semantic"]["findings"]:
            print(f"    {cause_key(finding)!r}:\n        {suggested_kind(finding)!r},   # suggested: check it")
    else:
        print(page_section(judged))
    sys.exit(0)
