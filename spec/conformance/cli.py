"""`kvcache conformance`: run the suite against a target.

Exit codes: 0 CONFORMING (with its coverage printed), 1 NOT CONFORMING (a wrong, crash or over-strict
finding; a lenient one only under --strict), 2 usage or harness error, 3 INCOMPLETE (the run exercised
less than its profile promises: stopped by a signal, the safety net, the restart cap, or a configuration
or rule in scope never exercised).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, TextIO

from ..report_files import open_report, report_path_problem
from . import report_page
from . import scope as scopes
from .engine import CLASSES, failing_classes
from .layouts import add_layout_hint
from .suite import (CONFORMING, INCOMPLETE, MAX_CAUSES, PROFILES, SuiteResult, baseline_problem, compare_to_baseline,
                    report_json, report_junit, run_suite, wrap)
from .suite.against import differences
from .targets import LAYOUTS, OP_LAYOUTS, HarnessInterrupted, Target, TargetError, parse_target, stop_on_signals
from .vectors import save_findings

EXIT_CODES = {CONFORMING: 0, "NOT CONFORMING": 1, INCOMPLETE: 3}
WIDTH = 110            # a finding's lines in the summary: longer text wraps (a word too long keeps its line)
INDENT = " " * 14
EPILOG = ("exit codes: 0 CONFORMING (full coverage), 1 NOT CONFORMING (a wrong, crash or over-strict finding; "
          "a lenient one too under --strict), 2 usage or harness error, "
          "3 INCOMPLETE (less exercised than the profile promises: interrupted, the wall-clock safety net, "
          "the restart cap, a configuration never created or a rule in scope never exercised). "
          "Report folders are created when missing; reports are written atomically.")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvcache conformance", epilog=EPILOG,
                                     description="Run the kvcache conformance suite against a target.")
    parser.add_argument("--target", default="reference",
                        help="reference (default), python:MODULE:FACTORY, or cmd:COMMAND (spec/PROTOCOL.md)")
    parser.add_argument("--layout", choices=LAYOUTS,
                        help="the layout the target implements (default: what it declares - a python: "
                             "factory's kvcache_layout, a cmd: target's hello - else sequence)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick", help=profile_help())
    parser.add_argument("--strict", action="store_true",
                        help="lenient findings (a caller error the target served) fail the run too; without it "
                             "they are warnings. Wrong, crash and over-strict findings (a valid call refused: a "
                             "runner would crash on it) always fail")
    parser.add_argument("--exact-layout", action="store_true",
                        help="a non-canonical layout (LAYOUT-CANON, DEPTH) fails the run (the sequence and cell "
                             "layouts; the op face has no canonical layout)")
    parser.add_argument("--isolate", action="store_true",
                        help="run a python: target in a subprocess, so a hang or a crash is a finding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds per request (cmd: and --isolate targets); finite, above 0")
    parser.add_argument("--json", metavar="F", help="write the JSON report to F ('-' for stdout)")
    parser.add_argument("--junit", metavar="F", help="write a JUnit XML report to F")
    parser.add_argument("--html", metavar="F", help="write the report as one self-contained HTML page to F: each "
                                                      "cause drawn (kvcache report REPORT.json --html F: from a saved one)")
    parser.add_argument("--save-findings", metavar="DIR",
                        help="write each finding as a golden-vector file in DIR, replayable without Python "
                             "(./my_target --vectors DIR/01-....json); the sequence and cell layouts only: an op-face "
                             "finding replays from the --json report")
    parser.add_argument("--all-causes", action="store_true",
                        help=f"print every distinct cause in full (default: the first {MAX_CAUSES} of each class "
                             "and rule, then how many more there are; the JSON report always has them all)")
    parser.add_argument("--pytest", action="store_true",
                        help="print each finding's pasteable pytest test under it in the summary (the JSON "
                             "report has it too, as 'pytest')")
    parser.add_argument("--baseline", metavar="REPORT.json",
                        help="an earlier run's --json report of the same target, profile and seed: each cause is "
                             "printed known or NEW, and the exit status counts the new ones only (a program that "
                             "passed there and fails now is shrunk apart from the known causes)")
    parser.add_argument("--against", metavar="TARGET",
                        help="another target (the library's other version, e.g. a cmd: target in its own "
                             "environment) run on the same programs: each program wrong on one and right on the "
                             "other is reported, shrunk on both; the exit status is 1 when a program fails here only")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every 'skipped:' note of the run (default: one line with their count; the JSON "
                             "report's 'skipped' always lists them all)")
    parser.add_argument("--scope", metavar="FEATURES",
                        help="override the target's declared scope: comma-separated features (or all) of "
                             f"its layout - {scopes.features_per_layout()} (max_seqs=N: a cell cache with N fixed "
                             "ids, all,max_seqs=64); configs outside it must be refused")
    return parser


def profile_help() -> str:
    """--profile's help, from PROFILES: its default and what each profile runs, as counts."""
    names = sorted(PROFILES, key=lambda name: PROFILES[name].random_programs)
    return ("default quick. Every profile runs every edge program of every configuration in scope, the border and "
            "the invalid configurations, then random programs: "
            + ", ".join(f"{name} {PROFILES[name].random_programs} of up to {PROFILES[name].largest} steps "
                        f"({PROFILES[name].shrink_budget} runs to shrink a finding)" for name in names))


