"""The suite: edge and random programs over the suite's configs, findings shrunk and reported."""

from __future__ import annotations

import json
import random
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..rules import BY_ID
from . import scope as scopes
from .configs import BAD_CONFIGS, SUITE_CONFIGS, JsonConfig, describe
from .engine import CRASH, LENIENT, OVER_STRICT, WRONG, Finding, Step, run_program
from .programs import edge_programs, random_program, shrink
from .targets import SubprocessTarget, Target, TargetCrash, parse_target

REPORT_FORMAT = "kvcache-conformance-report/1"
# profile -> (random programs, largest program, shrink budget per finding, wall-clock budget in seconds)
PROFILES: dict[str, tuple[int, int, int, float]] = {
    "quick": (150, 24, 300, 60.0),
    "pre-merge": (1500, 40, 600, 600.0),
    "deep": (15000, 60, 2000, 3600.0),
}


@dataclass
class Reported:
    finding: Finding
    config: JsonConfig
    steps: list[Step]
    hits: int = 1


@dataclass
class SuiteResult:
    target: str
    profile: str
    seed: int
    findings: dict[tuple[str, str], Reported] = field(default_factory=dict)
    layout: list[dict[str, Any]] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    programs: int = 0
    calls: int = 0
    seconds: float = 0.0
    first_counterexample: Optional[float] = None
    first_counterexample_programs: Optional[int] = None
    requests_per_second: Optional[float] = None
    aborted: str = ""
    scope: dict[str, Any] = field(default_factory=dict)   # scope.summary: features, what was left out

    def classes(self) -> set[str]:
        return {kind for kind, _ in self.findings}

    def conforming(self, strict: bool = False, exact_layout: bool = False) -> bool:
        failing = {WRONG, CRASH} | ({LENIENT, OVER_STRICT} if strict else set())
        return not (self.classes() & failing) and not self.aborted and not (exact_layout and self.layout)


def replay(target: Union[str, Target], config: JsonConfig, steps: list[Step],
           exact: bool = False) -> Optional[dict[str, Any]]:
    """Run one step list on a target; the finding as a dict, or None when the target conforms on it."""
    owned = isinstance(target, str)
    chosen = parse_target(target) if isinstance(target, str) else target
    try:
        result = run_program(chosen, config, steps, exact)
    finally:
        if owned:
            chosen.close()
    if result.finding is None:
        return None
    f = result.finding
    return {"class": f.kind, "rule": f.rule, "message": f.message, "step_index": f.step_index}


