"""What docs/hf-findings.md and docs/mlxlm-findings.md state of each library target at strict pre-merge: its
verdict, and every distinct cause the suite finds (its class, rule and label), each classed - `real` (a defect of
the library, with its repro in tests/library_repros.py where one is named) or `false alarm` / `spec` (the spec
stricter than the library's contract, or the suite's own reasoning wrong: which mechanism should remove it).
tests/test_library_targets.py holds every target to exactly these.

    python -m tests.library_verdicts hf:static_sliding    # the causes a target gives now, as entries to class
"""

from __future__ import annotations

import json
import sys
from typing import Any

PROFILE = "pre-merge"


def cause_key(finding: dict[str, Any]) -> str:
    """A distinct cause as the report names it: class, rule and label (the label holds the failing step), and the
    configuration its program was shrunk to. Not its message: the values a shrunk program ends on may differ
    between two runs of one cause."""
    return f"{finding['class']} {finding['rule']}: {finding['label']} | {finding['config_name']}"


# Each kind of cause, once: `real...` a defect of the library (its repro named), `false alarm...` the suite's
# own reasoning (which issue-33 mechanism should have removed it), `spec...` the spec stricter than, or unable
# to say, the library's contract.
KINDS: dict[str, str] = {
    'static_overflow':
        'real: StaticLayer.update counts a step before writing it (repro hf_static_overflow)',
    'static_zero':
        "real (minor): StaticCache(max_cache_len=0), the user's own argument, is built unchecked; the first forward raises (repro hf_static_zero_length)",
    'window1':
        'real: DynamicSlidingWindowLayer(sliding_window=1) never trims (repro hf_sliding_window_one)',
    'static_sliding':
        "real: StaticCache's sliding layers drop in-window tokens past max_cache_len (repro hf_static_sliding_past_max_cache_len)",
    'crop_empty':
        "real: a sliding layer's crop before any token raises AttributeError (repro hf_sliding_crop_before_any_token)",
    'sinks_prefill':
        "real: RotatingKVCache's mask for a step longer than the ring ignores keep (repro mlx_prompt_cache_prefill_ignores_sinks)",
    'keep_at_window':
        "real: make_prompt_cache(max_kv_size <= 4) builds RotatingKVCache(max_size, keep=4) with keep >= max_size, unchecked (the user's --max-kv-size; repro mlx_prompt_cache_small_ring)",
    'concat_trim':
        'real: ConcatenateKVCache.trim lowers offset only (repro mlx_concatenate_trim)',
    'fp8_saturates':
        "real: fp8's per-tensor scale, frozen at the first update, saturates every later value above the first step's amplitude (a K of 2 after a first step of 1s reads back 1: beyond any tolerance)",
}

EXPECTED: dict[str, dict[str, Any]] = {
    'hf:dynamic_full': {"verdict": 'CONFORMING', "causes": {
    }},
    'hf:dynamic_sliding': {"verdict": 'NOT CONFORMING', "causes": {
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; ring | cap 1, ring(1)':
            'window1',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; ring | cap 1, ring(1)':
            'crop_empty',
        'wrong OP-ATTEND: wrong OP-ATTEND, after over-strict OP-ATTEND in update_and_fetch: at fetch; ring | cap 1, ring(1)':
            'window1',
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not); ring | cap 1, ring(1)':
            'window1',
    }},
    'hf:static_full': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATOMIC: wrong OP-ATOMIC: at fetch OP-CAP capacity, which the target refused with 'IndexError: index_copy_(): index 1 is out of bounds for dimension 2 with size 1'; flat | cap 1, flat":
            'static_overflow',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity 0); flat | cap 0, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity bool); flat | cap True, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity float); flat | cap 4.0, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity negative); flat | cap -1, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity null); flat | cap None, flat':
            'static_zero',
        "lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity string); flat | cap '4', flat":
            'static_zero',
    }},
    'hf:static_sliding': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (misses tokens the spec attends); ring | cap 1, ring(2)':
            'static_sliding',
    }},
    'hf:quantized_quanto': {"verdict": 'CONFORMING', "causes": {
    }},
    'hf:quantized_hqq': {"verdict": 'CONFORMING', "causes": {
    }},
    'hf:quantized_fp8': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATTEND: wrong OP-ATTEND: at fetch (a row not one token's); flat | cap 1, flat":
            'fp8_saturates',
    }},
    'mlxlm:kv': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:llama_sliding': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:prompt_cache': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not and misses some it does); ring | cap 1, ring(5, keep 4)':
            'sinks_prefill',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (keep); ring | cap 4, ring(4, keep 4)':
            'keep_at_window',
    }},
    'mlxlm:quantized': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:chunked': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:concatenate': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not); flat | cap 1, flat':
            'concat_trim',
    }},
}