def usage_problem(args: argparse.Namespace) -> Optional[str]:
    """Everything checkable before the run: one line naming the option, or None."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        return f"--timeout {args.timeout}: seconds per request must be a finite number above 0"
    if args.against is not None and args.baseline:
        return "--against and --baseline: one comparison at a time"
    if args.junit == "-":
        return "--junit -: the JUnit report needs a file (only --json may go to stdout)"
    if args.html == "-":
        return "--html -: the HTML report needs a file (only --json may go to stdout)"
    for option, path in (("--json", args.json), ("--junit", args.junit), ("--html", args.html)):
        problem = report_path_problem(path, stdout_ok=option == "--json")
        if problem:
            return f"{option} {path}: {problem}"
    return None


@contextlib.contextmanager
def _protocol_stdout(keep: bool) -> Iterator[TextIO]:
    """Own stdout for the JSON report: while the suite runs, fd 1 and sys.stdout go to stderr, so an
    in-process target's print() (or a C extension's write to fd 1) cannot corrupt `--json -`."""
    if not keep:
        yield sys.stdout
        return
    sys.stdout.flush()
    saved = os.dup(1)
    real = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    previous = sys.stdout
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield real
    finally:
        sys.stdout.flush()
        sys.stdout = previous
        os.dup2(saved, 1)
        os.close(saved)
        real.close()


def main(argv: Optional[list[str]] = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    problem = usage_problem(args)
    if problem:
        print(f"kvcache conformance: {problem}", file=sys.stderr)
        return 2
    try:
        scope = None if args.scope is None else scopes.parse_text(args.scope, "--scope")
    except scopes.ScopeError as error:
        print(f"kvcache conformance: --scope: {error}", file=sys.stderr)
        return 2
    if scope is not None and (scope.ignored or not scope.features):
        print(f"kvcache conformance: --scope: unknown feature(s) {', '.join(scope.ignored) or '(none given)'}; "
              f"choose from all or, per layout, {scopes.features_per_layout()}", file=sys.stderr)
        return 2
    args.created_save_dir = bool(args.save_findings) and not Path(args.save_findings).exists()
    if args.save_findings:
        try:
            Path(args.save_findings).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            print(f"kvcache conformance: --save-findings: {error}", file=sys.stderr)
            return 2
    args.parsed_scope = scope
    args.baseline_report = None
    if args.baseline:
        try:
            args.baseline_report = json.loads(Path(args.baseline).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            print(f"kvcache conformance: --baseline {args.baseline}: {error}", file=sys.stderr)
            return 2
    # stdout is owned from here: even a target module printing while it is imported cannot corrupt it
    with stop_on_signals(), _protocol_stdout(args.json == "-") as out:
        target: Optional[Target] = None
        try:
            target = parse_target(args.target, timeout=args.timeout, isolate=args.isolate)
            return _run(target, args, out)
        except TargetError as error:
            print(f"kvcache conformance: {error}", file=sys.stderr)
            return 2
        except scopes.ScopeError as error:   # a declared or overriding scope its layout cannot declare
            print(f"kvcache conformance: --scope: {error}", file=sys.stderr)
            return 2
        except HarnessInterrupted as stop:   # outside the run (run_suite itself returns a partial result)
            if target is not None:
                target.kill()
            print(f"kvcache conformance: interrupted by {stop.signal_name} outside the run: no report",
                  file=sys.stderr)
            return 3


def _run(target: Target, args: argparse.Namespace, out: TextIO) -> int:
    """The run and its reports; a signal stops the run, and the partial report is still written."""
    to_stdout = args.json == "-"
    result: Optional[SuiteResult] = None
    compared: Optional[dict[str, Any]] = None
    problem = None if args.baseline_report is None else \
        baseline_problem(args.baseline_report, args.profile, args.seed)
    if problem:
        target.close()
        print(f"kvcache conformance: --baseline {args.baseline}: {problem}", file=sys.stderr)
        return 2
    try:
        result = run_suite(target, args.profile, args.seed, scope=args.parsed_scope, layout=args.layout,
                           baseline=args.baseline_report)
        if args.against is not None and not result.interrupted:
            other = parse_target(args.against, timeout=args.timeout, isolate=args.isolate)
            try:
                other_result = run_suite(other, args.profile, args.seed, scope=args.parsed_scope, layout=args.layout)
                compared = differences(target, result, other, other_result, PROFILES[args.profile].shrink_budget)
            finally:
                other.close()
    finally:
        try:
            if result is not None and result.interrupted:
                target.kill()
            else:
                target.close()
        except HarnessInterrupted:   # stopped while saying goodbye: the run itself is complete
            target.kill()
    report = report_json(result, args.strict, args.exact_layout)
    if args.baseline_report is not None:
        report["baseline"] = compare_to_baseline(report, args.baseline_report, args.baseline)
    if args.against is not None and compared is not None:
        report["against"] = compared
    add_layout_hint(report, result.interrupted, target)
    saved = None
    op_face = target.layout in OP_LAYOUTS
    report["layout"]["applies"] = not op_face   # the op face has no canonical layout: rows are the cache's own
    if op_face and args.exact_layout:
        report["skipped"].append("--exact-layout: the op face has no canonical layout (a cache keeps its rows as it "
                                 "likes, OP-ATTEND names tokens): it changes nothing here")
    if args.save_findings and op_face:
        # golden vectors are JSON calls; the op face passes tensors: its findings replay from the JSON report
        report["skipped"].append("--save-findings: the op face has no golden-vector form (its calls carry tensors); "
                                 "nothing was saved: each finding's config and steps in the JSON report replay with "
                                 "kvcache_spec.conformance.suite.replay(target, config, steps)")
        if args.created_save_dir:   # made only to check it could be written: not left behind empty
            try:
                Path(args.save_findings).rmdir()
            except OSError:
                pass
    elif args.save_findings and not result.interrupted:
        saved = save(result, args.save_findings, target, args.parsed_scope)
        report["saved_findings"] = saved
    try:
        if args.json:
            text = json.dumps(report, indent=1)
            if to_stdout:
                out.write(text + "\n")
                out.flush()
            else:
                with open_report(args.json) as handle:
                    handle.write(text + "\n")
        if args.junit:
            with open_report(args.junit) as handle:
                handle.write(report_junit(report) + "\n")
        if args.html:
            report_page.write(report, args.html)
    except OSError as error:
        print(f"kvcache conformance: cannot write the report: {error}", file=sys.stderr)
        return 2
    summary(report, result.target, args, sys.stderr if to_stdout else sys.stdout)
    if "against" in report:   # a regression is a program wrong here and right on the other target
        return 1 if report["against"]["only_here_programs"] else 3 if report["verdict"] == INCOMPLETE else 0
    return EXIT_CODES[report["baseline"]["verdict"] if "baseline" in report else report["verdict"]]


def save(result: SuiteResult, directory: str, target: Target, scope: Optional[scopes.Scope]) -> list[dict[str, Any]]:
    """--save-findings: every finding as a vector file, in the report's order (wrong first)."""
    order = {kind: rank for rank, kind in enumerate(CLASSES)}
    found = sorted((r for kept in result.causes.values() for r in kept),
                   key=lambda r: (order[r.finding.kind], r.finding.rule))
    return save_findings([(r.finding, r.config, r.steps) for r in found], Path(directory), target,
                         scope or target.scope)