def run_suite(target: Target, profile: str = "quick", seed: int = 0,
              configs: tuple[JsonConfig, ...] = SUITE_CONFIGS, deadline: Optional[float] = None,
              stop_after_first: bool = False, crash_shrink_budget: int = 12, edges: bool = True,
              scope: Optional[scopes.Scope] = None) -> SuiteResult:
    """Edge programs for every config inside the scope, then random ones, then the border (configs
    outside the scope must be refused); each new (class, rule) is shrunk once.

    scope: overrides the target's declared scope (the CLI's --scope)."""
    n_random, largest, budget, seconds = PROFILES[profile]
    started = time.monotonic()
    deadline = started + (seconds if deadline is None else deadline)
    result = SuiteResult(target.name, profile, seed)
    rng = random.Random(seed)
    requests_before = target.requests if isinstance(target, SubprocessTarget) else 0
    scope = scope or declared_scope(target, configs[0], result)
    if scope is None:
        return result
    result.scope = scopes.summary(scope, configs)
    result.skipped |= set(scopes.notes(result.scope))
    configs, outside = (tuple(part) for part in scopes.split(configs, scope))
    if not configs:   # a verdict on nothing would be vacuous
        result.aborted = f"no suite configuration lies inside the scope [{scope}] ({scope.source}): nothing to check"
        return result

    def check(cfg: JsonConfig, program: list[Step]) -> Optional[Finding]:
        return run_program(target, cfg, program, exact=True, scope=scope).finding

    def one(cfg: JsonConfig, program: list[Step]) -> bool:
        """Run one program; False when the suite must stop."""
        run = run_program(target, cfg, program, exact=True, scope=scope)
        result.programs += 1
        result.calls += run.calls
        result.skipped |= run.skipped
        if run.layout and len(result.layout) < 5:
            result.layout.append({"config": cfg, "divergences": run.layout})
        finding = run.finding
        if finding is None:
            return True
        if result.first_counterexample is None:
            result.first_counterexample = time.monotonic() - started
            result.first_counterexample_programs = result.programs
        if finding.key() in result.findings:
            result.findings[finding.key()].hits += 1
            return True
        if finding.kind == CRASH and finding.step_index < 0:
            result.findings[finding.key()] = Reported(finding, cfg, [])
            result.aborted = f"the target crashed while a cache was being created: {finding.message}"
            return False
        if not program:   # a config finding: nothing to shrink
            result.findings[finding.key()] = Reported(finding, cfg, [])
            return finding.kind != CRASH
        # A crash ends the run (after shrinking, on a small budget: each hang costs a timeout).
        small_cfg, small = shrink(cfg, program, finding, check,
                                  budget=budget if finding.kind != CRASH else min(budget, crash_shrink_budget))
        final = run_program(target, small_cfg, small, exact=True)
        if final.finding is None or final.finding.key() != finding.key():   # flaky target: keep the original
            small_cfg, final = cfg, run
        result.findings[finding.key()] = Reported(final.finding or finding, small_cfg, final.steps)
        if finding.kind == CRASH:
            result.aborted = f"stopped at the first crash: {finding.message}"
            return False
        return not stop_after_first

    try:
        work: list[tuple[JsonConfig, list[Step]]] = [(cfg, program) for cfg in configs
                                                     for _, program in edge_programs(cfg)] if edges else []
        for cfg, program in work:
            if time.monotonic() > deadline or not one(cfg, program):
                return result
        for _ in range(n_random):
            if time.monotonic() > deadline:
                break
            cfg = rng.choice(configs)
            if not one(cfg, random_program(cfg, rng, rng.randint(3, largest))):
                return result
        if not border(outside, deadline, result, one, check):
            return result
        # Config validation last: a target that crashes on a bad config ends the run.
        if isinstance(target, SubprocessTarget):
            for _, bad_cfg, _ in BAD_CONFIGS:
                if time.monotonic() > deadline or not one(bad_cfg, []):
                    break
        else:
            result.skipped.add("config validation: a python: target gets a kvcache.CacheConfig, "
                               "which validates itself")
        return result
    finally:
        result.seconds = time.monotonic() - started
        if isinstance(target, SubprocessTarget) and result.seconds > 0:
            result.requests_per_second = (target.requests - requests_before) / result.seconds


def declared_scope(target: Target, first: JsonConfig, result: SuiteResult) -> Optional[scopes.Scope]:
    """The target's declared scope; None (and the crash recorded) when its handshake fails."""
    try:
        return target.declared_scope()
    except TargetCrash as crash:   # what the first create would have reported
        finding = Finding(CRASH, "CFG-TYPE", f"create({describe(first)}): {crash}", -1)
        result.findings[finding.key()] = Reported(finding, first, [])
        result.aborted = f"the target crashed while a cache was being created: {finding.message}"
        return None


def border(outside: tuple[JsonConfig, ...], deadline: float, result: SuiteResult,
           one: Callable[[JsonConfig, list[Step]], bool],
           check: Callable[[JsonConfig, list[Step]], Optional[Finding]]) -> bool:
    """SCOPE-BORDER: each suite config outside the scope must be refused at creation. One that is
    accepted is probed with the edge programs until the target is seen serving it another way
    (wrong); accepted but never seen wrong stays lenient. False when the suite must stop."""
    wrong = (WRONG, scopes.BORDER_RULE)
    for cfg in outside:
        if time.monotonic() > deadline or wrong in result.findings:
            break
        if check(cfg, []) is None:
            continue   # refused at creation, as it must be
        if not one(cfg, []):   # accepted (or died on it): recorded
            return False
        for _, program in edge_programs(cfg):
            if time.monotonic() > deadline or wrong in result.findings:
                break
            if not one(cfg, program):
                return False
    if wrong in result.findings:   # the same acceptance, now shown to be wrong: one finding, not two
        result.findings.pop((LENIENT, scopes.BORDER_RULE), None)
    return True


