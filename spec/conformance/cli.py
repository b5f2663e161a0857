"""`kvcache conformance`: run the suite against a target; exit 0 conforming, 1 not, 2 usage/harness error."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional, TextIO

from ..cli import open_report
from . import scope as scopes
from .engine import CLASSES
from .suite import PROFILES, SuiteResult, report_json, report_junit, run_suite
from .targets import Target, TargetError, parse_target
from .vectors import save_findings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvcache conformance",
                                     description="Run the kvcache conformance suite against a target.")
    parser.add_argument("--target", default="reference",
                        help="reference (default), python:MODULE:FACTORY, or cmd:COMMAND (spec/PROTOCOL.md)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--strict", action="store_true", help="lenient and over-strict findings fail the run")
    parser.add_argument("--exact-layout", action="store_true",
                        help="a non-canonical layout (LAYOUT-CANON, DEPTH) fails the run")
    parser.add_argument("--isolate", action="store_true",
                        help="run a python: target in a subprocess, so a hang or a crash is a finding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per request (cmd: targets)")
    parser.add_argument("--json", metavar="F", help="write the JSON report to F ('-' for stdout)")
    parser.add_argument("--junit", metavar="F", help="write a JUnit XML report to F")
    parser.add_argument("--save-findings", metavar="DIR",
                        help="write each finding as a golden-vector file in DIR, replayable without Python "
                             "(./my_target --vectors DIR/01-....json)")
    parser.add_argument("--scope", metavar="FEATURES",
                        help="override the target's declared scope: comma-separated features of "
                             f"{', '.join(scopes.FEATURES)} (or all); configs outside it must be refused")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    # Killed from outside (CI timeout): unwind, so the target's process group is killed and reaped too.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(2))
    try:
        scope = None if args.scope is None else scopes.parse_text(args.scope, "--scope")
    except scopes.ScopeError as error:
        print(f"kvcache conformance: --scope: {error}", file=sys.stderr)
        return 2
    if scope is not None and (scope.ignored or not scope.features):
        print(f"kvcache conformance: --scope: unknown feature(s) {', '.join(scope.ignored) or '(none given)'}; "
              f"choose from {', '.join(scopes.FEATURES)} or all", file=sys.stderr)
        return 2
    if args.save_findings:
        try:
            Path(args.save_findings).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            print(f"kvcache conformance: --save-findings: {error}", file=sys.stderr)
            return 2
    try:
        target = parse_target(args.target, timeout=args.timeout, isolate=args.isolate)
    except TargetError as error:
        print(f"kvcache conformance: {error}", file=sys.stderr)
        return 2
    try:
        result = run_suite(target, args.profile, args.seed, scope=scope)
        saved = save(result, args.save_findings, target, scope) if args.save_findings else None
    except TargetError as error:
        print(f"kvcache conformance: {error}", file=sys.stderr)
        return 2
    finally:
        target.close()
    report = report_json(result, args.strict, args.exact_layout)
    if saved is not None:
        report["saved_findings"] = saved
    if args.json:
        text = json.dumps(report, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open_report(args.json) as out:
                out.write(text + "\n")
    if args.junit:
        with open_report(args.junit) as out:
            out.write(report_junit(report) + "\n")
    summary(report, result.target, args, sys.stderr if args.json == "-" else sys.stdout)
    return 0 if report["conforming"] else 1


def save(result: SuiteResult, directory: str, target: Target, scope: Optional[scopes.Scope]) -> list[dict[str, Any]]:
    """--save-findings: every finding as a vector file, in the report's order (wrong first)."""
    order = {kind: rank for rank, kind in enumerate(CLASSES)}
    found = sorted(result.findings.values(), key=lambda r: (order[r.finding.kind], r.finding.rule))
    return save_findings([(r.finding, r.config, r.steps) for r in found], Path(directory), target,
                         scope or target.scope)


def summary(report: dict[str, Any], target: str, args: argparse.Namespace, out: TextIO) -> None:
    """The human summary (to stderr when the JSON report goes to stdout)."""
    def line(text: str) -> None:
        out.write(text + "\n")

    stats = report["stats"]
    line(f"kvcache conformance: target {target}, profile {report['profile']}, seed {report['seed']}: "
          f"{stats['programs']} programs, {stats['calls']} calls in {stats['seconds']} s"
          + (f", {stats['requests_per_second']} requests/s" if stats["requests_per_second"] else ""))
    if report["aborted"]:
        line(f"  ABORTED: {report['aborted']}")
    for finding in report["semantic"]["findings"]:
        line(f"  {finding['class']:<11} {finding['rule']:<15} {finding['message'][:160]}")
        line(f"              config {finding['config_name']}; {len(finding['steps'])} steps: "
              f"{json.dumps(finding['steps'])[:300]}")
    line(f"  semantic conformance: {'yes' if report['semantic']['conforming'] else 'NO'}; "
          f"exact layout: {'canonical' if report['layout']['canonical'] else 'NOT canonical'}")
    for divergence in report["layout"]["divergences"][:1]:
        line(f"    first layout divergence: {divergence['divergences'][0]}")
    for note in report["skipped"]:
        line(f"  skipped: {note}")
    for saved in report.get("saved_findings", []):
        line(f"  saved {saved['path']}: {'reproduces' if saved['reproduces'] else 'DOES NOT reproduce'} "
             f"on replay ({saved['replay'][:120]})")
    partial = report.get("scope", {}).get("full") is False
    line(f"  {'CONFORMING' if report['conforming'] else 'NOT CONFORMING'}"
          f"{' (strict)' if args.strict else ''}"
          + (f" within the scope {','.join(report['scope']['features'])} only" if partial else ""))