def summary(report: dict[str, Any], target: str, args: argparse.Namespace, out: TextIO) -> None:
    """The human summary (to stderr when the JSON report goes to stdout)."""
    def paragraph(first: str, text: str) -> None:
        """A finding's text wrapped, never cut: the first line after `first`, the others indented under it."""
        out.write("".join(part + "\n" for part in wrap(text, WIDTH, first, " " * len(first))))

    def line(text: str) -> None:
        out.write(text + "\n")

    stats, coverage = report["stats"], report["coverage"]
    rules, clauses = coverage["rules"], coverage["clauses"]
    line(f"kvcache conformance: target {target}, profile {report['profile']}, seed {report['seed']}: "
         f"{stats['programs']} programs, {stats['calls']} calls in {stats['seconds']} s"
         + (f", {stats['requests_per_second']} requests/s" if stats["requests_per_second"] else ""))
    programs, configs, families = coverage["programs"], coverage["configurations"], coverage["families"]
    in_scope = len(rules["exercised"]) + len(rules["not_exercised"])
    line(f"  coverage: {programs['run']}/{programs['planned']} programs"
         + (f" (+{programs['continued']} rerun past a lenient or over-strict step)" if programs.get("continued") else "")
         + f", {configs['created']}/{configs['planned']} "
         f"configurations, {len(families['exercised'])}/{len(families['planned'])} families, "
         f"{len(rules['exercised'])}/{in_scope} rules in scope exercised, "
         f"{len(clauses['exercised'])}/{len(clauses['exercised']) + len(clauses['not_exercised'])} argument "
         f"and configuration cases broken"
         + (f", {coverage['restarts']} target restarts" if coverage["restarts"] else ""))
    for reason in coverage["incomplete"]:
        line(f"  INCOMPLETE: {reason}")
    findings = report["semantic"]["findings"]
    if findings:
        groups: dict[str, int] = {}
        for finding in findings:
            groups[f"{finding['class']} {finding['rule']}"] = groups.get(f"{finding['class']} {finding['rule']}", 0) + 1
        unshrunk = sum(1 for finding in findings if not finding["shrunk"])
        paragraph("  ", f"{len(findings)} distinct causes: " + ", ".join(f"{name} {count}" for name, count in groups.items())
                  + (f" ({unshrunk} not shrunk: past the shrink cap, kept as found)" if unshrunk else ""))
    compared = report.get("baseline")
    if compared:
        paragraph("  ", f"baseline {compared['report']}: {compared['known']} known causes, {compared['new']} NEW"
                  + (f" ({compared['newly_failing_programs']} programs that passed there fail now)"
                     if compared["newly_failing_programs"] else "")
                  + ("" if compared["same_programs"] else "; its run planned other programs (another scope or "
                     "layout?): causes are compared by their keys only")
                  + (f"; {len(compared['gone'])} of its causes not seen now: {'; '.join(compared['gone'])}"
                     if compared["gone"] else ""))
    for index, finding in enumerate(findings):
        if finding["cause"] > MAX_CAUSES and not args.all_causes and finding.get("baseline") != "new":
            if index + 1 == len(findings) or findings[index + 1]["rule"] != finding["rule"] or \
                    findings[index + 1]["class"] != finding["class"]:
                paragraph(INDENT, f"... and {finding['causes_of_rule'] - MAX_CAUSES} more causes of "
                                  f"{finding['class']} {finding['rule']}: every one is in the JSON report (--json), "
                                  f"--all-causes prints them")
            continue
        cause = f" (cause {finding['cause']} of {finding['causes_of_rule']})" if finding["causes_of_rule"] > 1 else ""
        head = f"  {finding['class']:<11} {finding['rule']:<15} "
        if "baseline" in finding:   # known or NEW against the baseline, first on the line
            head = f"  {'NEW' if finding['baseline'] == 'new' else 'known':<5} {finding['class']:<11} {finding['rule']:<15} "
        paragraph(head, finding["message"] + cause)
        paragraph(INDENT, f"cause: {finding['label']}" + ("" if finding["shrunk"] else " [NOT SHRUNK]"))
        paragraph(INDENT, f"config {finding['config_name']}; {len(finding['steps'])} steps: "
                          f"{json.dumps(finding['steps'])}")
        if finding["note"]:
            paragraph(INDENT, f"note: {finding['note']}")
        if args.pytest:   # code, at column 0 and ended by a blank line: it pastes as it is printed
            line(f"{INDENT}its test, to paste as it is:")
            out.write(finding["pytest"] + "\n")
    if findings and not args.pytest:
        line(f"{INDENT}(each finding's pytest test to paste: --pytest, or 'pytest' in the --json report)")
    broken = any(f["class"] in failing_classes(False) for f in report["semantic"]["findings"])
    semantic = "NO" if broken else "yes" if report["semantic"]["conforming"] else "not established (INCOMPLETE)"
    exact = "canonical" if report["layout"]["canonical"] else "NOT canonical"
    line(f"  semantic conformance: {semantic}"
         + (f"; exact layout: {exact}" if report["layout"].get("applies", True) else ""))   # none on the op face
    for divergence in report["layout"]["divergences"][:1]:
        line(f"    first layout divergence: {divergence['divergences'][0]}")
    notes = report["skipped"]
    if args.verbose:
        for note in notes:
            line(f"  skipped: {note}")
    elif notes:   # folded: the verdict and the findings stay on the first screen
        line(f"  skipped: {len(notes)} part{'s' if len(notes) > 1 else ''} of the spec not judged here (the scope, "
             f"the relaxations, what the target is not sent): -v prints {'them' if len(notes) > 1 else 'it'}, the "
             f"JSON report lists {'them' if len(notes) > 1 else 'it'} under 'skipped'")
    for saved_one in report.get("saved_findings", []):
        line(f"  saved {saved_one['path']}: {'reproduces' if saved_one['reproduces'] else 'DOES NOT reproduce'} "
             f"on replay ({saved_one['replay'][:120]})")
    if report.get("hint"):
        line(f"  hint: {report['hint']}")   # one line, as the JSON has it
    partial = report.get("scope", {}).get("full") is False
    verdict = report["verdict"]
    against = report.get("against")
    if against:
        for key, where in (("only_here", "here only"), ("only_there", f"on {against['against']} only")):
            line(f"  against {against['against']}: {against[f'{key}_programs']} programs wrong {where}"
                 + ("" if against["same_programs"] else " (the two runs planned other programs: compare with care)"))
            for difference in against[key]:
                paragraph(INDENT, f"{difference['label']}" + ("" if difference["shrunk"] else " [NOT SHRUNK]")
                          + f": {difference['message']}")
                paragraph(INDENT, f"config {difference['config_name']}; {len(difference['steps'])} steps: "
                                  f"{json.dumps(difference['steps'])} (right on {difference['right_on']})")
    if compared:
        line(f"  against the baseline: {compared['verdict']}{' (strict)' if args.strict else ''} "
             f"({compared['new']} new causes; the exit status is this verdict's)")
    line(f"  {verdict}{' (strict)' if args.strict else ''}"
         + (f" within the scope {','.join(report['scope']['features'])} only" if partial else "")
         + (f": {coverage['incomplete'][0]}" if verdict == INCOMPLETE else ""))
