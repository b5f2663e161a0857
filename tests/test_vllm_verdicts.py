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

MANAGER = "v1/core/kv_cache_manager.py"
SCHEDULER = "v1/core/sched/scheduler.py"
KINDS: dict[str, Kind] = {
    "refusal_releases_window": Kind(
        "stricter", "a refused extend of a request with a sliding-window group first hands the window group's blocks "
        "that left every window back to the pool (their table entries become the null block): available() grows "
        "and the table changes although the call was refused",
        f"{MANAGER}:557-568, allocate_slots frees the skipped blocks before it checks the fit, on purpose: \"We can "
        "do this even if we cannot schedule this request due to insufficient free blocks. Should call this function "
        "before allocating new blocks to reduce the number of evicted blocks\" (the check follows at :586). Only "
        "blocks out of every window the request still reads go (PAGED-WINDOW-RELEASE holds), so nothing attended "
        "is lost; PAGED-ATOMIC asks more (a refusal changes nothing)", "test_vllm_refused_extend_releases_window_blocks"),
    "whole_prompt_must_fit": Kind(
        "stricter", "on an idle pool, an admission whose first chunk fits is refused because the whole prompt does "
        "not",
        f"the scheduler admits with allocate_slots(..., full_sequence_must_fit=self.scheduler_reserve_full_isl) "
        f"({SCHEDULER}:1435-1449), True by default (config/scheduler.py:190-195: \"checks whether the full input "
        f"sequence length fits in the KV cache before admitting a new request, rather than only checking the first "
        f"chunk. Prevents over-admission and KV cache thrashing\"); {MANAGER}:531-548 refuses then. A prompt that "
        f"can never fit is never started; PAGED-IDLE-FIT counts only the reserved chunk"),
}

EXPECTED: dict[str, Any] = {"verdict": "NOT CONFORMING", "causes": {
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (available); full+window | B 2, 16 blocks, max_len 24, full+window(3)':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (table); full+window | B 2, 16 blocks, max_len 24, full+window(3)':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (table); window | B 4, 6 blocks, max_len 32, window(2)':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (available); window | B 4, 6 blocks, max_len 32, window(1), prefix_caching False':
        'refusal_releases_window',
    'over-strict PAGED-IDLE-FIT: over-strict PAGED-IDLE-FIT: at admit; full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'whole_prompt_must_fit',
}}


def suggested_kind(finding: dict[str, Any]) -> str:
    """The kind a cause most likely is, for a person to check against its message and program before it enters
    EXPECTED: how the causes above were classed (a refused extend that changed something is the window release)."""
    if finding["rule"] == "PAGED-ATOMIC" and "after the refused extend" in finding["message"]:
        return "refusal_releases_window"
    return {"PAGED-IDLE-FIT": "whole_prompt_must_fit"}.get(finding["rule"], "unclassed")


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
