"""The reports: the JSON report (REPORT_FORMAT), JUnit XML, and a pytest test per counterexample."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from typing import Any, Optional

from ...rules import BY_ID
from ..configs import describe
from ..coverage import clauses_summary, family
from ..coverage import summary as rules_summary
from ..engine import CRASH, LENIENT, OVER_STRICT, WRONG, failing_classes
from .account import Reported, SuiteResult, _op_kind, cause_key
from .plan import CONFORMING, INCOMPLETE, NOT_CONFORMING, REPORT_FORMAT

def wrap(text: str, width: int, first: str = "", indent: str = "") -> list[str]:
    """Lines of at most `width` characters (the first after `first`, the others after `indent`) where
    the text has spaces: never cut inside a word (a longer word gets a line of its own)."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [first]


def pytest_text(target: str, reported: Reported, number: int = 1) -> str:
    """A test to paste into the target's repository: replays the minimal step list."""
    f = reported.finding
    name = f"{f.kind}_{f.rule}".lower().replace("-", "_") + (f"_{number}" if number > 1 else "")
    statement = BY_ID[f.rule].statement if f.rule in BY_ID else ""
    message = "".join(line + "\n" for line in wrap(f.message.replace("\n", " "), 100, "    # ", "    # "))
    return (f'def test_kvcache_conformance_{name}() -> None:\n'
            f'    """{f.kind} {f.rule}: {statement}"""\n'
            f'{message}'
            f'    # config {describe(reported.config)}\n'
            f'    from kvcache_spec.conformance import replay\n'
            f'    config = {reported.config!r}\n'
            f'    steps = {reported.steps!r}\n'
            f'    finding = replay({target!r}, config, steps)\n'
            f'    assert finding is None, finding\n')


def label(reported: Reported) -> str:
    """A cause's name, from the program that shows it (after shrinking, when it was shrunk): its class and
    rule, the call it fails at (with what the spec finds wrong in it) and the configuration's family."""
    f, steps = reported.finding, reported.steps
    at = _op_kind(steps[-1]) if steps else "create"
    refused = next((step["refused_with"] for step in reversed(steps) if "refused_with" in step), None)
    if f.rule == "OP-ATOMIC" and refused:   # the cause is what the target refused the call for
        at += f", which the target refused with {refused!r}"
    mla = " (v_head_dim != head_dim)" if reported.config.get("v_head_dim", reported.config.get("head_dim")) != \
        reported.config.get("head_dim") else ""
    after = f", after {f.after}" if f.after else ""
    detail = f" ({f.detail})" if f.detail else ""
    return f"{f.kind} {f.rule}{after}: at {at}{detail}; {family(reported.config)}{mla}"


def coverage_json(result: SuiteResult) -> dict[str, Any]:
    """What the run exercised: the evidence behind its verdict."""
    return {"complete": not result.incomplete(), "incomplete": result.incomplete(),
            "programs": {"planned": result.planned, "run": result.programs, "continued": result.continued},
            "configurations": {"planned": len(result.configs), "created": len(result.created),
                               "never_created": sorted(set(result.configs) - result.created)},
            "families": {"planned": sorted({family(cfg) for cfg in result.configs.values()}),
                         "exercised": sorted(result.families)},
            "rules": rules_summary(result.scope, result.exercised),
            "clauses": clauses_summary(result.clauses, result.exercised),
            "restarts": result.restarts, "interrupted": result.interrupted or None}


def report_json(result: SuiteResult, strict: bool, exact_layout: bool) -> dict[str, Any]:
    findings: list[dict[str, Any]] = []
    for kept in result.causes.values():
        for number, r in enumerate(kept, 1):
            findings.append({"class": r.finding.kind, "rule": r.finding.rule, "cause": number,
                             "causes_of_rule": len(kept), "label": label(r), "shrunk": r.shrunk,
                             "statement": BY_ID[r.finding.rule].statement if r.finding.rule in BY_ID else "",
                             "message": r.finding.message, "config": r.config, "config_name": describe(r.config),
                             "steps": r.steps, "programs_hit": r.hits, "note": r.note, "after": r.finding.after,
                             **({"safety": r.finding.safety} if r.finding.safety else {}),
                             **({"picture": r.finding.picture} if r.finding.picture else {}),
                             "found_after": r.found_after,
                             # what makes it one cause (account.cause), as --baseline compares a run's causes by
                             "cause_key": cause_key(r.cause()), "new": r.new,
                             "pytest": pytest_text(result.target, r, number)})
    order = {WRONG: 0, CRASH: 1, LENIENT: 2, OVER_STRICT: 3}
    findings.sort(key=lambda f: (order[f["class"]], f["rule"], f["cause"]))
    verdict = result.verdict(strict, exact_layout)
    return {
        "format": REPORT_FORMAT, "target": result.target, "profile": result.profile, "seed": result.seed,
        "strict": strict, "exact_layout": exact_layout,
        "verdict": verdict, "conforming": verdict == CONFORMING,
        "semantic": {"conforming": not (result.classes() & failing_classes(False)) and not result.incomplete(),
                     "findings": findings},
        "layout": {"canonical": not result.layout, "divergences": result.layout},
        "coverage": coverage_json(result),
        "aborted": result.aborted,
        "scope": result.declared,
        "skipped": sorted(result.skipped),
        "failing_programs": sorted(result.failing_programs),
        "stats": {"programs": result.programs, "calls": result.calls, "seconds": round(result.seconds, 3),
                  "first_counterexample_seconds": None if result.first_counterexample is None
                  else round(result.first_counterexample, 4),
                  "first_counterexample_programs": result.first_counterexample_programs,
                  "requests_per_second": None if result.requests_per_second is None
                  else round(result.requests_per_second)},
    }


