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
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch; ring | cap 1, ring(1)':
            'window1',
    }},
    'hf:static_full': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATOMIC: wrong OP-ATOMIC: at fetch OP-CAP capacity, which the target refused with 'IndexError: index_copy_(): index 1 is out of bounds for dimension 2 with size 1'; flat | cap 1, flat":
            'static_overflow',
        'wrong OP-ATOMIC: wrong OP-ATOMIC: at fetch; flat | cap 8, flat x2':
            'static_overflow',
    }},
    'hf:static_sliding': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch; ring | cap 1, ring(2)':
            'static_sliding',
    }},
    'hf:quantized_quanto': {"verdict": 'CONFORMING', "causes": {
    }},
    'hf:quantized_hqq': {"verdict": 'CONFORMING', "causes": {
    }},
    'hf:quantized_fp8': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch; flat | cap 1, flat':
            'fp8_saturates',
    }},
    'mlxlm:kv': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:llama_sliding': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:prompt_cache': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch; ring | cap 1, ring(5, keep 4)':
            'sinks_prefill',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create; ring | cap 4, ring(4, keep 4)':
            'keep_at_window',
    }},
    'mlxlm:quantized': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:chunked': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:concatenate': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch; flat | cap 1, flat':
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
