"""--against: two targets - an old and a new version of a library, each in its own environment (a `cmd:` target or
`--isolate`) - run the same programs (the same profile and seed); a program wrong on one and right on the other is
reported, shrunk on both at once: the minimal program that still fails on the one and passes on the other."""

from __future__ import annotations

from typing import Any, Optional

from .. import layouts
from ..configs import JsonConfig, describe
from ..engine import Finding, Step
from ..targets import Target
from .account import Reported, SuiteResult, cause, cause_key
from .report import label
from .shrink import shrink

# Programs shrunk per direction (each candidate runs both targets); every differing program is counted.
MAX_DIFFERENCES = 8


def _finding(target: Target, cfg: JsonConfig, steps: list[Step]) -> tuple[Optional[Finding], list[Step]]:
    run = layouts.run_any(target, cfg, steps, True)
    return run.finding, run.steps


def differences(target: Target, result: SuiteResult, other: Target, other_result: SuiteResult,
                budget: int) -> dict[str, Any]:
    """The programs wrong on one target and right on the other, each direction's shrunk to its minimal program
    (distinct causes only); a program that does not differ again when run alone is left out (it needed the
    programs before it)."""
    out: dict[str, Any] = {"against": other.name, "same_programs": result.planned == other_result.planned,
                           "only_here": [], "only_there": []}
    for key, wrong, wrong_result, right, right_result in (
            ("only_here", target, result, other, other_result), ("only_there", other, other_result, target, result)):
        numbers = sorted(set(wrong_result.failing_steps) - right_result.failing_programs)
        out[f"{key}_programs"] = len(numbers)
        seen: set[str] = set()
        for number in numbers[:MAX_DIFFERENCES]:
            cfg, program = wrong_result.failing_steps[number]

            def check(c: JsonConfig, p: list[Step], wrong: Target = wrong, right: Target = right) -> Optional[Finding]:
                got, _ = _finding(wrong, c, p)
                return got if got is not None and _finding(right, c, p)[0] is None else None

            finding = check(cfg, program)
            if finding is None:
                continue
            small_cfg, small, minimal = shrink(cfg, program, finding, check, budget=budget)
            final, steps = _finding(wrong, small_cfg, small)
            if final is None or _finding(right, small_cfg, small)[0] is not None:   # flaky: as found
                small_cfg, final, steps, minimal = cfg, finding, _finding(wrong, cfg, program)[1], False
            reported = Reported(final, small_cfg, steps)
            key_of = cause_key(cause(final, small_cfg, steps))
            if key_of in seen:
                continue
            seen.add(key_of)
            out[key].append({"wrong_on": wrong.name, "right_on": right.name, "program": number,
                             "class": final.kind, "rule": final.rule, "label": label(reported),
                             "message": final.message, "config": small_cfg, "config_name": describe(small_cfg),
                             "steps": steps, "shrunk": minimal})
    return out