def baseline_problem(baseline: Any, profile: str, seed: int) -> Optional[str]:
    """Why `baseline` cannot be this run's baseline (None when it can): a report of this format, of the same profile
    and seed - the same programs in the same order, for a target of the same layout and scope (its name may differ:
    the same library at another version, another path; `compare_to_baseline` checks the programs planned)."""
    if not isinstance(baseline, dict) or baseline.get("format") != REPORT_FORMAT or \
            not isinstance(baseline.get("semantic", {}).get("findings"), list) or "failing_programs" not in baseline:
        return f"not a {REPORT_FORMAT} report with its failing programs (an earlier run's --json)"
    for what, want in (("profile", profile), ("seed", seed)):
        if baseline.get(what) != want:
            return f"a report of {what} {baseline.get(what)!r}, not this run's {want!r}: its programs are not this run's"
    return None


def compare_to_baseline(report: dict[str, Any], baseline: dict[str, Any], path: str) -> dict[str, Any]:
    """Each cause of `report` marked known or new ("baseline" in each finding) against an earlier run's report:
    new when its cause is none of the baseline's (`cause_key`), or the run kept it apart as new (`new`: found on a
    program that passed there - only when both runs planned the same programs). The summary it adds to the report: the
    counts, the baseline's causes gone, and the verdict on the new causes alone (what the exit status says)."""
    known = {finding.get("cause_key") for finding in baseline["semantic"]["findings"]}
    planned, planned_there = report["coverage"]["programs"]["planned"], baseline["coverage"]["programs"]["planned"]
    same_programs = planned == planned_there
    findings = report["semantic"]["findings"]
    for finding in findings:
        newly = same_programs and finding["new"]
        finding["baseline"] = "new" if newly or finding["cause_key"] not in known else "known"
    new = [f for f in findings if f["baseline"] == "new"]
    seen = {f["cause_key"] for f in findings}
    verdict = NOT_CONFORMING if any(f["class"] in failing_classes(report["strict"]) for f in new) else \
        CONFORMING if report["coverage"]["complete"] else INCOMPLETE
    return {"report": path, "target": baseline.get("target"), "known": len(findings) - len(new), "new": len(new),
            "same_programs": same_programs,
            "newly_failing_programs": len(set(report["failing_programs"]) - set(baseline["failing_programs"]))
            if same_programs else None,
            "gone": [f["label"] for f in baseline["semantic"]["findings"] if f.get("cause_key") not in seen],
            "verdict": verdict}


def report_junit(report: dict[str, Any]) -> str:
    suite = ET.Element("testsuite", name="kvcache-conformance", tests="0", failures="0", skipped="0")
    tests = failures = skipped = 0
    by_class: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (WRONG, CRASH, LENIENT, OVER_STRICT)}
    for finding in report["semantic"]["findings"]:
        by_class[finding["class"]].append(finding)
    fails_run = failing_classes(report["strict"])
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
    coverage = report["coverage"]
    tests += 1
    case = ET.SubElement(suite, "testcase", classname="kvcache.conformance.coverage", name="complete")
    ET.SubElement(case, "system-out").text = json.dumps(
        {k: coverage[k] for k in ("programs", "configurations", "families", "rules", "restarts")})
    if coverage["incomplete"]:
        failures += 1
        ET.SubElement(case, "failure", message="INCOMPLETE: " + "; ".join(coverage["incomplete"])[:500]).text = \
            "\n".join(coverage["incomplete"])
    for note in report["skipped"]:
        tests += 1
        skipped += 1
        ET.SubElement(ET.SubElement(suite, "testcase", classname="kvcache.conformance.skipped", name=note),
                      "skipped", message=note)
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    return ET.tostring(suite, encoding="unicode")