# --- reports ---------------------------------------------------------------------------------------

def pytest_text(target: str, reported: Reported) -> str:
    """A test to paste into the target's repository: replays the minimal step list."""
    f = reported.finding
    name = f"{f.kind}_{f.rule}".lower().replace("-", "_")
    statement = BY_ID[f.rule].statement if f.rule in BY_ID else ""
    message = f.message[:300].replace("\n", " ")
    return (f'def test_kvcache_conformance_{name}() -> None:\n'
            f'    """{f.kind} {f.rule}: {statement}"""\n'
            f'    # {message}\n'
            f'    from kvcache_spec.conformance import replay\n'
            f'    config = {reported.config!r}\n'
            f'    steps = {reported.steps!r}\n'
            f'    finding = replay({target!r}, config, steps)\n'
            f'    assert finding is None, finding\n')


def report_json(result: SuiteResult, strict: bool, exact_layout: bool) -> dict[str, Any]:
    findings: list[dict[str, Any]] = [{"class": r.finding.kind, "rule": r.finding.rule,
                 "statement": BY_ID[r.finding.rule].statement if r.finding.rule in BY_ID else "",
                 "message": r.finding.message, "config": r.config, "config_name": describe(r.config),
                 "steps": r.steps, "programs_hit": r.hits, "pytest": pytest_text(result.target, r)}
                for r in result.findings.values()]
    order = {WRONG: 0, CRASH: 1, LENIENT: 2, OVER_STRICT: 3}
    findings.sort(key=lambda f: (order[f["class"]], f["rule"]))
    return {
        "format": REPORT_FORMAT, "target": result.target, "profile": result.profile, "seed": result.seed,
        "strict": strict, "exact_layout": exact_layout,
        "conforming": result.conforming(strict, exact_layout),
        "semantic": {"conforming": not (result.classes() & {WRONG, CRASH}) and not result.aborted,
                     "findings": findings},
        "layout": {"canonical": not result.layout, "divergences": result.layout},
        "aborted": result.aborted,
        "scope": result.scope,
        "skipped": sorted(result.skipped),
        "stats": {"programs": result.programs, "calls": result.calls, "seconds": round(result.seconds, 3),
                  "first_counterexample_seconds": None if result.first_counterexample is None
                  else round(result.first_counterexample, 4),
                  "first_counterexample_programs": result.first_counterexample_programs,
                  "requests_per_second": None if result.requests_per_second is None
                  else round(result.requests_per_second)},
    }


def report_junit(report: dict[str, Any]) -> str:
    suite = ET.Element("testsuite", name="kvcache-conformance", tests="0", failures="0", skipped="0")
    tests = failures = skipped = 0
    by_class: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (WRONG, CRASH, LENIENT, OVER_STRICT)}
    for finding in report["semantic"]["findings"]:
        by_class[finding["class"]].append(finding)
    fails_run = {WRONG, CRASH} | ({LENIENT, OVER_STRICT} if report["strict"] else set())
    for kind, found in by_class.items():
        tests += 1
        case = ET.SubElement(suite, "testcase", classname="kvcache.conformance.semantic", name=kind)
        if found and kind in fails_run:
            failures += 1
            failure = ET.SubElement(case, "failure", message=f"{len(found)} {kind} finding(s)")
            failure.text = "\n\n".join(f"[{f['rule']}] {f['message']}\nsteps: {json.dumps(f['steps'])}"
                                       for f in found)
        elif found:
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(f"[{f['rule']}] {f['message']}" for f in found)
    tests += 1
    case = ET.SubElement(suite, "testcase", classname="kvcache.conformance.layout", name="canonical")
    if report["layout"]["divergences"]:
        if report["exact_layout"]:
            failures += 1
            ET.SubElement(case, "failure", message="layout is not canonical").text = \
                json.dumps(report["layout"]["divergences"], indent=1)
        else:
            ET.SubElement(case, "system-out").text = json.dumps(report["layout"]["divergences"])
    for note in report["skipped"]:
        tests += 1
        skipped += 1
        ET.SubElement(ET.SubElement(suite, "testcase", classname="kvcache.conformance.skipped", name=note),
                      "skipped", message=note)
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    return ET.tostring(suite, encoding="unicode")