def row(target: str) -> str:
    """The target's row of the findings pages' verdict table: verdict, distinct causes, and how many are real
    defects, false alarms of the suite, and the spec stricter than (or unable to say) the library's contract."""
    expected = EXPECTED[target]
    kinds = list(expected["causes"].values())
    real = sum(KINDS[kind].startswith("real") for kind in kinds)
    false = sum(KINDS[kind].startswith("false alarm") for kind in kinds)
    return f"| `{target}` | {expected['verdict']} | {len(kinds)} | {real} | {false} | {len(kinds) - real - false} |"


MESSAGE_CHARS = 300   # a cause's message on the page, cut past this


def page_line(target: str, finding: dict[str, Any]) -> str:
    """A cause's line in the findings page's list: the target, class and rule, the configuration its program was
    shrunk to, the program, and what the suite saw. tests/test_library_targets.py holds each run's lines on the page."""
    message = finding["message"] if len(finding["message"]) <= MESSAGE_CHARS else \
        finding["message"][:MESSAGE_CHARS] + "..."
    return (f"- `{target.split(':', 1)[1]}`: {finding['class']} {finding['rule']}, {finding['config_name']}, "
            f"{len(finding['steps'])} steps: `{json.dumps(finding['steps'])}`; {message}")


def page_section(reports: dict[str, dict[str, Any]]) -> str:
    """The page's "every distinct cause, by kind" list for these targets' reports, in KINDS' order."""
    by_kind: dict[str, list[str]] = {}
    for target, report in reports.items():
        for finding in report["semantic"]["findings"]:
            kind = EXPECTED[target]["causes"].get(cause_key(finding), "unclassed")
            by_kind.setdefault(kind, []).append(page_line(target, finding))
    return "\n".join(f"**{kind}** - {KINDS.get(kind, 'not in KINDS: class it')}\n\n" + "\n".join(lines) + "\n"
                      for kind, lines in sorted(by_kind.items(), key=lambda item: list(KINDS).index(item[0])
                                                if item[0] in KINDS else len(KINDS)))


def _judge(target: str) -> dict[str, Any]:
    from kvcache_spec.conformance.suite import report_json, run_suite
    from kvcache_spec.conformance.targets import PythonTarget

    return report_json(run_suite(PythonTarget(f"python:kvcache_spec.conformance.op.{target}"), PROFILE), True, False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--page"]:   # python -m tests.library_verdicts --page hf: the page's list of causes
        library = sys.argv[2]
        print(page_section({target: _judge(target) for target in EXPECTED if target.startswith(library + ":")}))
        sys.exit(0)
    for target in sys.argv[1:]:
        report = _judge(target)
        print(f"    {target!r}: {{'verdict': {report['verdict']!r}, 'causes': {{")
        for finding in report["semantic"]["findings"]:
            steps = len(finding["steps"])
            print(f"        {cause_key(finding)!r}: '',   # {steps} steps, shrunk {finding['shrunk']}")
        print("    }},")
