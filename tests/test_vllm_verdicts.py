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
    "trusted_args": Kind(
        "stricter", "a malformed call - a negative or bool token id, a bool budget, a request id or keys not "
        "strings, a total past max_model_len, the table of a request not live - is served as a well-formed one",
        f"KVCacheManager and Request check none of their arguments: the engine validates a prompt before a Request "
        f"exists (v1/engine/input_processor.py:557-600: an empty prompt or one longer than max_model_len is refused; "
        f":646-647, token ids checked by the renderer), the scheduler stops a request at max_model_len before "
        f"appending past it, and computes each step's token count itself ({SCHEDULER}:1845-1859); the table of an "
        f"id the manager does not hold is empty (v1/core/kv_cache_coordinator.py:456-461). The manager's "
        f"only caller is the scheduler; the paged face has no trusted-args relaxation yet to declare it"),
    "after_a_trusted_call": Kind(
        "stricter", "a wrong finding in a program run on past such a served malformed call: vLLM's state follows "
        "the call it served, the spec's the call it refused (the token, budget or request count differs from then "
        "on), and conservation, the reservation or a window read no longer match",
        "the same as trusted_args: the first step that differs is the malformed call vLLM's scheduler never makes"),
    "engine_config": Kind(
        "stricter", "an invalid configuration - block_size true, prefix_caching 1, max_model_len 0, a window of 0, "
        "an unknown key - is accepted",
        "the user's settings go through vLLM's CacheConfig (config/cache.py:187 block_size: Field(gt=0), :257 "
        "enable_prefix_caching: bool), a pydantic dataclass in lax mode that coerces true to 1 and 1 to true; "
        "max_model_len is checked by ModelConfig (config/model.py:1070-1075 refuses one below 1), which is built "
        "from a model's own config and so is not among the classes driven here, and the sliding window comes from "
        "the model's config as well: KVCacheManager and the specs take both as given; a key vLLM has no setting "
        "for does not reach it"),
    "unknown_free_skipped": Kind(
        "stricter", "free of a request never admitted, or already freed, does nothing and raises nothing",
        f"{SCHEDULER}:2993-2996, finish_requests skips an id it does not hold (\"if request is None or "
        "request.is_finished(): continue\"): a finish of an unknown request is not an error in vLLM"),
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
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC, after lenient PAGED-FREE in free: at admit; full+window | B 2, 6 blocks, max_len 24, full+window(1), prefix_caching False':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (available); full+window | B 2, 6 blocks, max_len 24, full+window(1), prefix_caching False':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (table); full+window | B 2, 8 blocks, max_len 24, full+window(2)':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC, after lenient PAGED-ARGS in table: at admit; full+window | B 2, 4 blocks, max_len 24, full+window(3), prefix_caching False':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC, after lenient PAGED-FREE in free: at extend; full+window | B 2, 2 blocks, max_len 24, full+window(1), prefix_caching False':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (table); window | B 4, 12 blocks, max_len 32, window(2)':
        'refusal_releases_window',
    'wrong PAGED-ATOMIC: wrong PAGED-ATOMIC: at extend (available); window | B 4, 6 blocks, max_len 32, window(1), prefix_caching False':
        'refusal_releases_window',
    'wrong PAGED-CONSERVE: wrong PAGED-CONSERVE, after lenient PAGED-ARGS in admit: at admit; full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-RESERVE: wrong PAGED-RESERVE, after lenient PAGED-ARGS in extend: at extend; full | B 1, 4 blocks, max_len 16, full, prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-RESERVE: wrong PAGED-RESERVE, after lenient PAGED-ARGS in extend: at check; full | B 4, 1 blocks, max_len 32, full, prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-RESERVE: wrong PAGED-RESERVE, after lenient PAGED-ARGS in extend: at admit; full | B 2, 2 blocks, max_len 24, full, prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-RESERVE: wrong PAGED-RESERVE, after lenient PAGED-ARGS in extend: at free; full | B 8, 7 blocks, max_len 96, full, prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-WINDOW-RELEASE: wrong PAGED-WINDOW-RELEASE, after lenient PAGED-ARGS in extend: at admit; full+window | B 2, 6 blocks, max_len 24, full+window(2), prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-WINDOW-RELEASE: wrong PAGED-WINDOW-RELEASE, after lenient PAGED-ARGS in extend: at extend; window | B 8, 2 blocks, max_len 96, window(4), prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-WINDOW-RELEASE: wrong PAGED-WINDOW-RELEASE, after lenient PAGED-ARGS in extend: at admit; window | B 1, 2 blocks, max_len 32, window(2), prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-WINDOW-RELEASE: wrong PAGED-WINDOW-RELEASE, after lenient PAGED-ARGS in extend: at free; window | B 4, 5 blocks, max_len 32, window(5), prefix_caching False':
        'after_a_trusted_call',
    'wrong PAGED-WINDOW-RELEASE: wrong PAGED-WINDOW-RELEASE, after lenient PAGED-ARGS in extend: at check; window | B 8, 9 blocks, max_len 96, window(4), prefix_caching False':
        'after_a_trusted_call',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at extend (tokens); full | B 8, 12 blocks, max_len 96, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at admit (tokens); full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at admit (keys); full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at admit (budget); full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at admit (request); full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at table (request); full | B 1, 1 blocks, max_len 24, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at table (request); full+window | B 8, 1024 blocks, max_len 96, full+window(12)':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at extend (budget); full | B 1, 2 blocks, max_len 16, full, prefix_caching False':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at table (request); window | B 4, 12 blocks, max_len 32, window(5)':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at extend (tokens); full+window | B 8, 1024 blocks, max_len 96, full+window(12)':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at extend (budget); full+window | B 2, 16 blocks, max_len 24, full+window(3)':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at admit (budget); window | B 4, 12 blocks, max_len 32, window(5)':
        'trusted_args',
    'lenient PAGED-ARGS: lenient PAGED-ARGS: at extend (tokens); window | B 4, 12 blocks, max_len 32, window(5)':
        'trusted_args',
    'lenient PAGED-CONFIG: lenient PAGED-CONFIG: at create (block_size bool); full | B True, 8 blocks, max_len 32, full':
        'engine_config',
    'lenient PAGED-CONFIG: lenient PAGED-CONFIG: at create (max_model_len 0); full | B 4, 8 blocks, max_len 0, full':
        'engine_config',
    'lenient PAGED-CONFIG: lenient PAGED-CONFIG: at create (groups[0].window absent); window | B 4, 8 blocks, max_len 32, window(0)':
        'engine_config',
    'lenient PAGED-CONFIG: lenient PAGED-CONFIG: at create (prefix_caching int); full | B 4, 8 blocks, max_len 32, full, prefix_caching 1':
        'engine_config',
    'lenient PAGED-CONFIG: lenient PAGED-CONFIG: at create (extra int); full | B 4, 8 blocks, max_len 32, full':
        'engine_config',
    'lenient PAGED-FREE: lenient PAGED-FREE: at free (request); full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'unknown_free_skipped',
    'over-strict PAGED-IDLE-FIT: over-strict PAGED-IDLE-FIT: at admit; full | B 1, 1 blocks, max_len 12, full, prefix_caching False':
        'whole_prompt_must_fit',
}}


def suggested_kind(finding: dict[str, Any]) -> str:
    """The kind a cause most likely is, for a person to check against its message and program before it enters
    EXPECTED: how the causes above were classed (a refused extend that changed something is the window release;
    anything past a served malformed call follows from it)."""
    if finding["rule"] == "PAGED-ATOMIC" and "after the refused extend" in finding["message"]:
        return "refusal_releases_window"
    if "after lenient" in finding["label"]:
        return "after_a_trusted_call"
    return {"PAGED-ARGS": "trusted_args", "PAGED-CONFIG": "engine_config", "PAGED-FREE": "unknown_free_skipped",
            "PAGED-IDLE-FIT": "whole_prompt_must_fit"}.get(finding["rule"], "unclassed")


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
